"""Approve and reject held calls in Slack (docs/integrations.md, "Slack approvals").

A call an approval policy holds is posted, as an interactive message, to the Slack channel of
every notification route that matches it (``NotificationRoute.slack_channel``): the tool, the
tenant, the values the policy's condition saw (secret fields redacted), the amount as money
where the tool declares one (``attempts.money``), the approvals so far, and Approve / Reject / Open buttons. The messages are an
outbox (``SlackMessage``), posted and updated by the reconcile worker's notification step under
a lease, like ``notify``'s notices: Slack being slow or down never holds up the ledger.

A click reaches ``/slack/interactions`` (``interaction``). It is refused unless Slack's
signature verifies (``slack_sdk``'s ``SignatureVerifier`` with the signing secret; a timestamp
more than five minutes away is refused) and the request was not seen before (``SlackRequest``
remembers signatures and click ids). The Slack user is mapped to a ledger user by a verified
identity (``identity``), and the decision is made by ``review.approve_held`` or
``review.reject_held``: the dashboard's rules, whole (role, tenant, four eyes, never whoever
recorded the intent, expiry, the policy version the message showed). Then the message is
updated with the decision and who made it. Edit-and-approve stays in the dashboard: the Open
button links to it.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import secrets
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from attempts import review
from attempts.ledger import LedgerError
from attempts.locking import write_transaction
from attempts.models import (
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    NoticeKind,
    NotificationRoute,
    SlackIdentity,
    SlackMessage,
    SlackRequest,
    State,
    Tool,
)
from attempts.money import amount_of
from attempts.redact import redact

log = logging.getLogger("ledgerweb.slack")

APPROVE, REJECT, OPEN = "ledger_approve", "ledger_reject", "ledger_open"
# Slack refuses a request whose timestamp is further than this from now; so do we.
MAX_SKEW = 5 * 60
# Seen requests are remembered a little longer than a signature stays acceptable.
REMEMBER = dt.timedelta(seconds=2 * MAX_SKEW)
DELIVER_BATCH = 50
BACKOFF_CAP = dt.timedelta(hours=1)


def enabled() -> bool:
    """Slack approvals are on when the bot token and the signing secret are both set."""
    return bool(settings.SLACK["BOT_TOKEN"] and settings.SLACK["SIGNING_SECRET"])


MAX_ANSWER = 1 << 20


def _request(url: str, req: urllib.request.Request, *, timeout: float, ssl: Any) -> dict:
    """One Web API request with a deadline on the whole of it (connect, send, every read), not
    per read: a server that answers a byte at a time cannot hold a worker or a click past it.
    Answers what slack_sdk's own urllib transport answers (status, headers, decoded body)."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"Slack did not answer within {timeout:g} seconds")
        return remaining

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"Slack's API address is http(s)://host/...; got {url!r}")
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=left(), context=ssl
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=left())
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(req.get_method(), path, body=req.data, headers=dict(req.header_items()))
        # The socket itself: the connection lets go of it once an answer says it will close.
        sock = connection.sock
        if sock is not None:
            sock.settimeout(left())
        response = connection.getresponse()
        chunks, total = [], 0
        while not response.isclosed():  # closed: the whole answer is read
            if sock is not None:
                sock.settimeout(left())
            chunk = response.read1(65536)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_ANSWER:
                raise ValueError("Slack answered more than 1 MiB")
            chunks.append(chunk)
        left()
        charset = response.headers.get_content_charset() or "utf-8"
        body = b"".join(chunks).decode(charset, errors="replace")
        return {"status": response.status, "headers": response.headers, "body": body}
    except TimeoutError:
        raise TimeoutError(f"Slack did not answer within {timeout:g} seconds") from None
    finally:
        connection.close()


