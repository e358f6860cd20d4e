"""Lose nothing when the database fails over (issue 45).

The ledger connects through a libpq multi-host ``DATABASE_URL`` to whichever server takes
writes; ``check --deploy`` and ``/healthz`` say whether an acknowledged write can be lost on a
failover; and under load from agents and two workers, a SIGKILLed primary and a promoted
standby lose no acknowledged write when replication is synchronous (the real test runs a private
primary and standby of its own; bench/failover.py holds the pair and the run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from bench.private_postgres import PG_BIN
from tests.conftest import REPO, child_env, manage


def test_a_multi_host_url_connects_to_the_host_that_takes_writes(tmp_path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    settings = connection.settings_dict
    # The first host answers nothing (a closed port); libpq goes on to the next.
    url = (
        f"postgres://{settings['USER'] or 'postgres'}@127.0.0.1:9,"
        f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}"
    )
    done = manage(
        "shell",
        "-c",
        "from django.db import connection; connection.ensure_connection(); "
        "o = connection.settings_dict['OPTIONS']; "
        "print(connection.connection.info.port, o['target_session_attrs'], o['connect_timeout'])",
        env=child_env(DATABASE_URL=url, LEDGERWEB_DATA_DIR=str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split() == [
        str(settings["PORT"] or 5432),
        "read-write",
        "5",
    ]


def test_a_database_url_with_a_malformed_host_list_fails_with_a_clear_message(tmp_path) -> None:
    env = child_env(
        DATABASE_URL="postgres://u@db1:5432,db2:x/ledger", LEDGERWEB_DATA_DIR=str(tmp_path)
    )
    done = manage("check", env=env)
    assert done.returncode != 0
    assert "DATABASE_URL lists a host that is not host[:port]: 'db2:x'" in done.stderr


@pytest.mark.django_db
def test_healthz_says_whether_a_failover_can_lose_acknowledged_writes() -> None:
    answer = json.loads(Client().get("/healthz").content)
    if connection.vendor != "postgresql":
        assert "replication" not in answer
        return
    # The shared test server has no standby: nothing to fail over to, nothing to lose.
    assert answer["replication"]["synchronous_commit"] == "on"
    assert answer["replication"]["failover_loss"] == "no_standby"


@pytest.mark.slow
def test_a_failover_under_load_loses_no_acknowledged_write_with_a_synchronous_standby() -> None:
    """A private primary and streaming standby, agents through gunicorn and two workers on a
    multi-host URL; the primary is SIGKILLed mid-run (its standby held back a second first, as
    a slow link would) and the standby promoted. Synchronous: every acknowledged intent and
    move is there, no key took effect twice at the provider, verify_audit passes and the log
    goes on. Asynchronous: check --deploy warned, and the writes lost are counted (printed)."""
    from bench import failover

    if connection.vendor != "postgresql":
        pytest.skip("runs once, in the PostgreSQL suite (it makes its own pair either way)")
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL server binaries are not installed ({PG_BIN})")
    sync, asynchronous = failover.run(failover.parse(["--seconds", "3", "--drain", "30"]))

    assert sync.acknowledged_intents > 0 and sync.acknowledged_moves > 0
    # The agents' calls went on through the same multi-host URL to the new primary.
    assert sync.confirmed_after_promotion > 0
    assert sync.lost_intents == [] and sync.lost_moves == []
    assert sync.duplicates == []
    assert sync.unsettled == {}
    assert sync.verify_ok, sync.verify_output
    assert sync.checkpoint_after > sync.checkpoint_before
    # The witness cosigned a checkpoint of the new primary past the one it held: the same log.
    assert sync.witness_status == "ok", sync.witness_message
    assert sync.witnessed_after > sync.witnessed_before
    assert sync.signer_refusals == 0
    assert asynchronous.warned is True
    # The measured fact behind docs/scaling.md's warning (not a pass condition: it depends on
    # where the kill lands).
    print(f"asynchronous failover lost {asynchronous.lost} acknowledged writes", end=" ")
    print(f"of {asynchronous.acknowledged_intents + asynchronous.acknowledged_moves}")


@pytest.mark.slow
def test_what_is_sent_to_a_witness_is_on_the_synchronous_standby_first(tmp_path) -> None:
    """PostgreSQL shows a commit to other sessions before its synchronous standby has it. Before
    the log sends a checkpoint to a witness, ``replication.make_durable`` waits until everything
    the session can see is on the standby: while the standby receives nothing it does not
    return, and it returns once the standby has caught up."""
    if connection.vendor != "postgresql":
        pytest.skip("runs once, in the PostgreSQL suite")
    from bench import failover

    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL server binaries are not installed ({PG_BIN})")
    pair = failover.Pair(Path(tempfile.mkdtemp(prefix="ledgerweb-durable-")))
    waiting = None
    senders: list[int] = []
    try:
        pair.add_standby(synchronous=True)
        senders = [int(p) for p in pair.primary.sql("SELECT pid FROM pg_stat_replication").split()]
        for pid in senders:
            os.kill(pid, signal.SIGSTOP)  # the standby receives nothing from now on
        waiting = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c",
             "from attempts import replication; replication.make_durable(); print('durable')"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=child_env(DATABASE_URL=pair.url, LEDGERWEB_DATA_DIR=str(tmp_path)),
        )  # fmt: skip
        time.sleep(3)
        assert waiting.poll() is None, waiting.communicate()
        for pid in senders:
            os.kill(pid, signal.SIGCONT)
        senders = []
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert out.splitlines()[-1] == "durable"
    finally:
        for pid in senders:
            os.kill(pid, signal.SIGCONT)
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
            waiting.wait()
        pair.stop()
        shutil.rmtree(pair.root, ignore_errors=True)
