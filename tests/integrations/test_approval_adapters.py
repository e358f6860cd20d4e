"""Approval before dispatch through the adapters, with the real packages, a live ledger and no
model: a held call (202 AWAITING_APPROVAL) is LangGraph's interrupt() in the tool node and
resumes with Command(resume=...); the same attempt continues by its key (one effect, never a
second), a rejection is a tool error, and an edit-and-approve link is followed with the
corrected arguments."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from attempts.models import Attempt, State
from ledgerweb_client.guard import (
    LedgerContext,
    ToolCallAwaitingApproval,
    ToolCallRejected,
    use_ledger,
)
from ledgerweb_client.integrations import ledgered
from ledgerweb_client.integrations.langchain import LedgerToolException, ledgered_tool
from tests.conftest import World
from tests.integrations.approvals import approve, edit_and_approve, hold, reject
from tests.integrations.conftest import KEY, URGENT, Tickets, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), sqlite_only]


def graph(tool: Any, checkpointer: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=checkpointer)


def ask(args: dict[str, Any], call_id: str = "call-1") -> dict[str, Any]:
    """What a model would ask for, written by hand."""
    message = AIMessage(
        content="", tool_calls=[{"name": "open_ticket", "args": args, "id": call_id}]
    )
    return {"messages": [message]}


@pytest.fixture
def tool(tickets: Tickets) -> Any:
    return ledgered_tool(tool_name="open_ticket", key=KEY, receipt=True)(tickets.open_ticket)


def config(acme: LedgerContext, thread: str = "thread-1") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "ledger": acme}}


def test_a_held_call_interrupts_the_graph_and_resumes_after_approval(
    tool, tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    app = graph(tool, InMemorySaver())
    out = app.invoke(ask(URGENT), config(acme))
    [paused] = out["__interrupt__"]
    request = paused.value
    attempt = Attempt.objects.get(attempt_id=request["attempt_id"])
    assert attempt.state == State.AWAITING_APPROVAL and tickets.effects == []
    assert request["kind"] == "ledgerweb.approval" and request["tool"] == "open_ticket"
    assert request["args_hash"] == attempt.args_hash and request["args"] == URGENT
    assert request["idempotency_key"] == "ticket:acme:cus_1:Printer on fire"
    assert request["approval_policy"] == "hold-open_ticket"
    assert request["dashboard_url"].endswith(f"/attempts/{attempt.attempt_id}/")
    assert request["dashboard_url"].startswith(acme.client.dashboard_url("x")[: -len("x/")])

    # Resumed before anyone decided: the ledger still holds it, so the graph pauses again.
    again = app.invoke(Command(resume="checked"), config(acme))
    assert again["__interrupt__"][0].value["attempt_id"] == attempt.attempt_id
    assert tickets.effects == []

    approve(attempt.attempt_id, world.reviewer)
    done = app.invoke(Command(resume={"wait": 2}), config(acme))
    reply = done["messages"][-1]
    assert isinstance(reply, ToolMessage) and reply.status == "success", reply.content
    assert json.loads(reply.content)["id"] == "T-1"
    attempt.refresh_from_db()
    assert (attempt.state, attempt.send_count) == (State.OUTCOME_CONFIRMED, 1)
    assert len(tickets.effects) == 1
    assert Attempt.objects.count() == 1

    # The agent restarts with nothing of its checkpoints: the same tool call, same key, is
    # answered by the ledger; no second ticket.
    fresh = graph(tool, InMemorySaver())
    replay = fresh.invoke(ask(URGENT, "call-again"), config(acme, "thread-2"))
    assert "__interrupt__" not in replay
    assert json.loads(replay["messages"][-1].content)["id"] == "T-1"
    assert len(tickets.effects) == 1 and Attempt.objects.count() == 1


def test_approved_while_the_agent_was_down_a_restarted_graph_sends_once(
    tool, tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    first = graph(tool, InMemorySaver())
    attempt_id = first.invoke(ask(URGENT), config(acme))["__interrupt__"][0].value["attempt_id"]
    del first  # the agent process is gone; the intent is durable in the ledger
    approve(attempt_id, world.reviewer)
    restarted = graph(tool, InMemorySaver())
    out = restarted.invoke(ask(URGENT, "call-after-restart"), config(acme, "thread-9"))
    assert out["messages"][-1].status == "success"
    assert len(tickets.effects) == 1
    attempt = Attempt.objects.get(attempt_id=attempt_id)
    assert (attempt.state, attempt.send_count) == (State.OUTCOME_CONFIRMED, 1)


def test_a_rejection_is_a_tool_error_and_nothing_is_sent(
    tool, tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    app = graph(tool, InMemorySaver())
    attempt_id = app.invoke(ask(URGENT), config(acme))["__interrupt__"][0].value["attempt_id"]
    reject(attempt_id, world.reviewer, "not urgent")
    out = app.invoke(Command(resume=True), config(acme))
    reply = out["messages"][-1]
    assert reply.status == "error" and "approval_rejected" in reply.content
    assert tickets.effects == []
    assert Attempt.objects.get(attempt_id=attempt_id).send_count == 0


def test_edit_and_approve_sends_the_corrected_arguments_once(
    tool, tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    app = graph(tool, InMemorySaver())
    attempt_id = app.invoke(ask(URGENT), config(acme))["__interrupt__"][0].value["attempt_id"]
    corrected = {**URGENT, "title": "Printer smoking"}
    linked = edit_and_approve(attempt_id, world.reviewer, corrected)
    out = app.invoke(Command(resume=True), config(acme))
    assert out["messages"][-1].status == "success", out["messages"][-1].content
    assert tickets.effects == [
        {"customer": "cus_1", "id": "T-1", "title": "Printer smoking", "priority": 3}
    ]
    original = Attempt.objects.get(attempt_id=attempt_id)
    linked.refresh_from_db()
    assert original.state == State.RECONCILED and original.send_count == 0
    assert (linked.state, linked.send_count) == (State.OUTCOME_CONFIRMED, 1)
    # Again, from the top (same key): the ledger follows the link and answers; nothing new.
    replay = graph(tool, InMemorySaver()).invoke(ask(URGENT, "call-2"), config(acme, "t-2"))
    assert json.loads(replay["messages"][-1].content)["title"] == "Printer smoking"
    assert len(tickets.effects) == 1


def test_outside_a_graph_a_held_call_is_a_tool_error(
    tool, tickets: Tickets, acme: LedgerContext, held_urgent
) -> None:
    with pytest.raises(LedgerToolException) as refused:
        tool.func(config={"configurable": {"ledger": acme}}, **URGENT)
    assert refused.value.code == "awaiting_approval"
    assert tickets.effects == []


def test_the_plain_decorator_waits_then_reports_held_and_rejected(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent
) -> None:
    open_ticket = ledgered(tool_name="open_ticket", key=KEY, receipt=True, wait_for_approval=1)(
        tickets.open_ticket
    )
    with use_ledger(acme.client, tenant="acme", task_id="task-int"):
        with pytest.raises(ToolCallAwaitingApproval) as held:
            open_ticket(**URGENT)
        assert held.value.approval_request["state"] == "AWAITING_APPROVAL"
        reject(held.value.attempt.attempt_id, world.reviewer)
        with pytest.raises(ToolCallRejected) as rejected:
            open_ticket(**URGENT)
        assert rejected.value.reason == "approval_rejected"
        # Below the policy's condition nothing is held: sent at once.
        assert open_ticket("cus_2", "Toner low", priority=1)["id"] == "T-1"
    assert len(tickets.effects) == 1


# ---------------------------------------------------------------------------------------------
# The OpenAI Agents SDK: the SDK's own tool-approval interruption, decided by the ledger. The
# model is the SDK's ScriptedModel (its deterministic test model): it asks for the tool call,
# then answers with text; no network.


def scripted(args: dict[str, Any]) -> Any:
    from agents.testing import ScriptedModel, assistant_message, function_call

    return ScriptedModel(
        [[function_call("open_ticket", args, call_id="call-1")], [assistant_message("done")]]
    )


def agent_for(tickets: Tickets, model: Any) -> Any:
    from agents import Agent

    from ledgerweb_client.integrations.openai_agents import ledgered_function_tool

    tool = ledgered_function_tool(tool_name="open_ticket", key=KEY, receipt=True)(
        tickets.open_ticket
    )
    return Agent(name="support", model=model, tools=[tool])


@pytest.fixture(autouse=False)
def no_tracing():
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


def run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


def _interrupted(tickets: Tickets, acme: LedgerContext, model: Any) -> tuple[Any, Any, Attempt]:
    """The Agents SDK runs ``model``'s script until the ledger's hold interrupts it; returns the
    agent, the run's result and the held attempt."""
    from agents import Runner

    agent = agent_for(tickets, model)
    result = run(Runner.run(agent, "open it", context=acme))
    return agent, result, Attempt.objects.get(idempotency_key="ticket:acme:cus_1:Printer on fire")


