"""Both services refuse admin tokens that guard nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from feature_party.config import Settings as FeatureSettings
from label_party.config import Settings as LabelSettings
from shared.tokens import admin_token_problem

ENV_EXAMPLE = Path(__file__).parents[2] / ".env.example"


@pytest.mark.parametrize(
    "token",
    [None, "", "   ", "admin", "change-me", "short-token", "Change-Me-label-admin-123456",
     "a" * 40, "abcabcabcabcabcabcabc", "change_me_change_me", "CHANGE ME PLEASE NOW",
     "<generate-a-secret-here>", "${LABEL_PARTY_ADMIN_TOKEN}", "password123456789"],
)  # fmt: skip
def test_weak_tokens_have_a_problem(token: str | None) -> None:
    assert admin_token_problem(token)


def test_a_random_token_is_fine() -> None:
    assert admin_token_problem("Zq3v0Jq1kS9_u7yWQe2m4xR8") is None


def test_the_example_env_file_secrets_are_refused_by_both_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens = [
        line.split("=", 1)[1]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "_ADMIN_TOKEN=" in line and not line.startswith("#")
    ]
    assert tokens
    for token in tokens:
        monkeypatch.setenv("LABELDP_ADMIN_TOKEN", token)
        monkeypatch.delenv("LABELDP_MODE", raising=False)
        with pytest.raises(ValueError, match="LABELDP_ADMIN_TOKEN"):
            LabelSettings()
        with pytest.raises(ValueError, match="LABELDP_ADMIN_TOKEN"):
            FeatureSettings().require_admin_token()


@pytest.mark.parametrize("settings", [LabelSettings, FeatureSettings])
def test_a_token_read_with_its_line_break_is_the_token_without_it(
    settings: type[LabelSettings] | type[FeatureSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token from a secret file or an env file often keeps its newline; the check
    stripped it but the comparison did not, so the admin was locked out."""
    monkeypatch.setenv("LABELDP_ADMIN_TOKEN", "Zq3v0Jq1kS9_u7yWQe2m4xR8\n")
    monkeypatch.delenv("LABELDP_MODE", raising=False)
    token = settings().admin_token
    assert token is not None and token.get_secret_value() == "Zq3v0Jq1kS9_u7yWQe2m4xR8"


LEVELS = [("warn", "WARNING"), ("Info", "INFO"), ("fatal", "CRITICAL"), (" debug ", "DEBUG")]


@pytest.mark.parametrize(("given", "level"), LEVELS)
def test_log_levels_take_the_standard_librarys_names(
    given: str, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABELDP_LOG_LEVEL", given)
    monkeypatch.setenv("LABELDP_MODE", "dev")
    assert LabelSettings().log_level == FeatureSettings().log_level == level
