"""Fixtures for reconciliation tests: a real demo provider process on 127.0.0.1 and the test
world's tools pointed at it, and a misbehaving provider (slow, silent, huge, rate-limiting)."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from attempts import ledger
from attempts.models import Attempt, State, Tool
from reconciliation.crashtest.harness import ProviderProcess
from reconciliation.demo_provider import wait_for_port_file
from tests.conftest import PYTHON, REPO, agent_intent


class DemoProvider(ProviderProcess):
    """A running ``reconciliation.demo_provider`` process (the crash test's, started at once)
    and what the tests ask of it besides."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        super().__init__(workdir, "demo", *extra)
        self.start()

    def inject(self, tool: str, key: str, args: dict[str, Any]) -> dict[str, Any]:
        """An effect the provider performed (e.g. before the agent crashed)."""
        status, body = self.request(
            "POST", "/_control/effects", {"tool": tool, "idempotency_key": key, "args": args}
        )
        assert status == 201, body
        return body

    def configure_tools(self, timeout: float = 2.0) -> None:
        for tool in Tool.objects.all():
            tool.dispatch_url = f"{self.base}/tools/{tool.name}/send"
            tool.lookup_url = f"{self.base}/tools/{tool.name}/lookup"
            tool.timeout_seconds = timeout
            tool.save()

    def ticket_incident(self) -> None:
        """The demo's ticket incident, with no other faults: the tools pointed here (a second's
        timeout) and ``demo_agents.configure_provider``, after which ticket lookups answer 503
        with a message that says it is on purpose."""
        from reconciliation import demo_agents

        self.configure_tools(timeout=1.0)
        demo_agents.configure_provider(
            demo_agents.Provider(self.base, 5.0),
            timeout_rate=0.0,
            lookup_fault_rate=0.0,
            hang_seconds=1.0,
        )


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[DemoProvider]:
    provider = DemoProvider(tmp_path)
    yield provider
    provider.stop()


@pytest.fixture
def wired(world, demo: DemoProvider):
    """The test world with every tool pointed at the demo provider."""
    demo.configure_tools()
    return world


class BadProvider:
    """A misbehaving provider (tests/reconciliation/bad_provider.py) in ``mode``, as a process."""

    def __init__(self, workdir: Path, mode: str) -> None:
        self.port_file = workdir / f"bad-{mode}.port"
        self.log = workdir / f"bad-{mode}.log"
        self.mode = mode
        command = [PYTHON, "-m", "tests.reconciliation.bad_provider", mode]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [*command, "--port-file", str(self.port_file)], cwd=REPO, stdout=out, stderr=out
            )
        port = wait_for_port_file(self.port_file, self.process, seconds=15)
        assert port is not None, f"bad provider did not start: {self.log.read_text()}"
        self.port = port
        self.base = f"http://127.0.0.1:{self.port}"

    def hits(self) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("GET", "/_hits")
            return json.loads(connection.getresponse().read())["hits"]
        finally:
            connection.close()

    def point(self, tool: str, timeout: float) -> None:
        """``tool`` sends to and looks up at this provider, with ``timeout`` seconds a call."""
        Tool.objects.filter(name=tool).update(
            dispatch_url=f"{self.base}/send",
            lookup_url=f"{self.base}/lookup",
            timeout_seconds=timeout,
        )

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def bad_provider(tmp_path: Path, request) -> Iterator[BadProvider]:
    """The bad provider in the mode the test names (``parametrize(..., indirect=True)``)."""
    provider = BadProvider(tmp_path, request.param)
    yield provider
    provider.stop()


def make_due(attempt: Attempt) -> Attempt:
    """Make recovery look at the attempt now (as if its stale threshold or backoff passed)."""
    past = timezone.now() - timezone.timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=past)
    attempt.refresh_from_db()
    return attempt


def make_stale(attempt: Attempt) -> Attempt:
    """Make the attempt look untouched for five seconds (past a short stale threshold)."""
    past = timezone.now() - timezone.timedelta(seconds=5)
    Attempt.objects.filter(pk=attempt.pk).update(updated_at=past)
    return attempt


def seconds_to_confirm(
    attempt: Attempt,
    limit: float,
    worker: subprocess.Popen,
    *,
    also: Callable[[], None] = lambda: None,
) -> float:
    """Seconds until the running ``worker`` confirms the attempt, at most ``limit``; the worker
    must stay alive, and ``also`` (a check of its own) holds all the while."""
    started = time.monotonic()
    while True:
        state = Attempt.objects.values_list("state", flat=True).get(pk=attempt.pk)
        if state == State.OUTCOME_CONFIRMED:
            return time.monotonic() - started
        assert worker.poll() is None, worker.stderr.read()
        elapsed = time.monotonic() - started
        assert elapsed < limit, f"{attempt.tool_name} still {state} after {elapsed:.1f}s"
        also()
        time.sleep(0.05)


def intent(world, tool: str, key: str, args: dict[str, Any] | None = None, tenant: str = "acme"):
    attempt, created = agent_intent(
        world,
        key,
        tool=tool,
        args=args if args is not None else {"n": 1, "to": "a@example.test"},
        task="task-1",
        tenant=tenant,
    )
    assert created
    return attempt


def dispatched(world, tool: str, key: str, args: dict[str, Any] | None = None) -> Attempt:
    attempt, claimed = ledger.claim_dispatch(intent(world, tool, key, args), actor=world.agent)
    assert claimed
    return attempt


def unknown(world, tool: str, key: str, args: dict[str, Any] | None = None) -> Attempt:
    attempt = dispatched(world, tool, key, args)
    return ledger.mark_unknown(attempt, reason="agent timed out", actor=world.agent)