def _resumed(agent: Any, result: Any) -> Any:
    """The interrupted run resumed once the ledger's decision is applied to its state (no
    interruption left pending); returns the resumed run's result."""
    from agents import Runner

    from ledgerweb_client.integrations.openai_agents import apply_ledger_decisions

    state = result.to_state()
    assert run(apply_ledger_decisions(state)) == []
    return run(Runner.run(agent, state))


def _tool_outputs(final: Any) -> list[Any]:
    return [i.output for i in final.new_items if type(i).__name__ == "ToolCallOutputItem"]


def test_agents_sdk_a_held_call_is_an_interruption_sent_once_after_approval(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent, no_tracing
) -> None:
    from agents import Runner, RunState

    from ledgerweb_client.integrations.openai_agents import apply_ledger_decisions

    model = scripted(URGENT)
    _, result, attempt = _interrupted(tickets, acme, model)
    [item] = result.interruptions
    assert item.tool_name == "open_ticket" and tickets.effects == []
    assert attempt.state == State.AWAITING_APPROVAL

    # Nobody decided yet: the interruption stays pending, and the state is saved (an agent
    # that stops here resumes from the string after a restart).
    state = result.to_state()
    pending = run(apply_ledger_decisions(state, wait=1))
    assert [p.tool_name for p in pending] == ["open_ticket"]
    saved = state.to_string()
    del state, result

    approve(attempt.attempt_id, world.reviewer)
    restarted = agent_for(tickets, model)  # a new process: new tool objects, same model script

    async def resume() -> Any:
        state = await RunState.from_string(restarted, saved, context_override=acme)
        assert await apply_ledger_decisions(state, wait=2) == []
        return await Runner.run(restarted, state)

    final = run(resume())
    assert final.final_output == "done"
    assert len(tickets.effects) == 1
    attempt.refresh_from_db()
    assert (attempt.state, attempt.send_count) == (State.OUTCOME_CONFIRMED, 1)
    outputs = _tool_outputs(final)
    assert any("T-1" in str(output) for output in outputs), outputs


