"""Several machines, one ledger (PostgreSQL): two gunicorn instances and two reconcile workers on
one database, agents spread over both, one master and one worker killed with SIGKILL mid-run;
a write transaction held open on one attempt does not hold up anyone else's; and the web tier
leaves no process behind on reload and stop."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from attempts import audit_verify, ledger, states
from attempts.actors import Actor
from attempts.locking import LedgerBusy, write_transaction
from attempts.models import AgentToken, Attempt, State
from ledgerweb_client import LedgerClient, LedgerError, SendResult
from tests.conftest import PYTHON, REPO, agent_intent, child_env, make_world, start_manage

SETTLED = {State.OUTCOME_CONFIRMED, State.FAILED, State.MANUAL_REVIEW, State.RECONCILED}


def postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite has one writer by nature and one machine")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_http(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server on {port} exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"server on {port} did not answer")


@contextlib.contextmanager
def held_by_a_writer(held: Attempt, actor: Actor) -> Iterator[None]:
    """For the body of the ``with``, another connection holds a write transaction that has
    moved ``held`` (a note) and not committed."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with write_transaction():
                attempt = Attempt.objects.get(pk=held.pk)
                states.move(attempt, None, action="attempt.note", actor=actor, reason="hold")
                inside.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        yield
    finally:
        release.set()
        holder.join(timeout=30)


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (however they were started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if marker.encode() in environ and "\nState:\tZ" not in status:
            found.append(int(entry.name))
    return found


def gunicorn(port: int, env: dict[str, str], workers: int = 2) -> subprocess.Popen:
    env = {
        **env,
        "LEDGERWEB_BIND": f"127.0.0.1:{port}",
        "LEDGERWEB_WORKERS": str(workers),
        "LEDGERWEB_THREADS": "4",
        "LEDGERWEB_ACCESS_LOG": "/dev/null",
    }
    return subprocess.Popen(
        [PYTHON, "-m", "gunicorn", "-c", "ledgerweb/gunicorn.conf.py", "ledgerweb.wsgi"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def send_to(provider) -> callable:
    """An agent's send: POST the arguments to the demo provider with the idempotency key."""

    def send(attempt) -> SendResult:
        body = json.dumps(attempt.args).encode()
        conn = http.client.HTTPConnection("127.0.0.1", provider.port, timeout=5)
        try:
            conn.request(
                "POST",
                f"/tools/{attempt.tool_name}/send",
                body=body,
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": attempt.idempotency_key,
                    "X-Ledger-Attempt-Id": attempt.attempt_id,
                    "X-Ledger-Args-Hash": attempt.args_hash,
                },
            )
            answer = conn.getresponse()
            data = json.loads(answer.read() or b"{}")
        finally:
            conn.close()
        # No receipt: the reconcile workers confirm it by lookup.
        return SendResult(provider_request_id=data.get("id"), result_ref=None)

    return send


@pytest.mark.slow
def test_two_web_nodes_and_two_workers_survive_a_kill_9_of_each(transactional_db, demo, tmp_path):
    postgresql_only()
    make_world()
    demo.configure_tools(timeout=3)
    _, token = AgentToken.issue("scale-agent", ["acme"])
    marker = f"LEDGERWEB_SCALE_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = child_env(
        **{
            name: value,
            "LEDGERWEB_STALE_AFTER": "3",
            "LEDGERWEB_BACKOFF_BASE": "1",
            "LEDGERWEB_BACKOFF_CAP": "2",
            "LEDGERWEB_SEAL_EVERY": "1",
            "LEDGERWEB_HEALTHZ_REQUIRE_WORKER": "0",
        }
    )
    ports = [free_port(), free_port()]
    webs = [gunicorn(port, env) for port in ports]
    workers = [
        start_manage(
            ["reconcile", "--interval", "0.5", "--worker-id", f"w{n}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for n in range(2)
    ]
    try:
        for port, web in zip(ports, webs, strict=True):
            wait_http(port, web)
        acknowledged: set[str] = set()
        errors: Counter = Counter()
        stop = threading.Event()
        lock = threading.Lock()

        def agent(number: int) -> None:
            rng = random.Random(number)
            send = send_to(demo)
            i = 0
            while not stop.is_set():
                key = f"scale:{number}:{i}"
                tool = "update_crm" if i % 3 else "open_ticket"
                for attempt_no in range(20):  # retry the same logical effect on the other node
                    port = ports[(number + i + attempt_no) % 2]
                    try:
                        with LedgerClient(f"http://127.0.0.1:{port}", token, timeout=5) as client:
                            result = client.call(
                                tenant="acme",
                                task_id=f"task-{number}",
                                tool_name=tool,
                                idempotency_key=key,
                                args={"n": number, "i": i, "tool": tool},
                                send=send,
                            )
                        with lock:
                            acknowledged.add(result.attempt.idempotency_key)
                        break
                    except (LedgerError, OSError) as exc:
                        with lock:
                            errors[type(exc).__name__] += 1
                        time.sleep(0.05 + rng.random() * 0.1)
                i += 1

        agents = [threading.Thread(target=agent, args=(n,)) for n in range(6)]
        for thread in agents:
            thread.start()
        time.sleep(4)
        os.kill(webs[0].pid, signal.SIGKILL)  # one web node's master
        os.kill(workers[0].pid, signal.SIGKILL)  # one reconcile worker
        time.sleep(5)
        stop.set()
        for thread in agents:
            thread.join(timeout=60)
        assert len(acknowledged) > 30, (len(acknowledged), errors)

        # The surviving worker settles everything (stale claims of the dead node included).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            open_work = Attempt.objects.exclude(state__in=SETTLED).count()
            unsealed = Attempt.objects.filter(sealed=False).count()
            if open_work == 0 and unsealed == 0:
                break
            time.sleep(1)
        states_now = Counter(Attempt.objects.values_list("state", flat=True))
        assert set(states_now) <= SETTLED, states_now
        # Every acknowledged intent is in the ledger; no effect happened twice.
        keys = set(Attempt.objects.values_list("idempotency_key", flat=True))
        assert acknowledged <= keys
        per_key = Counter(effect["idempotency_key"] for effect in demo.effects())
        assert per_key and max(per_key.values()) == 1, per_key.most_common(3)
        report = audit_verify.verify_django_database(max_unsealed_seconds=60)
        assert report.ok, report.render()
        assert report.checkpoint is not None
        print(f"acknowledged {len(acknowledged)}, states {dict(states_now)}, errors {dict(errors)}")
    finally:
        for process in [*webs, *workers]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in [*webs, *workers]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        # The killed master's workers notice their parent is gone and leave.
        deadline = time.monotonic() + 30
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_write_transaction_held_open_on_one_attempt_holds_up_no_other(transactional_db):
    postgresql_only()
    world = make_world()
    held, _ = agent_intent(world, "held:1", tool="update_crm", args={"n": 1}, task="held")
    with held_by_a_writer(held, world.agent):
        started = time.monotonic()
        for i in range(20):
            attempt, created = agent_intent(
                world, f"other:{i}", tool="update_crm", args={"i": i}, task="other"
            )
            assert created
            ledger.claim_dispatch(attempt, actor=world.agent)
            ledger.confirm(attempt, result_ref=f"r{i}", actor=world.agent)
        elapsed = time.monotonic() - started
        assert elapsed < 10, f"other attempts waited {elapsed:.1f}s behind one held attempt"
        assert Attempt.objects.filter(state=State.OUTCOME_CONFIRMED).count() == 20
        # The held attempt itself waits, and only as long as the lock timeout allows.
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '500ms'")
        try:
            with pytest.raises(LedgerBusy, match="busy"):
                ledger.claim_dispatch(held.attempt_id, actor=world.agent)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    ledger.claim_dispatch(held.attempt_id, actor=world.agent)  # free again


def test_reload_and_stop_leave_no_process_behind(db, tmp_path):
    """gunicorn with the shipped configuration: HUP (reload), then TERM, then nothing of it is
    left, whatever it started (SQLite, the embedded default)."""
    if connection.vendor == "postgresql":
        pytest.skip("runs once, in the SQLite run: it starts its own SQLite server")
    marker = f"LEDGERWEB_PROCESS_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = {
        **os.environ,
        name: value,
        "LEDGERWEB_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "ledgerweb.settings",
    }
    env.pop("DATABASE_URL", None)
    subprocess.run(
        [PYTHON, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True, timeout=300
    )
    port = free_port()
    web = gunicorn(port, env)
    try:
        wait_http(port, web)
        before = set(processes_with(marker))
        assert web.pid in before and len(before) == 3  # master and two workers
        web.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = set(processes_with(marker))
            if len(now) == 3 and not (now - {web.pid}) & before:
                break  # new workers, old ones gone
            time.sleep(0.2)
        else:
            raise AssertionError(f"reload left {processes_with(marker)} (before {before})")
        wait_http(port, web)
        web.send_signal(signal.SIGTERM)
        web.wait(timeout=30)
        deadline = time.monotonic() + 15
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with(marker) == []
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGKILL)


def test_the_sealer_never_waits_for_a_writer(transactional_db):
    """A writer may hold several attempt rows (a reconcile worker writes a group of answers in one
    transaction); the sealer passes over rows a writer holds instead of waiting for them, so the
    two can never deadlock. The held attempt is sealed by a later checkpoint."""
    postgresql_only()
    from attempts import chain

    world = make_world()
    made = [
        agent_intent(world, f"seal:{i}", tool="update_crm", args={"i": i}, task="seal")[0]
        for i in range(3)
    ]
    with held_by_a_writer(made[1], world.agent):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        try:
            started = time.monotonic()
            checkpoint = chain.seal()
            assert time.monotonic() - started < 1.5, "the sealer waited for a writer's row"
            assert checkpoint is not None and checkpoint.size == 2
            sealed = set(Attempt.objects.filter(sealed=True).values_list("pk", flat=True))
            assert sealed == {made[0].pk, made[2].pk}
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    assert chain.seal() is not None  # the held attempt, in the next checkpoint
    assert not Attempt.objects.filter(sealed=False).exists()
    assert audit_verify.verify_django_database().ok
