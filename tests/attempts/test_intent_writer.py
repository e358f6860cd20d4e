"""The intent writer (attempts/writer.py) as a real process on the suite's SQLite file: web-worker
threads hand it their intents; it commits them together; a refused or lost answer falls back
to the worker's own write; killing it mid-stream loses and doubles nothing."""

import os
import signal
import socket
import stat
import subprocess
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from attempts import ledger, writer
from attempts.audit_verify import verify_django_database
from attempts.models import Attempt
from attempts.states import Actor
from tests.conftest import PYTHON, REPO, child_env, make_world

AGENT = Actor.agent("writer-test")


def sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only: PostgreSQL has no intent writer")


def start_writer() -> subprocess.Popen:
    path = writer.socket_path()
    process = subprocess.Popen(
        [PYTHON, "manage.py", "ledger_writer"],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while True:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            break
        except OSError:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the writer never listened"
            time.sleep(0.05)
        finally:
            probe.close()
    writer._drop()
    writer._local.retry_at = 0.0
    return process


@pytest.fixture
def running_writer():
    sqlite_only()
    make_world()
    process = start_writer()
    yield process
    writer._drop()
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    if os.path.exists(writer.socket_path()):
        os.unlink(writer.socket_path())  # left by a writer that was killed


def record(key: str, **args):
    return ledger.record_intent(
        tenant="acme",
        task_id="writer",
        tool_name="open_ticket",
        idempotency_key=key,
        args=args or {"key": key},
        actor=AGENT,
    )


def start_agents(keys: list[str], count: int):
    """``count`` threads recording ``keys`` between them; returns (threads, results by key,
    errors), filled in as they go."""
    results, errors = {}, []

    def agent(chunk):
        try:
            for key in chunk:
                results[key] = record(key)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            writer._drop()
            connections.close_all()

    threads = [threading.Thread(target=agent, args=(keys[n::count],)) for n in range(count)]
    for thread in threads:
        thread.start()
    return threads, results, errors


@pytest.mark.django_db(transaction=True)
def test_intents_from_many_threads_go_through_the_writer(running_writer):
    before = writer.submitted
    keys = [f"writer:{n}" for n in range(60)]
    threads, results, errors = start_agents(keys, 6)
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert writer.submitted - before == 60  # every one through the writer, none written here
    for key, (attempt, created) in results.items():
        assert created and attempt.pk and attempt.idempotency_key == key
        stored = Attempt.objects.get(pk=attempt.pk)
        assert (stored.attempt_id, stored.args_hash) == (attempt.attempt_id, attempt.args_hash)
    assert verify_django_database().ok
    running_writer.send_signal(signal.SIGTERM)
    out, _ = running_writer.communicate(timeout=30)
    assert "60 intents in" in out
    assert not os.path.exists(writer.socket_path())  # removed on the way out


@pytest.mark.django_db(transaction=True)
def test_replays_and_conflicts_through_the_writer(running_writer):
    first, created = record("writer:replay", n=1)
    again, created_again = record("writer:replay", n=1)
    assert created and not created_again and again.pk == first.pk
    with pytest.raises(ledger.IdempotencyConflict):
        record("writer:replay", n=2)
    assert Attempt.objects.filter(idempotency_key="writer:replay").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_socket_is_private_and_one_writer_per_database(running_writer):
    mode = stat.S_IMODE(os.stat(writer.socket_path()).st_mode)
    assert mode == 0o600
    second = subprocess.run(
        [PYTHON, "manage.py", "ledger_writer"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0
    assert "already listening" in second.stderr


@pytest.mark.django_db(transaction=True)
def test_garbage_on_the_socket_drops_that_peer_only(running_writer):
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(writer.socket_path())
    bad.sendall((12).to_bytes(4, "big") + b"not json at ")
    bad.settimeout(10)
    assert bad.recv(10) == b""  # closed by the writer
    bad.close()
    huge = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    huge.connect(writer.socket_path())
    huge.sendall((writer.MAX_FRAME + 1).to_bytes(4, "big"))
    huge.settimeout(10)
    assert huge.recv(10) == b""
    huge.close()
    before = writer.submitted
    attempt, created = record("writer:after-garbage")
    assert created and writer.submitted == before + 1


@pytest.mark.django_db(transaction=True)
def test_killing_the_writer_mid_stream_loses_and_doubles_nothing(running_writer):
    keys = [f"writer:kill:{n}" for n in range(150)]
    before = writer.submitted
    threads, results, errors = start_agents(keys, 4)
    deadline = time.monotonic() + 30
    while len(results) < 20:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    running_writer.send_signal(signal.SIGKILL)
    running_writer.wait(timeout=30)
    for thread in threads:
        thread.join(120)
    assert errors == []
    answers = {key: attempt.attempt_id for key, (attempt, _) in results.items()}
    assert len(answers) == 150
    assert 20 <= writer.submitted - before < 150  # some through the writer, the rest here
    rows = dict(
        Attempt.objects.filter(idempotency_key__in=keys).values_list(
            "idempotency_key", "attempt_id"
        )
    )
    assert rows == answers  # one row per key, and it is the attempt each caller was given
    assert verify_django_database().ok


@pytest.mark.django_db(transaction=True)
def test_no_writer_means_the_worker_writes_itself():
    sqlite_only()
    make_world()
    writer._drop()
    writer._local.retry_at = 0.0
    before = writer.submitted
    attempt, created = record("writer:absent")
    assert created and writer.submitted == before
    assert Attempt.objects.filter(pk=attempt.pk).exists()


@pytest.mark.django_db
def test_the_command_refuses_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    with pytest.raises(CommandError, match="SQLite database only"):
        call_command("ledger_writer")


def _prepared(key: str, **args):
    from attempts import states
    from attempts.canonical import normalize_args
    from attempts.models import State

    normalized = normalize_args(args or {"key": key})
    prepared = states.PreparedAttempt(
        state=State.INTENT_RECORDED,
        actor=AGENT,
        tenant_id="acme",
        task_id="writer",
        tool_name="open_ticket",
        idempotency_key=key,
        args=normalized.value,
        args_hash=normalized.args_hash,
        policy_version="v1",
        credential_scope=[],
    )
    event = prepared.first_event
    return list(prepared.values), list(event.values), event.parts


@pytest.mark.django_db(transaction=True)
def test_a_group_keeps_its_good_pieces_and_refuses_the_others_alone():
    sqlite_only()
    make_world()
    good = _prepared("writer:group:good")
    broken = _prepared("writer:group:broken")
    broken[1][:] = [object()] * len(broken[1])  # its attempt inserts, its event cannot bind
    taken = _prepared("writer:group:good")  # the same key again, in the same group
    replies = writer.write_requests([good, broken, taken])
    assert "ok" in replies[0]
    assert replies[1]["error"].startswith("ProgrammingError: Error binding parameter")
    assert replies[2]["refused"] == "integrity"
    keys = set(Attempt.objects.values_list("idempotency_key", flat=True))
    assert "writer:group:good" in keys and "writer:group:broken" not in keys
    assert Attempt.objects.filter(idempotency_key="writer:group:good").count() == 1
    assert verify_django_database().ok
    assert not connection.in_atomic_block and connection.get_autocommit()
    # Alone, a refused piece is refused the same way, and the connection is left clean.
    assert writer.write_requests([_prepared("writer:group:good")]) == [
        {"refused": "integrity", "message": writer.write_requests([taken])[0]["message"]}
    ]
    assert not connection.connection.in_transaction
