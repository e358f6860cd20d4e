"""Actions: the role matrix, history with the acting user, required evidence and reasons,
linked retries with a preview and four eyes for critical tools, and the two-reviewer race."""

from __future__ import annotations

import threading

import pytest
from django.test import Client

from attempts.models import Attempt, Grant, State
from tests.conftest import PASSWORD
from tests.dashboard.conftest import login, make_awaiting, make_review, make_unknown

ROLES = ["viewer", "operator", "reviewer", "admin"]
# The lowest role allowed to do each action.
MINIMUM = {
    "take": "operator",
    "assign": "operator",
    "unassign": "operator",
    "note": "operator",
    "confirm": "reviewer",
    "fail": "reviewer",
    "approve": "reviewer",
    "reject": "reviewer",
}
RANK = {name: i for i, name in enumerate(ROLES)}


def _target(world, action: str) -> Attempt:
    if action == "reject":
        return make_awaiting(world)
    if action in ("approve", "confirm", "fail"):
        return make_review(world)
    return make_unknown(world)  # owned by triage through the ownership rule


def _form(client: Client, action: str, attempt: Attempt) -> dict:
    data = {
        "expected_version": attempt.version,
        "owner": "reviewer2",
        "text": "looked at it",
        "reason": "provider says it never arrived",
        "result_ref": "rcpt-1",
        "evidence": "provider dashboard shows receipt rcpt-1",
    }
    if action == "approve":
        data["fingerprint"] = client.get(f"/attempts/{attempt.attempt_id}/approve/").context[
            "preview"
        ]["fingerprint"]
    return data


@pytest.mark.parametrize("action", list(MINIMUM))
@pytest.mark.parametrize("role", ROLES)
def test_role_matrix(world, role, action):
    attempt = _target(world, action)
    before = (attempt.state, attempt.version, attempt.events.count())
    client = login(getattr(world, role))
    allowed = RANK[role] >= RANK[MINIMUM[action]]
    data = (
        _form(client, action, attempt)
        if allowed
        else {
            "expected_version": attempt.version,
            "owner": "reviewer2",
            "text": "x",
            "reason": "x",
            "result_ref": "x",
            "evidence": "x",
            "fingerprint": "x",
        }
    )
    response = client.post(
        f"/attempts/{attempt.attempt_id}/{action}/", data, headers={"HX-Request": "true"}
    )
    attempt.refresh_from_db()
    after = (attempt.state, attempt.version, attempt.events.count())
    if allowed:
        assert response.status_code == 200, response.content
        assert response.headers["HX-Redirect"].startswith("/attempts/")
        assert after != before
        assert attempt.events.filter(actor=role).exists(), "acting user not in history"
    else:
        assert response.status_code == 403, (role, action, response.status_code)
        assert f"needs the {MINIMUM[action]} role" in response.content.decode()
        assert after == before


def test_actions_record_the_acting_user_and_their_changes(world, clients):
    attempt = make_unknown(world)
    url = f"/attempts/{attempt.attempt_id}"
    clients.operator.post(f"{url}/take/", {"expected_version": attempt.version})
    attempt.refresh_from_db()
    assert attempt.owner == world.operator
    clients.operator.post(
        f"{url}/assign/", {"expected_version": attempt.version, "owner": "reviewer"}
    )
    attempt.refresh_from_db()
    assert attempt.owner == world.reviewer
    clients.operator.post(f"{url}/unassign/", {"expected_version": attempt.version})
    attempt.refresh_from_db()
    assert attempt.owner is None
    clients.operator.post(f"{url}/note/", {"text": "waiting for the provider"})
    events = list(attempt.events.values_list("action", "actor"))
    assert events[-4:] == [
        ("attempt.owner_changed", "operator"),
        ("attempt.owner_changed", "operator"),
        ("attempt.unassigned", "operator"),
        ("attempt.note", "operator"),
    ]


