"""Pydantic AI (docs/integrations.md): the real package, a scripted model (``FunctionModel``: no
network, no LLM) and a live ledger. A held call is a deferred tool call (``ApprovalRequired``;
the run ends with ``DeferredToolRequests``); ``ledger_decisions`` answers with the ledger's
decision and the resumed run sends an approved call once, the corrected arguments after an
edit, nothing after a rejection or an expiry, also when the agent restarted in between (its
messages and requests kept as JSON)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import connection
from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, ToolApproved, ToolDenied

from attempts.models import Attempt, State
from ledgerweb_client.guard import LedgerContext
from ledgerweb_client.integrations.pydantic_ai import ledger_decisions, ledgered_tool
from tests.conftest import World
from tests.integrations import approvals
from tests.integrations.conftest import KEY, URGENT, Tickets, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), sqlite_only]

REQUESTS = TypeAdapter(DeferredToolRequests)


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: first it asks for the ticket, then it repeats what the tool answered."""
    returned = [
        part
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("open_ticket", dict(URGENT), "call-1")])
    return ModelResponse(parts=[TextPart(f"done: {returned[-1].content}")])


def agent_for(tickets: Tickets) -> Agent[LedgerContext, Any]:
    """A fresh agent, as a restarted process builds it."""
    tool = ledgered_tool(tickets.open_ticket, tool_name="open_ticket", key=KEY, receipt=True)
    return Agent(
        FunctionModel(script),
        deps_type=LedgerContext,
        output_type=[str, DeferredToolRequests],
        tools=[tool],
    )


def held_run(tickets: Tickets, acme: LedgerContext) -> tuple[str, str, Attempt]:
    """Run until the ledger holds the call: (messages JSON, requests JSON, the attempt)."""
    result = agent_for(tickets).run_sync("open it", deps=acme)
    requests = result.output
    assert isinstance(requests, DeferredToolRequests), requests
    [part] = requests.approvals
    assert part.tool_name == "open_ticket" and tickets.effects == []
    held = requests.metadata[part.tool_call_id]
    assert held["kind"] == "ledgerweb.approval" and held["state"] == State.AWAITING_APPROVAL
    attempt = Attempt.objects.get(attempt_id=held["attempt_id"])
    assert attempt.state == State.AWAITING_APPROVAL
    return (
        ModelMessagesTypeAdapter.dump_json(result.all_messages()).decode(),
        REQUESTS.dump_json(requests).decode(),
        attempt,
    )


def resume(tickets: Tickets, acme: LedgerContext, messages: str, requests: str) -> Any:
    """A restarted agent: loads what it kept, asks the ledger, resumes the run."""
    loaded = REQUESTS.validate_json(requests)
    results, pending = asyncio.run(ledger_decisions(loaded, ledger=acme, wait=2))
    assert pending == []
    history = ModelMessagesTypeAdapter.validate_json(messages)
    return agent_for(tickets).run_sync(
        deps=acme, message_history=history, deferred_tool_results=results
    ), results


def test_approved_on_the_ledger_while_the_agent_was_down_it_is_sent_once(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    messages, requests, attempt = held_run(tickets, acme)
    # Nobody decided yet: the call stays pending.
    results, pending = asyncio.run(ledger_decisions(REQUESTS.validate_json(requests), ledger=acme))
    assert [p.tool_call_id for p in pending] == ["call-1"] and not results.approvals

    approvals.approve(attempt.attempt_id, world.reviewer)
    final, results = resume(tickets, acme, messages, requests)
    assert isinstance(results.approvals["call-1"], ToolApproved)
    assert final.output.startswith("done: {") and "T-1" in final.output
    assert len(tickets.effects) == 1
    attempt.refresh_from_db()
    assert (attempt.state, attempt.send_count) == (State.OUTCOME_CONFIRMED, 1)
    # Resumed once more from the same saved state (a second restart): answered from the ledger.
    again, _ = resume(tickets, acme, messages, requests)
    assert "T-1" in again.output and len(tickets.effects) == 1
    connection.close()


def test_a_rejection_reaches_the_model_as_a_denial_and_nothing_is_sent(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    messages, requests, attempt = held_run(tickets, acme)
    approvals.reject(attempt.attempt_id, world.reviewer, "not urgent")
    final, results = resume(tickets, acme, messages, requests)
    denial = results.approvals["call-1"]
    assert isinstance(denial, ToolDenied) and "approval_rejected" in denial.message
    assert "approval_rejected" in final.output and tickets.effects == []
    assert Attempt.objects.get(pk=attempt.pk).send_count == 0


def test_an_expired_wait_reaches_the_model_as_a_denial_and_nothing_is_sent(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    messages, requests, attempt = held_run(tickets, acme)
    assert approvals.expire_waits() == 1
    final, results = resume(tickets, acme, messages, requests)
    assert "approval_expired" in results.approvals["call-1"].message
    assert "approval_expired" in final.output and tickets.effects == []


def test_edit_and_approve_runs_the_corrected_call_never_the_original(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    messages, requests, original = held_run(tickets, acme)
    linked = approvals.edit_and_approve(
        original.attempt_id, world.reviewer, {**URGENT, "priority": 2}
    )
    final, _ = resume(tickets, acme, messages, requests)
    assert [t["priority"] for t in tickets.effects] == [2]
    assert "T-1" in final.output
    approvals.assert_only_the_correction_was_sent(linked, original)


def test_approving_in_pydantic_ai_alone_sends_nothing(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    messages, requests, attempt = held_run(tickets, acme)
    history = ModelMessagesTypeAdapter.validate_json(messages)
    final = agent_for(tickets).run_sync(
        deps=acme,
        message_history=history,
        deferred_tool_results=REQUESTS.validate_json(requests).build_results(approve_all=True),
    )
    assert "ledgerweb awaiting_approval" in final.output and tickets.effects == []
    assert Attempt.objects.get(pk=attempt.pk).state == State.AWAITING_APPROVAL


def test_a_call_no_policy_holds_runs_without_being_deferred(
    tickets: Tickets, acme: LedgerContext, world: World
) -> None:
    result = agent_for(tickets).run_sync("open it", deps=acme)
    assert isinstance(result.output, str) and "T-1" in result.output
    assert len(tickets.effects) == 1