def client() -> Any:
    """slack_sdk's Web API client, with a deadline on the whole of each call and no retries of
    its own (the outbox retries)."""
    from slack_sdk import WebClient

    class DeadlineClient(WebClient):
        def _perform_urllib_http_request_internal(self, url: str, req: Any) -> dict:
            return _request(url, req, timeout=float(self.timeout), ssl=self.ssl)

    return DeadlineClient(
        token=settings.SLACK["BOT_TOKEN"],
        base_url=settings.SLACK["API_URL"],
        timeout=settings.SLACK["TIMEOUT"],
        retry_handlers=[],
    )


# ---------------------------------------------------------------------------------------------
# The outbox: which messages there should be, and what they show


def channels_for(attempt: Attempt) -> list[str]:
    """The Slack channels of the active routes that carry approval notices about ``attempt``."""
    routes = NotificationRoute.objects.filter(active=True).exclude(slack_channel="")
    return sorted(
        {
            r.slack_channel
            for r in routes
            if r.matches(NoticeKind.APPROVAL, attempt.tenant_id, attempt.tool_name)
        }
    )


def note_event(event: AttemptEvent, attempt: Attempt, now: dt.datetime | None = None) -> int:
    """What one history event means for the Slack messages (called by ``notify`` for every
    event it reads): a call that starts waiting for approval gets a message in each route's
    channel; any later event of an attempt with messages asks for them to be updated.
    Reading an event twice costs at most one more update. Returns messages made or touched."""
    if not enabled():
        return 0
    now = now or timezone.now()
    entered = event.from_state != event.to_state and event.to_state == State.AWAITING_APPROVAL
    made = 0
    if entered and attempt.approval_policy_id is not None:
        for channel in channels_for(attempt):
            try:
                with transaction.atomic():
                    SlackMessage.objects.create(attempt=attempt, channel=channel, next_try_at=now)
                made += 1
            except IntegrityError:
                pass  # there is one already: it is updated below
    return made + touch(attempt, now)


def touch(attempt: Attempt, now: dt.datetime | None = None) -> int:
    """Ask for ``attempt``'s messages to be shown again (a decision, an approval, an expiry)."""
    now = now or timezone.now()
    return SlackMessage.objects.filter(attempt=attempt).update(
        wanted=F("wanted") + 1, next_try_at=now, dead=False, tries=0
    )


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:200]


def _link(path: str) -> str:
    return settings.NOTIFY["BASE_URL"] + path


def _decision_line(attempt: Attempt, verdict: Any) -> str:
    """What became of a call that is no longer waiting, and who decided."""
    left = (
        AttemptEvent.objects.filter(attempt=attempt, from_state=State.AWAITING_APPROVAL)
        .exclude(to_state=State.AWAITING_APPROVAL)
        .order_by("-id")
        .first()
    )
    if left is None:
        return f"It is {attempt.state}."
    if left.to_state == State.INTENT_RECORDED:
        who = ", ".join(verdict.valid) or left.actor
        return f":white_check_mark: Approved by {who}; the agent may send it (now {attempt.state})."
    if left.action == "attempt.approval_rejected":
        return f":x: Rejected by {left.actor}: {left.reason}"
    if left.to_state == State.FAILED:
        return (
            f":hourglass: Not approved in time ({left.reason or left.action}); it will not be sent."
        )
    return f"It is {attempt.state} ({left.action} by {left.actor})."


