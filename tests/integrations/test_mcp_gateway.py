"""The MCP gateway end to end: the SDK's real client talks to the gateway (a real process, on
stdio or streamable HTTP), which fronts real upstream MCP servers built with the SDK (one started
by the gateway over stdio, one over streamable HTTP), and records side effects in a live ledger.

The crash test kills the gateway with SIGKILL while the upstream holds the answer to a call it
has already performed; the real reconcile worker then finds the attempt, looks the effect up
through the upstream's lookup tool, and confirms it, and the effect happened exactly once."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from attempts.models import Attempt, State, Tool
from reconciliation.demo_provider import wait_for_port_file
from tests.conftest import PYTHON, REPO, child_env, manage
from tests.integrations.conftest import Tokens, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

START_TIMEOUT = 60.0


class Upstream:
    """One upstream test server (tests/integrations/mcp_upstream.py) and its effects file."""

    def __init__(self, workdir: Path, noun: str) -> None:
        self.noun = noun
        self.db = workdir / f"{noun}-effects.db"
        self.hold = workdir / f"{noun}.hold"
        self.args = ["-m", "tests.integrations.mcp_upstream", "--db", str(self.db)]
        self.args += ["--noun", noun, "--hold-file", str(self.hold)]
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    def start_http(self, workdir: Path) -> None:
        port_file = workdir / f"{self.noun}.port"
        log = open(workdir / f"{self.noun}.log", "wb")  # noqa: SIM115 (kept for the process)
        self.process = subprocess.Popen(
            [PYTHON, *self.args, "--http", "--port-file", str(port_file)],
            cwd=REPO,
            stdout=log,
            stderr=log,
        )
        self.url = f"http://127.0.0.1:{_wait_for_port(port_file, self.process)}/mcp"

    def toml(self) -> str:
        if self.url:
            return f'url = "{self.url}"\n'
        return (
            f"command = {json.dumps(PYTHON)}\nargs = {json.dumps(self.args)}\n"
            f"cwd = {json.dumps(str(REPO))}\n"
        )

    def server(self) -> Any:
        return self.url or StdioServerParameters(command=PYTHON, args=self.args, cwd=str(REPO))

    def effects(self) -> list[tuple[str, str, dict[str, Any]]]:
        if not self.db.exists():
            return []
        db = sqlite3.connect(self.db, timeout=10)
        try:
            rows = db.execute("SELECT id, idempotency_key, args FROM effects ORDER BY n").fetchall()
        finally:
            db.close()
        return [(effect_id, key, json.loads(args)) for effect_id, key, args in rows]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _wait_for_port(port_file: Path, process: subprocess.Popen[bytes]) -> int:
    port = wait_for_port_file(port_file, process, seconds=START_TIMEOUT, poll=0.05)
    if port is None:
        raise RuntimeError(f"process did not start listening (exit {process.returncode})")
    return port


def write_config(
    path: Path, ledger_url: str, tickets: Upstream, emails: Upstream, *, timeout: float = 30
) -> Path:
    path.write_text(
        f"""
[ledger]
url = "{ledger_url}"
tenant = "acme"
task_id = "task-mcp"

[upstreams.tickets]
{tickets.toml()}
[upstreams.emails]
{emails.toml()}
[tools.create_ticket]
upstream = "tickets"
ledger_tool = "open_ticket"
key = "ticket:{{tenant}}:{{args.customer}}"
receipt = true
request_id = "id"
timeout_seconds = {timeout}
lookup_tool = "find_ticket"

[tools.create_email]
upstream = "emails"
ledger_tool = "update_crm"
key = "email:{{tenant}}:{{task_id}}:{{args.customer}}"
lookup_tool = "find_email"
""",
        encoding="utf-8",
    )
    return path


class Gateway:
    """The gateway as a process serving streamable HTTP, so the test holds its pid."""

    def __init__(self, workdir: Path, config: Path, token: str) -> None:
        port_file = workdir / "gateway.port"
        port_file.unlink(missing_ok=True)
        self.log = workdir / "gateway.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [PYTHON, "-m", "ledgerweb_client.mcp_gateway", "--config", str(config)]
                + ["--http", "0", "--port-file", str(port_file)],
                cwd=REPO,
                env={**os.environ, "LEDGERWEB_TOKEN": token},
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{_wait_for_port(port_file, self.process)}/mcp"

    def kill(self) -> None:
        """SIGKILL the gateway process alone (a stdio upstream it started lives on)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)


@pytest.fixture
def world_tools(tokens: Tokens) -> Tokens:
    # Recovery reaches these tools through the gateway's upstreams (a lookup on a stdio upstream
    # starts a Python process: generous on a busy machine).
    Tool.objects.filter(name__in=["open_ticket", "update_crm"]).update(
        adapter="mcp", timeout_seconds=30
    )
    return tokens


