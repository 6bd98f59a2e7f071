"""``shared.strict_json``: a key named twice in any object, at any depth, is found;
what is not JSON is left to whoever parses it next."""

from __future__ import annotations

import pytest

from shared.strict_json import DuplicateKeyError, duplicate_key, loads


def test_a_key_named_twice_at_any_depth_is_found() -> None:
    assert loads('{"a": [{"b": 1}, {"b": 2}], "c": {"b": 3}}') == {
        "a": [{"b": 1}, {"b": 2}],
        "c": {"b": 3},
    }  # the same key in different objects is no duplicate
    assert duplicate_key(b'[{"x": {"y": 1, "z": 2, "y": 3}}]') == "y"
    assert duplicate_key(b'{"\\u0061": 1, "a": 2}') == "a"  # equal once decoded
    assert duplicate_key(b'{"a": 1, "A": 2}') is None


def test_what_is_not_json_is_not_judged_here() -> None:
    for data in (b"{", b"not json", b"\xff\xfe{", b"[" * 100_000, b"a=1&a=2"):
        assert duplicate_key(data) is None


def test_json_in_any_encoding_json_loads_reads_is_judged() -> None:
    """``json.loads`` reads UTF-8 after a byte-order mark, UTF-16 and UTF-32, as
    FastAPI's body parsing does (helper-81)."""
    text = '{"a": 1, "a": 2}'
    for data in (b"\xef\xbb\xbf" + text.encode(), text.encode("utf-16"), text.encode("utf-32-le")):
        assert duplicate_key(data) == "a"


def test_a_long_key_is_cut_in_the_message() -> None:
    key = "k" * 10_000
    with pytest.raises(DuplicateKeyError) as twice:
        loads(f'{{"{key}": 1, "{key}": 2}}')
    assert len(str(twice.value)) < 120 and twice.value.key.endswith("...")
