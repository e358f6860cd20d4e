# ruff: noqa: S608 -- the tampering steps write raw SQL against constant table names
"""One simulated history: the operations, faults and tamperings a step can be, run through the
product's own functions (ledger, review, erasure, the reconciler's passes, sealing, archive).

A step is ``(operation, choice)``: the choice (a number drawn from the seed) picks the attempt,
the person, the arguments, the fault. A step whose operation finds nothing to act on does
nothing, so any sub-list of a history is a history too (what shrinking needs).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.test import Client

from attempts import chain, erasure, history_guard, ledger, log, review, states
from attempts.actors import Actor
from attempts.config_history import acting
from attempts.models import (
    APPROVAL_ACTION,
    ATTENTION_STATES,
    ApprovalPolicy,
    Attempt,
    Grant,
    State,
)
from reconciliation.archive import archive
from reconciliation.archive.store import FolderStore, StoreError
from reconciliation.providers.base import Call, LookupStatus, SendStatus
from reconciliation.reconciler import Reconciler
from reconciliation.simulate import world
from reconciliation.simulate.provider import MODES, SimProvider
from reconciliation.simulate.witness import WITNESS_MODES

S = State
AGENT = Actor.agent(world.AGENT)
REVIEWERS = ("sim-rev1", "sim-rev2", "sim-rev3")
ADMINS = ("sim-admin1", "sim-admin2")
ERASED = history_guard.ERASED_TEXT

# What an operation may be refused with: the product saying no, clearly.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    ledger.LedgerError,
    states.TransitionError,
    ValidationError,
    PermissionDenied,
    archive.ArchiveError,
    StoreError,
    log.NotSealed,
)

# Operations and how often each is drawn (tamperings are drawn separately: see driver.draw).
OPERATIONS: dict[str, int] = {
    "record_new": 14,
    "record_same": 3,
    "record_other_args": 3,
    "record_archived_key": 3,
    "agent_send": 10,
    "agent_crash_after_claim": 3,
    "agent_crash_after_send": 2,
    "report_unknown": 2,
    "worker_pass": 10,
    "worker_crash": 2,
    "worker_restart": 1,
    "advance_clock": 6,
    "provider_mode": 5,
    "provider_lies": 3,
    "approve": 6,
    "approve_with_comment": 4,
    "reject": 2,
    "edit_and_approve": 2,
    "policy_change": 1,
    "assign_owner": 2,
    "manual_confirm": 2,
    "manual_fail": 1,
    "approve_linked": 3,
    "erase": 4,
    "seal": 4,
    "archive": 2,
    "authority_change": 2,
    "rotate_key": 1,
    "witness_mode": 4,
}

# Tampering steps: an attacker with the database's superuser. Each ends its history; the
# verifiers must then fail, online and offline, naming a problem.
TAMPERINGS = (
    "event_edit",
    "erasure_marker",
    "delete_attempt",
    "unsign",
    "approval_insert",
    "event_delete",
)

ARGS_POOL = ({"n": 1}, {"n": 2}, {"n": 3})


@dataclass
class Step:
    op: str
    choice: int

    def __str__(self) -> str:
        return f"{self.op}({self.choice})"


@dataclass
class Violation:
    check: str
    message: str
    step: int

    def __str__(self) -> str:
        return f"[{self.check}] after step {self.step}: {self.message}"


@dataclass
class Acked:
    """An intent the ledger acknowledged (record_intent returned it)."""

    attempt_id: str
    key: str
    tool: str
    tenant: str
    args: dict[str, Any]
    args_hash: str


@dataclass
class Given:
    """An approval the simulation saw the product accept."""

    approver: str
    at: dt.datetime
    args_hash: str
    policy_version: int


@dataclass
class Model:
    """What the simulation knows independently of the ledger's rows."""

    acked: dict[str, Acked] = field(default_factory=dict)  # key -> first acknowledgment
    approvals: dict[str, list[Given]] = field(default_factory=dict)  # attempt id -> approvals
    # (time, version, approvals needed) of the held tool's policy, oldest first
    policy_versions: list[tuple[dt.datetime, int, int]] = field(default_factory=list)
    archived_keys: set[str] = field(default_factory=set)
    keys: int = 0


