"""The files a killed write left where rows name files: ``feature_sets/``,
``received/`` and ``models/imported/``.

Each of those writes the file first and commits its row after (a row must never
name a missing file), so a process killed between the two left a file no row
names, and a partial one (``.tmp``, ``.part``) if killed while writing. Nothing
swept them: 73 MB a killed upload. At start the service deletes the partial ones
and sets the complete ones aside under ``orphans/`` (kept, for the operator to
look at), once untouched for :data:`~feature_party.uploads.STALE_SECONDS`: a
younger one may be another server's, its row about to commit.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from feature_party.orm import FeatureSet, Model, ReceivedLabels
from feature_party.uploads import STALE_SECONDS

log = logging.getLogger(__name__)

#: Where rows name files, relative to the data directory.
NAMED_DIRECTORIES = (Path("feature_sets"), Path("received"), Path("models") / "imported")
#: The suffix of a file that rows name; any other file there is a partial write.
COMPLETE_SUFFIXES = (".parquet", ".pt")


def sweep_unnamed(session: Session, data_dir: Path, *, older_than: float = STALE_SECONDS) -> int:
    """Delete the partial writes and set aside the complete files that no row
    names, in :data:`NAMED_DIRECTORIES`; their number."""
    named = {
        str(path)
        for table in (FeatureSet, ReceivedLabels, Model)
        for path in session.scalars(select(table.path))
    }
    cutoff, swept = time.time() - older_than, 0
    for directory in NAMED_DIRECTORIES:
        if not (data_dir / directory).is_dir():
            continue
        for path in (data_dir / directory).iterdir():
            relative = directory / path.name
            try:
                if not path.is_file() or str(relative) in named or path.stat().st_mtime >= cutoff:
                    continue
                if path.suffix in COMPLETE_SUFFIXES and not path.name.startswith("."):
                    aside = data_dir / "orphans" / relative
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    path.replace(aside)
                else:
                    path.unlink()
                swept += 1
            except FileNotFoundError:  # another server's sweep was first
                continue
            except OSError as exc:  # its permissions: the service starts all the same
                log.warning("housekeeping: cannot remove or set aside %s: %s", relative, exc)
    if swept:
        log.info("housekeeping: %d files no row names (a killed write) removed or set aside "
                 "under orphans/", swept)  # fmt: skip
    return swept
