"""Approvals are one mechanism inside the tamper-evident history (issue 39, items 4, 9, 10;
protocol invariants 9 and 13): every approval is an event of the attempt's chain, which
approvals count is read from those events alone (a row beside them releases nothing), erasure
redacts an approval's comment like any free text, and the recorder of a token's intent is the
token and whoever issued it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from attempts import audit_verify, erasure, ledger, review, states
from attempts.locking import write_transaction
from attempts.models import (
    AgentToken,
    Approval,
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    Membership,
    Role,
    State,
)
from attempts.states import Actor
from attempts.verify_export import (
    ERASED_TEXT,
    GENESIS,
    approval_problems,
    event_hash,
    verify_file,
)
from tests.api.conftest import Api
from tests.attempts.test_audit_export import export, offline
from tests.conftest import _user, agent_intent
from tests.dashboard.approvals_helpers import held_intent, hold_big_charges, login

BIG = {"amount_cents": 250000, "currency": "EUR"}
COMMENT = "customer Zelda Quixote asked for 900.00 on the phone"


def insert_approval_row(attempt: Attempt, approver, policy: ApprovalPolicy) -> None:
    """What a database user can do without the ledger: one INSERT into the approvals table
    (no event, no move)."""
    Approval.index(attempt, approver, policy, timezone.now())


# ---------------------------------------------------------------------------------------------
# 4. Which approvals count is read from the chain


def test_an_approval_row_inserted_behind_the_ledger_releases_nothing(world):
    policy = hold_big_charges()
    attempt = held_intent(world, "charge:acme:row", BIG)
    insert_approval_row(attempt, world.reviewer2, policy)
    # One real approval of the two the critical charge needs: the row does not count as the other.
    review.approve_held(attempt, user=world.reviewer)
    assert Attempt.objects.get(pk=attempt.pk).state == State.AWAITING_APPROVAL
    verdict = attempt.approval_verdict()
    assert (verdict.valid, verdict.needed) == (("reviewer",), 2)
    _, sent = ledger.claim_dispatch(attempt.attempt_id, actor=world.agent)
    assert not sent
    # Nor can a move out of the hold be forced past the check: states decides from the events.
    with pytest.raises(states.ApprovalsNotValid), write_transaction():
        states.move(Attempt.objects.get(pk=attempt.pk), State.INTENT_RECORDED, actor=world.agent)


def test_every_decision_on_a_held_attempt_is_an_event_of_its_chain(world):
    hold_big_charges()
    approved = held_intent(world, "charge:acme:a", BIG)
    review.approve_held(approved, user=world.reviewer, comment="ok")
    review.approve_held(approved, user=world.reviewer2)
    rejected = held_intent(world, "charge:acme:r", BIG)
    review.reject_held(rejected, user=world.reviewer, reason="not this customer")
    actions = list(approved.events.order_by("id").values_list("action", "actor"))
    assert actions[1:] == [
        ("attempt.approval", "reviewer"),
        ("attempt.approval", "reviewer2"),
        ("attempt.approved", "reviewer2"),
    ]
    created = approved.events.order_by("id").first()
    assert created.details["hold"] == {
        "name": "big-charges",
        "version": 1,
        "needed": 2,
        "approver_rule": ApprovalPolicy.objects.get().approver_rule_digest(),
    }
    first = approved.events.filter(action="attempt.approval").first()
    assert first.details["kind"] == "held" and first.details["valid_until"]
    released = approved.events.get(action="attempt.approved")
    assert released.details["approvals"]["approvers"] == ["reviewer", "reviewer2"]
    assert released.details["approvals"]["needed"] == 2
    assert rejected.events.order_by("id").last().action == "attempt.approval_rejected"


def charge_in_review(world, key: str) -> Attempt:
    """A small charge the agent recorded, moved to MANUAL_REVIEW (where a linked retry is
    approved)."""
    attempt, _ = agent_intent(world, key, tool="charge_card", args={"amount_cents": 10})
    with write_transaction():
        states.move(attempt, State.MANUAL_REVIEW, actor=world.agent)
    return attempt


def test_a_linked_retrys_approvals_are_events_checked_by_the_state_machine(world):
    attempt = charge_in_review(world, "charge:acme:retry")
    # The critical tool needs two reviewers: no move out of review without their events.
    with pytest.raises(states.ApprovalsNotValid), write_transaction():
        states.move(attempt, State.RECONCILED, actor=Actor.user(world.reviewer))
    assert review.approve_linked_retry(attempt, user=world.reviewer) is None
    child = review.approve_linked_retry(attempt, user=world.reviewer2)
    assert child.state == State.INTENT_RECORDED
    approvals = attempt.events.filter(action="attempt.approval").values_list("actor", flat=True)
    assert list(approvals) == ["reviewer", "reviewer2"]
    moved = attempt.events.get(to_state=State.RECONCILED)
    assert moved.details["approvals"]["approvers"] == ["reviewer", "reviewer2"]


# ---------------------------------------------------------------------------------------------
# 9. Erasure redacts approval comments like other free text


def edited_and_settled(world) -> tuple[Attempt, Attempt]:
    """A held charge corrected by edit-and-approve with a comment, whose corrected attempt is
    then rejected: the lineage is settled and erasable."""
    hold_big_charges()
    held = held_intent(world, "charge:acme:erase", BIG)
    child = review.edit_and_approve(
        held, user=world.reviewer, args={**BIG, "amount_cents": 90000}, comment=COMMENT
    )
    review.reject_held(child, user=world.reviewer2, reason="customer withdrew")
    return Attempt.objects.get(pk=held.pk), Attempt.objects.get(pk=child.pk)


def second_admin(world):
    person = _user("admin2")
    Membership.objects.create(user=person, tenant=world.acme, role=Role.ADMIN)
    return person


def assert_comment_erased(held: Attempt, child: Attempt) -> None:
    for attempt in (held, child):
        assert Attempt.objects.get(pk=attempt.pk).args == {ERASED_TEXT: True}
    texts = AttemptEvent.objects.filter(attempt__in=[held, child]).values_list("reason", "details")
    assert not any("Zelda" in reason or "Zelda" in str(details) for reason, details in texts)
    approval = child.events.get(action="attempt.approval")
    assert approval.reason == ERASED_TEXT and approval.details["kind"] == "edit_and_approve"
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()


def test_erasure_of_an_edited_and_approved_lineage_redacts_the_comment(world):
    held, child = edited_and_settled(world)
    erasure.request_erasure(held, user=world.admin, reason="DSR-39")
    erasure.approve_erasure(held, user=second_admin(world))
    assert_comment_erased(held, child)


def test_erasure_through_the_attempt_page_with_an_approval_comment_is_no_500(world):
    held, child = edited_and_settled(world)
    url = f"/attempts/{held.attempt_id}/"
    login(world, "admin").post(f"{url}erasure/request/", {"reason": "DSR-39"})
    second = login(world, "admin")
    second.force_login(second_admin(world))
    response = second.post(f"{url}erasure/approve/", follow=True)
    assert response.status_code == 200
    assert "Erased" in response.content.decode()
    assert_comment_erased(held, child)


# ---------------------------------------------------------------------------------------------
# 10. The recorder of a token's intent is the token and whoever issued it


@pytest.fixture
def issued_by_reviewer(world, client):
    """An agent token the reviewer issued, and an API client that records with it."""
    token, raw = AgentToken.issue("agent-of-reviewer", ["acme"], created_by=world.reviewer)
    return Api(client, raw)


def api_intent(api: Api, key: str, tool: str, args: dict) -> Attempt:
    answer = api.intent(key, tool_name=tool, args=args)
    assert answer.status in (201, 202), answer.body
    return Attempt.objects.get(attempt_id=answer.body["attempt"]["attempt_id"])


def test_the_issuer_of_the_token_cannot_approve_what_it_recorded(world, issued_by_reviewer):
    hold_big_charges()
    attempt = api_intent(issued_by_reviewer, "charge:acme:tok", "charge_card", BIG)
    assert attempt.state == State.AWAITING_APPROVAL
    created = attempt.events.order_by("id").first()
    assert (created.actor, created.details["token_issuer"]) == ("agent-of-reviewer", "reviewer")
    assert attempt.recorders() == {"agent-of-reviewer", "reviewer"}
    policy = ApprovalPolicy.objects.get()
    allowed, why = review.may_decide_held(world.reviewer, attempt, policy)
    assert not allowed and "issued the agent token" in why
    for decide in (
        lambda: review.approve_held(attempt, user=world.reviewer),
        lambda: review.reject_held(attempt, user=world.reviewer, reason="mine"),
        lambda: review.edit_and_approve(
            attempt, user=world.reviewer, args={**BIG, "amount_cents": 1}
        ),
    ):
        with pytest.raises(ledger.NotAllowed):
            decide()
    # Nor is it in their inbox; two other people release it.
    page = login(world, "reviewer").get("/approvals/?tab=me").content.decode()
    assert attempt.attempt_id not in page
    review.approve_held(attempt, user=world.reviewer2)
    review.approve_held(attempt, user=world.admin)
    assert Attempt.objects.get(pk=attempt.pk).state == State.INTENT_RECORDED


def test_the_issuer_of_the_token_cannot_approve_a_linked_retry_of_it(world, issued_by_reviewer):
    attempt = api_intent(issued_by_reviewer, "ticket:acme:tok", "open_ticket", {"title": "t"})
    with write_transaction():
        states.move(attempt, State.MANUAL_REVIEW, actor=world.agent)
    with pytest.raises(ledger.NotAllowed):
        review.approve_linked_retry(attempt, user=world.reviewer)
    assert not attempt.events.filter(action="attempt.approval").exists()
    child = review.approve_linked_retry(attempt, user=world.reviewer2)
    assert child is not None and child.state == State.INTENT_RECORDED


# ---------------------------------------------------------------------------------------------
# 4. The verifiers check the approvals, online and offline, from the chain alone


def approvals_problems(report) -> list[str]:
    return [str(p) for p in report.problems if p.kind == "approvals"]


def released_charge(world) -> Attempt:
    hold_big_charges()
    attempt = held_intent(world, "charge:acme:verify", BIG)
    review.approve_held(attempt, user=world.reviewer, comment="known customer")
    review.approve_held(attempt, user=world.reviewer2)
    assert attempt.state == State.INTENT_RECORDED
    return attempt


def cut_event_and_relink(attempt: Attempt, event: AttemptEvent) -> None:
    """A database superuser deletes one event and recomputes the hashes of every event after it
    and the attempt's head, so every link and content check still holds (the attempt is not
    sealed yet: nothing outside the database knows its head)."""
    from tests.attempts.audit_helpers import drop_triggers, event_row, sql

    drop_triggers()
    sql("DELETE FROM attempts_attemptevent WHERE id = %s", [event.pk])
    prev = GENESIS
    ids = list(attempt.events.order_by("id").values_list("id", flat=True))
    for event_id in ids:
        row = event_row(event_id)
        row["prev_hash"] = prev
        prev = event_hash(row)
        sql(
            "UPDATE attempts_attemptevent SET prev_hash = %s, hash = %s WHERE id = %s",
            [row["prev_hash"], prev, event_id],
        )
    sql(
        "UPDATE attempts_attempt SET chain_head = %s, chain_length = %s WHERE id = %s",
        [prev, len(ids), attempt.pk],
    )


def test_an_honest_history_of_approvals_verifies_online_and_offline(world, tmp_path):
    released_charge(world)
    attempt = charge_in_review(world, "charge:acme:small")
    review.approve_linked_retry(attempt, user=world.reviewer)
    review.approve_linked_retry(attempt, user=world.reviewer2)
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()
    result = offline(export(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_approval_row_without_its_event_is_named_by_verify_audit(world):
    policy = hold_big_charges()
    attempt = held_intent(world, "charge:acme:row", BIG)
    insert_approval_row(attempt, world.reviewer2, policy)
    report = audit_verify.verify_django_database()
    found = approvals_problems(report)
    assert len(found) == 1 and attempt.attempt_id in found[0], report.render()
    assert "no approval event" in found[0] and "by reviewer2" in found[0]


def test_a_deleted_approval_event_is_reported_online_and_offline(world, tmp_path):
    attempt = released_charge(world)
    second = attempt.events.filter(action="attempt.approval").last()
    cut_event_and_relink(attempt, second)
    report = audit_verify.verify_django_database()
    assert [p.kind for p in report.problems] == ["approvals"] * 3, report.render()
    text = report.render()
    assert "1 valid approval(s) in the chain of the 2 required" in text
    assert "names reviewer2 as an approver" in text
    row = Approval.objects.get(attempt=attempt, approver=world.reviewer2).pk
    assert f"approval row {row} (by reviewer2) has no approval event" in text
    # The standalone verifier finds the same from the export alone.
    path = export(tmp_path)
    checked = verify_file(path)
    assert [p.kind for p in checked.problems] == ["approvals", "approvals"], checked.render()
    result = offline(path)
    assert result.returncode == 1 and "[approvals]" in result.stdout


def test_an_approval_by_the_tokens_issuer_is_reported_offline(world, tmp_path):
    """A superuser turns an approval into the token issuer's, rewriting its hashes: the
    recorder check applies offline, from the issuer the creation event recorded."""
    token, raw = AgentToken.issue("agent-of-admin", ["acme"], created_by=world.admin)
    hold_big_charges()
    from django.test import Client

    attempt = api_intent(Api(Client(), raw), "charge:acme:iss", "charge_card", BIG)
    review.approve_held(attempt, user=world.reviewer)
    review.approve_held(attempt, user=world.reviewer2)
    from tests.attempts.audit_helpers import drop_triggers, sql

    drop_triggers()
    sql(
        "UPDATE attempts_attemptevent SET actor = 'admin' WHERE attempt_id = %s "
        "AND action = 'attempt.approval' AND actor = 'reviewer2'",
        [attempt.pk],
    )
    cut_event_and_relink(attempt, AttemptEvent(pk=0))  # relink only: nothing to delete
    path = export(tmp_path)
    checked = verify_file(path)
    kinds = {p.kind for p in checked.problems}
    assert kinds == {"approvals"}, checked.render()
    assert "not counted: admin: a recorder of the intent" in checked.render()


# ---------------------------------------------------------------------------------------------
# Upgrading: approvals written before this release still count and still verify


def test_an_approval_event_written_before_valid_until_still_counts(world, tmp_path):
    """Before approvals were chain-only, an approval event kept its expiry and count among its
    private details (``expires_at``, ``needed``): the verdict and both verifiers read those."""
    hold_big_charges()
    attempt = held_intent(world, "charge:acme:old", BIG)
    policy = ApprovalPolicy.objects.get()
    now = timezone.now()
    with write_transaction():
        states.move(
            attempt,
            None,
            action="attempt.approval",
            actor=Actor.user(world.reviewer),
            details={
                "kind": "held",
                "args_hash": attempt.args_hash,
                "policy": policy.name,
                "policy_version": policy.version,
                "expires_at": (now + policy.approval_ttl).isoformat(),
                "approvals": 1,
                "needed": 2,
            },
        )
    assert attempt.approval_verdict().valid == ("reviewer",)
    review.approve_held(attempt, user=world.reviewer2)
    assert attempt.state == State.INTENT_RECORDED
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()
    assert offline(export(tmp_path)).returncode == 0


def test_a_linked_retry_approved_before_every_approval_was_an_event_verifies():
    """The old linked retry: the first reviewer's approval event (its count private), then the
    deciding reviewer's move itself, with no ``needed`` recorded on it."""

    def event(number, action, actor, move, details):
        return {
            "id": number,
            "action": action,
            "actor_kind": "agent" if number == 1 else "user",
            "actor": actor,
            "from_state": move[0],
            "to_state": move[1],
            "details": details,
            "created_at": f"2026-01-01T00:00:0{number}.000000Z",
        }

    def chain(second: str):
        return [
            event(1, "attempt.created", "agent-7", ("", "INTENT_RECORDED"), {"args_hash": "a"}),
            event(2, "attempt.dispatched", "agent-7", ("INTENT_RECORDED", "DISPATCHED"), {}),
            event(3, "attempt.manual_review", "agent-7", ("DISPATCHED", "MANUAL_REVIEW"), {}),
            event(
                4,
                "attempt.approval",
                "reviewer",
                ("MANUAL_REVIEW", "MANUAL_REVIEW"),
                {"kind": "linked_retry", "approvals": 1, "needed": 2},
            ),
            event(
                5,
                "attempt.linked_retry_approved",
                second,
                ("MANUAL_REVIEW", "RECONCILED"),
                {"linked_attempt_id": "att_x"},
            ),
        ]

    assert approval_problems(chain("reviewer2")) == []
    (problem,) = approval_problems(chain("reviewer"))
    assert problem[0] == 5 and "1 valid approval(s) in the chain of the 2 required" in problem[1]


