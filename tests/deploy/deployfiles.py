"""Read the deployment files the way Docker would, without Docker.

* ``load_compose(*files)``: the compose files merged in order (later files override
  earlier ones; ``!reset`` removes a key, ``!override`` replaces without merging),
  like ``docker compose -f a.yml -f b.yml config`` before interpolation;
* ``interpolate(value, variables)``: compose's ``${VAR}``, ``${VAR:-default}``,
  ``${VAR:?error}`` … substitution;
* ``parse_dockerfile(text)``: the build stages (``FROM … AS name``) and their
  instructions, so a test can follow a ``build.target`` to its ``ENV``, ``COPY``,
  ``USER`` and ``VOLUME`` lines;
* ``settings_env_names(cls)``: the environment variables a pydantic-settings model
  reads (prefix + field name, or the field's aliases; upper-cased unless the model
  is case-sensitive).

Paths in every compose file are relative to the project directory, the directory
of the first file (``REPO`` here).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, AliasPath
from pydantic_settings import BaseSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
CPU_OVERRIDE = REPO / "deploy" / "compose.cpu.yml"
ENV_EXAMPLE = REPO / ".env.example"


# -- compose files -------------------------------------------------------------------


class Reset:
    """``!reset``: the key goes back to its default (it disappears from the merge)."""


@dataclass(frozen=True)
class Override:
    """``!override``: the value replaces the earlier one instead of merging into it."""

    value: Any


#: A ``yaml.SafeLoader`` that also knows compose's custom tags.
ComposeLoader: Any = type("ComposeLoader", (yaml.SafeLoader,), {})


def _construct_any(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    assert isinstance(node, yaml.ScalarNode)
    return loader.construct_scalar(node)


ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())
ComposeLoader.add_constructor(
    "!override", lambda loader, node: Override(_construct_any(loader, node))
)

#: Sequences that an override replaces; compose appends the others (ports, volumes …).
_REPLACED_SEQUENCES = frozenset({"command", "entrypoint", "test"})


def _strip_tags(value: Any) -> Any:
    if isinstance(value, Override):
        return _strip_tags(value.value)
    if isinstance(value, dict):
        return {k: _strip_tags(v) for k, v in value.items() if not isinstance(v, Reset)}
    if isinstance(value, list):
        return [_strip_tags(v) for v in value if not isinstance(v, Reset)]
    return value


def merge(base: Any, override: Any, key: str | None = None) -> Any:
    """Compose's merge of ``override`` (a later file) into ``base``."""
    if isinstance(override, Override):
        return _strip_tags(override.value)
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for k, v in override.items():
            if isinstance(v, Reset):
                merged.pop(k, None)
            elif k in merged:
                merged[k] = merge(merged[k], v, k)
            else:
                merged[k] = _strip_tags(v)
        return merged
    if isinstance(base, list) and isinstance(override, list) and key not in _REPLACED_SEQUENCES:
        return base + [v for v in _strip_tags(override) if v not in base]
    return _strip_tags(override)


def read_yaml(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=ComposeLoader)  # a SafeLoader with two tags
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


def load_compose(*files: Path) -> dict[str, Any]:
    """The merged configuration of ``files`` (default: the base compose file)."""
    merged: dict[str, Any] = {}
    for path in files or (COMPOSE,):
        merged = merge(merged, read_yaml(path))
    return merged


def environment(service: Mapping[str, Any]) -> dict[str, str | None]:
    """A service's ``environment`` as a mapping (compose accepts a list or a mapping)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.partition("=") for item in env)
        return {k: (v if sep else None) for k, sep, v in pairs}
    return {str(k): (None if v is None else str(v)) for k, v in env.items()}


def volume_mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """Container path → source (a named volume or a host path) of a service's volumes."""
    mounts: dict[str, str] = {}
    for item in service.get("volumes") or []:
        if isinstance(item, str):
            source, _, rest = item.partition(":")
            mounts[rest.split(":")[0]] = source
        else:
            mounts[item["target"]] = item.get("source", "")
    return mounts


