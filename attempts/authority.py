"""Authority: what a tenant may do with a tool now, and the never-wider rule for linked attempts.

Observing (a lookup) is always allowed; acting (sending) only under the authority that holds now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from attempts import rows
from attempts.models import Attempt, Grant


class NotGranted(Exception):
    """The tenant, tool, scope or policy version is not granted now."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Authority:
    policy_version: str
    scopes: list[str]


def active_grant(tenant: str, tool_name: str) -> Grant | None:
    return Grant.objects.filter(tenant_id=tenant, tool_id=tool_name, active=True).first()


def authority_for_intent(
    grant: Grant | GrantTerms | None, *, policy_version: str | None, scopes: list[str] | None
) -> Authority:
    """The authority an intent is recorded under, or NotGranted saying why not.

    An omitted policy version or scope list means "the grant as it stands now".
    """
    if grant is None:
        raise NotGranted("no active grant for this tenant and tool", code="tool_not_granted")
    if policy_version is not None and policy_version != grant.policy_version:
        raise NotGranted(
            f"policy version {policy_version!r} is not the current one ({grant.policy_version!r})",
            code="policy_version_mismatch",
        )
    allowed = set(grant.allowed_scopes)
    wanted = list(grant.allowed_scopes) if scopes is None else scopes
    extra = sorted(set(wanted) - allowed)
    if extra:
        raise NotGranted(f"scopes not granted: {', '.join(extra)}", code="scope_not_granted")
    return Authority(policy_version=grant.policy_version, scopes=sorted(set(wanted)))


class GrantTerms(NamedTuple):
    """What intents and claims check against: an active grant's policy version and scopes."""

    policy_version: str
    allowed_scopes: tuple[str, ...]
    # Whether an approval policy is active for the tool (read for new intents only).
    approval_policies: bool = False


def active_terms(tenant: str, tool_name: str, *, tool_active: bool = False) -> GrantTerms | None:
    """The active grant's policy version and scopes in one small query (every intent and claim
    asks); with ``tool_active``, only while the tool itself is active too (new intents)."""
    terms = rows.grant_terms(tenant, tool_name, tool_active=tool_active)
    return GrantTerms(terms[0], tuple(terms[1]), terms[2]) if terms else None


# The terms the last intent of each (tenant, tool) was recorded under, in this process: a
# guess an intent builds its rows from, never trusted, for its INSERT writes them only while
# they still hold (``rows.insert_attempt(terms=)``); a guess that no longer holds, or that
# would refuse the intent, is read again (``intent_terms(fresh=True)``). It saves every intent
# a round trip. Bounded: emptied when it reaches ``_RECENT_LIMIT`` entries.
_recent_terms: dict[tuple[str, str], GrantTerms] = {}
_RECENT_LIMIT = 10_000


def forget_terms() -> None:
    """Drop every guess ``intent_terms`` holds."""
    _recent_terms.clear()


def intent_terms(tenant: str, tool_name: str, *, fresh: bool) -> tuple[GrantTerms | None, bool]:
    """The terms a new intent of ``tool_name`` for ``tenant`` is built with (``active_terms``
    with ``tool_active``), and whether they are this process's guess rather than read now:
    read now when ``fresh`` or when there is no guess."""
    key = (tenant, tool_name)
    if not fresh and (guess := _recent_terms.get(key)) is not None:
        return guess, True
    terms = active_terms(tenant, tool_name, tool_active=True)
    if terms is None:
        _recent_terms.pop(key, None)
        return None, False
    if len(_recent_terms) >= _RECENT_LIMIT:
        _recent_terms.clear()
    _recent_terms[key] = terms
    return terms, False


def authority_holds(attempt: Attempt, grant: Grant | GrantTerms | None = None) -> tuple[bool, str]:
    """Whether the attempt may still be sent under today's authority, and if not, why.

    A claim checks the same rule inside its compare-and-set (``rows._grant_covers``, the SQL
    form of this function); a change to one is a change to both."""
    grant = grant if grant is not None else active_terms(attempt.tenant_id, attempt.tool_name)
    if grant is None:
        return False, "grant revoked or inactive"
    if grant.policy_version != attempt.policy_version:
        return False, (
            f"policy version changed from {attempt.policy_version!r} to {grant.policy_version!r}"
        )
    missing = sorted(set(attempt.credential_scope) - set(grant.allowed_scopes))
    if missing:
        return False, f"scopes no longer granted: {', '.join(missing)}"
    return True, ""


def linked_authority(original: Attempt) -> Authority:
    """Today's authority for a linked attempt: never wider than the original's nor the grant's."""
    grant = active_grant(original.tenant_id, original.tool_name)
    if grant is None:
        raise NotGranted("no active grant: a linked attempt cannot be created", code="revoked")
    scopes = sorted(set(original.credential_scope) & set(grant.allowed_scopes))
    return Authority(policy_version=grant.policy_version, scopes=scopes)