@pytest.fixture
def async_orm(monkeypatch) -> None:
    # The test's own ORM reads run inside anyio.run: Django would refuse them in an event loop.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def upstreams(tmp_path: Path) -> Iterator[tuple[Upstream, Upstream]]:
    tickets = Upstream(tmp_path, "ticket")  # stdio: the gateway starts it
    emails = Upstream(tmp_path, "email")  # streamable HTTP: started here
    emails.start_http(tmp_path)
    yield tickets, emails
    tickets.hold.unlink(missing_ok=True)
    tickets.stop()
    emails.stop()


def _ledger_code(error: MCPError) -> str:
    return error.data["code"]


@sqlite_only  # the gateway's own behaviour; the crash test below runs on both databases
def test_gateway_lists_unchanged_records_replays_and_refuses(
    live_server, world_tools: Tokens, upstreams, tmp_path: Path, async_orm
) -> None:
    tickets, emails = upstreams
    # A short upstream timeout: the held answer below is "lost" after 3 s.
    config = write_config(tmp_path / "gateway.toml", live_server.url, tickets, emails, timeout=3)
    gateway = StdioServerParameters(
        command=PYTHON,
        args=["-m", "ledgerweb_client.mcp_gateway", "--config", str(config)],
        env={"LEDGERWEB_TOKEN": world_tools.acme},
        cwd=str(REPO),
    )

    async def scenario() -> None:
        async with Client(gateway) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            direct = {}
            for upstream in (tickets, emails):
                async with Client(upstream.server()) as upstream_client:
                    direct.update({t.name: t for t in (await upstream_client.list_tools()).tools})
            assert (
                listed.keys()
                == direct.keys()
                == {
                    "create_ticket",
                    "find_ticket",
                    "list_tickets",
                    "create_email",
                    "find_email",
                    "list_emails",
                }
            )
            for name, tool in listed.items():
                assert tool.model_dump() == direct[name].model_dump(), name

            # A tool not configured as a side effect passes through, unrecorded.
            counted = await client.call_tool("list_tickets", {})
            assert counted.structured_content == {"result": 0}
            assert Attempt.objects.count() == 0

            # A side effect: recorded, claimed, sent with the key, confirmed by its receipt.
            args = {"customer": "cus_1", "title": "Printer on fire"}
            first = await client.call_tool("create_ticket", args)
            assert first.structured_content == {"id": "T-1", **args}
            attempt = Attempt.objects.get(tool_name="open_ticket")
            assert attempt.state == State.OUTCOME_CONFIRMED
            assert attempt.idempotency_key == "ticket:acme:cus_1"
            assert attempt.provider_request_id == "T-1"
            assert attempt.result_ref.startswith("mcp:")
            assert tickets.effects() == [("T-1", "ticket:acme:cus_1", args)]
            ledger_meta = first.meta["io.ledgerweb/attempt"]
            assert ledger_meta["attempt_id"] == attempt.attempt_id
            assert not ledger_meta["replayed"]

            # The same call again: the recorded result, nothing sent upstream.
            again = await client.call_tool("create_ticket", args)
            assert again.structured_content == first.structured_content
            assert again.meta["io.ledgerweb/attempt"]["replayed"] is True
            assert len(tickets.effects()) == 1

            # The same key with other arguments: an MCP error, nothing overwritten or sent.
            with pytest.raises(MCPError) as conflict:
                await client.call_tool("create_ticket", {**args, "title": "Other"})
            assert _ledger_code(conflict.value) == "idempotency_conflict"
            # A tenant the gateway's token does not hold, named in the request's _meta.
            with pytest.raises(MCPError) as refused:
                await client.call_tool(
                    "create_ticket",
                    {"customer": "cus_2", "title": "t"},
                    meta={"io.ledgerweb/tenant": "globex"},
                )
            assert _ledger_code(refused.value) == "not_granted"
            # A key template field the call lacks.
            with pytest.raises(MCPError) as invalid:
                await client.call_tool("create_ticket", {"title": "no customer"})
            assert _ledger_code(invalid.value) == "invalid_call"
            assert len(tickets.effects()) == 1 and Attempt.objects.count() == 1

            # The HTTP upstream's tool without a durable receipt: DISPATCHED, and in flight for
            # a repeated call until reconciliation confirms it.
            sent = await client.call_tool("create_email", {"customer": "cus_1", "title": "Hi"})
            assert sent.structured_content["id"] == "E-1"
            email = Attempt.objects.get(tool_name="update_crm")
            assert email.state == State.DISPATCHED
            assert email.idempotency_key == "email:acme:task-mcp:cus_1"
            with pytest.raises(MCPError) as in_flight:
                await client.call_tool("create_email", {"customer": "cus_1", "title": "Hi"})
            assert _ledger_code(in_flight.value) == "not_dispatchable"
            assert len(emails.effects()) == 1

            # The upstream performs the effect but its answer does not come back in time:
            # UNKNOWN, an MCP error saying so, and no second send on a repeated call.
            tickets.hold.touch()
            with pytest.raises(MCPError) as timed_out:
                await client.call_tool("create_ticket", {"customer": "cus_9", "title": "Slow"})
            tickets.hold.unlink()
            assert _ledger_code(timed_out.value) == "outcome_unknown"
            slow = Attempt.objects.get(idempotency_key="ticket:acme:cus_9")
            assert slow.state == State.UNKNOWN
            with pytest.raises(MCPError) as still_unknown:
                await client.call_tool("create_ticket", {"customer": "cus_9", "title": "Slow"})
            assert _ledger_code(still_unknown.value) == "outcome_unknown"
            assert [e[0] for e in tickets.effects()] == ["T-1", "T-2"]

    anyio.run(scenario)


