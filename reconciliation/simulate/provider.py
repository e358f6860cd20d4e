"""The simulated provider: an in-process service with its own record of effects, and the
adapter the reconciler and the simulated agents reach it through.

The provider is the outside world's truth: what it performed is what happened, whatever the
ledger says. Its fault mode is set by the history's steps and lasts until the next such step:
it accepts, loses the answer (performs, then the caller hears nothing), delivers twice,
refuses (for now or for good), is slow (past the tool's deadline: the caller gives up while
the provider performs), rate-limits or is down; independently, its lookups may lie (name another attempt's
effect with the same payload hash).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from reconciliation.providers import base

MODES = (
    "accept",
    "lose_answer",
    "deliver_twice",
    "refuse_retryable",
    "refuse",
    "slow",
    "rate_limit",
    "down",
)


@dataclass
class Effect:
    """One thing the provider did."""

    id: str
    tool: str
    key: str
    args_hash: str
    attempt_id: str


@dataclass
class SimProvider:
    """What the provider performed, and how it behaves now. Idempotent tools honour the key
    (a second send under it is the same effect); the others perform every send they get."""

    idempotent_tools: set[str]
    mode: str = "accept"
    # Lookups that name another attempt's effect with the same payload hash (a lying or
    # confused provider), whatever the sends do.
    lying: bool = False
    effects: list[Effect] = field(default_factory=list)
    sends: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _perform(self, call: base.Call) -> Effect:
        if call.tool_name in self.idempotent_tools:
            for effect in self.effects:
                if effect.tool == call.tool_name and effect.key == call.idempotency_key:
                    return effect
        effect = Effect(
            id=f"fx-{len(self.effects) + 1}",
            tool=call.tool_name,
            key=call.idempotency_key,
            args_hash=call.args_hash,
            attempt_id=call.attempt_id,
        )
        self.effects.append(effect)
        return effect

    def send(self, call: base.Call) -> base.SendAnswer:
        with self._lock:
            self.sends += 1
            mode = self.mode
            if mode in ("down", "rate_limit", "refuse_retryable"):
                return base.SendAnswer(
                    base.SendStatus.REFUSED,
                    retryable=True,
                    detail=f"simulated {mode}",
                    http_status=503 if mode == "down" else 429,
                    retry_after=1.0 if mode == "rate_limit" else None,
                )
            if mode == "refuse":
                return base.SendAnswer(
                    base.SendStatus.REFUSED, detail="simulated refusal", http_status=422
                )
            effect = self._perform(call)
            if mode == "deliver_twice" and call.tool_name in self.idempotent_tools:
                # The transport delivered the request twice: the provider saw it twice and,
                # honouring the key, performed it once. (A provider that does not honour keys
                # would perform a duplicated delivery twice whatever the ledger does.)
                effect = self._perform(call)
            if mode in ("lose_answer", "slow"):
                return base.SendAnswer(base.SendStatus.UNCERTAIN, detail=f"simulated {mode}")
            return base.SendAnswer(
                base.SendStatus.ACCEPTED, provider_request_id=effect.id, http_status=200
            )

    def lookup(self, call: base.Call) -> base.LookupAnswer:
        with self._lock:
            mode = self.mode
            if mode in ("down", "slow"):
                return base.LookupAnswer(base.LookupStatus.UNAVAILABLE, detail=f"simulated {mode}")
            found = [
                e
                for e in self.effects
                if e.tool == call.tool_name and e.key == call.idempotency_key
            ]
            if self.lying:
                # Names another attempt's effect whose payload hash matches, when there is one.
                other = [
                    e
                    for e in self.effects
                    if e.tool == call.tool_name
                    and e.args_hash == call.args_hash
                    and e.key != call.idempotency_key
                ]
                found = other[:1] or found
            if not found:
                return base.LookupAnswer(base.LookupStatus.NOT_FOUND)
            first = found[0]
            return base.LookupAnswer(
                base.LookupStatus.FOUND,
                provider_request_id=first.id,
                args_hash=first.args_hash,
                count=len(found),
                result_ref=f"receipt-{first.id}",
            )

    def per_key(self) -> dict[tuple[str, str], list[Effect]]:
        out: dict[tuple[str, str], list[Effect]] = {}
        for effect in self.effects:
            out.setdefault((effect.tool, effect.key), []).append(effect)
        return out


class SimAdapter(base.Adapter):
    """The adapter of every simulated tool: reaches the provider the running simulation set.
    Listed as ``sim`` in ``LEDGER["ADAPTERS"]`` only while a simulation runs."""

    provider: ClassVar[SimProvider | None] = None

    def _provider(self) -> SimProvider:
        if SimAdapter.provider is None:
            raise RuntimeError("no simulation is running")
        return SimAdapter.provider

    def send(self, call: base.Call) -> base.SendAnswer:
        return self._provider().send(call)

    def lookup(self, call: base.Call) -> base.LookupAnswer:
        return self._provider().lookup(call)

    @property
    def provider_key(self) -> str:
        return "sim"

    def describe(self) -> dict[str, Any]:
        return {"mode": self._provider().mode}