def render(attempt: Attempt, now: dt.datetime | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The message about a held ``attempt``: its fallback text and its Block Kit blocks."""
    now = now or timezone.now()
    policy = ApprovalPolicy.objects.get(pk=attempt.approval_policy_id)
    verdict = attempt.approval_verdict(now)
    first = AttemptEvent.objects.filter(attempt=attempt).order_by("id").first()
    held = ((first.details or {}).get("approval", {}) if first else {}) or {}
    values, _ = redact(held.get("values", {}))
    args = attempt.args if isinstance(attempt.args, dict) else {}
    title = f"{attempt.tool_name} in {attempt.tenant_id} waits for approval"
    lines = [
        f"*{title}*",
        f"Policy `{policy.name}` (version {policy.version})"
        + (f": `{policy.condition}`" if policy.condition else ""),
    ]
    lines += [f"• {name} = {_value(value)}" for name, value in values.items()]
    # The amount as money only where the tool declares it (attempts/money.py): never guessed.
    amount = amount_of(Tool.objects.filter(name=attempt.tool_name).first(), args)
    if amount is not None:
        lines.append(f"Amount: *{amount.text}* ({amount.raw})")
    approvers = f" ({', '.join(verdict.valid)})" if verdict.valid else ""
    lines.append(f"Approvals: {len(verdict.valid)} of {verdict.needed}{approvers}")
    waiting = attempt.state == State.AWAITING_APPROVAL
    if not waiting:
        lines.append(_decision_line(attempt, verdict))
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:2900]}},
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"attempt {attempt.attempt_id}"}],
        },
    ]
    detail = _link(reverse("attempt-detail", args=[attempt.attempt_id]))
    buttons: list[dict[str, Any]] = []
    if waiting:
        value = json.dumps(
            {
                "attempt": attempt.attempt_id,
                "args_hash": attempt.args_hash,
                "policy_version": policy.version,
            }
        )
        buttons += [
            _button("Approve", APPROVE, value, style="primary"),
            _button("Reject", REJECT, value, style="danger"),
        ]
        edit = _link(reverse("approval-edit", args=[attempt.attempt_id]))
        buttons.append({**_button("Open (edit and approve)", OPEN, "open"), "url": edit})
    else:
        buttons.append({**_button("Open", OPEN, "open"), "url": detail})
    blocks.append({"type": "actions", "block_id": "ledger", "elements": buttons})
    text = f"{title}: {len(verdict.valid)} of {verdict.needed} approvals"
    if not waiting:
        text = f"{attempt.tool_name} in {attempt.tenant_id}: {_decision_line(attempt, verdict)}"
    return text, blocks


def _button(label: str, action_id: str, value: str, *, style: str = "") -> dict[str, Any]:
    button = {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "action_id": action_id,
        "value": value,
    }
    if style:
        button["style"] = style
    return button


# ---------------------------------------------------------------------------------------------
# Delivery (the reconcile worker's notification step, and right after a click)


def _claim(pk: int, now: dt.datetime) -> tuple[str, int] | None:
    """Lease one due message: (token, the revision being shown), or None when another has it."""
    token = secrets.token_hex(16)
    lease = dt.timedelta(seconds=settings.NOTIFY["LEASE_SECONDS"])
    changed = (
        SlackMessage.objects.filter(pk=pk, dead=False, shown__lt=F("wanted"), next_try_at__lte=now)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(claim_token=token, lease_until=now + lease)
    )
    if changed != 1:
        return None
    wanted = SlackMessage.objects.filter(pk=pk).values_list("wanted", flat=True).first()
    return token, wanted


def deliver_due(
    now: dt.datetime | None = None, limit: int = DELIVER_BATCH, attempt: Attempt | None = None
) -> dict[str, int]:
    """Post or update up to ``limit`` due messages (only ``attempt``'s, when given); returns
    counts by outcome. A failure is retried later with a growing pause; after
    ``NOTIFY['MAX_TRIES']`` the message is given up (``dead``) until the next change."""
    counts = {"posted": 0, "updated": 0, "failed": 0}
    if not enabled():
        return counts
    now = now or timezone.now()
    due = SlackMessage.objects.filter(dead=False, shown__lt=F("wanted"), next_try_at__lte=now)
    due = due.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    if attempt is not None:
        due = due.filter(attempt=attempt)
    web = client()
    for pk in list(due.order_by("next_try_at", "id").values_list("pk", flat=True)[:limit]):
        claimed = _claim(pk, now)
        if claimed is None:
            continue
        token, revision = claimed
        message = SlackMessage.objects.select_related("attempt").get(pk=pk)
        try:
            text, blocks = render(message.attempt, now)
            if message.ts:
                web.chat_update(channel=message.channel, ts=message.ts, text=text, blocks=blocks)
                outcome, ts = "updated", message.ts
            else:
                answer = web.chat_postMessage(channel=message.channel, text=text, blocks=blocks)
                outcome, ts = "posted", str(answer["ts"])
        except Exception as exc:  # noqa: BLE001 (slack_sdk's, urllib's and socket errors alike)
            tries = message.tries + 1
            SlackMessage.objects.filter(pk=pk, claim_token=token).update(
                tries=tries,
                dead=tries >= settings.NOTIFY["MAX_TRIES"],
                next_try_at=now + min(BACKOFF_CAP, dt.timedelta(seconds=5 * 2**tries)),
                lease_until=None,
                claim_token="",
                last_error=f"{type(exc).__name__}: {exc}"[:500],
            )
            log.warning("Slack message about %s not delivered: %s", message.attempt_id, exc)
            counts["failed"] += 1
            continue
        SlackMessage.objects.filter(pk=pk, claim_token=token).update(
            ts=ts, shown=revision, tries=0, lease_until=None, claim_token="", last_error=""
        )
        counts[outcome] += 1
    return counts


# ---------------------------------------------------------------------------------------------
# Clicks


@dataclass(frozen=True)
class Answer:
    """What the interaction endpoint answers: an HTTP status and a message for a person."""

    status: int
    text: str
    decided: bool = False


def _remember(keys: list[str], now: dt.datetime) -> bool:
    """Record the request's keys; False when one of them was seen before (a replay)."""
    SlackRequest.objects.filter(received_at__lt=now - REMEMBER).delete()
    try:
        with transaction.atomic():
            for key in keys:
                SlackRequest.objects.create(key=key[:200], received_at=now)
    except IntegrityError:
        return False
    return True


def identity(team_id: str, slack_user_id: str) -> tuple[Any | None, str]:
    """The ledger user a Slack user is, by a verified identity, or (None, why not):

    - a ``SlackIdentity`` an administrator made (the configuration history records it), or
    - the email Slack has confirmed for the user (``users.info``), equal to the email of exactly
      one active ledger user who signs in through the identity provider (an SSO subject), so
      both sides vouch for it. An email typed into a local account is not enough."""
    row = (
        SlackIdentity.objects.select_related("user")
        .filter(team_id=team_id, slack_user_id=slack_user_id)
        .first()
    )
    if row is not None:
        if row.user.is_active:
            return row.user, ""
        return None, f"the ledger user {row.user.get_username()} is inactive"
    try:
        found = client().users_info(user=slack_user_id)["user"]
    except Exception as exc:  # noqa: BLE001 (Slack unreachable or refusing: not mapped)
        log.warning("users.info for %s failed: %s", slack_user_id, exc)
        return None, "Slack could not tell who you are just now; try again later"
    email = str((found.get("profile") or {}).get("email") or "")
    if found.get("deleted") or found.get("is_bot") or not found.get("is_email_confirmed"):
        return None, "your Slack account has no confirmed email"
    if not email:
        return None, "your Slack account has no email the app may read"
    people = list(
        get_user_model()
        .objects.filter(is_active=True, email__iexact=email, sso_identity__isnull=False)
        .order_by("pk")[:2]
    )
    if len(people) != 1:
        return None, (
            f"no single ledger user signing in through the identity provider has the email "
            f"{email}; ask an administrator to link your Slack account"
        )
    return people[0], ""


def _payload(body: bytes) -> dict[str, Any] | None:
    try:
        form = urllib.parse.parse_qs(body.decode(), strict_parsing=True)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError, IndexError):
        return None
    return payload if isinstance(payload, dict) else None


def _tell(channel: str, user: str, text: str) -> None:
    """Show ``text`` to the Slack user who clicked, in the channel, for their eyes only. A
    failure is logged: the answer to the request carries the same text."""
    if not channel or not user:
        return
    try:
        client().chat_postEphemeral(channel=channel, user=user, text=text)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not tell %s in Slack: %s", user, exc)


def interaction(body: bytes, headers: Any, now: float | None = None) -> Answer:
    """Handle one request Slack sent to the interaction endpoint (a button click)."""
    if not enabled():
        return Answer(404, "Slack approvals are not configured here")
    from slack_sdk.signature import SignatureVerifier

    now = time.time() if now is None else now
    stamp = headers.get("X-Slack-Request-Timestamp") or ""
    signature = headers.get("X-Slack-Signature") or ""
    if not stamp.isdigit() or not signature:
        return Answer(401, "refused: the request carries no Slack signature")
    if abs(now - int(stamp)) > MAX_SKEW:
        return Answer(401, "refused: the request's timestamp is more than five minutes off")
    if not SignatureVerifier(settings.SLACK["SIGNING_SECRET"]).is_valid(body, stamp, signature):
        return Answer(401, "refused: the Slack signature does not match")
    payload = _payload(body)
    if payload is None or payload.get("type") != "block_actions" or not payload.get("actions"):
        return Answer(400, "refused: not a button click Slack sends")
    action = payload["actions"][0] if isinstance(payload["actions"][0], dict) else {}
    team = str((payload.get("team") or {}).get("id") or "")
    slack_user = str((payload.get("user") or {}).get("id") or "")
    channel = str((payload.get("channel") or {}).get("id") or "")
    click = f"click:{team}:{slack_user}:{action.get('action_ts', '')}:{action.get('action_id')}"
    if not _remember([f"sig:{signature}", click], timezone.now()):
        return Answer(409, "refused: this request was received before (a replay)")
    if action.get("action_id") == OPEN:
        return Answer(200, "opened in the dashboard")
    if action.get("action_id") not in (APPROVE, REJECT):
        return Answer(400, "refused: an action this app does not have")
    try:
        value = json.loads(str(action.get("value", "")))
        attempt_id = str(value["attempt"])
        seen_hash, seen_version = str(value["args_hash"]), int(value["policy_version"])
    except (ValueError, KeyError, TypeError):
        return Answer(400, "refused: the button does not name a held attempt")
    user, why = identity(team, slack_user)
    if user is None:
        answer = Answer(200, f"Not decided: {why}.")
    else:
        answer = decide(
            user, attempt_id, approve=action["action_id"] == APPROVE, seen=(seen_hash, seen_version)
        )
    if answer.decided:
        attempt = Attempt.objects.filter(attempt_id=attempt_id).first()
        if attempt is not None:
            touch(attempt)
            deliver_due(attempt=attempt)  # now rather than at the worker's next pass
    else:
        _tell(channel, slack_user, answer.text)
    return answer


def decide(user: Any, attempt_id: str, *, approve: bool, seen: tuple[str, int]) -> Answer:
    """``user`` approves or rejects the held attempt, by ``review``'s rules, as the message
    showed it (its arguments' hash and its policy's version). Two people clicking at once are
    taken one after the other: each click is one decision."""
    args_hash, policy_version = seen
    name = user.get_username()
    try:
        with write_transaction():
            current = Attempt.objects.select_for_update().filter(attempt_id=attempt_id).first()
            if current is None:
                return Answer(200, f"Not decided: there is no attempt {attempt_id}.")
            before = current.state
            form = review.Seen(current.version, None, args_hash, policy_version)
            if approve:
                after = review.approve_held(
                    current.attempt_id, user=user, comment="approved in Slack", seen=form
                )
            else:
                after = review.reject_held(
                    current.attempt_id, user=user, reason=f"rejected in Slack by {name}", seen=form
                )
    except LedgerError as exc:
        return Answer(200, f"Not decided: {exc}")
    if before != State.AWAITING_APPROVAL:
        return Answer(200, f"Not decided: nothing changed, it is {after.state} already.")
    if not approve:
        return Answer(200, f"Rejected by {name}.", decided=True)
    verdict = after.approval_verdict()
    if after.state == State.AWAITING_APPROVAL:
        text = f"Approved by {name}: {len(verdict.valid)} of {verdict.needed} approvals."
    else:
        text = f"Approved by {name}: released, the agent may send it."
    return Answer(200, text, decided=True)
