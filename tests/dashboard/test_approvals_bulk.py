"""Bulk approve / reject in the approvals inbox (docs/approvals.md): several held calls decided
with one comment, each checked on its own as a single decision is (role, four eyes, the
recorder, state, what the page showed: version, arguments, policy version), with a result per
item; one refusal leaves the others decided and no item half-applied."""

from __future__ import annotations

import pytest
from django.test import Client

from attempts import review
from attempts.models import Approval, ApprovalPolicy, Attempt, AttemptEvent, State
from tests.dashboard.approvals_helpers import held_intent, hold_big_charges, login


@pytest.fixture
def held(world):
    hold_big_charges()
    ApprovalPolicy.objects.create(name="crm", tool_id="update_crm", approvals_needed=1)
    charges = [
        held_intent(world, f"charge:{tenant}:{n}", {"amount_cents": 200000 + n}, tenant=tenant)
        for n, tenant in ((1, "acme"), (2, "acme"), (3, "globex"))
    ]
    return [*charges, held_intent(world, "crm:acme:4", {"id": 4}, tool="update_crm")]


def pick(attempt, *, version=None, policy_version=None, args_hash=None):
    attempt.refresh_from_db()
    policy = ApprovalPolicy.objects.get(pk=attempt.approval_policy_id)
    return ":".join(
        str(part)
        for part in (
            attempt.attempt_id,
            version if version is not None else attempt.version,
            attempt.last_event_id(),
            args_hash or attempt.args_hash,
            policy_version if policy_version is not None else policy.version,
        )
    )


def bulk(client, picks, decision, comment=""):
    return client.post(
        "/approvals/bulk/",
        {"pick": picks, "decision": decision, "comment": comment, "tab": "all"},
        follow=True,
    )


def results(answer):
    return {r["attempt_id"]: (r["outcome"], r["message"]) for r in answer.context["bulk_results"]}


def snapshot():
    return (
        AttemptEvent.objects.count(),
        Approval.objects.count(),
        list(Attempt.objects.order_by("id").values_list("state", "version")),
    )


def test_approve_several_with_one_comment_and_a_result_each(world, held):
    charge1, charge2, _, crm = held
    answer = bulk(
        login(world, "reviewer"), [pick(charge1), pick(charge2), pick(crm)], "approve", "ok"
    )
    assert answer.status_code == 200
    got = results(answer)
    assert got[charge1.attempt_id][0] == got[charge2.attempt_id][0] == "recorded"
    assert "1 of 2" in got[charge1.attempt_id][1]
    assert got[crm.attempt_id][0] == "approved"
    assert Attempt.objects.get(pk=crm.pk).state == State.INTENT_RECORDED
    assert set(
        AttemptEvent.objects.filter(action="attempt.approval").values_list("reason", flat=True)
    ) == {"ok"}
    page = answer.content.decode()
    assert 'data-testid="bulk-results"' in page and 'data-outcome="recorded"' in page
    # The results are shown once.
    again = login(world, "reviewer").get("/approvals/")
    assert again.context["bulk_results"] is None


def test_four_eyes_hold_per_item(world, held):
    charge1, charge2, _, _ = held
    client = login(world, "reviewer")
    bulk(client, [pick(charge1)], "approve")
    before = snapshot()
    got = results(bulk(client, [pick(charge1)], "approve"))
    assert got[charge1.attempt_id][0] == "refused"
    assert "different person" in got[charge1.attempt_id][1]
    assert snapshot() == before
    got = results(bulk(login(world, "reviewer2"), [pick(charge1), pick(charge2)], "approve"))
    assert got[charge1.attempt_id][0] == "approved"
    assert got[charge2.attempt_id][0] == "recorded"


def test_a_stale_item_is_refused_and_the_others_are_decided(world, held):
    charge1, charge2, _, crm = held
    stale = pick(charge1)
    review.approve_held(charge1, user=world.reviewer2)  # someone else, meanwhile
    changed_policy = pick(crm, policy_version=7)
    other_args = pick(charge2, args_hash="0" * 64)
    before_charge1 = Attempt.objects.get(pk=charge1.pk).version
    got = results(bulk(login(world, "reviewer"), [stale, changed_policy, other_args], "approve"))
    assert got[charge1.attempt_id][0] == "refused"
    assert "reviewer2 approved it" in got[charge1.attempt_id][1]
    assert got[crm.attempt_id][0] == "refused" and "changed (version 7" in got[crm.attempt_id][1]
    assert (
        got[charge2.attempt_id][0] == "refused" and "other arguments" in got[charge2.attempt_id][1]
    )
    assert Attempt.objects.get(pk=charge1.pk).version == before_charge1
    assert Approval.objects.filter(approver=world.reviewer).count() == 0


