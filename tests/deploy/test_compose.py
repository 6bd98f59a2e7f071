"""docker-compose.yml (and the CPU override) against the code, without Docker.

Every service's command is a real ``labeldp`` command; every ``LABELDP_*`` variable
it gets (from the compose file or the image's ``ENV``) is a setting its party reads,
and the settings accept the values; every ``${VAR}`` is in ``.env.example`` and the
example's secrets are refused; build contexts, Dockerfiles, targets and ``COPY``
sources exist; health checks probe the port the service listens on; images are
pinned; the GPU worker reserves GPUs and the CPU override takes that away.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import secrets
import tomllib
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from sqlalchemy.engine import make_url

from feature_party import config as feature_config
from label_party import config as label_config
from labeldp.cli import build_parser
from tests.deploy.deployfiles import (
    COMPOSE,
    CPU_OVERRIDE,
    ENV_EXAMPLE,
    REPO,
    InterpolationError,
    dockerfile_of,
    dockerignore_for,
    environment,
    image_env,
    interpolate,
    is_ignored,
    load_compose,
    option,
    parse_dockerfile,
    read_env_file,
    settings_env_names,
    variables_in,
    volume_mounts,
)

CONFIGS = {"gpu": (COMPOSE,), "cpu": (COMPOSE, CPU_OVERRIDE)}
#: The services the stack must have (it may have more), and what each runs.
EXPECTED = {
    "label-db": None,
    "label-api": ["label-party", "serve"],
    "label-worker": ["label-party", "worker"],
    "feature-db": None,
    "feature-api": ["feature-party", "serve"],
    "feature-worker": ["feature-party", "worker"],
}
PARTIES: dict[str, tuple[str, type[BaseSettings]]] = {
    "label-": ("label-party", label_config.Settings),
    "feature-": ("feature-party", feature_config.Settings),
}
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(params=sorted(CONFIGS))
def compose(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The merged configuration: ``gpu`` (the base file) or ``cpu`` (with the override)."""
    return load_compose(*CONFIGS[request.param])


def services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = config["services"]
    return result


def labeldp_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in services(config).items()
        if isinstance(svc.get("command"), list) and svc["command"][:1] == ["labeldp"]
    }


def api_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in labeldp_services(config).items() if "serve" in s["command"]}


def postgres_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        n: s
        for n, s in services(config).items()
        if str(s.get("image", "")).split(":")[0].split("/")[-1] == "postgres"
    }


def party_of(service_name: str) -> tuple[str, type[BaseSettings]]:
    for prefix, party in PARTIES.items():
        if service_name.startswith(prefix):
            return party
    raise AssertionError(f"{service_name}: neither a label-* nor a feature-* service")


def settings_of(name: str, service: dict[str, Any]) -> type[BaseSettings]:
    """The settings class the service's command builds (the labels party's worker
    has its own: it needs no admin token)."""
    _, settings_cls = party_of(name)
    if settings_cls is label_config.Settings and "worker" in service["command"]:
        return label_config.WorkerSettings
    return settings_cls


def random_secrets(config: dict[str, Any]) -> dict[str, str]:
    """A real-looking value for every variable the compose file uses."""
    return {name: secrets.token_urlsafe(32) for name in variables_in(config)}


def parse(command: list[str]) -> argparse.Namespace:
    """``labeldp``'s own parser on ``command`` (without the program name)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(command)
    except SystemExit:
        pytest.fail(f"labeldp {' '.join(command)}: {stderr.getvalue().strip()}")


# -- the files -----------------------------------------------------------------------


def test_the_stack_has_its_services(compose: dict[str, Any]) -> None:
    assert set(EXPECTED) <= set(services(compose))
    for name, action in EXPECTED.items():
        command = services(compose)[name].get("command")
        assert (command[1:3] if command else None) == action, name


def test_the_labeldp_program_is_the_cli() -> None:
    """The ``labeldp`` the images run is ``labeldp.cli:main`` (what the tests parse with)."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["labeldp"] == "labeldp.cli:main"


def test_the_cpu_override_changes_only_the_workers_image_and_gpu() -> None:
    gpu, cpu = load_compose(*CONFIGS["gpu"]), load_compose(*CONFIGS["cpu"])
    for name in services(gpu):
        before, after = services(gpu)[name], services(cpu)[name]
        if name not in ("feature-worker", "label-worker"):
            assert before == after, name
            continue
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert changed == {"build", "image", "deploy"}


# -- commands ------------------------------------------------------------------------


def test_every_command_is_a_real_labeldp_command(compose: dict[str, Any]) -> None:
    found = labeldp_services(compose)
    assert {n for n, action in EXPECTED.items() if action} <= set(found)
    for name, service in found.items():
        command = service["command"]
        assert all(isinstance(arg, str) for arg in command), f"{name}: exec form, strings only"
        args = parse(command[1:])
        assert callable(getattr(args, "handler", None)), f"{name}: {command} runs nothing"
        party, _ = party_of(name)
        assert command[1] == party, f"{name} runs {command[1]}, not the {party}"