def _reconcile(config: Path) -> dict[str, Any]:
    done = manage(
        "reconcile",
        "--once",
        "--json",
        "--worker-id",
        "mcp-test",
        env=child_env(LEDGERWEB_MCP_GATEWAY_CONFIG=str(config)),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_gateway_killed_between_upstream_call_and_receipt_is_reconciled_by_lookup(
    transport: str, live_server, world_tools: Tokens, upstreams, tmp_path: Path, settings, async_orm
) -> None:
    tickets, emails = upstreams
    if transport == "streamable-http":
        tickets.start_http(tmp_path)
    # Intents and claims become due for recovery one second after they are recorded.
    settings.LEDGER = {**settings.LEDGER, "STALE_AFTER": 1}
    config = write_config(tmp_path / "gateway.toml", live_server.url, tickets, emails)
    args = {"customer": "cus_7", "title": "Crash window"}
    gateway = Gateway(tmp_path, config, world_tools.acme)
    try:
        tickets.hold.touch()

        async def call_and_kill() -> bool:
            """True once the gateway was killed with the effect performed upstream."""
            killed = False

            async def kill_once_performed() -> None:
                nonlocal killed
                while not tickets.effects():
                    await anyio.sleep(0.02)
                gateway.kill()  # the effect is durable upstream, its answer not yet received
                killed = True

            async with anyio.create_task_group() as group:
                group.start_soon(kill_once_performed)
                with pytest.raises(BaseException):  # noqa: B017, PT011 (the connection dies)
                    # Generous: the gateway starts its stdio upstream (a Python process) on the
                    # first call, and CI runs two suites on two cores.
                    with anyio.fail_after(90):
                        async with Client(gateway.url) as client:
                            await client.call_tool("create_ticket", args)
                # A call that failed before the upstream performed anything leaves nothing to
                # wait for: the test fails below with the gateway's log, it does not hang.
                group.cancel_scope.cancel()
            return killed

        killed = anyio.run(call_and_kill)
        tickets.hold.unlink()
    finally:
        gateway.stop()
    assert killed, gateway.log.read_text(errors="replace")[-4000:]
    assert gateway.process.returncode == -signal.SIGKILL
    attempt = Attempt.objects.get()
    assert attempt.state == State.DISPATCHED  # claimed, sent, and nothing after
    assert [(e[0], e[1]) for e in tickets.effects()] == [("T-1", "ticket:acme:cus_7")]

    # The real reconcile worker: stale claim -> UNKNOWN -> lookup tool -> found, same payload.
    time.sleep(1.2)
    summary = _reconcile(config)
    assert summary["lookups"] >= 1 and summary["sends"] == 0
    attempt.refresh_from_db()
    assert attempt.state == State.OUTCOME_CONFIRMED, list(
        attempt.events.values("reason", "details")
    )
    assert attempt.provider_request_id == "T-1"
    moves = list(attempt.events.values_list("to_state", flat=True))
    assert State.UNKNOWN in moves and moves[-1] == State.OUTCOME_CONFIRMED
    assert len(tickets.effects()) == 1

    # A restarted gateway answers the agent's retry from the ledger, without calling upstream.
    gateway = Gateway(tmp_path, config, world_tools.acme)
    try:

        async def retry() -> Any:
            with anyio.fail_after(60):
                async with Client(gateway.url) as client:
                    return await client.call_tool("create_ticket", args)

        replayed = anyio.run(retry)
    finally:
        gateway.stop()
    assert replayed.structured_content == {"id": "T-1", **args}
    assert replayed.meta["io.ledgerweb/attempt"]["replayed"] is True
    assert len(tickets.effects()) == 1


@sqlite_only
def test_gateway_refuses_a_bad_configuration(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[upstreams.a]\nurl = "http://127.0.0.1:1/mcp"\n[tools.x]\nkey = "{nope}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "ledgerweb_client.mcp_gateway", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "[tools.x] key: unknown field {nope}" in done.stderr
    assert "Traceback" not in done.stderr
