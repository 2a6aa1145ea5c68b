"""docker-compose.yml, the Dockerfile and .dockerignore, checked without Docker (it does not run
on the development machines): the service graph and its health checks, restart policies, the
commands (parsed by the service's own CLI), the settings (validated by the service's own
Settings), the image's user, ledger path and health check; the health check command is run
against a real server on a non-default port."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli import build_parser
from service.config import Settings
from tests.api_support import Backend, uvicorn_server

REPO = Path(__file__).resolve().parents[1]
LONG_RUNNING = ("postgres", "redis", "api")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def _interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` with the default, ``${NAME:?message}`` (required) with a
    stand-in value (the environment is not consulted)."""
    value = re.sub(r"\$\{[A-Z_]+:\?[^}]*\}", "required-value", value)
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def _service_args(command: list[str]) -> list[str]:
    assert command[:3] == ["python", "-m", "service"], command
    return command[3:]


def test_the_service_graph_waits_for_healthy_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "api"}
    conditions = {
        name: {dep: spec["condition"] for dep, spec in service.get("depends_on", {}).items()}
        for name, service in services.items()
    }
    assert conditions["migrate"] == {"postgres": "service_healthy"}
    assert conditions["api"] == {
        "migrate": "service_completed_successfully",
        "postgres": "service_healthy",
        "redis": "service_healthy",
    }
    # every dependency exists, is waited on for health only if it has a health check, no cycle
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle {(*path, name)}"
        for dep, condition in conditions[name].items():
            assert dep in services
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health check"
            visit(dep, (*path, name))
        if name not in order:
            order.append(name)

    for name in services:
        visit(name, ())
    assert order.index("postgres") < order.index("migrate") < order.index("api")


def test_health_checks_and_restart_policies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres = services["postgres"]["healthcheck"]["test"]
    assert postgres[0] == "CMD" and postgres[1] == "pg_isready"
    # over TCP on the container's own address (a socket check passes during the init phase)
    assert postgres[postgres.index("-h") + 1] == "127.0.0.1"
    assert "ping" in services["redis"]["healthcheck"]["test"]
    assert "PPR_PORT" in " ".join(services["api"]["healthcheck"]["test"])
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])  # readiness
    for name in LONG_RUNNING:
        assert services[name]["restart"] in ("unless-stopped", "always"), name
        assert services[name]["healthcheck"]["retries"] >= 3
    assert services["migrate"]["restart"] == "no"  # a one-shot step


def test_commands_and_settings_are_the_services_own(compose: dict[str, Any]) -> None:
    services = compose["services"]
    parser = build_parser()
    migrate = parser.parse_args(_service_args(services["migrate"]["command"]))
    assert (migrate.command, migrate.db_action) == ("db", "upgrade") and migrate.wait > 0
    api = parser.parse_args(_service_args(services["api"]["command"]))
    assert api.command == "serve"
    fields = set(Settings.model_fields)
    for name in ("migrate", "api"):
        environment = {k: _interpolate(str(v)) for k, v in services[name]["environment"].items()}
        for key in environment:
            assert key.startswith("PPR_") and key[4:].lower() in fields, f"{name}: unknown {key}"
        settings = Settings(**{k[4:].lower(): v for k, v in environment.items()})
        assert settings.database_url.startswith("postgresql+psycopg://")
        assert settings.redis_url is not None and settings.graph_dir == Path("/graphs")
    api_env = services["api"]["environment"]
    assert services["api"]["ports"] == [f"127.0.0.1:{api_env['PPR_PORT']}:{api_env['PPR_PORT']}"]
    assert services["api"]["volumes"] == ["./graphs:/graphs:ro"]


def _dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def _healthcheck_command(instructions: list[str]) -> list[str]:
    (check,) = [line for line in instructions if line.startswith("HEALTHCHECK")]
    command: list[str] = json.loads(check[check.index("CMD") + 3 :])
    return command


