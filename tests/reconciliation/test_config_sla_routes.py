"""SLA policies and notification routes as code: plan, apply, dump and history like every other
section, errors at the file's line, and routes that really add the people on call to notices."""

from __future__ import annotations

import datetime as dt
import io
import textwrap

import pytest
from django.core.management import call_command
from django.utils import timezone
from django.utils.dateparse import parse_duration

from attempts import notify
from attempts.models import (
    Attempt,
    ConfigEvent,
    NoticeKind,
    Notification,
    NotificationRoute,
    SlaPolicy,
)
from reconciliation import config
from tests.dashboard.conftest import make_review, make_unknown

FILE = textwrap.dedent(
    """\
    version = 1

    [[sla_policies]]
    tool = "open_ticket"
    unknown_warn_after = "5m"
    unknown_breach_after = "30m"
    escalate_to = "admin"

    [[sla_policies]]
    tool = "open_ticket"
    tenant = "globex"
    unknown_warn_after = "90m"
    review_breach_after = "1d12h"

    [[notification_routes]]
    name = "tickets-oncall"
    tool = "open_*"
    kinds = ["sla_breach", "manual_review"]
    notify = ["reviewer", "outsider"]
    """
)


def apply(text: str, actor: str = "ops") -> str:
    return "\n".join(
        config.apply(config.read("f.toml", text), actor=config.applied_by(actor)).lines()
    )


def problems(text: str) -> list[tuple[int | None, str]]:
    with pytest.raises(config.ConfigError) as caught:
        config.plan(config.read("f.toml", text))
    return caught.value.problems


def test_apply_makes_the_policies_and_routes_and_records_each_in_the_history(world):
    out = apply(FILE)
    assert "+ SLA policy open_ticket/*" in out and "+ SLA policy open_ticket/globex" in out
    assert "+ notification route tickets-oncall" in out
    every = SlaPolicy.objects.get(tool_id="open_ticket", tenant=None)
    assert every.unknown_warn_after == dt.timedelta(minutes=5)
    assert every.unknown_breach_after == dt.timedelta(minutes=30)
    assert every.review_breach_after == dt.timedelta(days=1)  # the default
    assert every.escalate_to == world.admin
    globex = SlaPolicy.objects.get(tool_id="open_ticket", tenant_id="globex")
    assert globex.review_breach_after == dt.timedelta(days=1, hours=12)
    route = NotificationRoute.objects.get(name="tickets-oncall")
    assert sorted(p.username for p in route.people.all()) == ["outsider", "reviewer"]
    assert route.kinds == ["manual_review", "sla_breach"]
    # Each row's change is recorded by the models (attempts/config_history.py), as from any path.
    events: dict[str, list[str]] = {}
    for subject, action in (
        ConfigEvent.objects.filter(
            subject__in=[
                "sla_policy:open_ticket/*",
                "sla_policy:open_ticket/globex",
                "notification_route:tickets-oncall",
            ]
        )
        .order_by("seq")
        .values_list("subject", "action")
    ):
        events.setdefault(subject, []).append(action)
    assert events["sla_policy:open_ticket/*"] == ["created"]
    assert events["sla_policy:open_ticket/globex"] == ["created"]
    # A route is created, then its people are added.
    assert events["notification_route:tickets-oncall"][0] == "created"
    route_now = ConfigEvent.objects.filter(subject="notification_route:tickets-oncall").last()
    assert route_now.after["people"] == ["outsider", "reviewer"]
    assert ConfigEvent.objects.get(subject="sla_policy:open_ticket/*").actor == "ops"


def test_dump_writes_them_back_and_apply_of_dump_changes_nothing(world):
    apply(FILE)
    dumped = config.dump()
    assert '[[sla_policies]]\ntool = "open_ticket"\ntenant = "*"' in dumped
    assert 'unknown_warn_after = "5m"' in dumped and 'escalate_to = "admin"' in dumped
    assert 'review_breach_after = "1d12h"' in dumped
    assert 'notify = ["outsider", "reviewer"]' in dumped
    before = ConfigEvent.objects.count()
    assert not config.plan(config.read("dump.toml", dumped)).changes
    assert "0 created, 0 updated, 0 removed" in apply(dumped)
    assert ConfigEvent.objects.count() == before


def test_the_same_duration_written_another_way_is_no_change(world):
    apply(FILE)
    same = FILE.replace('unknown_warn_after = "5m"', 'unknown_warn_after = "300s"')
    plan = config.plan(config.read("f.toml", same))
    assert not plan.changes


def test_an_update_is_planned_field_by_field_and_recorded(world):
    apply(FILE)
    changed = FILE.replace('unknown_breach_after = "30m"', 'unknown_breach_after = "1h"')
    changed = changed.replace('notify = ["reviewer", "outsider"]', 'notify = ["reviewer"]')
    out = apply(changed, actor="alice")
    assert "~ SLA policy open_ticket/*: unknown_breach_after '30m' -> '1h'" in out
    assert "~ notification route tickets-oncall: notify" in out
    assert SlaPolicy.objects.get(tenant=None).unknown_breach_after == dt.timedelta(hours=1)
    event = ConfigEvent.objects.filter(subject="sla_policy:open_ticket/*").order_by("-seq")[0]
    assert event.action == "changed" and event.actor == "alice"
    assert parse_duration(event.before["unknown_breach_after"]) == dt.timedelta(minutes=30)
    assert parse_duration(event.after["unknown_breach_after"]) == dt.timedelta(hours=1)