def test_mark_confirmed_needs_evidence_and_mark_failed_a_reason(world, clients):
    attempt = make_review(world)
    url = f"/attempts/{attempt.attempt_id}"
    response = clients.reviewer.post(
        f"{url}/confirm/",
        {"expected_version": attempt.version, "result_ref": "r-1", "evidence": " "},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 422 and "evidence must not be empty" in response.content.decode()
    response = clients.reviewer.post(
        f"{url}/fail/", {"expected_version": attempt.version, "reason": ""}, follow=True
    )
    assert "reason must not be empty" in response.content.decode()
    attempt.refresh_from_db()
    assert attempt.state == State.MANUAL_REVIEW
    response = clients.reviewer.post(
        f"{url}/confirm/",
        {"expected_version": attempt.version, "result_ref": "r-1", "evidence": "receipt in inbox"},
        follow=True,
    )
    assert "Marked OUTCOME_CONFIRMED" in response.content.decode()
    attempt.refresh_from_db()
    assert (attempt.state, attempt.result_ref) == (State.OUTCOME_CONFIRMED, "r-1")
    event = attempt.events.last()
    assert (event.actor, event.reason) == ("reviewer", "receipt in inbox")


def test_missing_version_and_wrong_method_are_4xx(world, clients):
    attempt = make_review(world)
    response = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/fail/", {"reason": "x"}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 400
    assert clients.reviewer.get(f"/attempts/{attempt.attempt_id}/fail/").status_code == 405
    response = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/assign/",
        {"expected_version": attempt.version, "owner": "ghost"},
    )
    assert response.status_code == 400


def test_csrf_is_enforced(world):
    attempt = make_unknown(world)
    client = Client(enforce_csrf_checks=True)
    client.login(username="operator", password=PASSWORD)
    response = client.post(f"/attempts/{attempt.attempt_id}/take/", {"expected_version": 1})
    assert response.status_code == 403
    attempt.refresh_from_db()
    assert attempt.owner == world.triage


def test_two_reviewers_one_page_one_wins_the_other_is_told(world, clients):
    """Both reviewers opened the page at the same version; the second click is refused with
    the clear message, and the first decision stands."""
    attempt = make_review(world)
    version = clients.reviewer.get(f"/attempts/{attempt.attempt_id}/").context["attempt"].version
    assert (
        clients.reviewer2.get(f"/attempts/{attempt.attempt_id}/").context["attempt"].version
        == version
    )
    first = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/confirm/",
        {"expected_version": version, "result_ref": "r-9", "evidence": "seen at provider"},
        headers={"HX-Request": "true"},
    )
    second = clients.reviewer2.post(
        f"/attempts/{attempt.attempt_id}/fail/",
        {"expected_version": version, "reason": "I think it failed"},
        headers={"HX-Request": "true"},
    )
    assert first.status_code == 200
    assert second.status_code == 409
    assert "someone else changed this attempt" in second.content.decode()
    assert second.headers["HX-Retarget"] == "#action-feedback"
    attempt.refresh_from_db()
    assert attempt.state == State.OUTCOME_CONFIRMED


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_at_the_same_instant():
    """Two real concurrent requests (threads, separate connections) for opposite decisions:
    exactly one wins, the other gets the conflict message, history has one decision."""
    from django.db import connections

    from tests.conftest import make_world

    world = make_world()
    attempt = make_review(world)
    barrier = threading.Barrier(2)
    results: dict[str, tuple[int, str]] = {}

    def act(name: str, path: str, data: dict) -> None:
        try:
            client = login(getattr(world, name))
            barrier.wait(timeout=10)
            response = client.post(path, data, headers={"HX-Request": "true"})
            results[name] = (response.status_code, response.content.decode())
        finally:
            connections.close_all()

    base = f"/attempts/{attempt.attempt_id}"
    threads = [
        threading.Thread(
            target=act,
            args=(
                "reviewer",
                f"{base}/confirm/",
                {"expected_version": attempt.version, "result_ref": "r", "evidence": "seen"},
            ),
        ),
        threading.Thread(
            target=act,
            args=(
                "reviewer2",
                f"{base}/fail/",
                {"expected_version": attempt.version, "reason": "not seen"},
            ),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    statuses = sorted(code for code, _ in results.values())
    assert statuses == [200, 409], results
    loser = next(body for code, body in results.values() if code == 409)
    assert "someone else changed this attempt" in loser
    attempt.refresh_from_db()
    decisions = attempt.events.filter(
        action__in=["attempt.review_confirmed", "attempt.review_failed"]
    )
    assert decisions.count() == 1
    assert attempt.state in (State.OUTCOME_CONFIRMED, State.FAILED)


def test_approve_linked_retry_shows_exactly_what_will_be_sent(world, clients):
    attempt = make_review(world, tool="open_ticket", args={"title": "Broken", "token": "t0p"})
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(
        policy_version="v2", allowed_scopes=["open_ticket:write"]
    )
    page = clients.reviewer.get(f"/attempts/{attempt.attempt_id}/approve/")
    body = page.content.decode()
    preview = page.context["preview"]["data"]
    assert preview["idempotency_key"] == attempt.idempotency_key + "~r1"
    assert (preview["tenant"], preview["policy_version"]) == ("acme", "v2")
    assert preview["credential_scope"] == ["open_ticket:write"]  # never wider
    for shown in (
        attempt.idempotency_key + "~r1",
        "v2",
        "open_ticket:write",
        "Broken",
        attempt.args_hash,
    ):
        assert shown in body
    assert "t0p" not in body
    response = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/approve/",
        {
            "expected_version": attempt.version,
            "fingerprint": page.context["preview"]["fingerprint"],
        },
    )
    child = Attempt.objects.get(parent=attempt)
    assert response.url == f"/attempts/{child.attempt_id}/"
    attempt.refresh_from_db()
    assert attempt.state == State.RECONCILED
    assert (child.state, child.idempotency_key, child.policy_version, child.credential_scope) == (
        State.INTENT_RECORDED,
        preview["idempotency_key"],
        "v2",
        ["open_ticket:write"],
    )
    assert child.events.first().actor == "reviewer"


def test_preview_that_changed_before_the_click_is_refused(world, clients):
    attempt = make_review(world, tool="open_ticket")
    page = clients.reviewer.get(f"/attempts/{attempt.attempt_id}/approve/")
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(policy_version="v3")
    response = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/approve/",
        {
            "expected_version": attempt.version,
            "fingerprint": page.context["preview"]["fingerprint"],
        },
        headers={"HX-Request": "true"},
    )
    assert (
        response.status_code == 409
        and "changed since you opened the preview" in response.content.decode()
    )
    assert not Attempt.objects.filter(parent=attempt).exists()


