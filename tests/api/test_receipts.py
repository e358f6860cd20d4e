"""Receipts for agents and the log served read-only under /log/: an agent gets a receipt once its
attempt's state is sealed and signed, checks it with the log's verifier key alone (the Python
client here, the TypeScript client in its own test), and a client that keeps the last checkpoint
it verified sees a rewritten history as a fork. /log/ serves the checkpoint and hash tiles,
cacheable and without login, and answers bad paths with 400/404."""

from __future__ import annotations

import base64

import pytest
from django.test import Client

from attempts import chain, log
from attempts.models import Attempt
from ledgerweb_client import LedgerClient, LogView, ReceiptError, StateConflict
from ledgerweb_client.errors import NotFound
from tests.api.conftest import Tokens
from tests.attempts.audit_helpers import (
    ORIGIN,
    forget_signer_state,
    rewrite_history,
    seal_all,
    sign_with_new_key,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def verifier(tmp_path, settings):
    return str(sign_with_new_key(tmp_path, settings)[1])


def _intent(ledger: LedgerClient, key: str, tenant: str = "acme"):
    return ledger.record_intent(
        tenant=tenant, task_id="t", tool_name="update_crm", idempotency_key=key, args={"n": key}
    )


def test_a_receipt_verifies_with_the_key_alone_and_a_forged_one_does_not(
    live_server, tokens: Tokens, verifier
):
    with LedgerClient(live_server.url, tokens.acme) as ledger:
        attempt = _intent(ledger, "r:1")
        with pytest.raises(StateConflict) as caught:
            ledger.receipt(attempt.attempt_id)
        assert caught.value.code == "not_sealed"
        seal_all()
        receipt = ledger.receipt(attempt.attempt_id)
        checkpoint = LedgerClient.verify_receipt(receipt, verifier)
        assert checkpoint.origin == ORIGIN and checkpoint.size == receipt["tree_size"]
        assert receipt["leaf"]["head"] == Attempt.objects.get().chain_head

        forged = {**receipt, "leaf": {**receipt["leaf"], "head": "0" * 64}}
        with pytest.raises(ReceiptError, match="events do not hash to the leaf's head"):
            LedgerClient.verify_receipt(forged, verifier)
        elsewhere = {**receipt, "index": receipt["index"] + 1}
        with pytest.raises(ReceiptError, match="does not lead to the signed root"):
            LedgerClient.verify_receipt(elsewhere, verifier)
        other_key = str(log.generate_key(ORIGIN)[1])
        with pytest.raises(ReceiptError, match="not signed"):
            LedgerClient.verify_receipt(receipt, other_key)

        # The attempt moves on: its new state has no receipt until the next seal.
        assert ledger.dispatch(attempt.attempt_id)
        with pytest.raises(StateConflict):
            ledger.receipt(attempt.attempt_id)
        seal_all()
        assert ledger.receipt(attempt.attempt_id)["leaf"]["length"] == 2


def test_another_tenants_attempt_has_no_receipt(live_server, tokens: Tokens, verifier):
    with LedgerClient(live_server.url, tokens.globex) as other:
        attempt = _intent(other, "g:1", tenant="globex")
    seal_all()
    with LedgerClient(live_server.url, tokens.acme) as ledger, pytest.raises(NotFound):
        ledger.receipt(attempt.attempt_id)


def test_a_client_that_keeps_its_checkpoint_sees_a_fork(live_server, tokens: Tokens, verifier):
    view = LogView()
    with LedgerClient(live_server.url, tokens.acme) as ledger:
        for i in range(3):
            _intent(ledger, f"f:{i}")
        seal_all()
        first = ledger.check_log(view, verifier)
        assert view.size == first.size == 3
        for i in range(3, 8):
            _intent(ledger, f"f:{i}")
        seal_all()
        second = ledger.check_log(view, verifier)  # consistent with the first
        assert view.size == second.size == 8
        # The operator, holding the key, rewrites history and re-signs; the client, which kept
        # the tree of 8, is not fooled by the new tree.
        rewrite_history(Attempt.objects.order_by("id").first(), details={"forged": True})
        forget_signer_state()
        log.sign_pending()
        _intent(ledger, "f:late")
        seal_all()
        with pytest.raises(ReceiptError, match="not consistent"):
            ledger.check_log(view, verifier)
        assert view.size == 8


def test_the_log_is_served_as_tiles_without_login(client: Client, world, verifier):
    from tests.attempts.audit_helpers import build_history

    build_history(world, 4)
    seal_all()
    newest = log.newest_signed()
    answer = client.get("/log/checkpoint")
    assert answer.status_code == 200
    assert answer.content.decode() == log.signed_note(newest)
    assert "no-cache" in answer["Cache-Control"]
    size = newest.size
    tile = client.get(f"/log/tile/0/000.p/{size}")
    assert tile.status_code == 200 and tile["Content-Type"] == "application/octet-stream"
    assert len(tile.content) == 32 * size
    assert tile.content[:32] == log.root_at(1)  # leaf 0's hash: the tree of one leaf
    consistency = client.get(f"/log/consistency/1/{size}")
    proof = [base64.b64decode(line) for line in consistency.content.decode().split()]
    assert proof == log.consistency_proof(1, size)
    assert "immutable" in consistency["Cache-Control"]
    for path, status in [
        ("/log/tile/0/000", 404),  # not full
        (f"/log/tile/0/000.p/{size + 1}", 404),  # wider than the published tree
        ("/log/tile/entries/000", 404),  # entries are never served
        ("/log/tile/0/0000", 400),
        ("/log/tile/0/x1/000", 400),
        ("/log/tile/99/000", 400),
        ("/log/tile/0/000.p/300", 400),
        ("/log/consistency/5/2", 400),
        (f"/log/consistency/0/{size + 1}", 400),
    ]:
        assert client.get(path).status_code == status, path
    assert client.post("/log/checkpoint").status_code == 405


def test_a_read_token_closes_the_log(client: Client, world, verifier, settings):
    from tests.attempts.audit_helpers import build_history

    build_history(world, 1)
    seal_all()
    settings.TLOG = {**settings.TLOG, "READ_TOKEN": "s3cret-token"}
    assert client.get("/log/checkpoint").status_code == 401
    answer = client.get("/log/checkpoint", headers={"Authorization": "Bearer s3cret-token"})
    assert answer.status_code == 200 and "private" in answer["Cache-Control"]


def test_no_signed_checkpoint_yet_is_a_clear_404(client: Client, world):
    from tests.attempts.audit_helpers import build_history

    build_history(world, 1)
    seal_all()  # no key configured: unsigned
    answer = client.get("/log/checkpoint")
    assert answer.status_code == 404 and b"no signed checkpoint" in answer.content


def test_without_cryptography_the_client_says_what_to_install(world, verifier, monkeypatch):
    import sys

    from ledgerweb_client import verify_receipt
    from tests.attempts.audit_helpers import build_history

    attempt = build_history(world, 1)[0]
    seal_all()
    receipt = log.receipt(Attempt.objects.get(pk=attempt.pk))
    assert verify_receipt(receipt, verifier).size == 1
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric.ed25519", None)
    with pytest.raises(ReceiptError, match=r"pip install 'ledgerweb-client\[verify\]'"):
        verify_receipt(receipt, verifier)


def _sent(attempt, args) -> dict:
    return {
        "tenant": attempt.tenant,
        "task_id": attempt.task_id,
        "tool_name": attempt.tool_name,
        "idempotency_key": attempt.idempotency_key,
        "args": args,
    }


def test_a_receipt_carries_what_its_leaf_commits_to_and_the_agent_checks_what_it_sent(
    live_server, tokens: Tokens, verifier
):
    from attempts import verify_export

    args = {"amount": 1.5, "note": "caf\u00e9 \u2028 \U0001f600", "n": [1, 2.5e-7, None, True]}
    with LedgerClient(live_server.url, tokens.acme) as ledger:
        attempt = ledger.record_intent(
            tenant="acme", task_id="t", tool_name="update_crm", idempotency_key="rc:1", args=args
        )
        assert ledger.dispatch(attempt.attempt_id)
        seal_all()
        receipt = ledger.receipt(attempt.attempt_id)
    assert receipt["version"] == 2 and len(receipt["events"]) == receipt["leaf"]["length"] == 2
    # The events carry no free text: only what their hashes cover (format 3: its digest).
    assert all("reason" not in event and "text" in event for event in receipt["events"])
    sent = _sent(attempt, args)
    assert LedgerClient.verify_receipt(receipt, verifier, sent=sent).size >= 1
    key = verify_export.VerifierKey.parse(verifier)
    assert verify_export.receipt_problems(receipt, [key], sent=sent) == []

    refusals = [
        ({**sent, "args": {**args, "amount": 2}}, "does not commit to the arguments sent"),
        ({**sent, "idempotency_key": "rc:other"}, "idempotency_key"),
        ({**sent, "tenant": "globex"}, "tenant"),
    ]
    for other, message in refusals:
        with pytest.raises(ReceiptError, match=message):
            LedgerClient.verify_receipt(receipt, verifier, sent=other)
        assert verify_export.receipt_problems(receipt, [key], sent=other)

    first, second = receipt["events"]
    edited = {**first, "details": {**first["details"], "task_id": "t2"}}
    tampered = [
        ({**receipt, "events": [first]}, "carries 1 events for a leaf of 2"),
        ({**receipt, "events": [edited, second]}, "does not follow"),
        ({**receipt, "events": [first, {**second, "to_state": "FAILED"}]}, "leaf's head"),
        ({**receipt, "events": [second, first]}, "does not follow"),
    ]
    for forged, message in tampered:
        with pytest.raises(ReceiptError, match=message):
            LedgerClient.verify_receipt(forged, verifier)
        assert verify_export.receipt_problems(forged, [key])
    old = {k: v for k, v in receipt.items() if k not in ("events", "args_salt")}
    with pytest.raises(ReceiptError, match="carries no events"):
        LedgerClient.verify_receipt(old, verifier)


def test_a_history_the_key_holder_rewrote_still_fails_the_agents_own_check(
    live_server, tokens: Tokens, verifier
):
    """The operator holds the log key: a rewritten and re-signed history verifies as a log, but
    the agent that kept what it sent sees its leaf commit to other arguments."""
    args = {"amount": 100}
    with LedgerClient(live_server.url, tokens.acme) as ledger:
        attempt = ledger.record_intent(
            tenant="acme", task_id="t", tool_name="update_crm", idempotency_key="rw:1", args=args
        )
        seal_all()
        row = Attempt.objects.get()
        created = row.events.order_by("id").first()
        forged_digest = chain.args_digest(row.args_salt, {"amount": 1})
        rewrite_history(row, details={**created.details, "args_digest": forged_digest})
        forget_signer_state()
        log.sign_pending()
        receipt = ledger.receipt(attempt.attempt_id)
    LedgerClient.verify_receipt(receipt, verifier)  # a consistent, signed log...
    with pytest.raises(ReceiptError, match="does not commit to the arguments sent"):
        LedgerClient.verify_receipt(receipt, verifier, sent=_sent(attempt, args))
    LedgerClient.verify_receipt(receipt, verifier, sent=_sent(attempt, {"amount": 1}))