def test_api_services_listen_on_all_interfaces_on_their_published_port(
    compose: dict[str, Any],
) -> None:
    for name, service in api_services(compose).items():
        command = service["command"]
        args = parse(command[1:])
        assert args.host == "0.0.0.0", f"{name} must listen on all interfaces in a container"
        assert option(command, "--port") is not None, f"{name}: give --port explicitly"
        published = [str(p).rsplit(":", 1)[-1].split("/")[0] for p in service.get("ports", [])]
        assert published == [str(args.port)], f"{name}: ports {service.get('ports')}"


# -- environment ---------------------------------------------------------------------


def test_every_labeldp_variable_is_a_setting_of_the_party(compose: dict[str, Any]) -> None:
    for name, service in labeldp_services(compose).items():
        _, settings_cls = party_of(name)
        known = settings_env_names(settings_cls)
        given = {**image_env(service), **environment(service)}
        unknown = sorted(
            k for k in given if k.upper().startswith("LABELDP_") and k.upper() not in known
        )
        assert not unknown, (
            f"{name} sets {unknown}, which {settings_cls.__module__}.Settings does not read "
            f"(it reads {sorted(known)})"
        )


def test_the_settings_accept_the_environment(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With real secrets in .env, each service's settings validate and point at the
    compose's database and data volume."""
    values = random_secrets(compose)
    for name, service in labeldp_services(compose).items():
        env = interpolate({**image_env(service), **environment(service)}, values)
        for key in [k for k in os.environ if k.upper().startswith("LABELDP_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        try:
            settings: Any = settings_of(name, service)()
        except ValidationError as exc:
            pytest.fail(f"{name}: the settings refuse the compose environment: {exc}")
        if isinstance(settings, feature_config.Settings) and name in api_services(compose):
            assert settings.require_admin_token() == env["LABELDP_ADMIN_TOKEN"]
        assert settings.resolved_database_url == env["LABELDP_DATABASE_URL"], name
        assert str(settings.data_dir) in volume_mounts(service), (
            f"{name}: LABELDP_DATA_DIR {settings.data_dir} is not on a volume"
        )


def test_only_the_apis_hold_an_admin_token(compose: dict[str, Any]) -> None:
    """Least privilege: a worker answers no request, so it gets no admin token."""
    apis = api_services(compose)
    for name, service in labeldp_services(compose).items():
        has_token = "LABELDP_ADMIN_TOKEN" in environment(service)
        assert has_token == (name in apis), f"{name}: admin token {has_token}"


def test_database_urls_point_at_the_partys_postgres(compose: dict[str, Any]) -> None:
    databases = postgres_services(compose)
    for name, service in labeldp_services(compose).items():
        raw = environment(service).get("LABELDP_DATABASE_URL")
        assert raw, f"{name} has no LABELDP_DATABASE_URL (it would use SQLite in the container)"
        url = make_url(interpolate(raw, {v: "x" for v in variables_in(raw)}))
        assert url.drivername == "postgresql+psycopg", f"{name}: {url.drivername}"
        url.get_dialect()  # the driver is installed
        assert url.host in databases, f"{name}: {url.host} is no Postgres service"
        assert url.host.startswith(name.split("-")[0] + "-"), f"{name} uses the other party's DB"
        db_env = environment(databases[url.host])
        assert (url.port, url.username, url.database) == (
            5432,
            db_env["POSTGRES_USER"],
            db_env["POSTGRES_DB"],
        ), name
        password_vars = variables_in(raw.split("@")[0])
        assert password_vars and password_vars == variables_in(db_env["POSTGRES_PASSWORD"]), name
        assert url.host in reachable_dependencies(compose, name), f"{name} does not wait for DB"


def reachable_dependencies(config: dict[str, Any], name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        deps = services(config)[todo.pop()].get("depends_on") or {}
        for dep in deps:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_services_of_a_party_on_one_database_share_the_data_volume(
    compose: dict[str, Any],
) -> None:
    """The worker reads the feature sets the API wrote: same database, same data dir."""
    groups: dict[str, set[str]] = {}
    for service in labeldp_services(compose).values():
        env = environment(service)
        data_dir = env.get("LABELDP_DATA_DIR") or image_env(service).get("LABELDP_DATA_DIR")
        volume = volume_mounts(service)[str(data_dir)]
        groups.setdefault(str(env["LABELDP_DATABASE_URL"]), set()).add(volume)
    assert all(len(volumes) == 1 for volumes in groups.values()), groups


# -- .env.example --------------------------------------------------------------------


def test_every_variable_is_in_env_example(compose: dict[str, Any]) -> None:
    example = read_env_file()
    used = variables_in(compose)
    assert used, "the compose file takes its secrets from .env"
    assert sorted(used - set(example)) == [], f"missing from {ENV_EXAMPLE.name}"
    assert sorted(set(example) - used) == [], f"{ENV_EXAMPLE.name} lists unused variables"


def test_every_secret_is_required() -> None:
    """Each variable is ``${VAR:?…}`` somewhere: a missing or empty one stops compose."""
    compose = load_compose(COMPOSE)
    for variable in variables_in(compose):
        with pytest.raises(InterpolationError, match=variable):
            interpolate(compose, {**random_secrets(compose), variable: ""})


def test_env_example_tokens_are_refused_by_the_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Someone who copies .env.example unchanged gets services that refuse to start
    (the real CLI does the same: test_env_example.py)."""
    compose = load_compose(COMPOSE)
    example = read_env_file()
    checked = 0
    for name, service in api_services(compose).items():
        raw = environment(service)["LABELDP_ADMIN_TOKEN"]
        assert raw is not None
        (variable,) = variables_in(raw)
        token = example[variable]
        with pytest.raises((ValidationError, ValueError), match="LABELDP_ADMIN_TOKEN"):
            make_settings(name, token, monkeypatch)
        checked += 1
    assert checked >= 2


def make_settings(service: str, token: str, monkeypatch: pytest.MonkeyPatch) -> BaseSettings:
    """The settings as ``serve`` builds them, in production mode, with ``token``."""
    for key in [k for k in os.environ if k.upper().startswith("LABELDP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("LABELDP_ADMIN_TOKEN", token)
    _, settings_cls = party_of(service)
    settings = settings_cls()
    if isinstance(settings, feature_config.Settings):
        settings.require_admin_token()
    return settings


@pytest.mark.parametrize("service", ["label-api", "feature-api"])
@pytest.mark.parametrize(
    "token", ["", "admin", "short-token", "change-me-label-admin", "change-me-feature-admin"]
)
def test_empty_well_known_short_or_placeholder_tokens_are_refused(
    service: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an operator who copied an example .env without editing it would meet."""
    with pytest.raises((ValidationError, ValueError), match="LABELDP_ADMIN_TOKEN"):
        make_settings(service, token, monkeypatch)


@pytest.mark.parametrize("service", ["label-api", "feature-api"])
def test_a_random_token_is_accepted(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the refusals above: a generated secret starts the service."""
    make_settings(service, secrets.token_urlsafe(32), monkeypatch)


# -- builds and images ---------------------------------------------------------------


def test_build_contexts_dockerfiles_and_targets_exist(compose: dict[str, Any]) -> None:
    built = {n: s for n, s in services(compose).items() if "build" in s}
    assert set(built) == set(labeldp_services(compose))
    for name, service in built.items():
        context, path, dockerfile = dockerfile_of(service)
        assert context.is_dir(), f"{name}: no build context {context}"
        assert path.is_file(), f"{name}: no Dockerfile {path}"
        target = service["build"].get("target")
        assert target, f"{name}: name a build target"
        stages = sorted(s.name for s in dockerfile.stages if s.name)
        assert dockerfile.stage(target) is not None, f"{name}: no '{target}' in {stages}"


def test_dockerfile_copies_what_exists_and_is_not_ignored() -> None:
    context, path = REPO, REPO / "deploy" / "Dockerfile"
    dockerfile = parse_dockerfile(path.read_text())
    ignored = dockerignore_for(path, context)
    sources = []
    for target in ("cpu", "cuda"):
        for arg in dockerfile.instructions(target, "COPY"):
            words = [w for w in arg.split() if not w.startswith("--")]
            sources += words[:-1]
    assert sources
    for source in sources:
        assert (context / source).exists(), f"COPY {source}: not in the build context"
        assert not is_ignored(source, ignored), f"COPY {source}: excluded by .dockerignore"
    assert is_ignored(".env", ignored), "the real secrets must stay out of the build context"


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_image_data_directory_belongs_to_the_service_user(target: str) -> None:
    """A new named volume copies its owner from the image: the directory must exist
    and belong to the USER the services run as, or they cannot write their data."""
    dockerfile = parse_dockerfile((REPO / "deploy" / "Dockerfile").read_text())
    user = dockerfile.user(target)
    assert user and user not in ("root", "0"), f"{target}: run as an unprivileged user"
    volumes = dockerfile.volumes(target)
    assert dockerfile.env(target).get("LABELDP_DATA_DIR") in volumes
    runs = " ".join(dockerfile.instructions(target, "RUN"))
    for volume in volumes:
        assert re.search(
            rf"chown\s+(-R\s+)?{user}(:\S+)?\s+(\S+\s+)*{re.escape(volume)}\b", runs
        ), f"{target}: {volume} is not chowned to {user}"


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        image = str(service.get("image", ""))
        repository, _, tag = image.rpartition(":")
        assert repository and tag and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag != "latest", f"{name}: {image} is not pinned"
        if "build" in service:
            target = service["build"]["target"]
            assert tag == f"{VERSION}-{target}", f"{name}: tag {VERSION}-{target}, not {tag}"
        else:
            assert re.match(r"\d+(\.\d+)+", tag), f"{name}: {image} has no version tag"


def test_dockerfile_base_images_and_torch_are_pinned() -> None:
    dockerfile = parse_dockerfile((REPO / "deploy" / "Dockerfile").read_text())
    for image in dockerfile.external_images():
        tag = image.rpartition(":")[2]
        assert re.match(r"\d+\.\d+\.\d+", tag), f"FROM {image}: pin a full version"
    constraints = (REPO / "constraints.txt").read_text()
    pinned = re.search(r"^torch==(\S+)", constraints, re.M)
    assert pinned
    for target in ("cpu", "cuda"):
        runs = " ".join(dockerfile.instructions(target, "RUN"))
        assert set(re.findall(r"torch==(\S+)", runs)) == {pinned[1]}, target
        assert "-c constraints.txt ." in runs, f"{target}: install labeldp under the constraints"
        commands = [
            c for run in dockerfile.instructions(target, "RUN") for c in re.split(r"&&|;", run)
        ]
        for command in commands:
            if "pip install" in command:  # torch's dependencies too, not only labeldp's
                assert "-c constraints.txt" in command, f"{target}: {command.strip()}"


# -- runtime policy ------------------------------------------------------------------


def test_the_worker_reserves_gpus_and_the_cpu_override_does_not() -> None:
    gpu = services(load_compose(*CONFIGS["gpu"]))["feature-worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert gpu["build"]["target"] == "cuda"
    cpu = services(load_compose(*CONFIGS["cpu"]))["feature-worker"]
    assert "deploy" not in cpu, "the CPU override must drop the GPU reservation"
    assert cpu["build"]["target"] == "cpu"


def test_api_services_have_a_healthcheck_on_their_port(compose: dict[str, Any]) -> None:
    apis = api_services(compose)
    assert {"label-api", "feature-api"} <= set(apis)
    for name, service in apis.items():
        check = service.get("healthcheck") or {}
        assert not check.get("disable"), name
        test = check.get("test")
        assert isinstance(test, list) and test[0] == "CMD", f"{name}: exec-form health check"
        port = option(service["command"], "--port")
        assert any(f"127.0.0.1:{port}/readyz" in arg for arg in test), f"{name}: {test}"
        for key in ("interval", "timeout", "retries", "start_period"):
            assert key in check, f"{name}: healthcheck.{key}"


def test_every_service_restarts(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        assert service.get("restart") in {"always", "unless-stopped", "on-failure"}, name


def _seconds(duration: str) -> float:
    value, unit = float(duration[:-1]), duration[-1]
    return value * {"s": 1, "m": 60}[unit]


def test_stopping_services_get_the_time_their_shutdown_takes(compose: dict[str, Any]) -> None:
    """Docker kills after 10 s by default: before the features API's LP-MST drivers
    could mark their runs interrupted, or a worker hand its training back."""
    from feature_party.multistage.service import STOP_TIMEOUT_SECONDS

    grace = {name: _seconds(s.get("stop_grace_period", "10s"))
             for name, s in services(compose).items()}  # fmt: skip
    assert grace["feature-api"] >= STOP_TIMEOUT_SECONDS + 10
    assert grace["label-api"] >= 60  # a release in flight commits
    assert grace["label-worker"] >= 30 and grace["feature-worker"] >= 30


def test_healthy_dependencies_have_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        for dep, condition in (service.get("depends_on") or {}).items():
            assert dep in services(compose), f"{name} depends on unknown {dep}"
            if condition.get("condition") == "service_healthy":
                check = services(compose)[dep].get("healthcheck") or {}
                assert check.get("test") and not check.get("disable"), f"{name} waits on {dep}"


def test_postgres_keeps_its_data_on_a_named_volume(compose: dict[str, Any]) -> None:
    databases = postgres_services(compose)
    assert {"label-db", "feature-db"} <= set(databases)
    for name, service in databases.items():
        mounts = volume_mounts(service)
        assert "/var/lib/postgresql/data" in mounts, f"{name} loses its data with the container"
        assert mounts["/var/lib/postgresql/data"] in (compose.get("volumes") or {}), name


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in services(compose).items():
        for source in volume_mounts(service).values():
            if not source.startswith((".", "/", "~")):
                assert source in declared, f"{name}: volume {source} is not declared"