def test_critical_linked_retry_needs_two_distinct_reviewers(world, clients):
    attempt = make_review(world, tool="charge_card")
    url = f"/attempts/{attempt.attempt_id}/approve/"

    def approve(client):
        page = client.get(url)
        return client.post(
            url,
            {
                "expected_version": page.context["attempt"].version,
                "fingerprint": page.context["preview"]["fingerprint"],
            },
            follow=True,
        )

    response = approve(clients.reviewer)
    assert "a second, different reviewer must approve" in response.content.decode()
    attempt.refresh_from_db()
    assert (
        attempt.state == State.MANUAL_REVIEW and not Attempt.objects.filter(parent=attempt).exists()
    )
    response = approve(clients.reviewer)
    assert "you already approved this" in response.content.decode()
    response = approve(clients.reviewer2)
    assert "Linked retry approved" in response.content.decode()
    attempt.refresh_from_db()
    assert attempt.state == State.RECONCILED
    assert Attempt.objects.get(parent=attempt).state == State.INTENT_RECORDED


def test_approve_and_reject_a_linked_attempt_awaiting_approval(world, clients):
    waiting = make_awaiting(world, tool="open_ticket")
    page = clients.reviewer.get(f"/attempts/{waiting.attempt_id}/approve/")
    assert page.context["preview"]["data"]["idempotency_key"] == waiting.idempotency_key
    clients.reviewer.post(
        f"/attempts/{waiting.attempt_id}/approve/",
        {
            "expected_version": waiting.version,
            "fingerprint": page.context["preview"]["fingerprint"],
        },
    )
    waiting.refresh_from_db()
    assert waiting.state == State.INTENT_RECORDED and not waiting.awaiting_approval

    other = make_awaiting(world, tool="open_ticket")
    response = clients.reviewer.post(
        f"/attempts/{other.attempt_id}/reject/",
        {"expected_version": other.version, "reason": "customer cancelled"},
        follow=True,
    )
    assert "Linked attempt rejected" in response.content.decode()
    other.refresh_from_db()
    assert other.state == State.FAILED
    assert other.events.last().reason == "linked attempt rejected: customer cancelled"


