"""Microsoft Agent Framework (docs/integrations.md): the real package, a scripted chat client (no
network, no LLM) and a live ledger. A ledgered tool is approval-required; the ledger decides
each request (``ledger_approvals``): a call no policy holds is approved at once, an approved one
is sent once (the corrected arguments after an edit), a rejected or expired one reaches the
agent as the framework's rejection and nothing is sent, also after a restart while held (the
session and the requests kept as JSON)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
)
from django.db import connection

from attempts.models import Attempt, State
from ledgerweb_client.guard import LedgerContext, use_ledger
from ledgerweb_client.integrations.agent_framework import ledger_approvals, ledgered_tool
from tests.conftest import World
from tests.integrations import approvals
from tests.integrations.conftest import KEY, URGENT, Tickets, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), sqlite_only]

REJECTED = "Error: Tool call invocation was rejected by user."


class Scripted(FunctionInvocationLayer, BaseChatClient):
    """The model: first it asks for the ticket, then it repeats what the tool answered."""

    def _inner_get_response(self, *, messages, stream, options, **kwargs):
        async def answer() -> ChatResponse:
            results = [c for m in messages for c in m.contents if c.type == "function_result"]
            if results:
                text = f"done: {results[-1].result}"
                return ChatResponse(messages=[Message(role="assistant", contents=[text])])
            call = Content.from_function_call(
                call_id="call-1", name="open_ticket", arguments=dict(URGENT)
            )
            return ChatResponse(messages=[Message(role="assistant", contents=[call])])

        return answer()


def agent_for(tickets: Tickets, acme: LedgerContext) -> Agent:
    """A fresh agent, as a restarted process builds it."""
    tool = ledgered_tool(
        tickets.open_ticket, tool_name="open_ticket", key=KEY, receipt=True, ledger=acme
    )
    return Agent(client=Scripted(), tools=[tool])


def asked(tickets: Tickets, acme: LedgerContext) -> tuple[str, list[str]]:
    """Run until the framework asks for approval, then ask the ledger, which holds the call
    (the intent is recorded, for people to decide): (the session, the requests), as JSON, as
    an agent keeps them when it stops to wait."""
    agent = agent_for(tickets, acme)
    session = agent.create_session()
    result = asyncio.run(agent.run("open it", session=session))
    [request] = result.user_input_requests
    assert request.type == "function_approval_request" and tickets.effects == []
    answers, pending = asyncio.run(
        ledger_approvals([request], tools=agent.default_options["tools"])
    )
    assert answers == [] and pending == [request]
    attempt = Attempt.objects.get(idempotency_key="ticket:acme:cus_1:Printer on fire")
    assert attempt.state == State.AWAITING_APPROVAL
    return json.dumps(session.to_dict()), [json.dumps(request.to_dict())]


def decide_and_resume(
    tickets: Tickets, acme: LedgerContext, saved: str, requests: list[str], *, wait: float = 2
) -> tuple[Any, list[Content]]:
    """A restarted agent: loads what it kept, asks the ledger, resumes with the answers."""
    agent = agent_for(tickets, acme)
    session = AgentSession.from_dict(json.loads(saved))
    loaded = [Content.from_dict(json.loads(r)) for r in requests]
    answers, pending = asyncio.run(
        ledger_approvals(loaded, tools=agent.default_options["tools"], wait=wait)
    )
    assert pending == []
    result = asyncio.run(agent.run(Message(role="user", contents=answers), session=session))
    connection.close()
    return result, answers


def test_a_call_no_policy_holds_is_approved_by_the_ledger_at_once_and_sent_once(
    tickets: Tickets, acme: LedgerContext, world: World
) -> None:
    agent = agent_for(tickets, acme)
    session = agent.create_session()
    [request] = asyncio.run(agent.run("open it", session=session)).user_input_requests
    saved, requests = json.dumps(session.to_dict()), [json.dumps(request.to_dict())]
    result, answers = decide_and_resume(tickets, acme, saved, requests, wait=0)
    assert [a.approved for a in answers] == [True]
    assert "T-1" in result.text and len(tickets.effects) == 1


def test_held_then_approved_on_the_ledger_after_a_restart_it_is_sent_once(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    saved, requests = asked(tickets, acme)  # held: the agent keeps its state and stops
    attempt = Attempt.objects.get(idempotency_key="ticket:acme:cus_1:Printer on fire")
    approvals.approve(attempt.attempt_id, world.reviewer)
    result, answers = decide_and_resume(tickets, acme, saved, requests)
    assert [a.approved for a in answers] == [True]
    assert "T-1" in result.text and len(tickets.effects) == 1
    attempt.refresh_from_db()
    assert (attempt.state, attempt.send_count) == (State.OUTCOME_CONFIRMED, 1)
    # The same saved state resumed again (a second restart): answered from the ledger.
    again, _ = decide_and_resume(tickets, acme, saved, requests)
    assert "T-1" in again.text and len(tickets.effects) == 1


def test_a_rejection_reaches_the_agent_as_the_frameworks_rejection(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    saved, requests = asked(tickets, acme)
    attempt = Attempt.objects.get(idempotency_key="ticket:acme:cus_1:Printer on fire")
    approvals.reject(attempt.attempt_id, world.reviewer, "not urgent")
    result, answers = decide_and_resume(tickets, acme, saved, requests)
    assert [a.approved for a in answers] == [False]
    assert REJECTED in result.text and tickets.effects == []
    assert Attempt.objects.get(pk=attempt.pk).send_count == 0


def test_an_expiry_reaches_the_agent_as_the_frameworks_rejection(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    saved, requests = asked(tickets, acme)
    assert approvals.expire_waits() == 1
    result, answers = decide_and_resume(tickets, acme, saved, requests)
    assert [a.approved for a in answers] == [False]
    assert REJECTED in result.text and tickets.effects == []


def test_edit_and_approve_runs_the_corrected_call_never_the_original(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    saved, requests = asked(tickets, acme)
    original = Attempt.objects.get(idempotency_key="ticket:acme:cus_1:Printer on fire")
    linked = approvals.edit_and_approve(
        original.attempt_id, world.reviewer, {**URGENT, "priority": 2}
    )
    result, _ = decide_and_resume(tickets, acme, saved, requests)
    assert [t["priority"] for t in tickets.effects] == [2] and "T-1" in result.text
    approvals.assert_only_the_correction_was_sent(linked, original)


def test_approving_in_the_framework_alone_sends_nothing(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    saved, requests = asked(tickets, acme)
    agent = agent_for(tickets, acme)
    session = AgentSession.from_dict(json.loads(saved))
    request = Content.from_dict(json.loads(requests[0]))
    yes = request.to_function_approval_response(approved=True)  # bypassing the ledger
    result = asyncio.run(agent.run(Message(role="user", contents=[yes]), session=session))
    assert "ledgerweb awaiting_approval" in result.text and tickets.effects == []


def test_the_tool_takes_its_ledger_from_use_ledger_too(
    tickets: Tickets, acme: LedgerContext, world: World
) -> None:
    tool = ledgered_tool(tickets.open_ticket, tool_name="open_ticket", key=KEY, receipt=True)
    with use_ledger(acme.client, tenant="acme", task_id="task-int"):
        answer = asyncio.run(tool.invoke(arguments=dict(URGENT)))
    [result] = answer
    assert "T-1" in str(result.to_dict()) and len(tickets.effects) == 1
