"""Fixtures for the agent API: tokens for acme and globex, and a small JSON caller."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from attempts.models import AgentToken, Attempt, AttemptEvent
from tests.conftest import REPO, World, child_env


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any


class Api:
    """Calls /api/v1/ with a bearer token through Django's test client."""

    def __init__(self, client: Client, token: str | None) -> None:
        self.client = client
        self.token = token

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        token: str | None | type[Ellipsis] = ...,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        token = self.token if token is ... else token
        extra = dict(headers or {})
        if token is not None:
            extra["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        response = self.client.generic(
            method,
            "/api/v1/" + path.lstrip("/"),
            data=data,
            content_type="application/json",
            headers=extra,
        )
        content = response.content
        parsed = json.loads(content) if content else None
        return Answer(response.status_code, parsed, response.headers)

    def post(self, path: str, body: Any = None, **kw: Any) -> Answer:
        return self.call("POST", path, body, **kw)

    def get(self, path: str, **kw: Any) -> Answer:
        return self.call("GET", path, **kw)

    def intent(
        self, key: str = "invoice:acme:1:send", *, token: Any = ..., **overrides: Any
    ) -> Answer:
        return self.post("attempts", intent_body(key, **overrides), token=token)


def intent_body(key: str = "invoice:acme:1:send", **overrides: Any) -> dict[str, Any]:
    body = {
        "tenant": "acme",
        "task_id": "task-1",
        "tool_name": "open_ticket",
        "idempotency_key": key,
        "args": {"title": "Printer on fire", "priority": 2},
    }
    body.update(overrides)
    return body


@dataclass
class Tokens:
    acme: str
    globex: str
    both: str
    acme_token: AgentToken


@pytest.fixture
def tokens(world: World) -> Tokens:
    acme_token, acme = AgentToken.issue("agent-acme", ["acme"])
    _, globex = AgentToken.issue("agent-globex", ["globex"])
    _, both = AgentToken.issue("agent-both", ["acme", "globex"])
    return Tokens(acme=acme, globex=globex, both=both, acme_token=acme_token)


@pytest.fixture
def api(client: Client, tokens: Tokens) -> Api:
    return Api(client, tokens.acme)


def ledger_snapshot() -> tuple[int, int, list[tuple[str, int]]]:
    """What a refused request must leave unchanged: attempts, events, every attempt's version."""
    return (
        Attempt.objects.count(),
        AttemptEvent.objects.count(),
        list(Attempt.objects.order_by("id").values_list("attempt_id", "version")),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def gunicorn(tokens: Tokens, tmp_path: Path):
    """gunicorn serving the test database on 127.0.0.1 (for tests that commit: transaction=True);
    yields its base URL."""
    port = free_port()
    env = child_env(
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_WORKERS="2",
        LEDGERWEB_THREADS="2",
        LEDGERWEB_ACCESS_LOG=str(tmp_path / "access.log"),
        LEDGERWEB_DATA_DIR=str(tmp_path),
        LEDGERWEB_LOG_LEVEL="WARNING",
    )
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                Path(sys.executable).parent / "gunicorn",
                "-c",
                "ledgerweb/gunicorn.conf.py",
                "ledgerweb.wsgi",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/v1/openapi.json", timeout=2).read()  # noqa: S310
            break
        except OSError:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    yield base
    os.killpg(process.pid, 15)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
