"""The production guide's files (docs/deploy.md, deploy/): systemd units that systemd accepts,
alert rules Prometheus accepts over metrics /metrics really serves, the example environment
passing ``check --deploy``, and the restore drill restoring a real dump."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.db import connection
from django.test import Client

from tests.conftest import REPO, agent_intent, child_env, manage

DEPLOY = REPO / "deploy"
UNITS = sorted((DEPLOY / "systemd").iterdir())
RULES = DEPLOY / "prometheus" / "ledgerweb-alerts.yml"
INSTALLED_COMMAND = "/opt/ledgerweb/venv/bin/ledgerweb"

database_independent = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="no database involved: the SQLite pass covers it"
)


@database_independent
@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_the_systemd_units_verify(tmp_path: Path) -> None:
    # The units name the command where docs/deploy.md installs it; point them at this one.
    command = Path(sys.executable).parent / "ledgerweb"
    assert command.is_file(), "scripts/setup installs the ledgerweb command into .venv"
    for unit in UNITS:
        text = unit.read_text()
        (tmp_path / unit.name).write_text(text.replace(INSTALLED_COMMAND, str(command)))
    assert {u.name for u in UNITS} >= {
        "ledgerweb-web.service",
        "ledgerweb-worker.service",
        "ledgerweb-backup.service",
        "ledgerweb-backup.timer",
    }
    done = subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


@database_independent
@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed")
def test_the_alert_rules_check() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.django_db
def test_the_alert_rules_use_metrics_the_server_serves(world, settings) -> None:
    settings.OPS = {**settings.OPS, "METRICS_TOKEN": "scrape-token"}
    served = (
        Client(REMOTE_ADDR="127.0.0.1")
        .get("/metrics", headers={"Authorization": "Bearer scrape-token"})
        .content.decode()
    )
    names = set(re.findall(r"^# TYPE (\w+)", served, flags=re.M))
    used = set(re.findall(r"\b(ledger_\w+)", RULES.read_text()))
    assert used and used <= names, used - names


def env_file(path: Path) -> dict[str, str]:
    """The settings an example environment file sets (its commented lines are suggestions)."""
    env = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    return env


def suggested(path: Path, name: str) -> str:
    """The value an example file suggests for ``name`` on a commented line."""
    [value] = re.findall(rf"^#{name}=(.+)$", path.read_text(), flags=re.M)
    return value


def compose_environment(dot_env: dict[str, str]) -> dict[str, str]:
    """What compose.yaml gives the ledgerweb services: its environment, ${...} filled from .env."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())

    def fill(value: str) -> str:
        def one(match: re.Match[str]) -> str:
            name, how, default = match.groups()
            if name in dot_env:
                return dot_env[name]
            assert how != ":?", f"compose.yaml requires {name} in .env"
            return default

        return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, str(value))

    return {**dot_env, **{k: fill(v) for k, v in compose["x-ledgerweb"]["environment"].items()}}


@database_independent
def test_the_example_environments_pass_the_deploy_check_on_a_configured_ledger(
    tmp_path: Path,
) -> None:
    """deploy/ledgerweb.env.example (systemd) and deploy/container/compose.env.example with
    compose.yaml, their placeholders replaced by real secrets as the guide says (the
    placeholders themselves are refused: tests/test_settings_reference.py), on a ledger migrated
    and configured with deploy/ledger.toml: ``check --deploy`` reports nothing."""
    # A scratch SQLite ledger: the examples point at PostgreSQL on a production host.
    ledger = {"LEDGERWEB_DATA_DIR": str(tmp_path), "LEDGERWEB_SQLITE_PATH": str(tmp_path / "l.db")}
    setup = child_env(**ledger)
    for args in (
        ["migrate", "-v", "0"],
        ["ledger_config", "apply", str(DEPLOY / "ledger.toml"), "--actor", "installer"],
        ["ledger_log", "genkey", "--out", str(tmp_path / "log.key")],  # as the guide says
    ):
        done = manage(*args, env=setup)
        assert done.returncode == 0, (args, done.stdout + done.stderr)

    systemd = DEPLOY / "ledgerweb.env.example"
    env = child_env(**{**env_file(systemd), **ledger})
    env.pop("DATABASE_URL")
    env["LEDGERWEB_SECRET_KEY"] = secrets.token_urlsafe(64)
    env["LEDGERWEB_METRICS_TOKEN"] = secrets.token_urlsafe(32)
    env["LEDGERWEB_TLOG_KEY_FILE"] = str(tmp_path / "log.key")

    # compose.yaml reads the secrets from files (./secrets/, mounted by compose).
    compose_file = DEPLOY / "container" / "compose.env.example"
    (tmp_path / "secret_key").write_text(secrets.token_urlsafe(64))
    compose = child_env(**{**compose_environment(env_file(compose_file)), **ledger})
    compose.pop("DATABASE_URL_FILE")
    compose.update(
        LEDGERWEB_SECRET_KEY_FILE=str(tmp_path / "secret_key"),
        LEDGERWEB_TLOG_KEY_FILE=str(tmp_path / "log.key"),
    )

    # The systemd example as it is (no default owner: ledger.toml's rule owns the work); the
    # compose one with the default owner it suggests, a person ledger.toml has created.
    compose["LEDGERWEB_DEFAULT_OWNER"] = suggested(compose_file, "LEDGERWEB_DEFAULT_OWNER")
    assert suggested(systemd, "LEDGERWEB_DEFAULT_OWNER") == compose["LEDGERWEB_DEFAULT_OWNER"]
    for name, environment in (("systemd", env), ("compose", compose)):
        done = manage(
            "check", "--deploy", "--database", "default", "--fail-level", "WARNING",
            env=environment,
        )  # fmt: skip
        assert done.returncode == 0, (name, done.stdout + done.stderr)
        assert "no issues" in done.stdout, (name, done.stdout)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_restore_drill_restores_a_dump_and_verifies_it(world, tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the drill restores pg_dump files: PostgreSQL only")
    if not shutil.which("pg_dump"):
        pytest.skip("pg_dump not installed")
    agent_intent(world, "drill-1", tool="open_ticket", args={"title": "restore me"})
    settings = connection.settings_dict
    server = f"postgres://{settings['USER'] or 'postgres'}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
    backups = tmp_path / "backups"
    backups.mkdir()
    dump = backups / "ledger-20261201T023000Z.dump"
    subprocess.run(
        ["pg_dump", "--format=custom", f"--file={dump}", f"{server}/{settings['NAME']}"],
        check=True,
        timeout=120,
    )
    scratch = f"{settings['NAME']}_drill"[:63]
    env = child_env(
        LEDGERWEB_BACKUP_DIR=str(backups),
        LEDGERWEB_DRILL_DATABASE_URL=f"{server}/{scratch}",
        LEDGERWEB_COMMAND=str(Path(sys.executable).parent / "ledgerweb"),
        LEDGERWEB_DATA_DIR=str(tmp_path / "data"),
    )
    env.pop("DATABASE_URL")
    done = subprocess.run(
        [str(DEPLOY / "restore-drill.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restores and its audit chain verifies" in done.stdout
    listed = subprocess.run(
        ["psql", f"{server}/postgres", "-Atc", "SELECT datname FROM pg_database"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert scratch not in listed  # the drill cleans up after itself