def test_removing_is_explicit(world):
    apply(FILE)
    removal = textwrap.dedent(
        """\
        version = 1

        [[sla_policies]]
        tool = "open_ticket"
        tenant = "globex"
        remove = true

        [[notification_routes]]
        name = "tickets-oncall"
        remove = true
        """
    )
    out = apply(removal)
    assert "- SLA policy open_ticket/globex" in out and "- notification route tickets-oncall" in out
    assert list(SlaPolicy.objects.values_list("tenant_id", flat=True)) == [None]
    assert not NotificationRoute.objects.exists()
    assert (
        ConfigEvent.objects.filter(
            subject="notification_route:tickets-oncall", action="deleted"
        ).count()
        == 1
    )


@pytest.mark.parametrize(
    ("old", "new", "at", "expected"),
    [
        (
            'unknown_warn_after = "5m"',
            'unknown_warn_after = "2h"',
            'unknown_warn_after = "2h"',
            "unknown_warn_after (2h) is later than unknown_breach_after (30m)",
        ),
        (
            'unknown_warn_after = "5m"',
            'unknown_warn_after = "five minutes"',
            'unknown_warn_after = "five',
            "does not match",
        ),
        (
            'unknown_warn_after = "5m"',
            'unknown_warn_after = "0m"',
            'unknown_warn_after = "0m"',
            "must be longer than 0s",
        ),
        ('escalate_to = "admin"', 'escalate_to = "nobody"', "escalate_to", "unknown user 'nobody'"),
        ('tenant = "globex"', 'tenant = "initech"', 'tenant = "initech"', "unknown tenant"),
        ('tool = "open_*"', 'tool = "open_*"\nweight = 1', "[[notification_routes]]", "weight"),
        (
            'notify = ["reviewer", "outsider"]',
            'notify = ["reviewer", "ghost"]',
            "notify =",
            "unknown user 'ghost'",
        ),
        ('kinds = ["sla_breach", "manual_review"]', 'kinds = ["digest"]', "kinds =", "digest"),
    ],
)
def test_each_error_names_its_line_and_changes_nothing(world, old, new, at, expected):
    text = FILE.replace(old, new, 1)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith(at))
    found = problems(text)
    assert any(n == line and expected in message for n, message in found), (found, line)
    assert not SlaPolicy.objects.exists() and not NotificationRoute.objects.exists()


def test_the_command_runs_the_new_sections(world, tmp_path):
    path = tmp_path / "ledger.toml"
    path.write_text(FILE)
    out = io.StringIO()
    call_command("ledger_config", "plan", str(path), stdout=out)
    assert "+ SLA policy open_ticket/*" in out.getvalue()
    assert not SlaPolicy.objects.exists()


@pytest.fixture
def channels(settings):
    settings.NOTIFY = {**settings.NOTIFY, "EMAIL": True, "CHAT_WEBHOOK_URL": ""}
    return settings


def told(kind: str) -> list[str]:
    return sorted(
        Notification.objects.filter(kind=kind).values_list("recipient__username", flat=True)
    )


def test_a_route_adds_the_people_on_call_with_a_role_in_the_tenant(world, channels):
    apply(FILE)
    notify.enqueue_from_events()  # start the cursor
    make_review(world)  # acme/open_ticket, owned by triage through the ownership rule
    notify.enqueue_from_events()
    # The owner, and the route's reviewer; never the outsider, who has no role in acme.
    assert told(NoticeKind.MANUAL_REVIEW) == ["reviewer", "triage"]
    body = Notification.objects.get(recipient=world.reviewer).body
    assert "notification route tickets-oncall" in body


def test_a_route_carries_only_its_kinds_and_its_tools(world, channels):
    apply(FILE.replace('kinds = ["sla_breach", "manual_review"]', 'kinds = ["sla_breach"]'))
    notify.enqueue_from_events()
    make_review(world)
    make_review(world, tool="update_crm")
    notify.enqueue_from_events()
    assert told(NoticeKind.MANUAL_REVIEW) == ["triage", "triage"]


def test_an_sla_breach_configured_as_code_escalates_and_is_routed(world, channels):
    apply(FILE)
    late = make_unknown(world)
    Attempt.objects.filter(pk=late.pk).update(created_at=timezone.now() - dt.timedelta(hours=1))
    assert notify.escalate_slas() == 1
    # The policy's person, the attempt's owner (triage, by the ownership rule) and the route.
    assert told(NoticeKind.SLA_BREACH) == ["admin", "reviewer", "triage"]
    # One copy each, however often the step runs.
    assert notify.escalate_slas() == 0
    assert Notification.objects.filter(kind=NoticeKind.SLA_BREACH).count() == 3


def test_someone_both_told_and_on_the_route_gets_one_copy(world, channels):
    apply(FILE.replace('notify = ["reviewer", "outsider"]', 'notify = ["triage"]'))
    notify.enqueue_from_events()
    make_review(world)
    notify.enqueue_from_events()
    assert told(NoticeKind.MANUAL_REVIEW) == ["triage"]
