"""What a ``labeldp`` command reports when it fails, and with which exit status.

Both parties' client commands raise these; ``labeldp``'s ``main`` prints the
message on one line of stderr and exits with :attr:`CommandError.exit_status`:

* 2 — the command must change: a bad argument, or a request the service refused
  as asked (a 4xx answer other than 429);
* 1 — the command may work as it is, later: the service did not answer, failed
  (5xx) or was busy (429), or what the command waited for failed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx

from shared.protocol import AMOUNT_TEXT
from shared.tokens import BEARER


class CommandError(Exception):
    """A command, or its request, that the user must change (exit status 2)."""

    exit_status = 2


class ServiceFailedError(CommandError):
    """A service that did not answer, failed or was busy (exit status 1)."""

    exit_status = 1


def refusal(status: int, message: str) -> CommandError:
    """The error for an HTTP answer with ``status`` ≥ 400: 429 and 5xx are the
    service's (retry later), other 4xx the request's."""
    return ServiceFailedError(message) if status == 429 or status >= 500 else CommandError(message)


def unreachable(url: str, exc: httpx.TransportError) -> CommandError:
    """The error for a request that got no answer: a URL that is not http(s) is the
    command's to change (nothing was sent); a service that did not answer, the
    service's."""
    if isinstance(exc, httpx.UnsupportedProtocol):
        return CommandError(f"{url} is not a URL to send requests to: give http://… or https://…")
    if isinstance(exc, httpx.LocalProtocolError):
        # Nothing was sent; httpx's text quotes the header, a token in it.
        return CommandError(f"a request to {url} could not be sent: a header holds characters "
                            "it cannot carry (is the token as issued?)")  # fmt: skip
    return ServiceFailedError(f"cannot reach {url}: {exc}")


def bearer(token: str, what: str = "the token") -> dict[str, str]:
    """The ``Authorization`` header for ``token``, surrounding whitespace dropped; a
    :class:`CommandError` that never quotes it for one a header cannot carry (a line
    break inside, a non-ASCII letter): httpx's complaint quoted the whole header
    into the error (helper-73)."""
    value = token.strip()
    if not BEARER.fullmatch(value):
        raise CommandError(
            f"{what} holds characters a header cannot carry (a line break, a non-ASCII "
            "letter): give it as issued"
        )
    return {"Authorization": f"Bearer {value}"}


def detail_text(detail: Any) -> str:
    """A refusal's detail as the commands print it: JSON, on one line, with its text
    as written ("max − min", not "max \\u2212 min")."""
    return json.dumps(detail, ensure_ascii=False)


def amount_argument(text: str) -> float:
    """An argparse type for an ε or δ: a number as JSON spells it (``float`` alone
    also takes "1_0", which is 10, and "١"; helper-70)."""
    if not AMOUNT_TEXT.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"expected a number such as 1 or 0.5, got {text!r}")
    return float(text)