def test_the_upgrade_fills_the_token_issuer_of_attempts_still_waiting(world):
    """Migration 0019's data step: an attempt a token recorded before the issuer was kept, still
    waiting for a decision, gets the token's issuer (as it is now); a settled one is left."""
    import importlib

    from django.apps import apps

    upgrade = importlib.import_module("attempts.migrations.0019_approvals_in_the_chain")
    AgentToken.issue("agent-old", ["acme"], created_by=world.reviewer)
    hold_big_charges()
    waiting = held_intent(world, "charge:acme:w", BIG)
    settled = held_intent(world, "charge:acme:s", BIG)
    review.reject_held(settled, user=world.reviewer2, reason="no")
    Attempt.objects.filter(pk__in=[waiting.pk, settled.pk]).update(recorded_by="agent-old")

    class Editor:
        connection = connection

    upgrade.fill_issuers(apps, Editor())
    assert Attempt.objects.get(pk=waiting.pk).recorded_by_issuer == "reviewer"
    assert Attempt.objects.get(pk=settled.pk).recorded_by_issuer == ""
    assert not review.may_decide_held(
        world.reviewer, Attempt.objects.get(pk=waiting.pk), ApprovalPolicy.objects.get()
    )[0]


def test_the_issuer_of_the_token_cannot_approve_a_correction_of_it(world, issued_by_reviewer):
    hold_big_charges()
    attempt = api_intent(issued_by_reviewer, "charge:acme:tok2", "charge_card", BIG)
    child = review.edit_and_approve(
        attempt, user=world.reviewer2, args={**BIG, "amount_cents": 120000}
    )
    assert child.recorders() == {"agent-of-reviewer", "reviewer"}
    created = child.events.order_by("id").first()
    assert created.details["recorders"] == ["agent-of-reviewer", "reviewer"]
    page = login(world, "reviewer").get("/approvals/?tab=me").content.decode()
    assert child.attempt_id not in page
    with pytest.raises(ledger.NotAllowed):
        review.approve_held(child, user=world.reviewer)
    review.approve_held(child, user=world.admin)
    assert Attempt.objects.get(pk=child.pk).state == State.INTENT_RECORDED
