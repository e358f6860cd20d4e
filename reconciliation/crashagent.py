"""The agent that crashtest kills: performs tool calls through ``ledger.run_tool_call`` and sends
them to the provider with the generic HTTP provider protocol (protocol section 10), or through
the tool's adapter when the tool names another one (Stripe, say).

It is a real agent in miniature: it records the intent, claims, sends with the idempotency key,
attaches the provider's request id and confirms on a receipt that carries the payload hash. When
it is restarted with the same plan it repeats the interrupted call with the same key, as an agent
resuming its task would; the ledger makes that safe.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from attempts import ledger
from attempts.canonical import canonical_bytes
from attempts.models import Attempt, State, Tool
from attempts.states import Actor
from reconciliation.faults import arm_kill_timer, crash_point
from reconciliation.providers.registry import send_with_adapter


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One tool call of an agent's plan (a JSON object in the plan file)."""

    tenant: str
    task_id: str
    tool_name: str
    idempotency_key: str
    args: dict[str, Any]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PlannedCall:
        return cls(
            tenant=raw["tenant"],
            task_id=raw["task_id"],
            tool_name=raw["tool_name"],
            idempotency_key=raw["idempotency_key"],
            args=raw["args"],
        )


def http_send(attempt: Attempt) -> ledger.SendResult:
    """Send one claimed attempt to its tool's ``dispatch_url`` (generic HTTP provider protocol).

    2xx with ``{"id", "args_hash"}``: the request id, and a receipt when the hash matches ours.
    4xx with an error: a definitive refusal. 5xx, a timeout or a broken connection: the effect
    may have happened, so ``run_tool_call`` records UNKNOWN.
    """
    tool = Tool.objects.get(name=attempt.tool_name)
    url = urlsplit(tool.dispatch_url)
    if url.scheme != "http" or not url.hostname:
        raise ledger.ProviderRefused(f"tool {tool.name} has no http dispatch_url", retryable=False)
    path = url.path + (f"?{url.query}" if url.query else "")
    connection = http.client.HTTPConnection(
        url.hostname, url.port or 80, timeout=tool.timeout_seconds
    )
    try:
        connection.request(
            "POST",
            path,
            body=canonical_bytes(attempt.args),
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": attempt.idempotency_key,
                "X-Ledger-Attempt-Id": attempt.attempt_id,
                "X-Ledger-Args-Hash": attempt.args_hash,
            },
        )
        crash_point("request_sent")
        answer = connection.getresponse()
        raw = answer.read()
    except (TimeoutError, http.client.HTTPException) as exc:
        raise ledger.ProviderLostResponse(f"{type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    if 200 <= answer.status < 300 and isinstance(body, dict) and body.get("id"):
        receipt = body.get("args_hash") == attempt.args_hash
        return ledger.SendResult(
            provider_request_id=str(body["id"]),
            result_ref=f"receipt:{body['id']}" if receipt else None,
        )
    if 400 <= answer.status < 500 and isinstance(body, dict) and "error" in body:
        error = body["error"] if isinstance(body["error"], dict) else {}
        raise ledger.ProviderRefused(
            f"provider refused ({answer.status} {error.get('code', 'error')})",
            retryable=bool(error.get("retryable", False)),
        )
    raise ledger.ProviderLostResponse(f"provider answered {answer.status} without a receipt")


# How long a crashtest agent waits for a held call to be approved, and how often it looks.
APPROVAL_WAIT = 4.0
APPROVAL_POLL = 0.1


def _run_call(call: PlannedCall, senders: dict[str, Any], actor: Actor) -> ledger.CallOutcome:
    """One planned call in the safe order, sent by its tool's sender."""
    return ledger.run_tool_call(
        tenant=call.tenant,
        task_id=call.task_id,
        tool_name=call.tool_name,
        idempotency_key=call.idempotency_key,
        args=call.args,
        send=senders.get(call.tool_name, http_send),
        actor=actor,
    )


def _wait_and_call(call: PlannedCall, held: Attempt, senders: dict[str, Any], actor: Actor) -> str:
    """A held call: wait (holding nothing) until a person decides, then carry on in the safe
    order under the same key, as an agent resuming its task would. Returns the final state."""
    deadline = time.monotonic() + APPROVAL_WAIT
    while time.monotonic() < deadline:
        crash_point("approval_waiting")
        time.sleep(APPROVAL_POLL)
        state = Attempt.objects.filter(pk=held.pk).values_list("state", flat=True).first()
        if state == State.AWAITING_APPROVAL:
            continue
        if state != State.INTENT_RECORDED:
            return state  # rejected, expired, or already claimed by the worker: do not send
        outcome = _run_call(call, senders, actor)
        if outcome.attempt.state != State.AWAITING_APPROVAL:
            return outcome.attempt.state
    return State.AWAITING_APPROVAL


def run_plan(
    calls: list[PlannedCall],
    *,
    agent_name: str,
    start: int = 0,
    count: int | None = None,
    not_before: float | None = None,
    out=sys.stdout,
) -> int:
    """Perform ``calls[start:start + count]`` (all from ``start`` when ``count`` is None) one by
    one, printing ``started i`` and ``done i STATE`` lines.

    ``not_before`` (a Unix time) lets several agents begin the same call at the same moment.
    Returns how many calls were performed.
    """
    actor = Actor.agent(agent_name)
    if not_before is not None:
        time.sleep(max(0.0, not_before - time.time()))
    arm_kill_timer()
    senders = {
        tool.name: http_send if tool.adapter in ("", "http") else send_with_adapter
        for tool in Tool.objects.filter(name__in={call.tool_name for call in calls})
    }
    done = 0
    end = len(calls) if count is None else min(len(calls), start + count)
    for index in range(start, end):
        call = calls[index]
        print(f"started {index}", file=out, flush=True)
        try:
            outcome = _run_call(call, senders, actor)
            state = outcome.attempt.state
            if state == State.AWAITING_APPROVAL:
                state = _wait_and_call(call, outcome.attempt, senders, actor)
        except ledger.LedgerError as exc:
            state = f"refused:{exc.code}"
        print(f"done {index} {state}", file=out, flush=True)
        done += 1
    return done
