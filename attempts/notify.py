"""The notification outbox: who is told what, and its delivery by the reconcile worker.

Notices are rows of ``Notification``. They are enqueued from the attempts' history (work
assigned to someone by someone else, an attempt entering MANUAL_REVIEW, an approval waiting
for a second reviewer or a prepared linked attempt waiting for its first), from SLA breaches
(``escalate_slas``) and once a day per person (``enqueue_digests``). Every notice has a
``dedupe_key``, unique in the table: reading the same events twice, or two workers doing it at
once, enqueues each notice once.

Delivery (``deliver_due``) claims one row at a time with a conditional UPDATE that sets a lease
(``claim_token``, ``lease_until``) and must change exactly one row, sends it (email through
Django's email framework, or a POST of Slack-compatible JSON to the chat webhook), then marks it
sent with a second conditional UPDATE on the same token. A worker killed before the provider
accepted the notice leaves it pending: another worker takes it once the lease ends, so nothing
is lost. A worker killed after the provider accepted it but before it recorded that can only
cause a second delivery of the *same* notice: both carry the same ``notice_id`` (the email's
Message-ID, the webhook's ``X-Ledgerweb-Notice`` header and ``notice_id`` field), so the
receiver drops the copy. No third party learns about an attempt outside the recipient's tenants:
recipients are checked with ``has_role`` when a notice is enqueued.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import urllib.error
import urllib.request
import zoneinfo
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.urls import reverse
from django.utils import timezone

from attempts import owners, slack
from attempts.faults import crash_point
from attempts.models import (
    APPROVAL_ACTION,
    ATTENTION_STATES,
    Attempt,
    AttemptEvent,
    NoticeKind,
    NoticeStatus,
    Notification,
    NotificationRoute,
    NotifyCursor,
    PersonSettings,
    Role,
    SlaEscalation,
    SlaPolicy,
    State,
    Tool,
    has_role,
)
from attempts.money import amount_of

log = logging.getLogger("ledgerweb.notify")


CURSOR = "events"
EVENT_BATCH = 1000
# Events are read again for this long after they were written: on PostgreSQL an event with a
# smaller id can commit after one with a larger id, and the dedupe key makes a second read free.
OVERLAP = dt.timedelta(seconds=15)
DELIVER_BATCH = 50
BACKOFF_CAP = dt.timedelta(hours=1)


def channels() -> list[str]:
    """The channels configured in this deployment."""
    found = []
    if settings.NOTIFY["EMAIL"]:
        found.append("email")
    if settings.NOTIFY["CHAT_WEBHOOK_URL"]:
        found.append("chat")
    return found


def _link(attempt_id: str | None) -> str:
    path = reverse("attempt-detail", args=[attempt_id]) if attempt_id else reverse("overview")
    return settings.NOTIFY["BASE_URL"] + path


@dataclass
class Draft:
    """A notice before it is a row: to whom, what, about which attempt."""

    kind: str
    recipient: Any
    subject: str
    body: str
    key: str
    attempt: Attempt | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def enqueue(drafts: list[Draft], now: dt.datetime | None = None) -> int:
    """Turn drafts into outbox rows, one per wanted channel, each at most once ever. Returns
    how many rows were new."""
    now = now or timezone.now()
    available = channels()
    made = 0
    for draft in routed(drafts):
        person = draft.recipient
        if person is None or not person.is_active:
            continue
        prefs = PersonSettings.of(person)
        if not prefs.wants(draft.kind):
            continue
        wanted = [
            c
            for c in available
            if (c == "email" and prefs.email and person.email) or (c == "chat" and prefs.chat)
        ]
        for channel in wanted:
            try:
                with transaction.atomic():
                    Notification.objects.create(
                        dedupe_key=f"{draft.key}:{person.pk}:{channel}"[:200],
                        kind=draft.kind,
                        channel=channel,
                        recipient=person,
                        attempt=draft.attempt,
                        subject=draft.subject[:300],
                        body=draft.body,
                        created_at=now,
                        next_try_at=now,
                    )
                made += 1
            except IntegrityError:
                continue  # enqueued before: once is enough
    return made


def routed(drafts: list[Draft]) -> list[Draft]:
    """``drafts`` plus a copy for each person a matching notification route names (once per
    person and notice; the dedupe key is per person, so someone both owner and on a route gets
    one). Only people with a role in the attempt's tenant are routed to: a notice shows the
    attempt."""
    about = [d for d in drafts if d.attempt is not None]
    if not about:
        return drafts
    routes = list(NotificationRoute.objects.filter(active=True).prefetch_related("people"))
    if not routes:
        return drafts
    out = list(drafts)
    for draft in about:
        attempt = draft.attempt
        told = {draft.recipient.pk} if draft.recipient is not None else set()
        for route in routes:
            if not route.matches(draft.kind, attempt.tenant_id, attempt.tool_name):
                continue
            for person in route.people.all():
                if person.pk in told or not has_role(person, attempt.tenant_id, Role.VIEWER):
                    continue
                told.add(person.pk)
                out.append(
                    Draft(
                        kind=draft.kind,
                        recipient=person,
                        subject=draft.subject,
                        body=f"{draft.body}\n\n(You are on the notification route {route.name}.)",
                        key=draft.key,
                        attempt=attempt,
                        extra=draft.extra,
                    )
                )
    return out


# ---------------------------------------------------------------------------------------------
# What is worth telling people, read from the attempts' history


def _about(attempt: Attempt) -> str:
    """The attempt in a notice: its id, tool and tenant, and its amount as money when the tool
    declares one (in the deployment's default locale: a notice has no browser)."""
    amount = amount_of(Tool.objects.filter(name=attempt.tool_name).first(), attempt.args)
    money = f", {amount.text}" if amount else ""
    return f"{attempt.attempt_id} ({attempt.tool_name}, tenant {attempt.tenant_id}{money})"


def drafts_for(event: AttemptEvent, attempt: Attempt) -> list[Draft]:
    """The notices one history event calls for (usually none)."""
    users = get_user_model().objects
    key = f"event:{event.pk}"
    out: list[Draft] = []
    moved = event.from_state != event.to_state
    if event.action == "attempt.owner_changed":
        owner_id = (event.details or {}).get("owner_id", attempt.owner_id)
        owner = users.filter(pk=owner_id).first() if owner_id else None
        if owner is not None and owner.get_username() != event.actor:
            out.append(
                Draft(
                    NoticeKind.ASSIGNED,
                    owner,
                    f"[ledgerweb] {event.actor} assigned {attempt.attempt_id} to you",
                    f"{event.actor} assigned {_about(attempt)} to you. It is {attempt.state}.\n"
                    f"{_link(attempt.attempt_id)}",
                    key,
                    attempt,
                )
            )
    if moved and event.to_state == State.MANUAL_REVIEW and attempt.state == State.MANUAL_REVIEW:
        if attempt.awaiting_approval:
            for person in owners.reviewers_of(attempt.tenant_id):
                if person.get_username() == event.actor:
                    continue
                out.append(
                    Draft(
                        NoticeKind.APPROVAL,
                        person,
                        f"[ledgerweb] A linked attempt waits for approval: {attempt.attempt_id}",
                        f"{_about(attempt)} waits for a reviewer's approval before it is sent "
                        f"({event.reason or 'authority changed'}).\n{_link(attempt.attempt_id)}",
                        key,
                        attempt,
                    )
                )
        elif attempt.owner_id:
            owner = users.filter(pk=attempt.owner_id).first()
            out.append(
                Draft(
                    NoticeKind.MANUAL_REVIEW,
                    owner,
                    f"[ledgerweb] {attempt.attempt_id} needs a person: MANUAL_REVIEW",
                    f"{_about(attempt)}, which you own, entered MANUAL_REVIEW: "
                    f"{event.reason or attempt.review_reason}.\n{_link(attempt.attempt_id)}",
                    key,
                    attempt,
                )
            )
    if event.action == APPROVAL_ACTION and attempt.state == State.MANUAL_REVIEW:
        verdict = attempt.approval_verdict()
        approved, needed = set(verdict.valid), verdict.needed
        if len(approved) < needed:
            for person in owners.reviewers_of(attempt.tenant_id):
                if person.get_username() in approved:
                    continue
                out.append(
                    Draft(
                        NoticeKind.APPROVAL,
                        person,
                        f"[ledgerweb] Second approval needed: {attempt.attempt_id}",
                        f"{event.actor} approved {_about(attempt)}; it needs {needed} distinct "
                        f"reviewers ({len(approved)} so far). Yours is awaited.\n"
                        f"{_link(attempt.attempt_id)}",
                        key,
                        attempt,
                    )
                )
    out += _held_drafts(event, attempt, key)
    return out


def _held_drafts(event: AttemptEvent, attempt: Attempt, key: str) -> list[Draft]:
    """Notices about an intent an approval policy holds: it started (or went back to) waiting,
    or one approval of several came in. Told: the people the policy lets approve, but not
    those whose approval already counts."""
    if attempt.approval_policy_id is None or attempt.state != State.AWAITING_APPROVAL:
        return []
    entered = event.from_state != event.to_state and event.to_state == State.AWAITING_APPROVAL
    if not entered and event.action != APPROVAL_ACTION:
        return []
    from attempts.models import ApprovalPolicy

    policy = ApprovalPolicy.objects.get(pk=attempt.approval_policy_id)
    verdict = attempt.approval_verdict(timezone.now())
    if event.action == "attempt.approval_void":
        subject = f"[ledgerweb] Approval expired, approve again: {attempt.attempt_id}"
        what = f"The approvals of {_about(attempt)} expired before it was sent; it waits again"
    elif event.action == APPROVAL_ACTION:
        subject = f"[ledgerweb] Another approval needed: {attempt.attempt_id}"
        what = f"{event.actor} approved {_about(attempt)}"
    else:
        subject = f"[ledgerweb] Approval needed before sending: {attempt.attempt_id}"
        what = f"Approval policy {policy.name} holds {_about(attempt)} before it is sent"
    body = (
        f"{what} ({len(verdict.valid)} of {verdict.needed} approvals).\n{_link(attempt.attempt_id)}"
    )
    out = []
    for person in owners.members_of(attempt.tenant_id):
        if person.get_username() in verdict.valid or person.get_username() == event.actor:
            continue
        if policy.may_approve(person, attempt.tenant_id)[0]:
            out.append(Draft(NoticeKind.APPROVAL, person, subject, body, key, attempt))
    return out


def enqueue_from_events(now: dt.datetime | None = None) -> int:
    """Read the history after the cursor and enqueue what it calls for. The cursor only moves
    past events older than OVERLAP, so an event that commits late is still read."""
    now = now or timezone.now()
    cursor, created = NotifyCursor.objects.get_or_create(name=CURSOR)
    if created:
        # The first run tells nobody about the past: it starts just before now.
        start = (
            AttemptEvent.objects.filter(created_at__lt=now - OVERLAP)
            .order_by("-id")
            .values_list("id", flat=True)
            .first()
        )
        if start:
            NotifyCursor.objects.filter(name=CURSOR).update(last_event_id=start)
            cursor.last_event_id = start
    interesting = (
        Q(action__in=["attempt.owner_changed", APPROVAL_ACTION])
        | (Q(to_state=State.MANUAL_REVIEW) & ~Q(from_state=State.MANUAL_REVIEW))
        | (Q(to_state=State.AWAITING_APPROVAL) & ~Q(from_state=State.AWAITING_APPROVAL))
        # A held call decided or expired: its Slack messages show what became of it.
        | (Q(from_state=State.AWAITING_APPROVAL) & ~Q(to_state=State.AWAITING_APPROVAL))
    )
    events = list(
        AttemptEvent.objects.filter(interesting, id__gt=cursor.last_event_id)
        .select_related("attempt")
        .order_by("id")[:EVENT_BATCH]
    )
    made = 0
    for event in events:
        made += enqueue(drafts_for(event, event.attempt), now)
        slack.note_event(event, event.attempt, now)
    safe = (
        AttemptEvent.objects.filter(id__gt=cursor.last_event_id, created_at__lt=now - OVERLAP)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    if safe is not None:
        if len(events) == EVENT_BATCH:
            safe = min(safe, events[-1].pk)
        NotifyCursor.objects.filter(name=CURSOR, last_event_id__lt=safe).update(last_event_id=safe)
    return made


# ---------------------------------------------------------------------------------------------
# SLAs


def escalate_slas(now: dt.datetime | None = None, limit: int = 500) -> int:
    """Escalate, once per attempt and state, every UNKNOWN or MANUAL_REVIEW attempt past its
    SLA that nobody acknowledged, and tell each person concerned once per pass, one notice
    listing all of their breaches (``owners.told_of_breach``). Returns how many attempts were
    escalated."""
    now = now or timezone.now()
    table = SlaPolicy.table()
    if not table:
        return 0
    shortest = min(min(p.unknown_breach_after, p.review_breach_after) for p in table.values())
    candidates = (
        Attempt.objects.filter(
            state__in=ATTENTION_STATES,
            tool_name__in={tool for tool, _ in table},
            created_at__lte=now - shortest,
        )
        .exclude(
            Exists(SlaEscalation.objects.filter(attempt=OuterRef("pk"), state=OuterRef("state")))
        )
        .select_related("owner")
        .order_by("created_at")[:limit]
    )
    escalated = 0
    # person pk -> (person, [(escalation id, attempt, breach threshold)])
    told: dict[int, tuple[Any, list[tuple[int, Attempt, dt.timedelta]]]] = {}
    # The escalations and their notices commit together: a worker killed in between leaves
    # neither, and the next pass escalates again.
    with transaction.atomic():
        for attempt in candidates:
            policy = SlaPolicy.pick(table, attempt.tool_name, attempt.tenant_id)
            if SlaPolicy.level(policy, attempt.state, attempt.attention_age(now)) != "breach":
                continue
            people = owners.told_of_breach(attempt, policy.escalate_to)
            row, created = SlaEscalation.objects.get_or_create(
                attempt=attempt,
                state=attempt.state,
                defaults={"escalated_to": people[0] if people else None, "escalated_at": now},
            )
            if not created:
                continue
            _, breach = policy.thresholds(attempt.state)
            for person in people:
                told.setdefault(person.pk, (person, []))[1].append((row.pk, attempt, breach))
            escalated += 1
        enqueue([_breach_notice(person, items) for person, items in told.values()], now)
    return escalated


BREACHES_LISTED = 20


def _breach_notice(person: Any, items: list[tuple[int, Attempt, dt.timedelta]]) -> Draft:
    """One notice telling ``person`` of every breach of this pass."""
    lines = []
    for _, attempt, breach in items[:BREACHES_LISTED]:
        owner = attempt.owner.get_username() if attempt.owner else "nobody"
        mine = " (yours)" if attempt.owner_id == person.pk else ""
        lines.append(
            f"- {_about(attempt)}: {attempt.state} past its SLA ({breach}); owner: {owner}{mine}\n"
            f"  {_link(attempt.attempt_id)}"
        )
    if len(items) > BREACHES_LISTED:
        lines.append(f"... and {len(items) - BREACHES_LISTED} more: {_link(None)}")
    first = items[0][1]
    if len(items) == 1:
        subject = f"[ledgerweb] SLA breached: {first.attempt_id} in {first.state}"
    else:
        subject = f"[ledgerweb] SLA breached: {len(items)} attempts"
    body = (
        f"{len(items)} attempt{'s' if len(items) != 1 else ''} breached "
        f"{'its' if len(items) == 1 else 'their'} SLA. Acknowledge or act on each.\n"
        + "\n".join(lines)
    )
    # Each escalation is in exactly one pass's notice to a person: the first one names it.
    key = f"sla:{min(pk for pk, _, _ in items)}"
    return Draft(
        NoticeKind.SLA_BREACH, person, subject, body, key, first if len(items) == 1 else None
    )


# ---------------------------------------------------------------------------------------------
# The daily digest


DIGEST_WINDOW_HOURS = 3


def _greeting(hour: int) -> str:
    return "Good morning" if hour < 12 else "Good afternoon" if hour < 18 else "Good evening"


def enqueue_digests(now: dt.datetime | None = None) -> int:
    """Once a day, at the person's chosen local hour, a summary of their open work."""
    now = now or timezone.now()
    made = 0
    users = get_user_model().objects.filter(is_active=True, ledger_memberships__isnull=False)
    for person in users.distinct():
        prefs = PersonSettings.of(person)
        if prefs.digest_hour is None:
            continue
        try:
            zone = zoneinfo.ZoneInfo(prefs.time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            zone = dt.UTC
        local = now.astimezone(zone)
        # Within a few hours of the chosen hour, never later that day: a worker first started
        # (or back) in the evening does not send the morning's digest at night.
        if not prefs.digest_hour <= local.hour < min(24, prefs.digest_hour + DIGEST_WINDOW_HOURS):
            continue
        scoped = Attempt.objects.visible_to(person)
        owned = scoped.filter(owner_id=person.pk, state__in=ATTENTION_STATES).count()
        awaiting = Attempt.objects.awaiting_approval_of(person).count()
        if not owned and not awaiting:
            continue
        body = (
            f"{_greeting(local.hour)} {person.get_username()}.\n"
            f"You own {owned} attempt{'s' if owned != 1 else ''} in UNKNOWN or MANUAL_REVIEW, and "
            f"{awaiting} wait{'s' if awaiting == 1 else ''} for your approval.\n{_link(None)}"
        )
        made += enqueue(
            [
                Draft(
                    NoticeKind.DIGEST,
                    person,
                    f"[ledgerweb] Your day: {owned} owned, {awaiting} awaiting approval",
                    body,
                    f"digest:{local.date().isoformat()}",
                )
            ],
            now,
        )
    return made


# ---------------------------------------------------------------------------------------------
# Delivery


class DeliveryError(Exception):
    """A channel refused or failed to take a notice (retried later)."""


def _send_email(notice: Notification) -> None:
    message = EmailMessage(
        subject=notice.subject,
        body=notice.body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[notice.recipient.email],
        headers={
            "Message-ID": f"<{notice.notice_id}@ledgerweb>",
            "X-Ledgerweb-Notice": notice.notice_id,
        },
    )
    try:
        sent = message.send(using="default")
    except Exception as exc:  # noqa: BLE001 (smtplib, socket and ssl errors alike)
        raise DeliveryError(f"email: {exc}") from exc
    if sent != 1:
        raise DeliveryError("email: the backend did not send it")


def _send_chat(notice: Notification) -> None:
    payload = {
        "text": f"@{notice.recipient.get_username()} {notice.subject}\n{notice.body}",
        "notice_id": notice.notice_id,
        "kind": notice.kind,
    }
    request = urllib.request.Request(  # noqa: S310 (the operator configures the address)
        settings.NOTIFY["CHAT_WEBHOOK_URL"],
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "X-Ledgerweb-Notice": notice.notice_id},
        method="POST",
    )
    try:
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=settings.NOTIFY["CHAT_TIMEOUT"]
        ) as response:
            if not 200 <= response.status < 300:
                raise DeliveryError(f"chat webhook answered {response.status}")
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"chat webhook answered {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryError(f"chat webhook: {exc}") from exc


def _claim(pk: int, now: dt.datetime) -> str | None:
    """Lease one due notice; the token, or None when another worker has it."""
    token = secrets.token_hex(16)
    lease = dt.timedelta(seconds=settings.NOTIFY["LEASE_SECONDS"])
    changed = (
        Notification.objects.filter(pk=pk, status=NoticeStatus.PENDING, next_try_at__lte=now)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(claim_token=token, lease_until=now + lease)
    )
    return token if changed == 1 else None


def deliver_due(now: dt.datetime | None = None, limit: int = DELIVER_BATCH) -> dict[str, int]:
    """Deliver up to ``limit`` due notices; returns counts by outcome."""
    now = now or timezone.now()
    counts = {"sent": 0, "failed": 0, "dead": 0}
    due = list(
        Notification.objects.filter(status=NoticeStatus.PENDING, next_try_at__lte=now)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .order_by("next_try_at", "id")
        .values_list("pk", flat=True)[:limit]
    )
    for pk in due:
        token = _claim(pk, now)
        if token is None:
            continue
        crash_point("notify_claimed")
        notice = Notification.objects.select_related("recipient").get(pk=pk)
        try:
            if notice.channel == "email":
                _send_email(notice)
            else:
                _send_chat(notice)
        except DeliveryError as exc:
            tries = notice.tries + 1
            dead = tries >= settings.NOTIFY["MAX_TRIES"]
            Notification.objects.filter(pk=pk, claim_token=token).update(
                tries=tries,
                status=NoticeStatus.DEAD if dead else NoticeStatus.PENDING,
                next_try_at=now + min(BACKOFF_CAP, dt.timedelta(seconds=5 * 2**tries)),
                lease_until=None,
                claim_token="",
                last_error=str(exc)[:500],
            )
            log.warning("notice %s not delivered: %s", notice.notice_id, exc)
            counts["dead" if dead else "failed"] += 1
            continue
        crash_point("notify_sent")
        Notification.objects.filter(pk=pk, claim_token=token).update(
            status=NoticeStatus.SENT,
            sent_at=timezone.now(),
            tries=notice.tries + 1,
            lease_until=None,
            last_error="",
        )
        counts["sent"] += 1
    return counts


class NotifyStep:
    """The worker's notification step: enqueue from the history, SLAs now and then, digests,
    then deliver. Each part returns quickly when there is nothing to do."""

    def __init__(self) -> None:
        self._last_sla: dt.datetime | None = None

    def run(self, now: dt.datetime | None = None) -> dict[str, int]:
        now = now or timezone.now()
        if not channels() and not slack.enabled() and not SlaPolicy.objects.exists():
            return {}
        done = {"enqueued": enqueue_from_events(now)}
        every = dt.timedelta(seconds=settings.NOTIFY["SLA_EVERY"])
        if self._last_sla is None or now - self._last_sla >= every:
            done["escalated"] = escalate_slas(now)
            done["enqueued"] += enqueue_digests(now)
            self._last_sla = now
        done.update(deliver_due(now))
        done.update({f"slack_{k}": v for k, v in slack.deliver_due(now).items()})
        return done
