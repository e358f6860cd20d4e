"""Notifications: who is told what (assignment, MANUAL_REVIEW, a pending second approval, an SLA
breach, the daily digest), per-person preferences, each notice enqueued once, and delivery by
real ``manage.py reconcile`` processes to a real SMTP server and a real webhook receiver, with
the worker killed mid-send: no notice lost, none delivered as two different notices."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import time
from collections import Counter

import pytest
from django.utils import timezone

from attempts import notify, review
from attempts.models import (
    Attempt,
    NoticeKind,
    NoticeStatus,
    Notification,
    OwnershipRule,
    PersonSettings,
    SlaEscalation,
    SlaPolicy,
    State,
)
from tests.conftest import child_env, make_world, no_digests, start_manage
from tests.dashboard.conftest import escalating_sla, make_review, make_unknown
from tests.notify_servers import MailSink, Webhook


def mail_to(settings, port: int) -> None:
    """Point the default mailer at an SMTP server on 127.0.0.1:port."""
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": port, "timeout": 10},
        }
    }


@pytest.fixture
def channels(settings):
    """Email and chat configured, pointing at receivers that do not exist (nothing is sent)."""
    settings.NOTIFY = {**settings.NOTIFY, "EMAIL": True, "CHAT_WEBHOOK_URL": "http://127.0.0.1:9/"}
    return settings


def pending(**filters) -> list[tuple[str, str, str]]:
    return sorted(
        Notification.objects.filter(**filters).values_list("kind", "recipient__username", "channel")
    )


def test_assignment_by_someone_else_is_told_taking_for_yourself_is_not(world, channels):
    notify.enqueue_from_events()  # start the cursor
    attempt = make_unknown(world)
    review.assign(attempt, user=world.operator, owner=world.operator)
    review.assign(attempt, user=world.operator, owner=world.reviewer)
    notify.enqueue_from_events()
    assert pending() == [
        (NoticeKind.ASSIGNED, "reviewer", "chat"),
        (NoticeKind.ASSIGNED, "reviewer", "email"),
    ]
    body = Notification.objects.first().body
    assert "operator assigned" in body and attempt.attempt_id in body


def test_entering_manual_review_tells_the_owner(world, channels):
    attempt = make_review(world)  # owned by triage through the ownership rule
    notify.enqueue_from_events()
    assert pending(kind=NoticeKind.MANUAL_REVIEW) == [
        (NoticeKind.MANUAL_REVIEW, "triage", "chat"),
        (NoticeKind.MANUAL_REVIEW, "triage", "email"),
    ]
    assert attempt.attempt_id in Notification.objects.first().subject


def test_a_pending_second_approval_tells_the_other_reviewers_only(world, channels):
    attempt = make_review(world, tool="charge_card")  # critical: two reviewers
    notify.enqueue_from_events()
    Notification.objects.all().delete()
    assert review.approve_linked_retry(attempt, user=world.reviewer) is None
    notify.enqueue_from_events()
    told = {name for _, name, _ in pending(kind=NoticeKind.APPROVAL)}
    assert told == {"reviewer2", "admin"}  # never the approver, never an operator or viewer
    assert Attempt.objects.awaiting_approval_of(world.reviewer2).filter(pk=attempt.pk).exists()
    assert not Attempt.objects.awaiting_approval_of(world.reviewer).exists()


def test_each_notice_is_enqueued_once_however_often_the_history_is_read(world, channels):
    make_review(world)
    first = notify.enqueue_from_events()
    # Forget how far we read: the same events again enqueue nothing new.
    from attempts.models import NotifyCursor

    NotifyCursor.objects.update(last_event_id=0)
    second = notify.enqueue_from_events()
    assert first == 2 and second == 0
    assert Notification.objects.count() == 2


def test_preferences_choose_channels_and_kinds(world, channels):
    PersonSettings.objects.create(user=world.triage, chat=False)
    PersonSettings.objects.create(user=world.reviewer, kinds=[NoticeKind.SLA_BREACH])
    notify.enqueue_from_events()  # start the cursor
    make_review(world)  # triage: email only
    review.assign(make_unknown(world), user=world.operator, owner=world.reviewer)  # not wanted
    notify.enqueue_from_events()
    assert pending() == [(NoticeKind.MANUAL_REVIEW, "triage", "email")]


def test_an_sla_breach_escalates_once_to_the_named_person_and_ack_stops_it(world, channels):
    escalating_sla(world)
    late = make_unknown(world)
    acked = make_unknown(world)
    fresh = make_unknown(world)
    hour_ago = timezone.now() - dt.timedelta(hours=1)
    Attempt.objects.filter(pk__in=[late.pk, acked.pk]).update(created_at=hour_ago)
    review.acknowledge_sla(acked, user=world.operator, comment="provider outage, on it")
    assert notify.escalate_slas() == 1
    assert notify.escalate_slas() == 0  # once
    row = SlaEscalation.objects.get(attempt=late)
    assert row.escalated_to == world.admin and row.state == State.UNKNOWN
    # The policy's person and the attempt's owner hear of it.
    assert pending(kind=NoticeKind.SLA_BREACH) == [
        (NoticeKind.SLA_BREACH, "admin", "chat"),
        (NoticeKind.SLA_BREACH, "admin", "email"),
        (NoticeKind.SLA_BREACH, "triage", "chat"),
        (NoticeKind.SLA_BREACH, "triage", "email"),
    ]
    assert not SlaEscalation.objects.filter(attempt=fresh).exists()
    # Acknowledging did not take the attempt: its owner is still the rule's person.
    assert Attempt.objects.get(pk=acked.pk).owner == world.triage
    assert acked.events.last().action == "attempt.sla_acknowledged"


def test_many_breaches_are_one_notice_per_person_per_pass(world, channels):
    SlaPolicy.objects.create(
        tool_id="open_ticket", unknown_breach_after=dt.timedelta(0), escalate_to=world.admin
    )
    made = [make_unknown(world) for _ in range(12)]
    assert notify.escalate_slas() == 12
    assert notify.escalate_slas() == 0
    assert pending(kind=NoticeKind.SLA_BREACH) == [
        (NoticeKind.SLA_BREACH, "admin", "chat"),
        (NoticeKind.SLA_BREACH, "admin", "email"),
        (NoticeKind.SLA_BREACH, "triage", "chat"),
        (NoticeKind.SLA_BREACH, "triage", "email"),
    ]
    notice = Notification.objects.filter(kind=NoticeKind.SLA_BREACH, recipient=world.triage).first()
    assert notice.subject == "[ledgerweb] SLA breached: 12 attempts"
    assert all(a.attempt_id in notice.body for a in made) and "(yours)" in notice.body
    # The next breach is a new notice.
    make_unknown(world)
    assert notify.escalate_slas() == 1
    assert Notification.objects.filter(kind=NoticeKind.SLA_BREACH).count() == 8


def test_a_breach_with_nobody_named_reaches_the_owner_or_the_reviewers(world, channels):
    SlaPolicy.objects.create(tool_id="open_ticket", unknown_breach_after=dt.timedelta(0))
    make_unknown(world)  # triage owns it (ownership rule)
    assert notify.escalate_slas() == 1
    assert {n for _, n, _ in pending(kind=NoticeKind.SLA_BREACH)} == {"triage"}
    Notification.objects.all().delete()
    OwnershipRule.objects.all().delete()
    ownerless = make_unknown(world)
    assert ownerless.owner is None
    assert notify.escalate_slas() == 1
    assert {n for _, n, _ in pending(kind=NoticeKind.SLA_BREACH)} == {
        "reviewer",
        "reviewer2",
        "admin",
    }


def test_breaches_escalate_to_the_default_owner_when_nobody_is_named(world, channels):
    channels.LEDGER = {**channels.LEDGER, "DEFAULT_OWNER": "reviewer2"}
    SlaPolicy.objects.create(tool_id="open_ticket", unknown_breach_after=dt.timedelta(0))
    make_unknown(world)
    assert notify.escalate_slas() == 1
    assert {n for _, n, _ in pending(kind=NoticeKind.SLA_BREACH)} == {"reviewer2", "triage"}


@pytest.mark.parametrize("named", ["viewer", "outsider"])
def test_a_breach_is_never_escalated_to_someone_who_cannot_act_on_it(world, channels, named):
    """An SLA policy (or the default owner) naming a viewer, or someone outside the tenant:
    the breach goes to the owner, and is escalated to them, not to the one named."""
    person = getattr(world, named)
    SlaPolicy.objects.create(
        tool_id="open_ticket", unknown_breach_after=dt.timedelta(0), escalate_to=person
    )
    channels.LEDGER = {**channels.LEDGER, "DEFAULT_OWNER": named}
    attempt = make_unknown(world)  # triage owns it
    assert notify.escalate_slas() == 1
    assert {n for _, n, _ in pending(kind=NoticeKind.SLA_BREACH)} == {"triage"}
    assert SlaEscalation.objects.get(attempt=attempt).escalated_to == world.triage


def test_the_digest_comes_once_a_day_at_the_local_hour(world, channels):
    make_review(world)  # triage owns one
    PersonSettings.objects.create(user=world.triage, time_zone="Asia/Tokyo", digest_hour=9)
    morning_tokyo = dt.datetime(2026, 3, 2, 0, 30, tzinfo=dt.UTC)  # 09:30 in Tokyo
    night_tokyo = dt.datetime(2026, 3, 1, 14, 0, tzinfo=dt.UTC)  # 23:00 on 1 March in Tokyo
    assert notify.enqueue_digests(morning_tokyo - dt.timedelta(hours=1)) == 0  # 08:30
    assert notify.enqueue_digests(morning_tokyo) == 2
    assert notify.enqueue_digests(morning_tokyo + dt.timedelta(hours=3)) == 0  # same day
    # 23:00 on the 1st, a first start in the evening: not a morning digest at night.
    assert notify.enqueue_digests(night_tokyo) == 0
    body = Notification.objects.filter(kind=NoticeKind.DIGEST).first().body
    assert "You own 1 attempt" in body and body.startswith("Good morning triage")


def test_the_digest_greets_by_the_local_hour_and_waits_for_the_next_day(world, channels):
    make_review(world)
    PersonSettings.objects.create(user=world.triage, time_zone="Europe/Paris", digest_hour=16)
    late = dt.datetime(2026, 3, 2, 16, 30, tzinfo=dt.UTC)  # 17:30 in Paris
    assert notify.enqueue_digests(late) == 2
    assert (
        Notification.objects.filter(kind=NoticeKind.DIGEST)
        .first()
        .body.startswith("Good afternoon triage")
    )
    assert notify.enqueue_digests(late + dt.timedelta(hours=4)) == 0  # 21:30: too late
    assert notify.enqueue_digests(late + dt.timedelta(days=1)) == 2  # the next day


def test_delivery_reaches_a_real_smtp_server_and_webhook(world, settings):
    world.triage.email = "triage@example.test"
    world.triage.save()
    with MailSink() as mail, Webhook() as hook:
        mail_to(settings, mail.port)
        settings.NOTIFY = {**settings.NOTIFY, "EMAIL": True, "CHAT_WEBHOOK_URL": hook.url}
        make_review(world)
        notify.enqueue_from_events()
        assert notify.deliver_due() == {"sent": 2, "failed": 0, "dead": 0}
        assert notify.deliver_due() == {"sent": 0, "failed": 0, "dead": 0}
    ids = {n.notice_id for n in Notification.objects.all()}
    assert set(mail.counts()) | set(hook.counts()) == ids
    assert mail.messages[0]["to"] == "triage@example.test"
    assert mail.messages[0]["message_id"].startswith("<ledgerweb-notice-")
    assert hook.posts[0]["text"].startswith("@triage ")
    assert hook.posts[0]["_header"] == hook.posts[0]["notice_id"]
    assert set(Notification.objects.values_list("status", flat=True)) == {NoticeStatus.SENT}


def test_a_refused_delivery_is_retried_later_not_lost(world, settings):
    settings.NOTIFY = {**settings.NOTIFY, "EMAIL": False, "CHAT_WEBHOOK_URL": "http://127.0.0.1:9/"}
    make_review(world)
    notify.enqueue_from_events()
    assert notify.deliver_due()["failed"] == 1
    notice = Notification.objects.get()
    assert notice.status == NoticeStatus.PENDING and notice.tries == 1
    assert notice.next_try_at > timezone.now() and "chat webhook" in notice.last_error


# ---------------------------------------------------------------------------------------------
# Real worker processes, killed mid-send


def _deliver_to(settings, mail: MailSink, hook: Webhook) -> dict[str, str]:
    """Notices go by email to ``mail`` and by chat to ``hook``, from this process; returns the
    same for a worker's environment (with a two-second lease)."""
    mail_to(settings, mail.port)
    settings.NOTIFY = {**settings.NOTIFY, "EMAIL": True, "CHAT_WEBHOOK_URL": hook.url}
    return {
        "LEDGERWEB_EMAIL_HOST": "127.0.0.1",
        "LEDGERWEB_EMAIL_PORT": str(mail.port),
        "LEDGERWEB_CHAT_WEBHOOK_URL": hook.url,
        "LEDGERWEB_NOTIFY_LEASE_SECONDS": "2",
    }


