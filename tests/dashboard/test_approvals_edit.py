"""Edit-and-approve (protocol section 11, docs/approvals.md): an approver corrects a held call's
arguments after seeing what differs; the original becomes RECONCILED and points to a linked
attempt with the corrected arguments (same tenant, tool, scopes and policy version), approved by
the editor, and a second person is still needed where the policy says two. Bad input is a clear
answer that changes nothing, never a 500."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from attempts import ledger, review
from attempts.canonical import normalize_args
from attempts.models import (
    AgentToken,
    Approval,
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    Grant,
    State,
)
from tests.dashboard.approvals_helpers import held_intent, hold_big_charges, login

ORIGINAL = {"amount_cents": 250000, "currency": "EUR", "card_number": "4242424242424242"}


@pytest.fixture
def held(world):
    hold_big_charges()
    return held_intent(world, "charge:acme:order-7", ORIGINAL)


def url(attempt):
    return f"/approvals/{attempt.attempt_id}/edit/"


def form(attempt, args, **extra):
    attempt.refresh_from_db()
    policy = ApprovalPolicy.objects.get(pk=attempt.approval_policy_id)
    return {
        "expected_version": attempt.version,
        "seen_event": attempt.last_event_id(),
        "args_hash": attempt.args_hash,
        "policy_version": policy.version,
        "args": args if isinstance(args, str) else json.dumps(args),
        **extra,
    }


def preview_and_confirm(client, attempt, args, **extra):
    page = client.post(url(attempt), form(attempt, args, step="preview", **extra))
    assert page.status_code == 200, page.content.decode()[:2000]
    hash_ = page.context["preview"]["args_hash"]
    return client.post(
        url(attempt), form(attempt, args, step="confirm", preview_hash=hash_, **extra)
    )


def snapshot():
    return (
        Attempt.objects.count(),
        AttemptEvent.objects.count(),
        Approval.objects.count(),
        list(Attempt.objects.order_by("id").values_list("state", "version")),
    )


def corrected(amount=90000):
    # What a person types over the page's redacted copy: the secret left as shown.
    return {"amount_cents": amount, "currency": "EUR", "card_number": "•••• redacted ••••"}


def test_the_editor_shows_the_arguments_with_secrets_redacted(world, held):
    page = login(world, "reviewer").get(url(held))
    text = page.content.decode()
    assert page.status_code == 200
    assert 'data-testid="args-editor"' in text and "250000" in text
    assert "4242424242424242" not in text


def test_preview_shows_what_differs_and_changes_nothing(world, held):
    before = snapshot()
    page = login(world, "reviewer").post(url(held), form(held, corrected(), step="preview"))
    assert page.status_code == 200
    rows = {r["field"]: (r["before"], r["after"]) for r in page.context["diff"]["rows"]}
    assert rows["args.amount_cents"] == ("250000", "90000")
    assert "args.card_number" not in rows  # kept as it was
    assert rows["Idempotency key"] == ("charge:acme:order-7", "charge:acme:order-7~r1")
    assert "Yours is 1 of 2" in page.content.decode()
    assert snapshot() == before


def test_confirm_links_a_corrected_attempt_approved_by_the_editor(world, held):
    answer = preview_and_confirm(login(world, "reviewer"), held, corrected(), comment="typo")
    assert answer.status_code == 302
    held.refresh_from_db()
    child = Attempt.objects.get(parent=held)
    assert held.state == State.RECONCILED
    assert answer["Location"] == f"/attempts/{child.attempt_id}/"
    assert child.state == State.AWAITING_APPROVAL  # charge_card is critical: two approvals
    assert child.args == {**ORIGINAL, "amount_cents": 90000}
    assert child.args_hash != held.args_hash
    assert (child.tenant_id, child.tool_name, child.task_id) == (
        "acme",
        "charge_card",
        held.task_id,
    )
    assert (child.credential_scope, child.policy_version) == (
        held.credential_scope,
        held.policy_version,
    )
    assert child.idempotency_key == "charge:acme:order-7~r1"
    assert child.approval_policy_id == "big-charges"
    approval = Approval.objects.get(attempt=child)
    assert (approval.approver, approval.args_hash) == (world.reviewer, child.args_hash)
    # The comment is the approval event's reason: the record that counts.
    event = child.events.get(action="attempt.approval")
    assert (event.actor, event.reason, event.details["kind"]) == (
        "reviewer",
        "typo",
        "edit_and_approve",
    )
    assert not Approval.objects.filter(attempt=held).exists()
    moved = held.events.get(to_state=State.RECONCILED)
    assert moved.action == "attempt.edited_and_approved" and moved.actor == "reviewer"
    assert moved.details["linked_attempt_id"] == child.attempt_id
    created = child.events.order_by("id").first()
    assert created.details["edited_from"] == held.attempt_id
    assert created.details["original_args_hash"] == held.args_hash
    assert list(child.events.values_list("action", flat=True)) == [
        "attempt.created",
        "attempt.approval",
    ]


def test_a_second_person_not_the_editor_releases_the_corrected_call(world, held):
    preview_and_confirm(login(world, "reviewer"), held, corrected())
    child = Attempt.objects.get(parent=held)
    with pytest.raises(ledger.NotAllowed):
        review.approve_held(child, user=world.reviewer)
    page = login(world, "reviewer").get("/approvals/?tab=me").content.decode()
    assert child.attempt_id not in page
    page = login(world, "reviewer2").get("/approvals/?tab=me").content.decode()
    assert f'data-attempt="{child.attempt_id}"' in page
    assert "Corrected by <strong>reviewer</strong>" in page and "90000" in page
    # Before the second approval the claim is refused (the worker claims the same way).
    _, sent = ledger.claim_dispatch(child.attempt_id, actor=world.agent)
    assert not sent
    review.approve_held(child, user=world.reviewer2)
    assert child.state == State.INTENT_RECORDED
    claimed, sent = ledger.claim_dispatch(child.attempt_id, actor=world.agent)
    assert sent and claimed.args["amount_cents"] == 90000
    # The original can never be claimed.
    _, sent = ledger.claim_dispatch(held.attempt_id, actor=world.agent)
    assert not sent


def test_one_approval_policy_sends_the_corrected_call_on_confirm(world):
    ApprovalPolicy.objects.create(name="crm", tool_id="update_crm", approvals_needed=1)
    attempt = held_intent(world, "crm:1", {"id": 1, "name": "Acme"}, tool="update_crm")
    answer = preview_and_confirm(login(world, "reviewer"), attempt, {"id": 1, "name": "ACME"})
    assert answer.status_code == 302
    child = Attempt.objects.get(parent=attempt)
    assert child.state == State.INTENT_RECORDED
    assert child.next_check_at is not None


def test_the_api_shows_the_link_so_a_waiting_agent_can_follow_it(world, held):
    _, raw = AgentToken.issue("agent-acme", ["acme"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    before = api.get(f"/api/v1/attempts/{held.attempt_id}").json()["attempt"]
    assert before["linked_attempt_id"] is None
    preview_and_confirm(login(world, "reviewer"), held, corrected())
    child = Attempt.objects.get(parent=held)
    after = api.get(f"/api/v1/attempts/{held.attempt_id}?wait=5").json()["attempt"]
    assert (after["state"], after["linked_attempt_id"]) == ("RECONCILED", child.attempt_id)
    linked = api.get(f"/api/v1/attempts/{child.attempt_id}").json()["attempt"]
    assert linked["parent_attempt_id"] == held.attempt_id
    assert linked["state"] == "AWAITING_APPROVAL" and linked["args"]["amount_cents"] == 90000


def test_confirming_twice_makes_one_linked_attempt(world, held):
    client = login(world, "reviewer")
    page = client.post(url(held), form(held, corrected(), step="preview"))
    data = form(
        held, corrected(), step="confirm", preview_hash=page.context["preview"]["args_hash"]
    )
    assert client.post(url(held), data).status_code == 302
    before = snapshot()
    child = review.edit_and_approve(
        held.attempt_id, user=world.reviewer, args={**ORIGINAL, "amount_cents": 90000}
    )
    assert child == Attempt.objects.get(parent=held)
    assert snapshot() == before


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        ('{"amount_cents": 90000,', 422, "not valid JSON"),
        ("[1, 2]", 422, "must be a JSON object"),
        ('{"amount_cents": 1e300}', 422, "interoperable range"),
        (json.dumps(ORIGINAL), 422, "same as the original"),
        ('{"amount_cents": 9007199254740993}', 422, "interoperable range"),
        ('{"a": ' + "[" * 40 + "]" * 40 + "}", 422, "nest deeper than 32"),
        ('{"a": ' + "[" * 200000 + "]" * 200000 + "}", 422, "nest too deeply"),
        ('{"note": "' + "x" * 70000 + '"}', 422, "the limit is"),
    ],
    ids=[
        "invalid-json",
        "not-an-object",
        "huge-number",
        "unchanged",
        "unsafe-integer",
        "too-deep",
        "far-too-deep",
        "too-large",
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(world, held, args, status, says):
    client = login(world, "reviewer")
    before = snapshot()
    for step in ("preview", "confirm"):
        answer = client.post(url(held), form(held, args, step=step, preview_hash="x"))
        assert answer.status_code == status
        assert says in answer.content.decode()
    assert snapshot() == before


def test_a_nul_character_is_a_clear_400(world, held):
    before = snapshot()
    answer = login(world, "reviewer").post(url(held), form(held, '{"a": "\x00"}', step="preview"))
    assert answer.status_code == 400
    assert snapshot() == before


def test_arguments_other_than_the_previewed_ones_are_refused(world, held):
    client = login(world, "reviewer")
    before = snapshot()
    page = client.post(url(held), form(held, corrected(90000), step="preview"))
    shown = page.context["preview"]["args_hash"]
    answer = client.post(
        url(held), form(held, corrected(80000), step="confirm", preview_hash=shown)
    )
    assert answer.status_code == 409 and "preview them again" in answer.content.decode()
    answer = client.post(url(held), form(held, corrected(80000), step="confirm"))
    assert answer.status_code == 409
    assert snapshot() == before


def test_a_stale_form_is_refused(world, held):
    client = login(world, "reviewer")
    data = form(held, corrected(), step="confirm")
    review.approve_held(held, user=world.reviewer2)  # someone approved meanwhile
    before = snapshot()
    page = client.post(url(held), {**data, "step": "preview"})
    data["preview_hash"] = page.context["preview"]["args_hash"] if page.context else "x"
    answer = client.post(url(held), data)
    assert answer.status_code == 409 and "reviewer2 approved it" in answer.content.decode()
    assert snapshot() == before


def test_a_changed_policy_is_refused(world, held):
    client = login(world, "reviewer")
    data = form(held, corrected(), step="preview")
    page = client.post(url(held), data)
    policy = ApprovalPolicy.objects.get(name="big-charges")
    policy.approvals_needed = 3
    policy.save()
    before = snapshot()
    data.update(step="confirm", preview_hash=page.context["preview"]["args_hash"])
    answer = client.post(url(held), data)
    assert answer.status_code == 409 and "changed (version 1 → 2)" in answer.content.decode()
    assert snapshot() == before


def test_the_scope_never_widens_and_a_narrowed_grant_refuses(world, held):
    grant = Grant.objects.get(tenant_id="acme", tool_id="charge_card")
    grant.allowed_scopes = [*grant.allowed_scopes, "charge_card:refund"]
    grant.save()
    # A tampered form asking for more scope: the form has no such field, nothing reads it.
    preview_and_confirm(
        login(world, "reviewer"), held, corrected(), credential_scope="charge_card:refund"
    )
    child = Attempt.objects.get(parent=held)
    assert child.credential_scope == held.credential_scope
    assert "charge_card:refund" not in child.credential_scope


def test_a_narrowed_grant_refuses_the_correction(world, held):
    grant = Grant.objects.get(tenant_id="acme", tool_id="charge_card")
    grant.allowed_scopes = ["charge_card:read"]
    grant.save()
    before = snapshot()
    client = login(world, "reviewer")
    shown = normalize_args({**ORIGINAL, "amount_cents": 90000}).args_hash
    for step in ("preview", "confirm"):
        answer = client.post(url(held), form(held, corrected(), step=step, preview_hash=shown))
        assert answer.status_code == 409 and "Authority changed since" in answer.content.decode()
    with pytest.raises(ledger.StateConflict, match="authority changed"):
        review.edit_and_approve(held, user=world.reviewer, args=corrected(1))
    assert snapshot() == before


def test_a_stricter_policy_for_the_corrected_arguments_holds_the_linked_attempt(world, held):
    ApprovalPolicy.objects.create(
        name="huge-charges",
        tool_id="charge_card",
        condition="args.amount_cents > 1000000",
        approvals_needed=3,
    )
    preview_and_confirm(login(world, "reviewer"), held, corrected(5000000))
    child = Attempt.objects.get(parent=held)
    assert child.approval_policy_id == "huge-charges"
    assert child.approval_verdict(child.created_at).needed == 3


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_the_wrong_role_is_refused(world, held, who):
    client = login(world, who)
    before = snapshot()
    assert client.get(url(held)).status_code == 403
    page = client.post(url(held), form(held, corrected(), step="confirm", preview_hash="x"))
    assert page.status_code == 403 and "reviewer role" in page.content.decode()
    assert snapshot() == before


def test_another_tenants_attempt_is_not_found_and_login_is_needed(world, held):
    before = snapshot()
    outsider = login(world, "outsider")
    assert outsider.get(url(held)).status_code == 404
    assert outsider.post(url(held), form(held, corrected(), step="confirm")).status_code == 404
    anonymous = Client().get(url(held))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert Client().post(url(held), form(held, corrected())).status_code == 302
    assert snapshot() == before


def test_only_held_attempts_can_be_edited(world, held):
    review.reject_held(held, user=world.reviewer2, reason="fraud")
    before = snapshot()
    client = login(world, "reviewer")
    answer = client.get(url(held))
    assert answer.status_code == 302
    answer = client.post(url(held), form(held, corrected(), step="confirm"))
    assert answer.status_code == 302
    assert snapshot() == before
    assert "not held" in str(list(answer.wsgi_request._messages))


def test_the_detail_page_offers_edit_and_approve_to_approvers_only(world, held):
    page = login(world, "reviewer").get(f"/attempts/{held.attempt_id}/").content.decode()
    assert f'href="/approvals/{held.attempt_id}/edit/"' in page
    page = login(world, "operator").get(f"/attempts/{held.attempt_id}/").content.decode()
    assert 'data-testid="held-actions"' not in page


def test_the_other_approvers_are_told_of_the_corrected_call_and_the_editor_is_not(world, held):
    from attempts import notify

    preview_and_confirm(login(world, "reviewer"), held, corrected())
    child = Attempt.objects.get(parent=held)
    told = {
        draft.recipient.get_username()
        for event in child.events.order_by("id")
        for draft in notify.drafts_for(event, child)
    }
    assert "reviewer2" in told and "reviewer" not in told


@pytest.mark.django_db(transaction=True)
def test_two_people_correcting_at_once_make_one_linked_attempt(monkeypatch):
    """Both read the held attempt before either writes (on PostgreSQL; SQLite's one writer
    lets the second read only after the first committed): one wins, the other is told the
    attempt is RECONCILED now, and nothing else is written."""
    import threading

    from tests.conftest import make_world

    world = make_world()
    hold_big_charges()
    attempt = held_intent(world, "charge:acme:race", ORIGINAL)
    both_read = threading.Barrier(2, timeout=3)
    real = review._edit_authority

    def after_reading(current):
        try:
            both_read.wait()
        except threading.BrokenBarrierError:
            pass  # SQLite: the other is waiting for the write lock
        return real(current)

    monkeypatch.setattr(review, "_edit_authority", after_reading)
    outcomes: dict[str, object] = {}

    def correct(person, amount):
        from django.db import connection

        try:
            outcomes[person.username] = review.edit_and_approve(
                attempt.attempt_id, user=person, args={**ORIGINAL, "amount_cents": amount}
            )
        except Exception as exc:  # noqa: BLE001 (the test reports what it was)
            outcomes[person.username] = exc
        finally:
            connection.close()

    threads = [
        threading.Thread(target=correct, args=(world.reviewer, 90000)),
        threading.Thread(target=correct, args=(world.admin, 80000)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    won = [o for o in outcomes.values() if isinstance(o, Attempt)]
    lost = [o for o in outcomes.values() if not isinstance(o, Attempt)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], ledger.StateConflict), repr(lost[0])
    assert "RECONCILED" in lost[0].message
    assert Attempt.objects.filter(parent__attempt_id=attempt.attempt_id).count() == 1
    assert Approval.objects.count() == 1
