"""Witnesses (C2SP tlog-witness): a witness in its own process, keeping its state on disk,
cosigns each new checkpoint the publisher submits with a consistency proof from the size it
last cosigned, and refuses a fork; the publisher stores the cosignatures beside the checkpoint,
says when a witness is behind or refused, and never blocks a write."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from attempts import log
from attempts.models import Attempt, CheckpointSignature, WitnessState
from attempts.verify_export import open_checkpoint
from tests.attempts.audit_helpers import (
    ORIGIN,
    build_history,
    forget_signer_state,
    rewrite_history,
    seal_all,
    sign_with_new_key,
)
from tests.conftest import free_port

pytestmark = pytest.mark.django_db(transaction=True)

# The witness the simulation runs, here in a process of its own (it remembers across restarts).
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def signing(tmp_path, settings):
    return sign_with_new_key(tmp_path, settings)[1]


def _start_witness(tmp_path: Path, verifier, name: str = "witness.test/w1", *, lie_once: int = 0):
    port = free_port()
    process = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "reconciliation.simulate.witness", "--state", str(tmp_path / name.replace("/", "_")),
         "--port", str(port), "--name", name, "--origin", ORIGIN, "--log-key", str(verifier),
         "--lie-once", str(lie_once)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )  # fmt: skip
    line = process.stdout.readline()
    assert line.startswith("witness-key "), line
    return process, port, line.split()[1]


@pytest.fixture
def witness(tmp_path, signing, settings):
    process, port, key = _start_witness(tmp_path, signing)
    settings.TLOG = {**settings.TLOG, "WITNESSES": [f"{key} http://127.0.0.1:{port}"]}
    yield key
    process.terminate()
    process.wait(timeout=10)


def test_a_witness_cosigns_a_series_and_refuses_a_fork(world, signing, witness, settings):
    build_history(world, 3)
    seal_all()
    assert log.publish() == {"witness.test/w1": "ok"}
    first = log.newest_signed()
    build_history(world, 2, prefix="b")
    seal_all()
    assert log.publish() == {"witness.test/w1": "ok"}  # old size + consistency proof accepted
    second = log.newest_signed()
    assert second.size > first.size
    keys = log.witnesses()
    for checkpoint in (first, second):
        note = log.signed_note(checkpoint)
        _, cosigned = open_checkpoint(note, [signing], witnesses=[k.key for k in keys], quorum=1)
        assert cosigned == ["witness.test/w1"]
    assert log.status()["witnessed"] is True
    assert log.publish() == {"witness.test/w1": "ok"}  # nothing new: no request

    # The operator, holding the signing key, rewrites history after the witnessed checkpoint,
    # re-signs it and seals more: the witness refuses, and verify_audit says so.
    attempt = Attempt.objects.order_by("id").first()
    rewrite_history(attempt, details={"rewritten": True})
    forget_signer_state()
    log.sign_pending()
    build_history(world, 1, prefix="c")
    seal_all()
    assert log.publish() == {"witness.test/w1": "refused"}
    state = WitnessState.objects.get()
    assert state.status == "refused" and "422" in state.message
    assert state.size == second.size
    newest = log.newest_signed()
    assert not newest.signatures.filter(kind="witness").exists()
    assert log.status()["witnessed"] is False
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit", stdout=io.StringIO())
    assert "[witness] witness witness.test/w1 refused" in str(caught.value)


def test_a_witness_that_is_down_never_blocks_a_write_and_is_reported(world, signing, settings):
    port = free_port()  # nothing listens there
    key = log.generate_key("witness.test/down")[1]
    settings.TLOG = {**settings.TLOG, "WITNESSES": [f"{key} http://127.0.0.1:{port}"]}
    build_history(world, 1)
    seal_all()
    assert log.publish() == {"witness.test/down": "unreachable"}
    assert log.newest_signed() is not None  # signed all the same
    status = log.status()
    assert status["witnessed"] is False
    assert status["witnesses"][0]["status"] == "unreachable"
    assert status["witnesses"][0]["behind"] == status["signed_size"]
    assert not CheckpointSignature.objects.filter(kind="witness").exists()


def test_a_witness_behind_is_degraded_health_and_a_metric(world, signing, client, settings):
    key = log.generate_key("witness.test/down")[1]
    settings.TLOG = {**settings.TLOG, "WITNESSES": [f"{key} http://127.0.0.1:{free_port()}"]}
    settings.OPS = {**settings.OPS, "METRICS_ALLOW_LOOPBACK": True, "HEALTHZ_REQUIRE_WORKER": False}
    build_history(world, 2)
    seal_all()
    log.publish()
    health = client.get("/healthz")
    assert health.status_code == 200  # a witness never makes the ledger unhealthy
    body = health.json()
    assert body["status"] == "degraded" and body["log"] == "degraded"
    assert body["log_witnesses_behind"] == ["witness.test/down"]
    metrics = client.get("/metrics").content.decode()
    size = log.newest_signed().size
    assert f'ledger_log_witness_behind{{witness="witness.test/down"}} {size}' in metrics
    assert 'ledger_log_witness_ok{witness="witness.test/down",status="unreachable"} 0' in metrics
    assert "ledger_log_witnessed 0" in metrics
    assert f'ledger_log_size{{checkpoint="signed"}} {size}' in metrics


def test_a_witness_that_never_answers_is_cut_off_by_the_deadline(world, signing, settings):
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    key = log.generate_key("witness.test/slow")[1]
    settings.TLOG = {
        **settings.TLOG,
        "WITNESSES": [f"{key} http://127.0.0.1:{listener.getsockname()[1]}"],
        "WITNESS_TIMEOUT": 1,
    }
    build_history(world, 1)
    seal_all()
    started = time.monotonic()
    assert log.publish() == {"witness.test/slow": "unreachable"}
    assert time.monotonic() - started < 5
    listener.close()


def test_quorum_counts_cosignatures_of_configured_witnesses(world, signing, tmp_path, settings):
    first, port1, key1 = _start_witness(tmp_path, signing, "witness.test/a")
    second, port2, key2 = _start_witness(tmp_path, signing, "witness.test/b")
    try:
        down = log.generate_key("witness.test/c")[1]
        settings.TLOG = {
            **settings.TLOG,
            "WITNESSES": [
                f"{key1} http://127.0.0.1:{port1}",
                f"{key2} http://127.0.0.1:{port2}",
                f"{down} http://127.0.0.1:{free_port()}",
            ],
            "WITNESS_QUORUM": 2,
        }
        build_history(world, 2)
        seal_all()
        log.publish()
        assert log.status()["witnessed"] is True
        settings.TLOG = {**settings.TLOG, "WITNESS_QUORUM": 3}
        assert log.status()["witnessed"] is False
    finally:
        for process in (first, second):
            process.terminate()
            process.wait(timeout=10)


def test_one_409_claiming_a_larger_tree_does_not_stop_witnessing(
    world, signing, tmp_path, client, settings
):
    """A 409's size is the witness's unauthenticated word: a hint to retry from, never stored.
    The witness is asked again at the next pass, and the metric shows how far behind it is."""
    process, port, key = _start_witness(tmp_path, signing, lie_once=10**9)
    settings.TLOG = {**settings.TLOG, "WITNESSES": [f"{key} http://127.0.0.1:{port}"]}
    settings.OPS = {**settings.OPS, "METRICS_ALLOW_LOOPBACK": True, "HEALTHZ_REQUIRE_WORKER": False}
    try:
        build_history(world, 2)
        seal_all()
        assert log.publish() == {"witness.test/w1": "refused"}
        size = log.newest_signed().size
        assert WitnessState.objects.get().size == 0  # nothing it said is kept as fact
        metrics = client.get("/metrics").content.decode()
        assert f'ledger_log_witness_behind{{witness="witness.test/w1"}} {size}' in metrics
        row = log.status()["witnesses"][0]
        assert row["status"] == "refused" and "says it holds a tree of 1000000000" in row["message"]

        assert log.publish() == {"witness.test/w1": "ok"}  # contacted again, and cosigns
        assert log.status()["witnessed"] is True
        metrics = client.get("/metrics").content.decode()
        assert 'ledger_log_witness_behind{witness="witness.test/w1"} 0' in metrics
    finally:
        process.terminate()
        process.wait(timeout=10)
