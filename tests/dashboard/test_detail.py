"""The attempt detail page: every identifier, redacted arguments, lineage, history with actors,
lookups and notes; another tenant's attempt is a 404."""

from __future__ import annotations

import datetime as dt

from attempts import review
from attempts.models import ConfigEvent, SlaPolicy
from tests.dashboard.conftest import make_awaiting, make_review, make_unknown, record_lookup


def test_detail_shows_every_identifier_copyable(world, clients):
    attempt = make_unknown(world, provider_request_id="req-42-xyz", key="acme:invoice:7")
    body = clients.viewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    for value in (
        attempt.attempt_id,
        "acme:invoice:7",
        attempt.args_hash,
        "req-42-xyz",
        attempt.task_id,
        "open_ticket",
        "v1",
        "open_ticket:read, open_ticket:write",
    ):
        assert value in body, value
        assert f'data-copy="{value}"' in body, value
    assert "UNKNOWN" in body and "triage" in body  # state and owner


def test_secret_argument_fields_are_redacted(world, clients, settings):
    attempt = make_unknown(
        world,
        args={
            "to": "a@example.test",
            "password": "hunter2",
            "nested": {"API_KEY": "sk_live_1"},
            "cards": [{"card_number": "4242424242424242"}],
        },
    )
    body = clients.viewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "a@example.test" in body
    for secret in ("hunter2", "sk_live_1", "4242424242424242"):
        assert secret not in body
    assert "3 secret fields redacted" in body
    settings.LEDGER = {**settings.LEDGER, "REDACT_FIELDS": ["to"]}
    body = clients.viewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "a@example.test" not in body and "hunter2" in body


def test_history_lookups_and_notes(world, clients):
    attempt = make_unknown(world)
    record_lookup(attempt, answer="unavailable", latency_ms=9001)
    review.add_note(attempt, user=world.operator, text="Called the provider; they are checking.")
    response = clients.viewer.get(f"/attempts/{attempt.attempt_id}/")
    body = response.content.decode()
    context = response.context
    actions = [e.action for e in context["events"]]
    assert actions[:3] == ["attempt.created", "attempt.dispatched", "attempt.unknown"]
    assert "test-agent" in body and "timeout after 10s" in body
    assert [e.details["answer"] for e in context["lookups"]] == ["unavailable"]
    assert "latency_ms=9001" in body
    assert [n.reason for n in context["notes"]] == ["Called the provider; they are checking."]


def test_lineage_links_parent_and_linked_attempts(world, clients):
    child = make_awaiting(world)
    parent = child.parent
    body = clients.reviewer.get(f"/attempts/{parent.attempt_id}/").content.decode()
    assert f'href="/attempts/{child.attempt_id}/"' in body and "RECONCILED" in body
    body = clients.reviewer.get(f"/attempts/{child.attempt_id}/").content.decode()
    assert f'href="/attempts/{parent.attempt_id}/"' in body
    assert child.idempotency_key in body and "awaits approval" in body


def test_other_tenants_attempt_is_404_everywhere(world, clients):
    theirs = make_review(world, tenant="globex")
    for path in ("", "approve/"):
        assert clients.admin.get(f"/attempts/{theirs.attempt_id}/{path}").status_code == 404
    for action in ("take", "assign", "unassign", "note", "confirm", "fail", "approve", "reject"):
        response = clients.admin.post(
            f"/attempts/{theirs.attempt_id}/{action}/",
            {
                "expected_version": theirs.version,
                "owner": "admin",
                "text": "x",
                "reason": "x",
                "result_ref": "x",
                "evidence": "x",
            },
        )
        assert response.status_code == 404, action
    assert clients.admin.get("/attempts/att_does_not_exist/").status_code == 404
    assert clients.outsider.get(f"/attempts/{theirs.attempt_id}/").status_code == 200


def test_viewer_sees_no_action_forms(world, clients):
    attempt = make_review(world)
    body = clients.viewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "/take/" not in body and "/confirm/" not in body and "/approve/" not in body
    body = clients.operator.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "/take/" in body and "/note/" in body and "/confirm/" not in body
    body = clients.reviewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "/confirm/" in body and "/fail/" in body and "/approve/" in body