def test_agents_sdk_a_rejection_is_the_tools_answer_and_nothing_is_sent(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent, no_tracing
) -> None:
    model = scripted(URGENT)
    agent, result, attempt = _interrupted(tickets, acme, model)
    reject(attempt.attempt_id, world.reviewer, "not urgent")
    final = _resumed(agent, result)
    assert tickets.effects == []
    [output] = _tool_outputs(final)
    assert "ledgerweb approval_rejected" in str(output)
    # What the model was told, as the model received it.
    sent_back = [
        entry for entry in model.last_call.input if entry.get("type") == "function_call_output"
    ]
    assert "approval_rejected" in sent_back[0]["output"]
    assert Attempt.objects.get(pk=attempt.pk).send_count == 0


def test_agents_sdk_approving_in_the_sdk_alone_sends_nothing(
    tickets: Tickets, acme: LedgerContext, held_urgent, no_tracing
) -> None:
    from agents import Runner

    agent, result, _ = _interrupted(tickets, acme, scripted(URGENT))
    state = result.to_state()
    state.approve(result.interruptions[0])  # bypassing the ledger's approvers
    final = run(Runner.run(agent, state))
    assert tickets.effects == []
    [output] = _tool_outputs(final)
    assert "ledgerweb awaiting_approval" in str(output)


def test_agents_sdk_edit_and_approve_runs_the_tool_with_the_corrected_arguments(
    tickets: Tickets, acme: LedgerContext, world: World, held_urgent, no_tracing
) -> None:
    agent, result, original = _interrupted(tickets, acme, scripted(URGENT))
    linked = edit_and_approve(original.attempt_id, world.reviewer, {**URGENT, "priority": 2})
    _resumed(agent, result)
    assert [t["priority"] for t in tickets.effects] == [2]
    linked.refresh_from_db()
    assert (linked.state, linked.send_count) == (State.OUTCOME_CONFIRMED, 1)
    assert Attempt.objects.get(pk=original.pk).send_count == 0


def test_agents_sdk_calls_no_policy_holds_run_without_an_interruption(
    tickets: Tickets, acme: LedgerContext, held_urgent, no_tracing
) -> None:
    from agents import Runner

    calm = {"customer": "cus_3", "title": "Toner low", "priority": 1}  # below the condition
    final = run(Runner.run(agent_for(tickets, scripted(calm)), "open it", context=acme))
    assert final.interruptions == [] and final.final_output == "done"
    assert len(tickets.effects) == 1


# ---------------------------------------------------------------------------------------------
# The MCP gateway: the SDK's real client, the gateway as a process over stdio, a real upstream.


