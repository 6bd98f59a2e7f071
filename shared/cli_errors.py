"""What a ``labeldp`` command reports when it fails, and with which exit status.

Both parties' client commands raise these; ``labeldp``'s ``main`` prints the
message on one line of stderr and exits with :attr:`CommandError.exit_status`:

* 2 — the command must change: a bad argument, or a request the service refused
  as asked (a 4xx answer other than 429);
* 1 — the command may work as it is, later: the service did not answer, failed
  (5xx) or was busy (429), or what the command waited for failed.
"""

from __future__ import annotations


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