def test_history_names_owners(world, clients):
    attempt = make_unknown(world)
    review.assign(attempt, user=world.operator, owner=world.reviewer)
    body = clients.viewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    # History details are labelled fields, owners by name.
    assert '<dt>owner</dt><dd class="mono wrap">reviewer</dd>' in body
    assert '<dt>previous owner</dt><dd class="mono wrap">triage</dd>' in body
    assert "owner_id" not in body


def test_a_terminal_attempt_shows_no_empty_actions_card(world, clients):
    attempt = make_review(world)
    review.review_fail(attempt, user=world.reviewer, reason="declined by the customer")
    body = clients.reviewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "decide-title" not in body
    assert (
        '<h2 id="decide-title">Actions</h2>'
        in clients.reviewer.get(f"/attempts/{make_review(world).attempt_id}/").content.decode()
    )


def test_not_found_page_says_nothing_of_other_tenants(world, clients):
    theirs = make_review(world, tenant="globex")
    for path in (f"/attempts/{theirs.attempt_id}/", f"/audit/report/{theirs.attempt_id}/"):
        response = clients.admin.get(path)
        assert response.status_code == 404
        assert "tenant" not in response.content.decode().lower(), path


def test_acknowledging_says_who_stays_the_owner(world, clients):
    attempt = make_review(world)
    SlaPolicy.objects.create(tool_id="open_ticket", review_warn_after=dt.timedelta(0))
    body = clients.operator.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "not the owner" not in body
    assert f"the owner stays {attempt.owner.username}" in body


def test_configuration_changes_are_shown_in_my_time_zone(world, clients):
    from django.utils import timezone

    from attempts.config_history import save_with_history
    from attempts.models import PersonSettings, Tool
    from attempts.states import Actor

    attempt = make_unknown(world)
    tool = Tool.objects.get(name="open_ticket")
    tool.timeout_seconds = 7
    save_with_history(tool, actor=Actor.user(world.admin), reason="slower provider")
    PersonSettings.objects.create(user=world.viewer, time_zone="Asia/Tokyo")
    body = clients.viewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    change = ConfigEvent.objects.filter(subject="tool:open_ticket").order_by("-seq").first()
    tokyo = timezone.localtime(change.created_at, dt.timezone(dt.timedelta(hours=9)))
    assert f"{tokyo:%Y-%m-%d %H:%M:%S} JST" in body
    assert "When (UTC)" not in body


def test_after_a_decision_the_page_offers_the_next_attempt_needing_attention(world, clients):
    first, second, third = make_review(world), make_unknown(world), make_review(world)
    review.assign(third, user=world.operator, owner=world.reviewer)
    clients.reviewer.post(
        f"/attempts/{first.attempt_id}/confirm/",
        {"expected_version": 4, "result_ref": "r-1", "evidence": "seen at the provider"},
    )
    page = clients.reviewer.get(f"/attempts/{first.attempt_id}/")
    assert page.context["attempt"].state == "OUTCOME_CONFIRMED"
    # Mine first (third), then the oldest in my tenants (second).
    assert page.context["next_attempt"].attempt_id == third.attempt_id
    assert f'href="/attempts/{third.attempt_id}/" rel="next"' in page.content.decode()
    after_mine = clients.reviewer.get(f"/attempts/{third.attempt_id}/").context["next_attempt"]
    assert after_mine.attempt_id == second.attempt_id
    # Nothing of another tenant, nothing terminal.
    make_review(world, tenant="globex")
    assert clients.viewer.get(f"/attempts/{second.attempt_id}/").context[
        "next_attempt"
    ].attempt_id in {third.attempt_id}


def test_the_printable_report_is_offered_only_to_whoever_may_open_it(world, clients):
    """The report is for reviewers and admins of the attempt's tenant: a viewer or an operator
    is not shown a link that would answer 403."""
    attempt = make_unknown(world)
    url = f"/attempts/{attempt.attempt_id}/"
    report = f"/audit/report/{attempt.attempt_id}/"
    for name, shown in (("viewer", False), ("operator", False), ("reviewer", True)):
        client = getattr(clients, name)
        assert ('data-testid="report-link"' in client.get(url).content.decode()) is shown, name
        status = client.get(report).status_code
        assert (status == 200) is shown, (name, status)
