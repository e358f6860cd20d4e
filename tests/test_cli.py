"""The ``ledgerweb`` command: the messages and hints of a process name the command its person
ran, ``ledgerweb config apply`` after the installed command, ``manage.py ledger_config apply``
after the checkout's (ledgerweb.cli.command_line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ledgerweb import cli
from tests.conftest import PYTHON, REPO, child_env

LEDGERWEB = Path(sys.executable).parent / "ledgerweb"  # scripts/setup installs it into .venv


@pytest.mark.parametrize(
    ("argv0", "shown"),
    [
        ("/opt/ledgerweb/venv/bin/ledgerweb", "ledgerweb config apply FILE"),
        ("ledgerweb serve", "ledgerweb config apply FILE"),  # the web workers of `ledgerweb serve`
        ("manage.py", "manage.py ledger_config apply FILE"),
        ("/srv/ledgerweb/manage.py", "manage.py ledger_config apply FILE"),
        ("/usr/bin/gunicorn", "manage.py ledger_config apply FILE"),  # started by hand: a checkout
    ],
)
def test_a_command_is_named_as_this_process_was_started(monkeypatch, argv0, shown) -> None:
    monkeypatch.setattr(sys, "argv", [argv0, "whatever"])
    assert cli.command_line("ledger_config apply FILE") == shown
    worker = "ledgerweb worker" if shown.startswith("ledgerweb") else "manage.py reconcile"
    assert cli.command_line("reconcile") == worker
    assert cli.command_line("verify_audit").endswith(" verify_audit")


@pytest.mark.django_db(transaction=True)
def test_the_installed_command_says_ledgerweb_and_manage_py_says_manage_py(world) -> None:
    assert LEDGERWEB.is_file(), "scripts/setup installs the ledgerweb command into .venv"
    toml = str(REPO / "deploy" / "ledger.toml")
    env = child_env()
    for command, shown in (
        ([str(LEDGERWEB), "config", "plan", toml], "`ledgerweb config apply` makes these changes"),
        (
            [PYTHON, "manage.py", "ledger_config", "plan", toml],
            "`manage.py ledger_config apply` makes these changes",
        ),
    ):
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert shown in done.stdout, done.stdout