def _worker(env: dict[str, str]) -> subprocess.Popen[str]:
    return start_manage(
        ["reconcile", "--interval", "0.2", "--worker-id", "notifier"],
        env=env,
        start_new_session=True,
    )


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def _kill(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def _setup_notices(count: int) -> set[int]:
    world = make_world()
    no_digests()
    for person in (world.triage, world.reviewer):
        person.email = f"{person.username}@example.test"
        person.save()
    for _ in range(count):
        make_review(world)
    notify.enqueue_from_events()
    ids = set(Notification.objects.values_list("pk", flat=True))
    assert len(ids) == 2 * count
    return ids


def _the_rest_sent(
    env: dict[str, str], notices: set[int], mail: MailSink, hook: Webhook
) -> Counter:
    """A new worker sends what is left, then is stopped; every notice has arrived (nothing
    lost). Returns how many times each arrived, by its id."""
    worker = _worker(env)
    try:
        _wait(lambda: Notification.objects.filter(status="sent").count() == len(notices))
    finally:
        _kill(worker)
    delivered = mail.counts() + hook.counts()
    assert set(delivered) == {f"ledgerweb-notice-{pk}" for pk in notices}  # nothing lost
    return delivered


@pytest.mark.slow
def test_a_worker_killed_mid_send_loses_and_doubles_nothing(transactional_db, settings):
    with MailSink() as mail, Webhook() as hook:
        base = _deliver_to(settings, mail, hook)
        notices = _setup_notices(3)
        env = child_env(**base)
        # The first email is held inside the SMTP conversation; the worker dies there.
        mail.hold_next()
        first = _worker(env)
        _wait(mail.holding.is_set)
        _kill(first)
        mail.release(accept=False)  # the dead worker's message was never accepted
        held = Notification.objects.filter(lease_until__isnull=False, status="pending")
        assert held.count() == 1  # leased by the dead worker, not sent
        delivered = _the_rest_sent(env, notices, mail, hook)
    assert set(delivered.values()) == {1}  # nothing doubled


@pytest.mark.slow
def test_a_crash_between_accepted_and_recorded_resends_the_same_notice(transactional_db, settings):
    with MailSink() as mail, Webhook() as hook:
        base = _deliver_to(settings, mail, hook)
        notices = _setup_notices(2)
        crashing = _worker(
            child_env(LEDGERWEB_CRASH_AT="notify_sent", LEDGERWEB_FAULTS_ALLOWED="1", **base)
        )
        assert crashing.wait(timeout=60) == -signal.SIGKILL
        assert len(mail.messages) + len(hook.posts) == 1
        delivered = _the_rest_sent(child_env(**base), notices, mail, hook)
    # The one notice in flight at the crash arrived twice, as the same notice (same id), which
    # the receiver drops; every other notice arrived once.
    assert sorted(delivered.values()) == [1] * (len(notices) - 1) + [2]


def test_the_first_run_tells_nobody_about_the_past(world, channels):
    make_review(world)  # history from before the first run (seen from a day later)
    assert notify.enqueue_from_events(timezone.now() + dt.timedelta(days=1)) == 0
    make_review(world)
    assert notify.enqueue_from_events() == 2
