"""The CLI keeps a token that begins with ``-`` a value, and never prints a
parser's message that may quote a label (``labeldp.cli``)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from labeldp.cli import _shown, attach_token_values, build_parser
from labeldp.harness import endpoints_from
from shared.cli_errors import CommandError


def test_the_demo_takes_dash_tokens() -> None:
    argv = ["demo", "--labels-party", "http://a", "--labels-token", "-a1",
            "--features-party", "http://b", "--features-token", "-b2"]  # fmt: skip
    args = build_parser().parse_args(attach_token_values(argv))
    assert (args.labels_token, args.features_token) == ("-a1", "-b2")


@pytest.mark.parametrize("command", ["demo", "experiment"])
def test_the_harness_tokens_come_from_variables(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of the command line, where ``ps`` and shell history show them."""
    monkeypatch.setenv("LABELDP_LABELS_TOKEN", "lp-secret")
    monkeypatch.setenv("LABELDP_FEATURES_TOKEN", "fp-secret")
    argv = [command, "--labels-party", "http://a", "--features-party", "http://b"]
    if command == "experiment":
        argv += ["--dataset", "rand-hie-spend", "--method", "laplace", "--epsilon", "1"]
    args = build_parser().parse_args(argv)
    endpoints = endpoints_from(args.labels_party, args.labels_token, args.features_party,
                               args.features_token)  # fmt: skip
    assert endpoints is not None
    assert (endpoints.labels_admin_token, endpoints.features_token) == ("lp-secret", "fp-secret")
    # Exported for runs against services, they must not stop a local run.
    assert endpoints_from(None, None, None, None) is None
    with pytest.raises(CommandError, match="LABELDP_LABELS_TOKEN"):
        endpoints_from("http://a", None, None, None)


def test_other_words_pass_unchanged() -> None:
    argv = ["label-party", "budget", "-d", "--url", "u", "--token"]
    assert attach_token_values(argv) == argv  # the trailing option is argparse's to report
    assert attach_token_values(["--token", "--url", "u"]) == ["--token", "--url", "u"]
    assert attach_token_values(["--token", "--X9"]) == ["--token=--X9"]
    assert attach_token_values(["--token=-a", "-v"]) == ["--token=-a", "-v"]


def test_an_arrow_error_is_not_shown_it_may_quote_a_label() -> None:
    error = pa.ArrowInvalid("Failed to parse string: 'secret-abc' as a scalar of type double")
    assert "secret-abc" not in _shown(error)
    assert _shown(ValueError("--domain: min must be < max")) == "--domain: min must be < max"