@pytest.mark.slow
def test_mcp_gateway_answers_a_held_call_as_pending_and_the_same_call_later_with_the_outcome(
    live_server, tokens, world: World, tmp_path, monkeypatch
) -> None:
    import anyio
    from mcp import Client, StdioServerParameters

    from tests.conftest import PYTHON, REPO
    from tests.integrations.test_mcp_gateway import Upstream, write_config

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the test's ORM reads in the loop
    hold("open_ticket")
    tickets = Upstream(tmp_path, "ticket")  # stdio: the gateway starts it
    emails = Upstream(tmp_path, "email")
    emails.start_http(tmp_path)
    config = write_config(tmp_path / "gateway.toml", live_server.url, tickets, emails)
    gateway = StdioServerParameters(
        command=PYTHON,
        args=["-m", "ledgerweb_client.mcp_gateway", "--config", str(config)],
        env={"LEDGERWEB_TOKEN": tokens.acme},
        cwd=str(REPO),
    )

    def text(result: Any) -> str:
        return " ".join(block.text for block in result.content if block.type == "text")

    async def scenario() -> None:
        async with Client(gateway) as client:
            args = {"customer": "cus_1", "title": "Printer on fire"}
            pending = await client.call_tool("create_ticket", args)
            ledger_meta = pending.meta["io.ledgerweb/attempt"]
            assert pending.is_error is True and pending.structured_content is None
            assert "Pending approval" in text(pending) and "same arguments" in text(pending)
            assert ledger_meta["pending_approval"] is True
            assert ledger_meta["state"] == "AWAITING_APPROVAL"
            assert ledger_meta["code"] == "awaiting_approval"
            attempt_id = ledger_meta["attempt_id"]
            assert ledger_meta["dashboard_url"].endswith(f"/attempts/{attempt_id}/")
            assert attempt_id in text(pending)
            assert tickets.effects() == []
            # Asked again before anyone decided: the same attempt, still pending.
            again = await client.call_tool("create_ticket", args)
            assert again.meta["io.ledgerweb/attempt"]["attempt_id"] == attempt_id
            assert Attempt.objects.count() == 1 and tickets.effects() == []

            approve(attempt_id, world.reviewer)
            done = await client.call_tool("create_ticket", args)
            assert done.is_error is not True
            assert done.structured_content == {"id": "T-1", **args}
            assert done.meta["io.ledgerweb/attempt"]["attempt_id"] == attempt_id
            replay = await client.call_tool("create_ticket", args)
            assert replay.meta["io.ledgerweb/attempt"]["replayed"] is True
            assert tickets.effects() == [("T-1", "ticket:acme:cus_1", args)]

            # Rejected: the same call returns the rejection, as a result the model reads.
            other = {"customer": "cus_2", "title": "Toner low"}
            held_id = (await client.call_tool("create_ticket", other)).meta["io.ledgerweb/attempt"][
                "attempt_id"
            ]
            reject(held_id, world.reviewer, "buy toner yourself")
            refused = await client.call_tool("create_ticket", other)
            assert refused.is_error is True and "approval_rejected" in text(refused)
            assert refused.meta["io.ledgerweb/attempt"]["pending_approval"] is False
            assert refused.meta["io.ledgerweb/attempt"]["state"] == "FAILED"

            # Edited and approved: the corrected arguments go upstream, under the linked key.
            third = {"customer": "cus_3", "title": "Sreen flickers"}
            third_id = (await client.call_tool("create_ticket", third)).meta[
                "io.ledgerweb/attempt"
            ]["attempt_id"]
            fixed = {**third, "title": "Screen flickers"}
            linked = edit_and_approve(third_id, world.reviewer, fixed)
            sent = await client.call_tool("create_ticket", third)
            assert sent.structured_content == {"id": "T-2", **fixed}
            assert sent.meta["io.ledgerweb/attempt"]["attempt_id"] == linked.attempt_id
            assert tickets.effects()[-1] == ("T-2", linked.idempotency_key, fixed)
            assert len(tickets.effects()) == 2

    try:
        anyio.run(scenario)
    finally:
        tickets.stop()
        emails.stop()
    states = dict(Attempt.objects.values_list("attempt_id", "state"))
    assert sorted(states.values()) == sorted(
        [State.OUTCOME_CONFIRMED, State.FAILED, State.RECONCILED, State.OUTCOME_CONFIRMED]
    )


def test_an_async_tool_interrupts_and_resumes_the_same_way(
    acme: LedgerContext, world: World, held_urgent
) -> None:
    import asyncio

    opened: list[str] = []

    async def open_ticket(customer: str, title: str, priority: int = 1) -> dict[str, Any]:
        """Open a support ticket for a customer."""
        opened.append(title)
        return {"id": f"T-{len(opened)}", "title": title}

    tool = ledgered_tool(tool_name="open_ticket", key=KEY, receipt=True)(open_ticket)
    app = graph(tool, InMemorySaver())

    async def scenario() -> None:
        out = await app.ainvoke(ask(URGENT), config(acme))
        attempt_id = out["__interrupt__"][0].value["attempt_id"]
        await asyncio.to_thread(approve, attempt_id, world.reviewer)
        done = await app.ainvoke(Command(resume={"wait": 2}), config(acme))
        assert done["messages"][-1].status == "success", done["messages"][-1].content

    asyncio.run(scenario())
    assert opened == ["Printer on fire"]
    assert Attempt.objects.get(idempotency_key="ticket:acme:cus_1:Printer on fire").send_count == 1
