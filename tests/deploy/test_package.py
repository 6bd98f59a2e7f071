"""The package's declared dependencies: floors the code runs on, and the pinned
set the set-up command installs within them."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]

#: The lowest version of each that the services start and serve on. A lower floor
#: let ``pip install .`` into an environment that had an older one keep it, and the
#: four services died at start (helper-84, one package at a time).
NEEDED = {
    "fastapi": "0.130",  # Depends(scope=...); 0.121 answered 500 on features-party routes
    "pydantic": "2.11",  # 2.9 could not resolve the routes' Request annotations
    "pyarrow": "16",  # pa.string_view (shared.parquet)
    "sqlalchemy": "2.0.33",  # list[Any] in the features party's type_annotation_map
}


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.lstrip().startswith("#"):
            pins[canonicalize_name(name.strip())] = Version(version.strip())
    return pins


def test_no_dependency_floor_is_below_what_the_code_needs() -> None:
    requirements = _requirements()
    for name, needed in NEEDED.items():
        floors = [Version(s.version) for s in requirements[name].specifier if s.operator == ">="]
        assert floors and min(floors) >= Version(needed), (name, str(requirements[name]))


def test_the_pinned_versions_satisfy_the_declared_ranges() -> None:
    pins = _pins()
    for name, requirement in _requirements().items():
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name])
