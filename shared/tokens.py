"""Admin-token hygiene shared by both services.

A service refuses to start with an admin token that is empty, short, a well-known
word, or a placeholder copied from an example file (``.env.example``'s
``change-me-…``): such a token is as good as none.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, SecretStr

MIN_LENGTH = 16
#: Fewer distinct characters than this (``aaaa…``, ``abababab…``) is a pattern, not a
#: secret, whatever its length.
MIN_DISTINCT = 8
WEAK_TOKENS = frozenset({"admin", "changeme", "change-me", "secret", "token", "password"})
PLACEHOLDER_PREFIXES = ("change-me", "changeme", "replace-me", "your-", "example")
#: Words and marks of a placeholder anywhere in a token (compared in lower case,
#: with ``_`` and spaces read as ``-``): ``change_me_change_me``,
#: ``<generate-a-secret>``, an unexpanded ``${ADMIN_TOKEN}`` and ``password123…``
#: all passed the prefix list alone (helper-73). Words of 7 letters or more: a
#: random token holds one by chance about once in 10¹⁰.
PLACEHOLDER_MARKS = ("change-me", "changeme", "replace", "generate", "password", "<", ">", "${")


def admin_token_problem(token: str | None) -> str | None:
    """Why ``token`` is unfit to guard a service, or ``None`` when it is fine."""
    value = (token or "").strip()
    lowered = value.lower().replace("_", "-").replace(" ", "-")
    if not value:
        return "LABELDP_ADMIN_TOKEN is not set"
    if (
        lowered in WEAK_TOKENS
        or lowered.startswith(PLACEHOLDER_PREFIXES)
        or any(mark in lowered for mark in PLACEHOLDER_MARKS)
    ):
        return "LABELDP_ADMIN_TOKEN is a well-known or placeholder value"
    if len(value) < MIN_LENGTH:
        return f"LABELDP_ADMIN_TOKEN must be at least {MIN_LENGTH} characters"
    if len(set(value)) < MIN_DISTINCT:
        return (
            f"LABELDP_ADMIN_TOKEN repeats a pattern (fewer than {MIN_DISTINCT} distinct characters)"
        )
    return None


def _strip(value: object) -> object:
    """A token read from a file or an env file often ends with a line break; the
    service must compare against the token as checked, without it."""
    return value.strip() if isinstance(value, str) else value


#: The ``LABELDP_ADMIN_TOKEN`` setting: surrounding whitespace is not part of it.
AdminToken = Annotated[SecretStr | None, BeforeValidator(_strip)]


#: What a bearer token may hold: visible ASCII, spaces inside (an admin token may
#: be a passphrase). One with a line break, a non-ASCII letter or a space at either
#: end cannot go in a header as sent, and httpx's complaint about it quoted
#: the whole header, token included, into errors, logs and stored run errors.
BEARER = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


def _check_bearer(token: SecretStr) -> SecretStr:
    if not BEARER.fullmatch(token.get_secret_value()):
        raise ValueError(
            "the token must be the labels party's token as it gave it: visible ASCII "
            "characters, spaces only between them (no line breaks or other letters)"
        )
    return token


#: A labels-party token a request carries to the features party.
BearerToken = Annotated[SecretStr, AfterValidator(_check_bearer)]