def test_reject_needs_a_reason_and_nothing_to_approve_is_clear(world, clients):
    waiting = make_awaiting(world)
    response = clients.reviewer.post(
        f"/attempts/{waiting.attempt_id}/reject/",
        {"expected_version": waiting.version, "reason": ""},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 422
    unknown = make_unknown(world)
    response = clients.reviewer.get(f"/attempts/{unknown.attempt_id}/approve/", follow=True)
    assert "nothing to approve" in response.content.decode()
    response = clients.reviewer.post(
        f"/attempts/{unknown.attempt_id}/reject/",
        {"expected_version": unknown.version, "reason": "x"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 409


def test_two_reviewers_failing_with_different_reasons_is_a_race_not_a_repeat(world, clients):
    """The same move with the same reason is a harmless repeat; with another reason it is a
    second person's decision that lost, and they are told so (core: review.review_fail)."""
    attempt = make_review(world)
    url = f"/attempts/{attempt.attempt_id}/fail/"
    first = clients.reviewer.post(url, {"expected_version": attempt.version, "reason": "gone"})
    assert first.status_code == 302
    again = clients.reviewer.post(
        url, {"expected_version": attempt.version, "reason": "gone"}, headers={"HX-Request": "true"}
    )
    assert again.status_code == 200  # a repeat of the same decision
    second = clients.reviewer2.post(
        url,
        {"expected_version": attempt.version, "reason": "never sent"},
        headers={"HX-Request": "true"},
    )
    assert second.status_code == 409
    assert "someone else changed this attempt" in second.content.decode()
    attempt.refresh_from_db()
    assert list(attempt.events.filter(to_state=State.FAILED).values_list("reason", flat=True)) == [
        "gone"
    ]


def test_nul_characters_are_a_clear_4xx_never_a_500(world, clients):
    attempt = make_unknown(world)
    base = f"/attempts/{attempt.attempt_id}"
    assert clients.operator.post(f"{base}/note/", {"text": "a\x00b"}).status_code == 400
    assert (
        clients.operator.post(
            f"{base}/assign/", {"expected_version": attempt.version, "owner": "op\x00"}
        ).status_code
        == 400
    )
    assert clients.operator.get("/queues/all/", {"q": "key\x00"}).status_code == 400
    assert clients.operator.get("/queues/unknown/", {"tool": "x\x00"}).status_code == 400
    assert clients.operator.get("/attempts/att_%00/").status_code == 404
    assert (
        clients.operator.post("/queues/bulk/", {"action": "take", "attempt": ["a\x00"]}).status_code
        == 400
    )
    assert not attempt.events.filter(action="attempt.note").exists()


def test_a_conflict_on_an_attempt_that_became_terminal_does_not_invite_submitting_again(
    world, clients
):
    attempt = make_review(world)
    version = clients.reviewer.get(f"/attempts/{attempt.attempt_id}/").context["attempt"].version
    clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/confirm/",
        {"expected_version": version, "result_ref": "r-9", "evidence": "seen at provider"},
    )
    late = clients.reviewer2.post(
        f"/attempts/{attempt.attempt_id}/fail/",
        {"expected_version": version, "reason": "I think it failed"},
        headers={"HX-Request": "true"},
    ).content.decode()
    assert "someone else changed this attempt" in late
    assert "submit again" not in late and "OUTCOME_CONFIRMED now" in late


def test_my_own_change_in_another_tab_is_told_as_mine(world, clients):
    attempt = make_unknown(world)
    page = clients.operator.get(f"/attempts/{attempt.attempt_id}/").context
    version, seen = page["attempt"].version, page["last_event_id"]
    # The same person assigns it in another tab, then submits the stale form of the first.
    clients.operator.post(
        f"/attempts/{attempt.attempt_id}/assign/",
        {"expected_version": version, "seen_event": seen, "owner": "reviewer"},
    )
    stale = clients.operator.post(
        f"/attempts/{attempt.attempt_id}/assign/",
        {"expected_version": version, "seen_event": seen, "owner": "operator"},
        headers={"HX-Request": "true"},
    ).content.decode()
    assert "you changed this attempt in another window or tab" in stale.lower()
    assert "someone else" not in stale and "you changed its owner" in stale


def test_a_held_attempt_is_reassigned_but_never_unassigned_like_manual_review(world, clients):
    """AWAITING_APPROVAL and MANUAL_REVIEW are resting states that always have an owner: the
    page offers no Unassign, and the action is refused with a message."""
    from tests.dashboard.approvals_helpers import held_intent, hold_big_charges

    hold_big_charges()
    for attempt in (held_intent(world, "own:1", {"amount_cents": 500000}), make_review(world)):
        attempt.refresh_from_db()
        assert attempt.owner_id is not None, attempt.state
        url = f"/attempts/{attempt.attempt_id}"
        page = clients.operator.get(url + "/").content.decode()
        assert f'action="{url}/unassign/"' not in page
        response = clients.operator.post(
            f"{url}/unassign/", {"expected_version": attempt.version}, follow=True
        )
        assert "always has an owner" in response.content.decode()
        attempt.refresh_from_db()
        assert attempt.owner_id is not None
        clients.operator.post(
            f"{url}/assign/", {"expected_version": attempt.version, "owner": "reviewer"}
        )
        attempt.refresh_from_db()
        assert attempt.owner == world.reviewer