class History:
    """Runs steps against the ledger inside the caller's transaction and says what broke."""

    def __init__(
        self,
        *,
        env: world.Environment,
        clock: world.SimClock,
        keys: world.Keys,
        provider: SimProvider,
        people: world.People,
        token: str,
        folder: Path,
        open_breaks: frozenset[str],
        settings_stack: contextlib.ExitStack,
        signer_state: Path,
    ) -> None:
        self.env = env
        self.clock = clock
        self.keys = keys
        self.provider = provider
        self.people = people
        self.token = token
        self.folder = folder
        self.open_breaks = open_breaks
        self.settings_stack = settings_stack
        self.signer_state = signer_state
        self.model = Model()
        self.violations: list[Violation] = []
        self.step_no = 0
        self.workers = [self._worker(0), self._worker(1)]
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        self.tampered: str | None = None
        self.tamper_applied = False
        self.tamperings: list[str] = []
        self.cosigned = False  # an honest witness has cosigned a checkpoint of this history
        self.stats: Counter[tuple[str, str]] = Counter()
        policy = ApprovalPolicy.objects.get(name=world.POLICY)
        self.model.policy_versions.append(
            (clock.now() - dt.timedelta(seconds=1), policy.version, policy.approvals_needed)
        )

    # -- helpers --------------------------------------------------------------------------------

    def _worker(self, n: int) -> Reconciler:
        import random

        return Reconciler(
            worker_id=f"sim-worker-{n + 1}",
            concurrency=2,
            batch_size=20,
            rng=random.Random(n),
        )

    def violate(self, check: str, message: str) -> None:
        self.violations.append(Violation(check, message, self.step_no))

    def pick(self, queryset, choice: int) -> Attempt | None:
        rows = list(queryset.order_by("id").values_list("pk", flat=True)[:50])
        if not rows:
            return None
        return Attempt.objects.get(pk=rows[choice % len(rows)])

    def person(self, name: str) -> Any:
        return self.people[name]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    # -- running a step -------------------------------------------------------------------------

    def run(self, step: Step) -> None:
        """Run one step in its own savepoint: a refusal rolls back what it began."""
        self.step_no += 1
        if step.op in TAMPERINGS:
            self.tampered = step.op
            self.tamper_applied = False
            self.tamperings.append(step.op)
            getattr(self, f"tamper_{step.op}")(step.choice)
            return
        operation = getattr(self, f"op_{step.op}")
        try:
            with transaction.atomic():
                operation(step.choice)
            self.stats[(step.op, "done")] += 1
        except EXPECTED_ERRORS as exc:
            self.stats[(step.op, f"refused: {type(exc).__name__}")] += 1
        except Exception as exc:  # the product answered with an error it did not mean
            check = "operation_error"
            if step.op == "erase":
                check = "erasure_completes"
            if check not in self.open_breaks:
                self.violate(check, f"{step} raised {type(exc).__name__}: {exc}"[:500])

    # -- recording ------------------------------------------------------------------------------

    def _args_for(self, tool: str, choice: int) -> dict[str, Any]:
        if tool == world.HELD_TOOL:
            return {"amount": (50, 500, 900)[choice % 3]}
        return dict(ARGS_POOL[choice % len(ARGS_POOL)])

    def _record(self, tenant: str, tool: str, key: str, args: dict[str, Any]) -> Attempt:
        """Record through the agent API (the token's path) for the held tool, in-process
        through ledger.record_intent for the others."""
        if tool == world.HELD_TOOL:
            body = {
                "tenant": tenant,
                "task_id": f"task-{key}",
                "tool_name": tool,
                "idempotency_key": key,
                "args": args,
            }
            answer = self.client.post(
                "/api/v1/attempts", json.dumps(body), content_type="application/json"
            )
            if answer.status_code == 409:
                raise ledger.IdempotencyConflict("409 from the API", existing=None)  # type: ignore[arg-type]
            if answer.status_code >= 500:
                raise RuntimeError(f"the API answered {answer.status_code}: {answer.content!r}")
            if answer.status_code not in (200, 201, 202):
                raise ledger.LedgerError(f"the API answered {answer.status_code}")
            attempt_id = answer.json()["attempt"]["attempt_id"]
            attempt = Attempt.objects.get(attempt_id=attempt_id)
            attempt._sim_created = answer.status_code in (201, 202)  # type: ignore[attr-defined]
            return attempt
        attempt, created = ledger.record_intent(
            tenant=tenant,
            task_id=f"task-{key}",
            tool_name=tool,
            idempotency_key=key,
            args=args,
            actor=AGENT,
        )
        attempt._sim_created = created  # type: ignore[attr-defined]
        if created:
            self._recorded_under_todays_grant(attempt)
        return attempt

    def _recorded_under_todays_grant(self, attempt: Attempt) -> None:
        """A new intent is recorded under the grant as it stands (histories are one thread, so
        that is the grant now), whatever the process guessed of it from an earlier intent
        (``authority.intent_terms``) before an authority change."""
        grant = Grant.objects.get(tenant_id=attempt.tenant_id, tool_id=attempt.tool_name)
        if not grant.active or attempt.policy_version != grant.policy_version:
            self.violate(
                "authority",
                f"{attempt.attempt_id} recorded under policy {attempt.policy_version!r}; the "
                f"grant is {'active' if grant.active else 'revoked'} at {grant.policy_version!r}",
            )
        if sorted(attempt.credential_scope) != sorted(grant.allowed_scopes):
            self.violate(
                "authority",
                f"{attempt.attempt_id} recorded with scopes {attempt.credential_scope}; the "
                f"grant allows {grant.allowed_scopes}",
            )

    def op_record_new(self, choice: int) -> None:
        tools = list(world.TOOLS)
        tool = tools[choice % len(tools)]
        tenant = world.TENANTS[(choice // 7) % len(world.TENANTS)]
        self.model.keys += 1
        key = f"sim:{tenant}:{self.model.keys}"
        args = self._args_for(tool, choice // 3)
        attempt = self._record(tenant, tool, key, args)
        self.model.acked[key] = Acked(
            attempt.attempt_id, key, tool, tenant, args, attempt.args_hash
        )

    def _acked(self, choice: int) -> Acked | None:
        if not self.model.acked:
            return None
        keys = sorted(self.model.acked)
        return self.model.acked[keys[choice % len(keys)]]

    def op_record_same(self, choice: int) -> None:
        acked = self._acked(choice)
        if acked is not None:
            self._same(acked)

    def _reuses_archived(self, acked: Acked) -> bool:
        """Whether this would use an archived key again while that is a known break."""
        return (
            acked.key in self.model.archived_keys and "key_once_after_archive" in self.open_breaks
        )

    def _same(self, acked: Acked) -> None:
        if self._reuses_archived(acked):
            return
        attempt = self._record(acked.tenant, acked.tool, acked.key, acked.args)
        if attempt._sim_created or attempt.attempt_id != acked.attempt_id:  # type: ignore[attr-defined]
            where = (
                "after its attempt was archived" if acked.key in self.model.archived_keys else ""
            )
            check = "key_once_after_archive" if where else "same_key_same_attempt"
            if check not in self.open_breaks:
                self.violate(
                    check,
                    f"key {acked.key!r} recorded again {where} as {attempt.attempt_id} "
                    f"(first acknowledged as {acked.attempt_id})",
                )

    def op_record_archived_key(self, choice: int) -> None:
        """An agent uses a key again after its attempt was archived: the same arguments (must
        return the archived outcome, create nothing) or other ones (must be refused)."""
        archived = sorted(self.model.archived_keys)
        if not archived:
            return
        acked = self.model.acked[archived[choice % len(archived)]]
        if choice % 2:
            self._same(acked)
        else:
            self._other_args(acked, choice)

    def op_record_other_args(self, choice: int) -> None:
        acked = self._acked(choice)
        if acked is None:
            return
        self._other_args(acked, choice)

    def _other_args(self, acked: Acked, choice: int) -> None:
        if self._reuses_archived(acked):
            return
        args = dict(acked.args)
        args["changed"] = choice % 5
        before = Attempt.objects.filter(attempt_id=acked.attempt_id).first()
        try:
            attempt = self._record(acked.tenant, acked.tool, acked.key, args)
        except ledger.IdempotencyConflict:
            after = Attempt.objects.filter(attempt_id=acked.attempt_id).first()
            if before is not None and (after is None or after.args_hash != before.args_hash):
                self.violate("conflict_overwrites_nothing", f"key {acked.key!r} was changed")
            return
        archived = acked.key in self.model.archived_keys
        check = "key_once_after_archive" if archived else "conflict_refused"
        if check not in self.open_breaks:
            self.violate(
                check,
                f"key {acked.key!r} with other arguments was accepted as {attempt.attempt_id}"
                + (" after its attempt was archived" if archived else ""),
            )

    # -- the agent's send -----------------------------------------------------------------------

    def _sendable(self, choice: int) -> Attempt | None:
        return self.pick(
            Attempt.objects.filter(state__in=(S.INTENT_RECORDED, S.FAILED_RETRYABLE)), choice
        )

    def _agent_send(self, choice: int, crash: str = "") -> None:
        attempt = self._sendable(choice)
        if attempt is None:
            return
        attempt, claimed = ledger.claim_dispatch(attempt, actor=AGENT)
        if not claimed or crash == "after_claim":
            return  # a killed agent leaves its claim open: recovery finds it stale
        call = Call.of(attempt)
        answer = self.provider.send(call)
        if crash == "after_send":
            return  # the provider acted; the agent died before writing down what it heard
        if answer.status == SendStatus.REFUSED:
            ledger.fail(
                attempt, reason=answer.detail or "refused", retryable=answer.retryable, actor=AGENT
            )
            return
        if answer.status == SendStatus.UNCERTAIN:
            ledger.mark_unknown(attempt, reason=answer.detail or "no answer", actor=AGENT)
            return
        attempt = ledger.attach_provider_request(attempt, answer.provider_request_id, actor=AGENT)
        found = self.provider.lookup(call)
        if (
            found.status == LookupStatus.FOUND
            and found.count == 1
            and found.args_hash == attempt.args_hash
            and found.provider_request_id == answer.provider_request_id
        ):
            ledger.confirm(attempt, result_ref=found.result_ref, actor=AGENT)
        else:
            ledger.mark_unknown(attempt, reason="no receipt", actor=AGENT)

    def op_agent_send(self, choice: int) -> None:
        self._agent_send(choice)

    def op_agent_crash_after_claim(self, choice: int) -> None:
        self._agent_send(choice, crash="after_claim")

    def op_agent_crash_after_send(self, choice: int) -> None:
        self._agent_send(choice, crash="after_send")

    def op_report_unknown(self, choice: int) -> None:
        attempt = self.pick(Attempt.objects.filter(state=S.DISPATCHED), choice)
        if attempt is not None:
            ledger.mark_unknown(attempt, reason="the agent timed out", actor=AGENT)

    # -- workers, clock, provider, witness -------------------------------------------------------

    def op_worker_pass(self, choice: int) -> None:
        self.workers[choice % 2].run_pass()

    def op_worker_crash(self, choice: int) -> None:
        """A worker claims a batch and dies: its leases stand until they run out."""
        worker = self.workers[choice % 2]
        now = self.clock.now()
        worker.claim(cutoff=now, limit=1 + choice % 3, lease=dt.timedelta(seconds=120))
        worker.close()
        self.workers[choice % 2] = self._worker(choice % 2)

    def op_worker_restart(self, choice: int) -> None:
        self.workers[choice % 2].close()
        self.workers[choice % 2] = self._worker(choice % 2)

    def op_advance_clock(self, choice: int) -> None:
        self.clock.advance((30, 90, 300, 1800, 3 * 3600, 2 * 86400)[choice % 6])

    def op_provider_mode(self, choice: int) -> None:
        # "accept" half the time: faults come and go.
        self.provider.mode = "accept" if choice % 2 else MODES[(choice // 2) % len(MODES)]

    def op_provider_lies(self, choice: int) -> None:
        """The provider's lookups start or stop naming other attempts' effects."""
        self.provider.lying = bool(choice % 2) and "one_attempt_per_effect" not in self.open_breaks

    def op_witness_mode(self, choice: int) -> None:
        mode = "up" if choice % 2 else WITNESS_MODES[(choice // 2) % len(WITNESS_MODES)]
        if mode == "lying" and "witness_recovers" in self.open_breaks:
            mode = "down"
        self.env.witness.mode = mode

    # -- approvals ------------------------------------------------------------------------------

    def _held(self, choice: int) -> Attempt | None:
        """A held attempt: the oldest three times in four (approvals gather on one attempt
        until it is released, as a queue is worked), any other otherwise."""
        held = Attempt.objects.filter(state=S.AWAITING_APPROVAL)
        return self.pick(held, 0 if choice % 4 else choice // 4)

    def _approver(self, choice: int) -> str:
        names = list(REVIEWERS)
        if "recorder_not_approver" in self.open_breaks:
            names.remove(world.ISSUER)
        return names[choice % len(names)]

    def _approve(self, choice: int, comment: str) -> None:
        attempt = self._held(choice)
        if attempt is None:
            return
        name = self._approver(choice // 3)
        review.approve_held(attempt, user=self.person(name), comment=comment)
        self._given(attempt, name)

    def _given(self, attempt: Attempt, name: str) -> None:
        policy = ApprovalPolicy.objects.get(name=attempt.approval_policy_id)
        self.model.approvals.setdefault(attempt.attempt_id, []).append(
            Given(name, self.clock.now(), attempt.args_hash, policy.version)
        )
        if name == world.ISSUER and self._recorded_by_token(attempt):
            self.violate(
                "recorder_not_approver",
                f"{name} issued the token that recorded {attempt.attempt_id} and approved it",
            )

    def _recorded_by_token(self, attempt: Attempt) -> bool:
        root = attempt
        while root.parent_id is not None:
            root = Attempt.objects.get(pk=root.parent_id)
        first = root.events.order_by("id").first()
        return first is not None and first.actor == world.AGENT

    def op_approve(self, choice: int) -> None:
        self._approve(choice, "")

    def op_approve_with_comment(self, choice: int) -> None:
        self._approve(choice, f"checked with the customer ({choice % 10})")

    def op_reject(self, choice: int) -> None:
        attempt = self._held(choice)
        if attempt is not None:
            review.reject_held(attempt, user=self.person(self._approver(choice)), reason="no")

    def op_edit_and_approve(self, choice: int) -> None:
        attempt = self._held(choice)
        if attempt is None:
            return
        name = self._approver(choice // 3)
        args = dict(attempt.args)
        args["amount"] = int(args.get("amount", 500)) + 1 + choice % 50
        child = review.edit_and_approve(
            attempt, user=self.person(name), args=args, comment="amount corrected"
        )
        self._given(child, name)

    def op_policy_change(self, choice: int) -> None:
        policy = ApprovalPolicy.objects.get(name=world.POLICY)
        policy.approvals_needed = 3 if policy.approvals_needed == 2 else 2
        with acting(world.SETUP, "simulation: policy change"):
            policy.full_clean()
            policy.save()
        policy.refresh_from_db()
        self.model.policy_versions.append(
            (self.clock.now(), policy.version, policy.approvals_needed)
        )

    # -- people's decisions ---------------------------------------------------------------------

    def op_assign_owner(self, choice: int) -> None:
        attempt = self.pick(Attempt.objects.filter(state__in=ATTENTION_STATES), choice)
        if attempt is not None:
            owner = self.person(REVIEWERS[choice % 3])
            review.assign(attempt, user=self.person("sim-admin1"), owner=owner)

    def _in_review(self, choice: int, *, linked: bool | None = None) -> Attempt | None:
        found = Attempt.objects.filter(state=S.MANUAL_REVIEW)
        if linked is not None:
            found = found.filter(awaiting_approval=linked)
        return self.pick(found, choice)

    def op_manual_confirm(self, choice: int) -> None:
        attempt = self._in_review(choice, linked=False)
        if attempt is None:
            return
        # A reviewer confirms only what the provider did (the evidence is its record).
        done = [
            e
            for e in self.provider.effects
            if e.key == attempt.idempotency_key and e.tool == attempt.tool_name
        ]
        if done:
            review.review_confirm(
                attempt,
                user=self.person(REVIEWERS[choice % 3]),
                result_ref=f"receipt-{done[0].id}",
                evidence=f"the provider's record shows {done[0].id}",
            )
        else:
            review.review_fail(
                attempt, user=self.person(REVIEWERS[choice % 3]), reason="not done: no effect"
            )

    def op_manual_fail(self, choice: int) -> None:
        attempt = self._in_review(choice, linked=False)
        if attempt is None:
            return
        done = any(e.key == attempt.idempotency_key for e in self.provider.effects)
        if not done:
            review.review_fail(attempt, user=self.person(REVIEWERS[choice % 3]), reason="dropped")

    def op_approve_linked(self, choice: int) -> None:
        reviewer = self.person(REVIEWERS[choice % 3])
        linked = self._in_review(choice, linked=True)
        if linked is not None:
            review.approve_linked_attempt(linked, user=reviewer, comment="fine")
            return
        attempt = self._in_review(choice, linked=False)
        if attempt is None:
            return
        if any(e.key == attempt.idempotency_key for e in self.provider.effects):
            return  # a reviewer retries only what the provider never did
        review.approve_linked_retry(attempt, user=reviewer)

    # -- erasure, sealing, archive, authority, keys ---------------------------------------------

    def op_erase(self, choice: int) -> None:
        settled = Attempt.objects.filter(state__in=(S.OUTCOME_CONFIRMED, S.FAILED, S.RECONCILED))
        if choice % 2:  # half the time, what people decided on (approved, with a comment or not)
            settled = settled.filter(events__action=APPROVAL_ACTION).distinct()
        attempt = self.pick(settled, choice // 2)
        if attempt is None:
            return
        erasure.request_erasure(attempt, user=self.person("sim-admin1"), reason="GDPR request")
        erasure.approve_erasure(attempt, user=self.person("sim-admin2"))

    def op_seal(self, choice: int) -> None:
        self.seal()

    def seal(self) -> None:
        while chain.seal() is not None:
            pass
        log.sign_pending()
        witness_mode = self.env.witness.mode
        results = log.publish()
        if witness_mode == "up" and results and set(results.values()) == {"ok"}:
            self.cosigned = True
        if witness_mode == "up" and results and set(results.values()) != {"ok"}:
            if "witness_recovers" not in self.open_breaks:
                self.violate(
                    "witness_recovers",
                    f"an honest witness, back up, was not asked to cosign: {results}",
                )

    def op_archive(self, choice: int) -> None:
        """Two days on (the retention rules archive after one), seal and archive."""
        self.clock.advance(2 * 86400)
        self.seal()
        before = set(Attempt.objects.values_list("idempotency_key", flat=True))
        archive.run(
            store=FolderStore(self.folder / "archives"),
            actor=Actor.system("simulation-archive"),
        )
        after = set(Attempt.objects.values_list("idempotency_key", flat=True))
        self.model.archived_keys |= before - after

    def op_authority_change(self, choice: int) -> None:
        tenant = world.TENANTS[choice % 2]
        tool = list(world.TOOLS)[(choice // 2) % len(world.TOOLS)]
        grant = Grant.objects.get(tenant_id=tenant, tool_id=tool)
        what = (choice // 8) % 3
        if what == 0:
            grant.policy_version = "v2" if grant.policy_version == "v1" else "v1"
        elif what == 1:
            full = world.full_scopes(tool)
            grant.allowed_scopes = full if len(grant.allowed_scopes) == 1 else full[:1]
        else:
            grant.active = not grant.active
        with acting(world.SETUP, "simulation: authority change"):
            grant.save()

    def op_rotate_key(self, choice: int) -> None:
        self.seal()
        self.keys.rotate()
        self.env.witness.trust(self.keys.verifier)
        self.settings_stack.enter_context(self.env.settings(self.keys, self.signer_state))

    # -- tampering ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def undone(self) -> Iterator[None]:
        """Whatever happens inside is undone afterwards: the database (a savepoint), and what
        lives outside it (the signers' memory files, the witness, the provider's record), as
        restoring a snapshot would. A tampering runs inside, so a history goes on after it."""
        memory = {path: path.read_bytes() for path in self.folder.glob("*.state")}
        witness = (self.env.witness.size, self.env.witness.root)
        effects = len(self.provider.effects)
        savepoint = transaction.savepoint()
        try:
            yield
        finally:
            transaction.savepoint_rollback(savepoint)
            for path in self.folder.glob("*.state"):
                if path not in memory:
                    path.unlink()
            for path, data in memory.items():
                path.write_bytes(data)
            self.env.witness.size, self.env.witness.root = witness
            del self.provider.effects[effects:]
            self.tampered = None

    def sql(self, statement: str, params: list | tuple = ()) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
        self.tamper_applied = True

    def tamper_event_edit(self, choice: int) -> None:
        event = self.pick_event(choice)
        if event is None:
            return
        history_guard.remove(connection)
        self.sql("UPDATE attempts_attemptevent SET actor = %s WHERE id = %s", ["mallory", event])

    def tamper_event_delete(self, choice: int) -> None:
        """Cut an event out of the middle of an attempt's history (not its newest: an unsealed
        attempt whose every event is gone leaves nothing an export could show)."""
        from django.db.models import Max

        from attempts.models import AttemptEvent

        newest = AttemptEvent.objects.values("attempt_id").annotate(last=Max("id"))
        last_ids = {row["last"] for row in newest}
        ids = [
            i
            for i in AttemptEvent.objects.order_by("id").values_list("id", flat=True)
            if i not in last_ids
        ]
        event = ids[choice % len(ids)] if ids else None
        if event is None:
            return
        history_guard.remove(connection)
        self.sql("DELETE FROM attempts_attemptevent WHERE id = %s", [event])

    def pick_event(self, choice: int) -> int | None:
        from attempts.models import AttemptEvent

        ids = list(AttemptEvent.objects.order_by("id").values_list("id", flat=True))
        return ids[choice % len(ids)] if ids else None

    def tamper_erasure_marker(self, choice: int) -> None:
        """One plain UPDATE the guard lets through: a reason becomes the erasure marker, with
        no erasure behind it (issue 39, item 1)."""
        from attempts.models import AttemptEvent

        events = AttemptEvent.objects.exclude(reason=ERASED).order_by("id")
        # An event with a reason when there is one; any event otherwise (its empty reason
        # becomes the marker).
        ids = list(events.exclude(reason="").values_list("id", flat=True)) or list(
            events.values_list("id", flat=True)
        )
        if ids:
            self.sql(
                "UPDATE attempts_attemptevent SET reason = %s WHERE id = %s",
                [ERASED, ids[choice % len(ids)]],
            )

    def tamper_delete_attempt(self, choice: int) -> None:
        """Drop the guard and delete a sealed attempt with its events (issue 39, item 2)."""
        self.seal()
        victim = self.pick(Attempt.objects.filter(sealed=True), choice)
        if victim is None:
            return
        history_guard.remove(connection)
        for table in ("attempts_approval", "attempts_erasurerequest", "attempts_notification"):
            with contextlib.suppress(Exception), transaction.atomic():
                self.sql(f"DELETE FROM {table} WHERE attempt_id = %s", [victim.pk])
        with contextlib.suppress(Exception), transaction.atomic():
            self.sql("DELETE FROM attempts_slaescalation WHERE attempt_id = %s", [victim.pk])
        self.sql("UPDATE attempts_attempt SET parent_id = NULL WHERE parent_id = %s", [victim.pk])
        self.sql("DELETE FROM attempts_attemptevent WHERE attempt_id = %s", [victim.pk])
        self.sql("DELETE FROM attempts_attempt WHERE id = %s", [victim.pk])

    def tamper_unsign(self, choice: int) -> None:
        """Delete every signature and cosignature (issue 39, item 3): the newest checkpoint
        no longer verifies by itself."""
        self.seal()
        history_guard.remove(connection)
        self.sql("DELETE FROM attempts_checkpointsignature")

    def tamper_approval_insert(self, choice: int) -> None:
        """One INSERT into the approvals table stands in for a second person (issue 39, item
        4); a real approval then releases the hold, and the agent claims."""
        attempt = self._held(choice)
        if attempt is None:
            self.model.keys += 1
            key = f"sim:tamper:{self.model.keys}"
            attempt = self._record(world.TENANTS[0], world.HELD_TOOL, key, {"amount": 700})
        policy = ApprovalPolicy.objects.get(name=attempt.approval_policy_id)
        now = self.clock.now()
        for name in ("sim-rev2", "sim-rev3")[: max(0, policy.approvals_needed - 1)]:
            self.sql(
                "INSERT INTO attempts_approval (attempt_id, approver_id, args_hash, policy_id,"
                " policy_version, created_at, expires_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [
                    attempt.pk,
                    self.person(name).pk,
                    attempt.args_hash,
                    policy.name,
                    policy.version,
                    now,
                    now + dt.timedelta(hours=1),
                ],
            )
        with contextlib.suppress(*EXPECTED_ERRORS), transaction.atomic():
            review.approve_held(attempt, user=self.person("sim-admin1"))
            attempt.refresh_from_db()
            ledger.claim_dispatch(attempt, actor=AGENT)
        attempt.refresh_from_db()
        if attempt.state not in (S.AWAITING_APPROVAL, S.FAILED):
            self.violate(
                "approval_rows_release_nothing",
                f"inserted approval rows and one real approval moved {attempt.attempt_id} "
                f"to {attempt.state}",
            )
