"""Fixtures for reconciliation tests: a real demo provider process on 127.0.0.1 and the test
world's tools pointed at it."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from attempts import ledger
from attempts.models import Attempt, Tool
from tests.conftest import PYTHON, REPO, agent_intent

START_TIMEOUT = 15.0


class DemoProvider:
    """A running ``reconciliation.demo_provider`` process and a small client for it."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port_file = workdir / "demo-provider.port"
        self.db = workdir / "demo-provider.db"
        self.log = workdir / "demo-provider.log"
        command = [PYTHON, "-m", "reconciliation.demo_provider", "--db", str(self.db)]
        command += ["--port", "0", "--port-file", str(self.port_file), *extra]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=out)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.port_file.exists() or not self.port_file.read_text().strip():
            if self.process.poll() is not None:
                raise RuntimeError(f"demo provider exited: {self.log.read_text()}")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError("demo provider did not start in time")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text().strip())
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            connection.request(method, path, body=data, headers=headers)
            answer = connection.getresponse()
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else None
        finally:
            connection.close()

    def control(self, **patch: Any) -> None:
        status, body = self.request("POST", "/_control", patch)
        assert status == 200, body

    def reset(self) -> None:
        status, body = self.request("POST", "/_control/reset", {})
        assert status == 200, body

    def inject(self, tool: str, key: str, args: dict[str, Any]) -> dict[str, Any]:
        """An effect the provider performed (e.g. before the agent crashed)."""
        status, body = self.request(
            "POST", "/_control/effects", {"tool": tool, "idempotency_key": key, "args": args}
        )
        assert status == 201, body
        return body

    def effects(self, **filters: str) -> list[dict[str, Any]]:
        query = f"?{urlencode(filters)}" if filters else ""
        return self.request("GET", f"/effects{query}")[1]

    def summary(self) -> dict[str, Any]:
        return self.request("GET", "/effects/summary")[1]

    def configure_tools(self, timeout: float = 2.0) -> None:
        for tool in Tool.objects.all():
            tool.dispatch_url = f"{self.base}/tools/{tool.name}/send"
            tool.lookup_url = f"{self.base}/tools/{tool.name}/lookup"
            tool.timeout_seconds = timeout
            tool.save()


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


def make_due(attempt: Attempt) -> Attempt:
    """Make recovery look at the attempt now (as if its stale threshold or backoff passed)."""
    past = timezone.now() - timezone.timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=past)
    attempt.refresh_from_db()
    return attempt


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