def test_the_image_runs_as_a_user_that_can_write_its_ledger() -> None:
    instructions = _dockerfile()
    runtime = instructions[
        max(i for i, line in enumerate(instructions) if line.startswith("FROM")) :
    ]
    env = " ".join(line for line in runtime if line.startswith("ENV"))
    assert "PPR_DATABASE_URL=sqlite:////data/" in env
    run = " ".join(line for line in runtime if line.startswith("RUN"))
    assert "useradd" in run and "chown ppr:ppr /data" in run
    assert "USER ppr" in runtime and "WORKDIR /data" in runtime
    assert "PPR_PORT" in " ".join(_healthcheck_command(instructions))


def test_the_build_context_holds_what_the_image_copies_and_no_venv() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        parts = Path(path).parts
        return any(
            fnmatch.fnmatch(path, p.removeprefix("**/"))
            or any(fnmatch.fnmatch(part, p.removeprefix("**/")) for part in parts)
            for p in patterns
        )

    for path in (".venv", ".git", "service/__pycache__", "ppr-ledger.db", "build", "tests"):
        assert ignored(path), path
    copied = [
        source
        for line in _dockerfile()
        if line.startswith("COPY") and "--from" not in line
        for source in shlex.split(line)[1:-1]
    ]
    assert {"pyproject.toml", "setup.py", "service", "migrations"} <= set(copied)
    for source in copied:
        assert (REPO / source).exists() and not ignored(source), source


@pytest.mark.slow
def test_the_health_check_follows_ppr_port(tmp_path: Path) -> None:
    from service.graph.generate import write_generated_edge_list
    from service.ledger import upgrade

    graph = tmp_path / "graph.txt"
    write_generated_edge_list(graph, 50, 120, seed=1)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    image_check = _healthcheck_command(_dockerfile())
    compose_file: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    compose_check = compose_file["services"]["api"]["healthcheck"]["test"][1:]
    for command in (image_check, compose_check):
        assert command[0] == "python"
    with uvicorn_server(Backend("sqlite", url, None, graph), forked=True) as server:
        port = server.base_url.rsplit(":", 1)[1]
        for command in (image_check, compose_check):
            for expected, env_port in ((0, port), (1, "1")):
                done = subprocess.run(
                    [sys.executable, *command[1:]],
                    env={**os.environ, "PPR_PORT": env_port},
                    capture_output=True,
                    timeout=30,
                    check=False,
                )
                assert (done.returncode == 0) == (expected == 0), done.stderr


def test_the_database_password_is_required_and_has_no_default() -> None:
    """Every use of POSTGRES_PASSWORD is ``${POSTGRES_PASSWORD:?...}``: compose refuses to
    start without it (no known default password)."""
    text = (REPO / "docker-compose.yml").read_text()
    uses = re.findall(r"\$\{POSTGRES_PASSWORD([^}]*)\}", text)
    assert len(uses) == 2  # the postgres service and the ledger URL
    assert all(use.startswith(":?") and len(use) > 10 for use in uses), uses
    assert "change-me" not in text


def test_one_image_is_built_once(compose: dict[str, Any]) -> None:
    services = compose["services"]
    builders = [name for name, service in services.items() if "build" in service]
    assert builders == ["migrate"]
    image = services["migrate"]["image"]
    assert services["api"]["image"] == image and services["api"]["pull_policy"] == "never"
    assert not image.startswith(("postgres", "redis"))


def test_the_readme_tells_how_to_run_the_containers() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Installing the wheel; containers") :]
    section = section[: section.index("\n### ", 10)]
    compose_text = (REPO / "docker-compose.yml").read_text()
    # a single container on the SQLite default migrates its own ledger
    assert "docker run" in section and "PPR_AUTO_MIGRATE=true" in section
    # the first admin key, in the README and as the compose file says it
    admin = "docker compose run --rm api python -m service accounts create --type admin --json"
    assert admin in section and admin in compose_text
    assert "POSTGRES_PASSWORD=" in section
    # publishing the port: TLS in front, the metrics token
    assert "TLS" in section and "PPR_METRICS_TOKEN" in section
    assert "/readyz" in section
    parser = build_parser()
    for line in section.splitlines():
        if "python -m service " in line and line.lstrip().startswith(("docker", "$ docker")):
            argv = shlex.split(line.split("python -m service ", 1)[1], comments=True)
            parser.parse_args(argv)
