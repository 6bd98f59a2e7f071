"""The readers the deploy tests rely on: compose merging and interpolation,
Dockerfile stages, .dockerignore patterns, settings environment names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tests.deploy.deployfiles import (
    ComposeLoader,
    InterpolationError,
    interpolate,
    is_ignored,
    load_compose,
    merge,
    parse_dockerfile,
    settings_env_names,
    variables_in,
)


def test_reset_removes_override_replaces_and_mappings_merge(tmp_path: Path) -> None:
    base = tmp_path / "base.yml"
    base.write_text(
        "x: &common {restart: always}\n"
        "services:\n"
        "  a:\n"
        "    <<: *common\n"
        "    deploy: {resources: {limits: {cpus: '1'}}}\n"
        "    ports: ['1:1']\n"
        "    environment: {A: '1', B: '2'}\n"
        "    command: [x, y]\n"
    )
    override = tmp_path / "override.yml"
    override.write_text(
        "services:\n"
        "  a:\n"
        "    deploy: !reset {}\n"
        "    ports: ['2:2']\n"
        "    environment: !override {C: '3'}\n"
        "    command: [z]\n"
    )
    service = load_compose(base, override)["services"]["a"]
    assert "deploy" not in service
    assert service["restart"] == "always"
    assert service["ports"] == ["1:1", "2:2"]
    assert service["environment"] == {"C": "3"}
    assert service["command"] == ["z"]
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    assert yaml.load("k: !reset null", Loader=ComposeLoader)["k"].__class__.__name__ == "Reset"


def test_interpolation_follows_compose() -> None:
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET}-$SET-$$SET", env) == "v-v-$SET"
    assert interpolate("${UNSET:-d} ${EMPTY:-d} ${EMPTY-d}", env) == "d d "
    assert interpolate("${SET:+alt}${UNSET:+alt}", env) == "alt"
    assert interpolate({"k": ["${SET:?needed}"]}, env) == {"k": ["v"]}
    for missing in ("${UNSET:?set it}", "${EMPTY:?set it}", "${UNSET?set it}"):
        with pytest.raises(InterpolationError, match="set it"):
            interpolate(missing, env)
    assert interpolate("${EMPTY?fine}", env) == ""
    assert variables_in({"a": ["${A:?x}", "$B"], "c": "$$C ${D:-e}"}) == {"A", "B", "D"}


def test_dockerfile_stages_env_and_volumes() -> None:
    dockerfile = parse_dockerfile(
        "ARG IMAGE=python:3.11.10-slim\n"
        "FROM ${IMAGE} AS base\n"
        "# a comment\n"
        "ENV A=1 \\\n"
        "    B='two words'\n"
        "FROM base AS app\n"
        "ENV C 3\n"
        "USER app\n"
        'VOLUME ["/data"]\n'
        "FROM --platform=linux/amd64 base AS other\n"
    )
    assert [s.name for s in dockerfile.stages] == ["base", "app", "other"]
    assert [s.name for s in dockerfile.chain("app")] == ["base", "app"]
    assert dockerfile.env("app") == {"A": "1", "B": "two words", "C": "3"}
    assert dockerfile.env("other") == {"A": "1", "B": "two words"}
    assert dockerfile.user("app") == "app" and dockerfile.user("other") is None
    assert dockerfile.volumes("app") == ["/data"]
    assert dockerfile.external_images() == ["python:3.11.10-slim"]
    assert dockerfile.stage("missing") is None


def test_dockerignore_patterns() -> None:
    patterns = ["**/__pycache__", "tests", "*.md", "!README.md", "docs/*.txt"]
    assert is_ignored("__pycache__", patterns)
    assert is_ignored("pkg/sub/__pycache__/m.pyc", patterns)
    assert is_ignored("tests/test_x.py", patterns)
    assert is_ignored("NOTES.md", patterns)
    assert not is_ignored("README.md", patterns)
    assert not is_ignored("pkg/NOTES.md", patterns)
    assert is_ignored("docs/a.txt", patterns) and not is_ignored("docs/a/b.txt", patterns)
    assert not is_ignored("pkg/module.py", patterns)


def test_settings_env_names_follow_prefix_aliases_and_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Example(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="APP_")

        plain: int = 0
        aliased: int = Field(default=0, validation_alias="OTHER_NAME")
        choices: int = Field(default=0, validation_alias=AliasChoices("first", "second"))

    names = settings_env_names(Example)
    assert names == {"APP_PLAIN", "OTHER_NAME", "FIRST", "SECOND"}
    # pydantic-settings agrees: each name is read (in any case), the bare field is not.
    monkeypatch.setenv("PLAIN", "1")
    assert Example().plain == 0
    for name in names:
        monkeypatch.setenv(name.lower(), "7")
    assert Example().model_dump() == {"plain": 7, "aliased": 7, "choices": 7}

    class Sensitive(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="app_", case_sensitive=True)

        Mixed: int = 0

    assert settings_env_names(Sensitive) == {"app_Mixed"}
