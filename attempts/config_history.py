"""Changes to what decides authority or review, recorded in the tamper-evident history.

A tool's effect class and critical flag (four eyes, automatic resends), a grant's policy version,
scopes and activity, and the ownership rules are configuration that changes what the ledger does
with an attempt. Every place that changes them (the admin, ``load_tools``) saves through
``save_with_history`` / ``delete_with_history``, which append a ``ConfigEvent`` with who made the
change, before and after, in the same transaction (``attempts.chain.record_config_change``).
The attempt detail page shows the changes affecting the attempt
(``ConfigEvent.objects.affecting``).
"""

from __future__ import annotations

from typing import Any

from django.db import models

from attempts.chain import record_config_change
from attempts.locking import write_transaction
from attempts.models import ApprovalPolicy, Grant, OwnershipRule, Tool
from attempts.states import Actor

# The fields of each model whose change is recorded, by model.
TRACKED: dict[type[models.Model], tuple[str, ...]] = {
    Tool: (
        "effect_class",
        "critical",
        "active",
        "adapter",
        "dispatch_url",
        "lookup_url",
        "timeout_seconds",
        "max_sends",
    ),
    Grant: ("tenant_id", "tool_id", "policy_version", "allowed_scopes", "active"),
    OwnershipRule: ("tenant_pattern", "tool_pattern", "owner_id", "priority"),
    ApprovalPolicy: (
        "tool_id",
        "tenants",
        "condition",
        "approvals_needed",
        "approver_role",
        "approver_group",
        "approval_ttl_seconds",
        "max_wait_seconds",
        "active",
        "version",
    ),
}


def subject_of(instance: models.Model) -> str:
    """The config subject an instance is recorded under (``tool:<name>`` and so on)."""
    if isinstance(instance, Tool):
        return f"tool:{instance.name}"
    if isinstance(instance, Grant):
        return f"grant:{instance.tenant_id}/{instance.tool_id}"
    if isinstance(instance, OwnershipRule):
        return f"ownership_rule:{instance.pk}"
    if isinstance(instance, ApprovalPolicy):
        return f"approval_policy:{instance.pk}"
    raise TypeError(f"{type(instance).__name__} is not tracked configuration")


def snapshot(instance: models.Model) -> dict[str, Any]:
    """The tracked fields of ``instance`` as JSON values."""
    values = {}
    for name in TRACKED[type(instance)]:
        value = getattr(instance, name)
        values[name] = list(value) if isinstance(value, list | tuple) else value
    if isinstance(instance, OwnershipRule):
        values["owner"] = instance.owner.get_username() if instance.owner_id else None
    return values


def _stored(instance: models.Model) -> models.Model | None:
    if instance.pk is None:
        return None
    return type(instance)._default_manager.filter(pk=instance.pk).first()


def save_with_history(instance: models.Model, *, actor: Actor, reason: str = "", save=None) -> bool:
    """Save ``instance`` (with ``save()``, or the given callable) and record the change of its
    tracked fields, in one transaction. Returns whether anything tracked changed."""
    with write_transaction():
        stored = _stored(instance)
        before = snapshot(stored) if stored is not None else None
        (save or instance.save)()
        after = snapshot(instance)
        if before == after:
            return False
        record_config_change(
            subject=subject_of(instance),
            action="created" if before is None else "changed",
            actor=actor,
            before=_changed(before, after, keep=before),
            after=_changed(before, after, keep=after),
            reason=reason,
        )
        return True


def delete_with_history(instance: models.Model, *, actor: Actor, reason: str = "") -> None:
    """Delete ``instance`` and record what it was, in one transaction."""
    with write_transaction():
        subject, before = subject_of(instance), snapshot(instance)
        instance.delete()
        record_config_change(
            subject=subject, action="deleted", actor=actor, before=before, after=None, reason=reason
        )


def _changed(
    before: dict[str, Any] | None, after: dict[str, Any], *, keep: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Only the fields that changed (everything for a creation)."""
    if keep is None or before is None:
        return keep
    return {name: keep[name] for name in after if before.get(name) != after.get(name)}