def option(command: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` (or ``--name=VALUE``) in an exec-form command."""
    for i, arg in enumerate(command):
        if arg == name and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


# -- interpolation --------------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    """``${VAR:?message}`` with VAR unset or empty: compose refuses the file."""


def variables_in(value: Any) -> set[str]:
    """Every variable a (nested) compose value refers to."""
    if isinstance(value, dict):
        return set().union(*(variables_in(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(variables_in(v) for v in value))
    if isinstance(value, str):
        return {m["braced"] or m["named"] for m in _VARIABLE.finditer(value) if not m["escaped"]}
    return set()


def interpolate(value: Any, variables: Mapping[str, str]) -> Any:
    """Substitute ``variables`` into a (nested) compose value, as compose does."""
    if isinstance(value, dict):
        return {k: interpolate(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, variables) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name = m["braced"] or m["named"]
        op, arg = m["op"], m["arg"] or ""
        current = variables.get(name)
        missing = current is None or (op is not None and op.startswith(":") and current == "")
        if op in ("-", ":-"):
            return arg if missing else str(current)
        if op in ("?", ":?"):
            if missing:
                raise InterpolationError(f"{name}: {arg}")
            return str(current)
        if op in ("+", ":+"):
            return "" if missing else arg
        return "" if current is None else current

    return _VARIABLE.sub(substitute, value)


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """``KEY=VALUE`` lines of a compose ``.env`` file (comments and blanks skipped)."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {raw!r}"
        values[key.strip()] = value.strip().strip("'\"")
    return values


# -- Dockerfiles ------------------------------------------------------------------------


@dataclass
class Stage:
    name: str | None
    base: str  # an image reference or another stage's name
    instructions: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Dockerfile:
    args: dict[str, str]  # global ARGs (before the first FROM) with defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def chain(self, target: str) -> list[Stage]:
        """``target``'s stage and the stages it builds on, base first."""
        chain: list[Stage] = []
        stage = self.stage(target)
        while stage is not None:
            chain.insert(0, stage)
            stage = self.stage(stage.base)
        return chain

    def instructions(self, target: str, keyword: str) -> list[str]:
        return [arg for s in self.chain(target) for kw, arg in s.instructions if kw == keyword]

    def env(self, target: str) -> dict[str, str]:
        """The ``ENV`` an image built for ``target`` starts its containers with."""
        env: dict[str, str] = {}
        for arg in self.instructions(target, "ENV"):
            words = shlex.split(arg)
            if words and "=" not in words[0]:  # legacy ``ENV KEY value with spaces``
                env[words[0]] = " ".join(words[1:])
                continue
            for word in words:
                key, _, value = word.partition("=")
                env[key] = value
        return env

    def user(self, target: str) -> str | None:
        users = self.instructions(target, "USER")
        return users[-1].strip() if users else None

    def volumes(self, target: str) -> list[str]:
        paths: list[str] = []
        for arg in self.instructions(target, "VOLUME"):
            text = arg.strip()
            paths += yaml.safe_load(text) if text.startswith("[") else text.split()
        return paths

    def external_images(self) -> list[str]:
        """The images the stages start from (not other stages), ARGs resolved."""
        names = {s.name for s in self.stages}
        images = []
        for stage in self.stages:
            image = interpolate(stage.base, self.args)
            if image not in names:
                images.append(image)
        return images


def parse_dockerfile(text: str) -> Dockerfile:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = (pending + stripped).strip()
        pending = ""
        if line:
            lines.append(line)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(name=name, base=words[0]))
        elif not stages:
            if keyword == "ARG":
                key, _, default = rest.partition("=")
                args[key.strip()] = default.strip()
        else:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(args=args, stages=stages)


def dockerfile_of(service: Mapping[str, Any]) -> tuple[Path, Path, Dockerfile]:
    """A compose service's build context, Dockerfile path and parsed Dockerfile."""
    build = service["build"]
    build = {"context": build} if isinstance(build, str) else build
    context = (REPO / build.get("context", ".")).resolve()
    path = (context / build.get("dockerfile", "Dockerfile")).resolve()
    return context, path, parse_dockerfile(path.read_text())


def image_env(service: Mapping[str, Any]) -> dict[str, str]:
    """The ``ENV`` of the image a compose service runs (its build target's stages)."""
    if "build" not in service:
        return {}
    _, _, dockerfile = dockerfile_of(service)
    return dockerfile.env(service["build"]["target"])


def dockerignore_for(dockerfile: Path, context: Path) -> list[str]:
    """The ignore patterns BuildKit applies: ``<Dockerfile>.dockerignore`` next to the
    Dockerfile if present, else ``.dockerignore`` at the context's root."""
    for candidate in (dockerfile.with_name(dockerfile.name + ".dockerignore"),
                      context / ".dockerignore"):  # fmt: skip
        if candidate.is_file():
            return [
                line.strip()
                for line in candidate.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")
            ]
    return []


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A ``.dockerignore`` pattern (Go ``filepath.Match`` plus ``**``) as a regex."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Whether ``path`` (relative to the context) is left out of the build context:
    the last pattern matching it or one of its parent directories decides."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern_regex(pattern.removeprefix("!").strip().strip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


# -- settings -------------------------------------------------------------------------


def settings_env_names(cls: type[BaseSettings]) -> set[str]:
    """The environment variables ``cls`` reads (upper-cased unless case-sensitive)."""
    config = cls.model_config
    prefix = str(config.get("env_prefix") or "")
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    names: set[str] = set()
    for name, info in cls.model_fields.items():
        alias = info.validation_alias if info.validation_alias is not None else info.alias
        choices: list[Any] = []
        if alias is None or by_name:
            names.add(prefix + name)
        if isinstance(alias, AliasChoices):
            choices = list(alias.choices)
        elif alias is not None:
            choices = [alias]
        for choice in choices:
            if isinstance(choice, AliasPath):
                names.add(str(choice.path[0]))
            else:
                names.add(str(choice))
    if config.get("case_sensitive"):
        return names
    return {n.upper() for n in names}
