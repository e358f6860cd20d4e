"""The framework adapters with the real packages and a live ledger, tools invoked directly as
each framework does (no language model): the plain decorator, LangChain's tool interface,
LangGraph's ToolNode and the OpenAI Agents SDK's FunctionTool.

Every adapter must record, claim, send and confirm through the client, answer a repeated call
from the ledger without sending, and turn each refusal of the ledger into its framework's tool
error: idempotency conflict, not granted, in flight, outcome unknown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from agents import RunContextWrapper
from agents.tool_context import ToolContext
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import StructuredTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from attempts.models import Attempt, State
from ledgerweb_client import ProviderRefused, ProviderTimeout
from ledgerweb_client.guard import (
    LedgerContext,
    ToolCallConflict,
    ToolCallError,
    ToolCallNotDispatchable,
    ToolCallNotGranted,
    ToolCallOutcomeUnknown,
    use_ledger,
)
from ledgerweb_client.integrations import ledgered
from ledgerweb_client.integrations.langchain import (
    LedgerToolException,
    guard_tool,
    ledgered_tool,
)
from ledgerweb_client.integrations.openai_agents import ledgered_function_tool
from tests.integrations.conftest import KEY, Tickets, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), sqlite_only]

# Each driver builds a guarded tool from the provider's function and calls it as its framework
# would, answering ("ok", value) or ("error", ledger code).
Outcome = tuple[str, Any]


class Plain:
    def build(self, provider: Tickets, *, receipt: bool) -> Any:
        return ledgered(tool_name="open_ticket", key=KEY, receipt=receipt)(provider.open_ticket)

    def call(self, tool: Any, context: LedgerContext, **args: Any) -> Outcome:
        with use_ledger(context.client, tenant=context.tenant, task_id=context.task_id):
            try:
                return "ok", tool(**args)
            except ToolCallError as exc:
                return "error", exc.code


def _tool_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": "call-1", "name": name, "args": args}


def _from_message(message: ToolMessage) -> Outcome:
    if message.status == "error":
        assert message.content.startswith("ledgerweb "), message.content
        return "error", message.content.split()[1].rstrip(":")
    return "ok", message.artifact if message.artifact is not None else message.content


class LangChain:
    def build(self, provider: Tickets, *, receipt: bool) -> StructuredTool:
        return ledgered_tool(tool_name="open_ticket", key=KEY, receipt=receipt)(
            provider.open_ticket
        )

    def call(self, tool: StructuredTool, context: LedgerContext, **args: Any) -> Outcome:
        config = {"configurable": {"ledger": context}}
        message = tool.invoke(_tool_call(tool.name, args), config=config)
        outcome = _from_message(message)
        return outcome if outcome[0] == "error" else ("ok", json.loads(message.content))


class LangGraph(LangChain):
    def call(self, tool: StructuredTool, context: LedgerContext, **args: Any) -> Outcome:
        # A one-node graph around LangGraph's prebuilt ToolNode, driven without a model.
        builder = StateGraph(MessagesState)
        builder.add_node("tools", ToolNode([tool]))
        builder.add_edge(START, "tools")
        builder.add_edge("tools", END)
        request = AIMessage(content="", tool_calls=[_tool_call(tool.name, args)])
        state = builder.compile().invoke(
            {"messages": [request]}, config={"configurable": {"ledger": context}}
        )
        message = state["messages"][-1]
        outcome = _from_message(message)
        return outcome if outcome[0] == "error" else ("ok", json.loads(message.content))


class OpenAIAgents:
    def build(self, provider: Tickets, *, receipt: bool) -> Any:
        return ledgered_function_tool(provider.open_ticket, key=KEY, receipt=receipt)

    def call(self, tool: Any, context: LedgerContext, **args: Any) -> Outcome:
        payload = json.dumps(args)
        tool_context = ToolContext(
            context=context, tool_name=tool.name, tool_call_id="call-1", tool_arguments=payload
        )
        answer = asyncio.run(tool.on_invoke_tool(tool_context, payload))
        if isinstance(answer, str) and answer.startswith("ledgerweb "):
            return "error", answer.split()[1].rstrip(":")
        return "ok", answer


DRIVERS: dict[str, Callable[[], Any]] = {
    "decorator": Plain,
    "langchain": LangChain,
    "langgraph": LangGraph,
    "openai-agents": OpenAIAgents,
}


@pytest.fixture(params=list(DRIVERS))
def driver(request) -> Any:
    return DRIVERS[request.param]()


def test_safe_order_replay_and_every_refusal(driver, acme: LedgerContext) -> None:
    provider = Tickets()
    confirmed = driver.build(provider, receipt=True)
    args = {"customer": "cus_1", "title": "Printer on fire"}

    # Recorded, claimed, sent once, confirmed with the answer as the durable receipt.
    ticket = {"id": "T-1", "title": "Printer on fire", "priority": 3}
    assert driver.call(confirmed, acme, **args) == ("ok", ticket)
    attempt = Attempt.objects.get()
    assert attempt.idempotency_key == "ticket:acme:cus_1:Printer on fire"
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert attempt.args == {"customer": "cus_1", "title": "Printer on fire", "priority": 3}
    assert json.loads(attempt.result_ref.removeprefix("json:"))["id"] == "T-1"

    # The same call again: the recorded result, nothing sent.
    assert driver.call(confirmed, acme, **args)[1]["id"] == "T-1"
    assert len(provider.effects) == 1

    # The same key with other arguments: refused, nothing overwritten or sent.
    assert driver.call(confirmed, acme, **args, priority=1) == ("error", "idempotency_conflict")
    # A tenant this agent's token does not hold.
    globex = replace(acme, tenant="globex")
    assert driver.call(confirmed, globex, **args) == ("error", "not_granted")
    assert len(provider.effects) == 1 and Attempt.objects.count() == 1

    # No durable receipt: the attempt stays DISPATCHED, and a second call must not send.
    unconfirmed = driver.build(provider, receipt=False)
    other = {"customer": "cus_2", "title": "Toner low"}
    assert driver.call(unconfirmed, acme, **other)[0] == "ok"
    assert Attempt.objects.get(args__customer="cus_2").state == State.DISPATCHED
    assert driver.call(unconfirmed, acme, **other) == ("error", "not_dispatchable")

    # A lost answer: UNKNOWN, reported as such, and never sent again by the agent.
    provider.fail_with = ProviderTimeout("read timed out")
    lost = {"customer": "cus_3", "title": "Paper jam"}
    assert driver.call(confirmed, acme, **lost) == ("error", "outcome_unknown")
    assert Attempt.objects.get(args__customer="cus_3").state == State.UNKNOWN
    provider.fail_with = None
    assert driver.call(confirmed, acme, **lost) == ("error", "outcome_unknown")
    assert len(provider.effects) == 2


def test_decorator_errors_are_typed_and_refusals_recorded(acme: LedgerContext) -> None:
    provider = Tickets()
    open_ticket = ledgered(tool_name="open_ticket", key=KEY, receipt=True)(provider.open_ticket)
    with use_ledger(acme.client, tenant="acme", task_id="t"):
        open_ticket("cus_1", "A")
        with pytest.raises(ToolCallConflict):
            open_ticket("cus_1", "A", priority=1)
        provider.fail_with = ProviderRefused("customer closed", retryable=False)
        with pytest.raises(ToolCallError) as refused:
            open_ticket("cus_9", "B")
        assert refused.value.code == "failed" and not refused.value.retryable
        assert Attempt.objects.get(args__customer="cus_9").state == State.FAILED
        provider.fail_with = RuntimeError("socket closed mid-answer")
        with pytest.raises(ToolCallOutcomeUnknown) as unknown:
            open_ticket("cus_8", "C")
        assert isinstance(unknown.value.__cause__, RuntimeError)
        assert unknown.value.attempt.state == State.UNKNOWN
    with use_ledger(acme.client, tenant="globex", task_id="t"):
        with pytest.raises(ToolCallNotGranted):
            open_ticket("cus_1", "A")
    # A key field the call does not have: refused before anything is recorded.
    broken = ledgered(tool_name="open_ticket", key="t:{args.missing}")(provider.open_ticket)
    with use_ledger(acme.client, tenant="acme", task_id="t"), pytest.raises(ToolCallError):
        broken("cus_1", "A")
    # No ledger context at all: the tool refuses to run unrecorded.
    with pytest.raises(ToolCallError, match="no ledger context"):
        open_ticket("cus_7", "D")
    assert len(provider.effects) == 1


def test_guard_tool_wraps_an_existing_langchain_tool(acme: LedgerContext) -> None:
    provider = Tickets()

    @tool
    def open_ticket(customer: str, title: str) -> str:
        """Open a support ticket."""
        return provider.open_ticket(customer, title)["id"]

    guarded = guard_tool(open_ticket, key=KEY, receipt=True)
    assert (guarded.name, guarded.description) == (open_ticket.name, open_ticket.description)
    assert guarded.args == open_ticket.args
    config = {"configurable": {"ledger": acme}}
    assert guarded.invoke({"customer": "c", "title": "t"}, config=config) == "T-1"
    assert guarded.invoke({"customer": "c", "title": "t"}, config=config) == "T-1"
    assert len(provider.effects) == 1
    # Without handle_tool_error, the refusal raises the framework's ToolException.
    strict = guard_tool(open_ticket, key="same-key", receipt=True, handle_tool_error=False)
    strict.invoke({"customer": "c", "title": "x"}, config=config)
    with pytest.raises(LedgerToolException) as conflict:
        strict.invoke({"customer": "c", "title": "y"}, config=config)
    assert conflict.value.code == "idempotency_conflict"
    assert isinstance(conflict.value.error, ToolCallConflict)


def test_openai_tool_that_takes_the_run_context(acme: LedgerContext) -> None:
    seen = []

    @ledgered_function_tool(key="crm:{tenant}:{args.account}", tool_name="update_crm", receipt=True)
    async def update_crm(ctx: RunContextWrapper[LedgerContext], account: str, stage: str) -> str:
        """Move a CRM account to a stage."""
        seen.append(ctx.context.task_id)
        return f"{account}->{stage}"

    assert set(update_crm.params_json_schema["properties"]) == {"account", "stage"}
    payload = json.dumps({"account": "a1", "stage": "won"})
    tool_context = ToolContext(
        context=acme, tool_name=update_crm.name, tool_call_id="c1", tool_arguments=payload
    )
    assert asyncio.run(update_crm.on_invoke_tool(tool_context, payload)) == "a1->won"
    assert asyncio.run(update_crm.on_invoke_tool(tool_context, payload)) == "a1->won"
    assert seen == ["task-int"]
    assert Attempt.objects.get().args == {"account": "a1", "stage": "won"}
    # Invalid arguments never reach the ledger.
    answer = asyncio.run(update_crm.on_invoke_tool(tool_context, '{"account": 1}'))
    assert "ledgerweb" not in answer and Attempt.objects.count() == 1
    assert ToolCallNotDispatchable.CODE == "not_dispatchable"
