"""Erasure: four eyes (an admin asks with a reason, another admin approves), the plaintext and the
salt gone, an event that says who, why, when and which fields, and every chain, checkpoint,
export and receipt still verifying; older chain formats refused with the reason."""

from __future__ import annotations

import json

import pytest
from django.db import DatabaseError, connection, transaction

from attempts import (
    audit_verify,
    chain,
    erasure,
    history_guard,
    ledger,
    linked,
    log,
    review,
    verify_export,
)
from attempts.ledger import AttemptNotFound, InvalidIntent, NotAllowed
from attempts.locking import write_transaction
from attempts.models import (
    Attempt,
    AttemptEvent,
    ErasureRequest,
    Membership,
    Role,
    State,
)
from attempts.states import Actor, move
from attempts.verify_export import ERASED_ARGS, ERASED_TEXT
from ledgerweb_client.receipts import verify_receipt
from tests.attempts.audit_helpers import seal_all, sign_with_new_key, sql
from tests.attempts.test_audit_export import export, offline
from tests.conftest import _user, agent_intent
from tests.dashboard.conftest import login

SECRET = "Zelda-Quixote-7731@private.example"
NOTE = "Called Zelda Quixote at +44 7700 900431"
REFUSAL = "card declined for Zelda Quixote"


def settled_attempt(world, *, key: str = "erase:acme:1", tool: str = "update_crm") -> Attempt:
    """An attempt with personal data in its args, a note, a provider refusal and a reviewer's
    reason: FAILED, so settled."""
    attempt, _ = agent_intent(
        world, key, tool=tool, args={"to": SECRET, "amount": 12}, task="task-erase"
    )
    attempt, _ = ledger.claim_dispatch(attempt, actor=world.agent)
    # One provider effect per attempt (protocol section 7, invariant 12).
    attempt = ledger.attach_provider_request(attempt, f"req-{key}", actor=world.agent)
    review.add_note(attempt, user=world.operator, text=NOTE)
    ledger.fail(attempt, reason=REFUSAL, retryable=False, actor=world.agent)
    return Attempt.objects.get(pk=attempt.pk)


def second_admin(world):
    person = _user("admin2")
    Membership.objects.create(user=person, tenant=world.acme, role=Role.ADMIN)
    return person


def erase(world, attempt: Attempt, approver) -> Attempt:
    erasure.request_erasure(attempt, user=world.admin, reason="data subject request DSR-17")
    return erasure.approve_erasure(attempt, user=approver)


def stored_text(attempt: Attempt) -> str:
    """Everything the ledger keeps of one attempt, as text."""
    parts = [json.dumps(Attempt.objects.filter(pk=attempt.pk).values().get(), default=str)]
    parts += [
        json.dumps(row, default=str)
        for row in AttemptEvent.objects.filter(attempt=attempt).values()
    ]
    return "\n".join(parts)


@pytest.fixture
def key_file(tmp_path, settings):
    return str(sign_with_new_key(tmp_path, settings)[1])


