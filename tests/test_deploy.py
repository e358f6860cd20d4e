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
from django.db import connection
from django.test import Client

from tests.conftest import PYTHON, REPO, agent_intent, child_env, manage

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


def example_environment() -> dict[str, str]:
    env = {}
    for line in (DEPLOY / "ledgerweb.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    return env


@database_independent
def test_the_example_environment_passes_the_deploy_check(tmp_path: Path) -> None:
    env = child_env(**example_environment())
    # The example points at PostgreSQL on a production host; the check runs on a scratch SQLite.
    env.pop("DATABASE_URL")
    env.update(LEDGERWEB_DATA_DIR=str(tmp_path), LEDGERWEB_SQLITE_PATH=str(tmp_path / "l.db"))
    # With its placeholders replaced by real secrets, as the guide says (the placeholders
    # themselves are refused: tests/test_settings_reference.py).
    env["LEDGERWEB_SECRET_KEY"] = secrets.token_urlsafe(64)
    env["LEDGERWEB_METRICS_TOKEN"] = secrets.token_urlsafe(32)
    subprocess.run(  # the log's signing key, made as the deploy guide says
        [PYTHON, "manage.py", "ledger_log", "genkey", "--out", str(tmp_path / "log.key")],
        cwd=REPO, env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    env["LEDGERWEB_TLOG_KEY_FILE"] = str(tmp_path / "log.key")
    done = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


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
