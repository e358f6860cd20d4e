"""Erasure: a four-eyes, recorded redaction of an attempt's arguments and free text that leaves
every chain, checkpoint and receipt verifiable.

One admin of the attempt's tenant asks (``request_erasure``, with a reason); a different admin
approves (``approve_erasure``), and then, in one transaction, for the attempt and every attempt of
its lineage (linked attempts carry the same arguments):

- the plaintext arguments become ``verify_export.ERASED_ARGS`` and the salt a fresh one, so the
  salted digest the creation event recorded commits to nothing anyone can recompute;
- each event's free text (its reason and the details ``verify_export.PUBLIC_DETAILS`` does not
  name) becomes the marker; what the event's hash covers (its salted ``text_digest`` and its
  public details) stays, so the chain, its sealed heads and every receipt verify as before;
- approvers' comments are emptied;
- an ``attempt.erased`` event records who asked, who approved, when, why and which fields.

Only attempts written in chain format 3 (with a salt) can be erased: older formats hash the
free text itself, so removing it would break their chains (``NotErasable`` says so). Only settled
attempts (OUTCOME_CONFIRMED, FAILED, RECONCILED): a live one still needs its arguments.

What remains after erasure, and what it means for GDPR and record keeping: docs/privacy.md.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone

from attempts import chain, dbadapter, states
from attempts.ledger import AttemptNotFound, InvalidIntent, NotAllowed, StateConflict, _text
from attempts.locking import write_transaction
from attempts.models import (
    Attempt,
    AttemptEvent,
    ErasureRequest,
    Role,
    has_role,
)
from attempts.states import Actor
from attempts.verify_export import (
    ERASED_ARGS,
    ERASED_TEXT,
    ERASURE_ACTION,
    SALTED_FORMAT,
    chain_time,
    is_erased_event,
    split_details,
)

# Who may ask for and approve an erasure in a tenant.
ERASURE_ROLE = Role.ADMIN
Pending = ErasureRequest.Status.PENDING


class NotErasable(StateConflict):
    """The attempt cannot be erased (its chain format, its state, or a request in the way)."""

    def __init__(self, message: str, *, code: str = "not_erasable") -> None:
        super().__init__(message, code=code)


def _require_admin(user: Any, attempt: Attempt) -> None:
    if not has_role(user, attempt.tenant_id, ERASURE_ROLE, fresh=True):
        raise NotAllowed(f"erasure needs the {ERASURE_ROLE} role in tenant {attempt.tenant_id}")


def _attempt(attempt: Attempt | str, tenants: set[str] | None = None) -> Attempt:
    attempt_id = attempt.attempt_id if isinstance(attempt, Attempt) else attempt
    if not isinstance(attempt_id, str):
        raise AttemptNotFound(f"no attempt {attempt_id!r}")
    qs = (
        Attempt.objects.select_for_update()
        if connection.vendor == "postgresql"
        else Attempt.objects
    )
    if tenants is not None:
        qs = qs.filter(tenant_id__in=tenants)
    found = qs.filter(attempt_id=attempt_id).first()
    if found is None:
        raise AttemptNotFound(f"no attempt {attempt_id!r}")
    return found


def lineage(attempt: Attempt) -> list[Attempt]:
    """Every attempt of ``attempt``'s lineage (its root and everything linked from it), by id:
    they carry the same arguments, so they are erased together."""
    root = attempt
    while root.parent_id is not None:
        root = Attempt.objects.get(pk=root.parent_id)
    found = {root.pk: root}
    frontier = [root.pk]
    while frontier:
        children = list(Attempt.objects.filter(parent_id__in=frontier))
        frontier = [child.pk for child in children if child.pk not in found]
        found.update({child.pk: child for child in children})
    return sorted(found.values(), key=lambda a: a.pk)


def erasure_refusal(attempt: Attempt) -> str | None:
    """Why ``attempt`` (and its lineage) cannot be erased now, in words for a person; None if
    it can."""
    for member in lineage(attempt):
        which = "it" if member.pk == attempt.pk else f"its linked attempt {member.attempt_id}"
        if not member.args_salt:
            return (
                f"{which} was recorded before erasable history (chain format {SALTED_FORMAT}): "
                "its history hashes its free text itself, so erasing that text would break the "
                "chain and every proof sealed over it. It stays as it is; see docs/privacy.md"
            )
        if member.args == ERASED_ARGS and not _written_since_erasure(member):
            return f"{which} is already erased, and nothing was written to it since"
        if not member.is_terminal:
            return (
                f"{which} is {member.state}: only a settled attempt (OUTCOME_CONFIRMED, FAILED "
                "or RECONCILED) can be erased, a live one still needs its arguments"
            )
    return None


def _written_since_erasure(attempt: Attempt) -> bool:
    """Whether events came after the attempt's last erasure (a note, say): they are erasable."""
    last = (
        AttemptEvent.objects.filter(attempt=attempt, action=ERASURE_ACTION)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    return AttemptEvent.objects.filter(attempt=attempt, id__gt=last or 0).exists()


def pending_request(attempt: Attempt) -> ErasureRequest | None:
    """The erasure request waiting for a second admin on ``attempt``, if any."""
    return (
        ErasureRequest.objects.filter(attempt=attempt, status=Pending)
        .select_related("requested_by")
        .first()
    )


def _pending(attempt: Attempt, user: Any) -> ErasureRequest:
    """The request an admin decides on, or a refusal."""
    _require_admin(user, attempt)
    request = pending_request(attempt)
    if request is None:
        raise NotErasable(f"no erasure of {attempt.attempt_id} waits", code="no_request")
    return request


def request_erasure(
    attempt: Attempt | str, *, user: Any, reason: str, tenants: set[str] | None = None
) -> ErasureRequest:
    """Ask for the erasure of the attempt's (and its lineage's) arguments and free text. An
    admin of its tenant; a reason is required; a second admin must approve."""
    reason = _text("reason", reason)
    if reason == ERASED_TEXT:
        raise InvalidIntent(f"{ERASED_TEXT!r} is the erasure marker: say why the data goes")
    with write_transaction():
        current = _attempt(attempt, tenants)
        _require_admin(user, current)
        why_not = erasure_refusal(current)
        if why_not:
            raise NotErasable(f"cannot erase {current.attempt_id}: {why_not}")
        if pending_request(current) is not None:
            raise NotErasable(
                f"an erasure of {current.attempt_id} already waits for approval", code="pending"
            )
        return ErasureRequest.objects.create(
            attempt=current, requested_by=user, reason=reason, requested_at=timezone.now()
        )


def cancel_erasure(
    attempt: Attempt | str, *, user: Any, tenants: set[str] | None = None
) -> ErasureRequest:
    """Withdraw the pending erasure request (any admin of the tenant, the requester included)."""
    with write_transaction():
        current = _attempt(attempt, tenants)
        request = _pending(current, user)
        request.status = ErasureRequest.Status.CANCELLED
        request.decided_by, request.decided_at = user, timezone.now()
        request.save(update_fields=["status", "decided_by", "decided_at"])
        return request


def approve_erasure(
    attempt: Attempt | str, *, user: Any, tenants: set[str] | None = None
) -> Attempt:
    """Approve the pending request and erase, in one transaction: another admin than the one
    who asked. Returns the attempt as erased."""
    if connection.vendor == "sqlite":
        # Freed and rewritten space is overwritten, not left for a file reader to find.
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA secure_delete = ON")
    with write_transaction():
        current = _attempt(attempt, tenants)
        request = _pending(current, user)
        if request.requested_by_id == user.pk:
            raise NotAllowed(
                "four eyes: the erasure must be approved by another admin than the one who "
                "asked for it"
            )
        why_not = erasure_refusal(current)
        if why_not:
            raise NotErasable(f"cannot erase {current.attempt_id}: {why_not}")
        now = timezone.now()
        members = lineage(current)
        for member in members:
            _erase(
                current if member.pk == current.pk else member,
                request=request,
                approver=user,
                lineage_ids=[m.attempt_id for m in members],
                now=now,
            )
        request.status = ErasureRequest.Status.ERASED
        request.decided_by, request.decided_at = user, now
        request.save(update_fields=["status", "decided_by", "decided_at"])
    if connection.vendor == "sqlite" and not dbadapter.in_atomic_block(connection):
        _checkpoint_sqlite()
    current.refresh_from_db()
    return current


def _erase(
    attempt: Attempt,
    *,
    request: ErasureRequest,
    approver: Any,
    lineage_ids: list[str],
    now: Any,
) -> None:
    """Replace one attempt's plaintext and salt, and record it in its history."""
    private_keys: set[str] = set()
    texts = 0
    for event in AttemptEvent.objects.filter(attempt=attempt).order_by("id"):
        if event.chain_format < SALTED_FORMAT:
            raise NotErasable(f"event {event.pk} of {attempt.attempt_id} is not erasable")
        row = {"reason": event.reason, "details": event.details}
        if is_erased_event(row):
            continue
        public, private = split_details(event.details)
        private_keys.update(private)
        texts += bool(event.reason)
        AttemptEvent.objects.filter(pk=event.pk).update(reason=ERASED_TEXT, details=public)
    fields = ["args", "salt"]
    if texts:
        fields.append("reason")
    fields += [f"details.{key}" for key in sorted(private_keys)]
    # The erasure's own event is committed with the new salt (its reason is free text too).
    salt = chain.new_salt()
    attempt.args_salt = salt
    states.move(
        attempt,
        None,
        action=ERASURE_ACTION,
        actor=Actor.user(approver),
        reason=request.reason,
        details={
            "erasure": {
                "request": request.pk,
                "requested_by": request.requested_by.get_username(),
                "requested_at": chain_time(request.requested_at),
                "approved_by": approver.get_username(),
                "fields": fields,
                "lineage": lineage_ids,
            }
        },
        fields={"args": ERASED_ARGS, "args_salt": salt},
        now=now,
    )


def _checkpoint_sqlite() -> None:
    """Move the WAL into the database file and truncate it, so the erased text's old pages are
    not left in the WAL. Best effort: a reader holding an old snapshot lets it finish later."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