def test_erasure_removes_the_plaintext_and_everything_still_verifies(world, key_file, tmp_path):
    attempt = settled_attempt(world)
    other = settled_attempt(world, key="erase:acme:2")
    assert attempt.events.first().chain_format == verify_export.SALTED_FORMAT
    seal_all()
    before = log.receipt(Attempt.objects.get(pk=attempt.pk))
    verify_receipt(before, key_file)
    assert SECRET in stored_text(attempt) and NOTE in stored_text(attempt)

    erased = erase(world, attempt, second_admin(world))

    assert erased.args == ERASED_ARGS
    text = stored_text(attempt)
    for plaintext in (SECRET, NOTE, REFUSAL, "Zelda"):
        assert plaintext not in text
    assert SECRET in stored_text(other)  # only that attempt
    events = list(attempt.events.order_by("id"))
    assert all(e.reason == ERASED_TEXT for e in events[:-1])
    last = events[-1]
    assert last.action == "attempt.erased" and last.actor == "admin2"
    assert last.reason == "data subject request DSR-17"
    record = last.details["erasure"]
    assert record["requested_by"] == "admin" and record["approved_by"] == "admin2"
    assert {"args", "salt", "reason"} <= set(record["fields"])
    assert record["lineage"] == [attempt.attempt_id]
    # What the history still says in the clear: who, when, states, ids.
    assert [e.to_state for e in events][:4] == [
        State.INTENT_RECORDED,
        State.DISPATCHED,
        State.DISPATCHED,
        State.DISPATCHED,
    ]
    assert events[0].details["tenant"] == "acme" and "args_hash" not in events[0].details
    assert erased.args_hash == attempt.args_hash  # kept for idempotency (docs/privacy.md)
    request = ErasureRequest.objects.get(attempt=attempt)
    assert (request.status, request.decided_by.username) == ("erased", "admin2")

    report = audit_verify.verify_django_database()
    assert report.ok, report.render()
    seal_all()
    report = audit_verify.verify_django_database(max_unsealed_seconds=0)
    assert report.ok, report.render()
    # The receipt from before still verifies, and the new one too.
    verify_receipt(before, key_file)
    after = log.receipt(Attempt.objects.get(pk=attempt.pk))
    verify_receipt(after, key_file)
    assert after["leaf"]["length"] == before["leaf"]["length"] + 1
    # The standalone verifier, with no Django, on an export of everything.
    path = export(tmp_path)
    mine = [line for line in path.read_text().splitlines() if attempt.attempt_id in line]
    assert len(mine) > len(events) and not any(SECRET in x or NOTE in x for x in mine)
    result = offline(path, "--log-key", key_file)
    assert result.returncode == 0, result.stdout + result.stderr
    csv_path = export(tmp_path, "csv")
    result = offline(csv_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The same key with the same args is still the same intent (idempotency).
    again, created = agent_intent(
        world,
        "erase:acme:1",
        tool="update_crm",
        args={"to": SECRET, "amount": 12},
        task="task-erase",
    )
    assert not created and again.pk == attempt.pk


def test_the_standalone_verifier_checks_free_text_against_its_salted_digest(world, tmp_path):
    attempt = settled_attempt(world)
    path = export(tmp_path)
    assert offline(path).returncode == 0
    edited = path.read_text().replace(NOTE, "Called nobody")
    path.write_text(edited)
    report = verify_export.verify_file(path)
    assert not report.ok
    assert report.problems[0].kind == "content" and "free text" not in str(report.problems[0])
    assert report.problems[0].attempt_id == attempt.attempt_id


def test_four_eyes_the_same_admin_cannot_approve_their_own_request(world):
    attempt = settled_attempt(world)
    erasure.request_erasure(attempt, user=world.admin, reason="DSR-18")
    with pytest.raises(NotAllowed, match="four eyes"):
        erasure.approve_erasure(attempt, user=world.admin)
    assert Attempt.objects.get(pk=attempt.pk).args["to"] == SECRET
    with pytest.raises(erasure.NotErasable, match="already waits"):
        erasure.request_erasure(attempt, user=second_admin(world), reason="again")


@pytest.mark.parametrize("name", ["viewer", "operator", "reviewer", "outsider"])
def test_only_admins_of_the_tenant_ask_or_approve(world, name):
    attempt = settled_attempt(world)
    person = getattr(world, name)
    with pytest.raises(NotAllowed, match="admin"):
        erasure.request_erasure(attempt, user=person, reason="DSR-19")
    erasure.request_erasure(attempt, user=world.admin, reason="DSR-19")
    with pytest.raises(NotAllowed, match="admin"):
        erasure.approve_erasure(attempt, user=person)
    assert Attempt.objects.get(pk=attempt.pk).args["to"] == SECRET
    # Another tenant's attempt is not found at all, when asked within one's tenants.
    with pytest.raises(AttemptNotFound):
        erasure.request_erasure(attempt, user=world.outsider, reason="x", tenants={"globex"})


def test_bad_input_is_refused_clearly_and_changes_nothing(world):
    attempt = settled_attempt(world)
    for reason, message in (("   ", "must not be empty"), (None, "must be a string")):
        with pytest.raises(InvalidIntent, match=message):
            erasure.request_erasure(attempt, user=world.admin, reason=reason)
    with pytest.raises(InvalidIntent, match="marker"):
        erasure.request_erasure(attempt, user=world.admin, reason=ERASED_TEXT)
    with pytest.raises(InvalidIntent, match="longer than"):
        erasure.request_erasure(attempt, user=world.admin, reason="x" * 5000)
    with pytest.raises(AttemptNotFound):
        erasure.request_erasure("att_nope", user=world.admin, reason="DSR")
    with pytest.raises(erasure.NotErasable, match="no erasure"):
        erasure.approve_erasure(attempt, user=world.admin)
    assert not ErasureRequest.objects.exists()
    assert Attempt.objects.get(pk=attempt.pk).args["to"] == SECRET


def test_live_attempts_and_older_chain_formats_are_refused_with_the_reason(world, monkeypatch):
    live, _ = agent_intent(world, "erase:live", tool="update_crm", args={"to": SECRET})
    with pytest.raises(erasure.NotErasable, match="only a settled attempt"):
        erasure.request_erasure(live, user=world.admin, reason="DSR")
    # An attempt recorded before format 3 (no salt): its chain hashes its free text itself.
    monkeypatch.setattr(chain, "new_salt", lambda: "")
    old = settled_attempt(world, key="erase:old")
    assert {e.chain_format for e in old.events.all()} == {verify_export.CHAIN_FORMAT}
    with pytest.raises(erasure.NotErasable, match="hashes its free text itself"):
        erasure.request_erasure(old, user=world.admin, reason="DSR")
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()


def test_a_lineage_is_erased_together(world):
    # A linked attempt carries its original's arguments.
    parent, _ = agent_intent(world, "erase:lineage:parent", tool="open_ticket", args={"to": SECRET})
    parent, _ = ledger.claim_dispatch(parent, actor=world.agent)
    ledger.mark_unknown(parent, reason="timeout", actor=world.agent)
    child = linked.create_linked_attempt(
        Attempt.objects.get(pk=parent.pk), actor=Actor.worker("w"), reason="authority changed"
    )
    with write_transaction():
        move(child, State.FAILED, actor=Actor.worker("w"), reason="given up")
    erased = erase(world, Attempt.objects.get(pk=parent.pk), second_admin(world))
    assert erased.args == ERASED_ARGS
    assert Attempt.objects.get(pk=child.pk).args == ERASED_ARGS
    assert SECRET not in stored_text(child)
    assert child.events.last().details["erasure"]["lineage"] == sorted(
        [parent.attempt_id, child.attempt_id]
    )
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()


def test_tampering_after_erasure_is_still_seen(world):
    attempt = settled_attempt(world)
    erase(world, attempt, second_admin(world))
    seal_all()
    created = attempt.events.order_by("id").first()
    history_guard.remove(connection)
    try:
        details = {**created.details, "tenant": "globex"}
        sql(
            "UPDATE attempts_attemptevent SET details = %s WHERE id = %s",
            [json.dumps(details), created.pk],
        )
        sql("UPDATE attempts_attempt SET args = %s WHERE id = %s", ['{"to": "x"}', attempt.pk])
        report = audit_verify.verify_django_database()
    finally:
        history_guard.install(connection)
    kinds = {(p.kind, p.event_id) for p in report.problems}
    assert ("content", created.pk) in kinds, report.render()
    assert any("has args again" in p.message for p in report.problems), report.render()


def test_the_database_refuses_any_other_change_of_an_event(world):
    attempt = settled_attempt(world)
    event = attempt.events.order_by("id").first()
    for statement, params in (
        ("UPDATE attempts_attemptevent SET reason = %s WHERE id = %s", ["edited", event.pk]),
        (
            "UPDATE attempts_attemptevent SET reason = %s, hash = %s WHERE id = %s",
            [ERASED_TEXT, "0" * 64, event.pk],
        ),
        (
            "UPDATE attempts_attemptevent SET reason = %s, text_digest = %s WHERE id = %s",
            [ERASED_TEXT, "0" * 64, event.pk],
        ),
        ("DELETE FROM attempts_attemptevent WHERE id = %s", [event.pk]),
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            sql(statement, params)
    assert AttemptEvent.objects.get(pk=event.pk).hash == event.hash


# ---------------------------------------------------------------------------------------------
# The dashboard action


def test_the_attempt_page_offers_erasure_to_admins_only_and_runs_four_eyes(world):
    attempt = settled_attempt(world)
    url = f"/attempts/{attempt.attempt_id}/"
    admin2 = second_admin(world)
    assert b'data-testid="erasure"' not in login(world.reviewer).get(url).content
    page = login(world.admin).get(url).content.decode()
    assert 'data-testid="erasure"' in page and "Request erasure" in page
    # A reviewer posting the form is refused; nothing is asked.
    response = login(world.reviewer).post(f"{url}erasure/request/", {"reason": "DSR"})
    assert response.status_code == 302 and not ErasureRequest.objects.exists()
    # Bad input: a clear message, nothing asked.
    response = login(world.admin).post(f"{url}erasure/request/", {"reason": " "}, follow=True)
    assert "must not be empty" in response.content.decode()
    assert not ErasureRequest.objects.exists()
    login(world.admin).post(f"{url}erasure/request/", {"reason": "DSR-20"})
    assert ErasureRequest.objects.get().status == "pending"
    page = login(world.admin).get(url).content.decode()
    assert "A different admin must approve" in page and "erasure-approve" not in page
    response = login(world.admin).post(f"{url}erasure/approve/", follow=True)
    assert "four eyes" in response.content.decode()
    assert Attempt.objects.get(pk=attempt.pk).args["to"] == SECRET
    second = login(admin2)
    assert 'data-testid="erasure-approve"' in second.get(url).content.decode()
    response = second.post(f"{url}erasure/approve/", follow=True)
    assert "Erased" in response.content.decode()
    assert Attempt.objects.get(pk=attempt.pk).args == ERASED_ARGS
    page = second.get(url).content.decode()
    assert SECRET not in page and NOTE not in page and "already erased" in page
    # Another tenant's admin: 404, and GET on an action: 405.
    outsider = login(world.outsider)
    assert outsider.post(f"{url}erasure/request/", {"reason": "x"}).status_code == 404
    assert outsider.post(f"{url}erasure/approve/").status_code == 404
    assert second.get(f"{url}erasure/approve/").status_code == 405


def test_a_request_can_be_withdrawn(world):
    attempt = settled_attempt(world)
    url = f"/attempts/{attempt.attempt_id}/"
    client = login(world.admin)
    client.post(f"{url}erasure/request/", {"reason": "DSR-21"})
    client.post(f"{url}erasure/cancel/")
    assert ErasureRequest.objects.get().status == "cancelled"
    response = client.post(f"{url}erasure/cancel/", follow=True)
    assert "no erasure" in response.content.decode()


def test_text_written_after_an_erasure_can_be_erased_again(world):
    attempt = settled_attempt(world)
    admin2 = second_admin(world)
    erase(world, attempt, admin2)
    with pytest.raises(erasure.NotErasable, match="already erased"):
        erasure.request_erasure(attempt, user=world.admin, reason="again")
    review.add_note(attempt, user=world.operator, text=f"mail from {SECRET}")
    assert SECRET in stored_text(attempt)
    assert audit_verify.verify_django_database().ok
    erase(world, attempt, admin2)
    assert SECRET not in stored_text(attempt)
    assert attempt.events.filter(action="attempt.erased").count() == 2
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()