def test_stale_and_fresh_together(world, held):
    charge1, charge2, _, _ = held
    stale = pick(charge1)
    review.approve_held(charge1, user=world.reviewer2)
    got = results(bulk(login(world, "reviewer"), [stale, pick(charge2)], "approve"))
    assert got[charge1.attempt_id][0] == "refused"
    assert got[charge2.attempt_id][0] == "recorded"
    assert list(
        Approval.objects.filter(approver=world.reviewer).values_list("attempt", flat=True)
    ) == [charge2.pk]


def test_reject_several_needs_one_reason(world, held):
    charge1, charge2, _, _ = held
    client = login(world, "reviewer")
    before = snapshot()
    answer = bulk(client, [pick(charge1), pick(charge2)], "reject", "  ")
    assert "reason must not be empty" in answer.content.decode()
    assert snapshot() == before
    got = results(bulk(client, [pick(charge1), pick(charge2)], "reject", "duplicate orders"))
    assert {outcome for outcome, _ in got.values()} == {"rejected"}
    for attempt in (charge1, charge2):
        attempt.refresh_from_db()
        assert (attempt.state, attempt.review_reason) == (State.FAILED, "approval_rejected")
        assert attempt.events.last().reason == "duplicate orders"


def test_another_tenants_item_is_not_found_and_changes_nothing(world, held):
    charge1, _, globex, _ = held
    got = results(bulk(login(world, "reviewer"), [pick(globex), pick(charge1)], "reject", "no"))
    assert got[globex.attempt_id] == ("refused", "not found")
    assert got[charge1.attempt_id][0] == "rejected"
    assert Attempt.objects.get(pk=globex.pk).state == State.AWAITING_APPROVAL


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_the_wrong_role_decides_nothing(world, held, who):
    charge1, charge2, _, crm = held
    before = snapshot()
    got = results(bulk(login(world, who), [pick(charge1), pick(crm)], "approve"))
    assert {outcome for outcome, _ in got.values()} == {"refused"}
    assert "reviewer role" in got[charge1.attempt_id][1]
    assert snapshot() == before


@pytest.mark.parametrize(
    "picks",
    [["nonsense"], ["att_x:1:2:3"], ["att_x:a:b:c:d"], [":::: "], ["x" * 5000 + ":1:1:a:1"]],
)
def test_malformed_items_are_refused_clearly(world, held, picks):
    before = snapshot()
    answer = bulk(login(world, "reviewer"), picks, "approve")
    assert answer.status_code == 200
    assert {outcome for outcome, _ in results(answer).values()} == {"refused"}
    assert snapshot() == before


def test_bad_requests_are_clear_4xx(world, held):
    client = login(world, "reviewer")
    assert (
        client.post("/approvals/bulk/", {"pick": [pick(held[0])], "decision": "x"}).status_code
        == 400
    )
    answer = client.post("/approvals/bulk/", {"decision": "approve"}, follow=True)
    assert "select at least one" in answer.content.decode()
    assert client.get("/approvals/bulk/").status_code == 405
    many = [pick(held[0])] * 101
    answer = client.post("/approvals/bulk/", {"pick": many, "decision": "approve"}, follow=True)
    assert "at most 100" in answer.content.decode()
    assert Approval.objects.count() == 0
    anonymous = Client().post("/approvals/bulk/", {"pick": [pick(held[0])], "decision": "approve"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_the_inbox_offers_a_checkbox_only_for_what_i_may_decide(world, held):
    page = login(world, "reviewer").get("/approvals/?tab=all").content.decode()
    assert page.count('data-testid="pick"') == 3  # acme's three; not globex's
    page = login(world, "operator").get("/approvals/?tab=all").content.decode()
    assert 'data-testid="pick"' not in page


def test_a_bulk_reject_without_a_reason_is_refused_and_keeps_the_selection(world, held):
    charge1, charge2, _, crm = held
    before = snapshot()
    answer = bulk(login(world, "reviewer"), [pick(charge1), pick(crm)], "reject", "  ")
    page = answer.content.decode()
    assert answer.status_code == 200 and "reason" in page
    assert snapshot() == before
    checked = {item["attempt"].attempt_id for item in answer.context["items"] if item.get("picked")}
    assert checked == {charge1.attempt_id, crm.attempt_id}
    assert page.count(" checked>") >= 2
    # Given the reason, the same selection is decided.
    got = results(bulk(login(world, "reviewer"), [pick(charge1), pick(crm)], "reject", "no"))
    assert {outcome for outcome, _ in got.values()} == {"rejected"}


def test_each_result_says_its_outcome_once(world, held):
    charge1, _, _, crm = held
    reviewer = login(world, "reviewer")
    got = results(bulk(reviewer, [pick(charge1), pick(crm)], "approve"))
    for outcome, message in got.values():
        assert outcome not in message, (outcome, message)
    got = results(bulk(login(world, "reviewer2"), [pick(charge1)], "reject", "too much"))
    outcome, message = got[charge1.attempt_id]
    assert outcome == "rejected" and "rejected" not in message and "FAILED" in message
