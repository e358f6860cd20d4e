"""The demo provider, exercised as a real separate process over HTTP on 127.0.0.1.

Each test starts ``python -m reconciliation.demo_provider --port 0 --port-file ...`` with its own
SQLite file, reads the bound port from the port file and talks to it with ``http.client``. The
fixture always kills every process it started. No Django is needed.
"""

from __future__ import annotations

import hashlib
import http.client
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import rfc8785

from reconciliation.demo_provider import wait_for_port_file

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULE = "reconciliation.demo_provider"
SCRIPT = REPO_ROOT / "reconciliation" / "demo_provider.py"
START_TIMEOUT = 10.0


def canonical_hash(args: dict[str, Any]) -> str:
    return hashlib.sha256(rfc8785.dumps(args)).hexdigest()


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str]


class Provider:
    """One demo provider process and a tiny HTTP client for it."""

    _counter = itertools.count()

    def __init__(self, db: Path, workdir: Path, extra_args: tuple[str, ...]) -> None:
        number = next(self._counter)
        self.db = db
        self.port_file = workdir / f"provider-{number}.port"
        self.stdout_path = workdir / f"provider-{number}.out"
        self.stderr_path = workdir / f"provider-{number}.err"
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        command = [sys.executable, "-m", MODULE, "--db", str(self.db), "--port", "0"]
        command += ["--port-file", str(self.port_file), "--seed", "1234", *self.extra_args]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=err)
        port = wait_for_port_file(self.port_file, self.process, seconds=START_TIMEOUT)
        if port is None:
            raise RuntimeError(f"provider did not start: {self.stderr_path.read_text()}")
        self.port = port

    def stop(self, sig: int = signal.SIGKILL) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=10)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 5.0,
    ) -> Response:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=data, headers=headers or {})
            answer = connection.getresponse()
            raw = answer.read()
            return Response(answer.status, json.loads(raw) if raw else None, dict(answer.headers))
        finally:
            connection.close()

    def send(
        self, tool: str, key: str | None, args: Any, timeout: float = 5.0, **headers: str
    ) -> Response:
        all_headers = {"Content-Type": "application/json", **headers}
        if key is not None:
            all_headers["Idempotency-Key"] = key
        return self.request("POST", f"/tools/{tool}/send", args, all_headers, timeout)

    def lookup(
        self, tool: str, key: str, timeout: float = 5.0, param: str = "idempotency_key"
    ) -> Response:
        path = f"/tools/{tool}/lookup?{urlencode({param: key})}"
        return self.request("GET", path, None, None, timeout)

    def control(self, **patch: Any) -> Response:
        answer = self.request("POST", "/_control", patch)
        assert answer.status == 200, answer.body
        return answer

    def effects(self, **filters: str) -> list[dict[str, Any]]:
        query = f"?{urlencode(filters)}" if filters else ""
        return self.request("GET", f"/effects{query}").body

    def summary(self) -> dict[str, Any]:
        return self.request("GET", "/effects/summary").body


@pytest.fixture
def start_provider(tmp_path: Path) -> Iterator[Callable[..., Provider]]:
    """Start provider processes (same db by default); every one of them is killed at the end."""
    started: list[Provider] = []

    def start(*extra_args: str, db: Path | None = None) -> Provider:
        provider = Provider(db or tmp_path / "provider.db", tmp_path, extra_args)
        started.append(provider)
        provider.start()
        return provider

    yield start
    for provider in started:
        if provider.process is not None and provider.process.poll() is None:
            provider.process.kill()
            provider.process.wait(timeout=10)


@pytest.fixture
def provider(start_provider: Callable[..., Provider]) -> Provider:
    return start_provider()


# --------------------------------------------------------------------------- process and CLI


def test_prints_listening_line_and_answers_healthz(provider: Provider) -> None:
    line = provider.stdout_path.read_text().strip()
    assert line == f"demo provider listening on http://127.0.0.1:{provider.port}"
    assert provider.request("GET", "/healthz").status == 200


def test_help_works_when_run_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0
    for option in ("--host", "--port", "--db", "--port-file", "--seed", "--no-honour-keys"):
        assert option in done.stdout


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com"])  # noqa: S104
def test_refuses_non_loopback_hosts(tmp_path: Path, host: str) -> None:
    command = [sys.executable, "-m", MODULE, "--db", str(tmp_path / "p.db"), "--host", host]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "loopback" in done.stderr


def test_sigterm_shuts_down_cleanly(provider: Provider) -> None:
    assert provider.stop(signal.SIGTERM) == 0


# --------------------------------------------------------------------------- send and lookup


def test_send_then_lookup_finds_the_effect_with_its_hash(provider: Provider) -> None:
    args = {"amount": 1200, "currency": "EUR", "note": "café"}
    sent = provider.send(
        "charge_card",
        "inv:7:send",
        args,
        **{"X-Ledger-Attempt-Id": "att_1", "X-Ledger-Args-Hash": canonical_hash(args)},
    )
    assert sent.status == 201
    assert sent.body["id"].startswith("prv_")
    assert sent.body["args_hash"] == canonical_hash(args)
    assert sent.body["status"] == "performed"

    found = provider.lookup("charge_card", "inv:7:send")
    assert found.status == 200
    assert found.body["id"] == sent.body["id"]
    assert found.body["args_hash"] == canonical_hash(args)
    assert found.body["count"] == 1
    assert found.body["created_at"]

    [effect] = provider.effects(tool="charge_card")
    assert effect["ledger_attempt_id"] == "att_1"
    assert effect["ledger_args_hash"] == canonical_hash(args)
    assert effect["body"] == rfc8785.dumps(args).decode()


def test_lookup_not_found_and_correlation_alias(provider: Provider) -> None:
    missing = provider.lookup("charge_card", "nobody")
    assert (missing.status, missing.body) == (404, {"error": "not_found"})
    sent = provider.send("charge_card", "k-corr", {"a": 1})
    found = provider.lookup("charge_card", "k-corr", param="correlation")
    assert (found.status, found.body["id"]) == (200, sent.body["id"])
    assert provider.lookup("other_tool", "k-corr").status == 404
    assert provider.request("GET", "/tools/charge_card/lookup").status == 400


def test_honoured_key_replay_performs_nothing_new(provider: Provider) -> None:
    first = provider.send("send_email", "mail:1", {"to": "a@example.com", "n": 1})
    again = provider.send("send_email", "mail:1", {"n": 1, "to": "a@example.com"})
    assert first.status == 201
    assert again.status == 200
    assert again.body["replayed"] is True
    assert (again.body["id"], again.body["args_hash"]) == (
        first.body["id"],
        first.body["args_hash"],
    )
    assert provider.summary() == {"total": 1, "by_key": {"mail:1": 1}, "duplicates": {}}


def test_unhonoured_keys_duplicate_effects_and_are_counted(
    start_provider: Callable[..., Provider],
) -> None:
    provider = start_provider("--no-honour-keys")
    ids = {provider.send("deploy", "deploy:42", {"rev": "abc"}).body["id"] for _ in range(3)}
    provider.send("deploy", "deploy:43", {"rev": "def"})
    assert len(ids) == 3
    summary = provider.summary()
    assert summary["total"] == 4
    assert summary["duplicates"] == {"deploy:42": 3}
    found = provider.lookup("deploy", "deploy:42")
    assert found.body["count"] == 3
    assert found.body["id"] == provider.effects(idempotency_key="deploy:42")[0]["id"]


def test_per_tool_honour_override(provider: Provider) -> None:
    provider.control(tools={"open_ticket": {"honour_keys": False}})
    for _ in range(2):
        provider.send("open_ticket", "t:1", {"title": "x"})
        provider.send("send_email", "m:1", {"to": "x"})
    assert provider.summary()["duplicates"] == {"t:1": 2}
    config = provider.control(tools={"open_ticket": None}).body
    assert config["tools"] == {}


def test_same_key_different_payload_on_honoured_tool_is_422(provider: Provider) -> None:
    original = provider.send("charge_card", "pay:1", {"amount": 100})
    conflict = provider.send("charge_card", "pay:1", {"amount": 999})
    assert conflict.status == 422
    assert "error" in conflict.body
    [effect] = provider.effects()
    assert effect["id"] == original.body["id"]
    assert effect["args"] == {"amount": 100}


@pytest.mark.parametrize(
    ("key", "body", "code"),
    [
        (None, {"a": 1}, "missing_idempotency_key"),
        ("k", b"{not json", "malformed_json"),
        ("k", b"[1, 2]", "not_an_object"),
        ("k", b'{"a": 1, "a": 2}', "malformed_json"),
        ("k", b'{"a": NaN}', "malformed_json"),
    ],
)
def test_bad_sends_are_400_and_record_nothing(
    provider: Provider, key: str | None, body: Any, code: str
) -> None:
    answer = provider.send("charge_card", key, body)
    assert answer.status == 400
    assert answer.body["error"]["code"] == code
    assert provider.summary()["total"] == 0


def test_concurrent_sends_with_one_key_record_one_effect(provider: Provider) -> None:
    answers: list[Response] = []

    def send() -> None:
        answers.append(provider.send("charge_card", "race:1", {"amount": 5}))

    threads = [threading.Thread(target=send) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answer.status for answer in answers) == [200] * 11 + [201]
    assert len({answer.body["id"] for answer in answers}) == 1
    assert provider.summary()["total"] == 1


def test_injected_effect_is_found_and_blocks_other_payloads(provider: Provider) -> None:
    injected = provider.request(
        "POST",
        "/_control/effects",
        {"tool": "charge_card", "idempotency_key": "pay:9", "args": {"amount": 1}},
    )
    assert injected.status == 201
    found = provider.lookup("charge_card", "pay:9")
    assert found.body["args_hash"] == canonical_hash({"amount": 1})
    assert found.body["args_hash"] != canonical_hash({"amount": 2})
    assert provider.send("charge_card", "pay:9", {"amount": 2}).status == 422
    assert provider.summary()["total"] == 1


# --------------------------------------------------------------------------- send faults


@pytest.mark.parametrize(
    ("patch", "status", "code", "retryable"),
    [
        ({"send_mode": "error_5xx"}, 503, "unavailable", True),
        ({"send_mode": "refuse"}, 400, "refused", False),
        ({"send_mode": "refuse_retryable"}, 429, "retry_later", True),
        ({"send_mode": "refuse_retryable", "retryable_status": 409}, 409, "retry_later", True),
    ],
)
def test_send_faults_without_effect(
    provider: Provider, patch: dict[str, Any], status: int, code: str, retryable: bool
) -> None:
    provider.control(**patch)
    answer = provider.send("charge_card", "f:1", {"a": 1})
    assert answer.status == status
    assert answer.body["error"]["code"] == code
    assert answer.body["error"]["retryable"] is retryable
    assert provider.summary()["total"] == 0


def test_hang_before_effect_times_out_then_closes_without_effect(provider: Provider) -> None:
    provider.control(send_mode="hang_before_effect", hang_seconds=1)
    with pytest.raises(TimeoutError):
        provider.send("charge_card", "h:1", {"a": 1}, timeout=0.5)
    with pytest.raises(http.client.RemoteDisconnected):
        provider.send("charge_card", "h:2", {"a": 1}, timeout=3)
    assert provider.summary()["total"] == 0


def test_hang_after_effect_times_out_but_the_effect_happened(provider: Provider) -> None:
    provider.control(send_mode="hang_after_effect", hang_seconds=1)
    with pytest.raises(TimeoutError):
        provider.send("charge_card", "h:1", {"a": 1}, timeout=0.5)
    found = provider.lookup("charge_card", "h:1")
    assert (found.status, found.body["args_hash"]) == (200, canonical_hash({"a": 1}))


def test_drop_after_effect_gives_no_response_but_records_the_effect(provider: Provider) -> None:
    provider.control(send_mode="drop_after_effect")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        provider.send("charge_card", "d:1", {"a": 1})
    assert provider.lookup("charge_card", "d:1").status == 200


def test_a_hanging_request_does_not_block_others(provider: Provider) -> None:
    provider.control(tools={"slow": {"send_mode": "hang_before_effect", "hang_seconds": 2}})
    outcome: list[BaseException | Response] = []

    def hang() -> None:
        try:
            outcome.append(provider.send("slow", "s:1", {}, timeout=3))
        except (OSError, http.client.HTTPException) as exc:
            outcome.append(exc)

    hanging = threading.Thread(target=hang)
    hanging.start()
    time.sleep(0.1)
    assert provider.send("fast", "f:1", {}).status == 201
    assert provider.request("GET", "/healthz").status == 200
    assert hanging.is_alive()  # answered while the slow request was still hanging
    hanging.join()
    assert isinstance(outcome[0], http.client.RemoteDisconnected)


def test_latency_settings(provider: Provider) -> None:
    provider.control(latency_ms=600, tools={"quick": {"lookup_latency_ms": 0}})
    started = time.monotonic()
    provider.send("quick", "l:1", {})
    assert time.monotonic() - started >= 0.6
    started = time.monotonic()
    assert provider.lookup("quick", "l:1").status == 200
    assert time.monotonic() - started < 0.5


# --------------------------------------------------------------------------- lookup faults


@pytest.mark.parametrize(("mode", "status"), [("error_5xx", 503), ("not_found", 404)])
def test_lookup_faults(provider: Provider, mode: str, status: int) -> None:
    provider.send("charge_card", "lk:1", {"a": 1})
    provider.control(lookup_mode=mode)
    assert provider.lookup("charge_card", "lk:1").status == status
    provider.control(lookup_mode="ok")
    assert provider.lookup("charge_card", "lk:1").status == 200


def test_a_rate_limited_lookup_answers_429_with_retry_after(provider: Provider) -> None:
    provider.send("charge_card", "lk:1", {"a": 1})
    provider.control(lookup_mode="rate_limited", retry_after_seconds=3)
    answer = provider.lookup("charge_card", "lk:1")
    assert answer.status == 429 and answer.headers["Retry-After"] == "3"
    provider.control(lookup_mode="ok")
    assert provider.lookup("charge_card", "lk:1").status == 200


def test_stats_count_the_calls_being_answered_at_once(provider: Provider) -> None:
    provider.send("charge_card", "st:1", {"a": 1})
    provider.control(lookup_latency_ms=300)
    assert provider.request("POST", "/_stats").status == 200  # a new peak from here
    threads = [
        threading.Thread(target=provider.lookup, args=("charge_card", "st:1")) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = provider.request("GET", "/_stats").body
    assert stats == {"in_flight": 0, "peak_in_flight": 3}


def test_lookup_hang_times_out_then_answers_503(provider: Provider) -> None:
    provider.send("charge_card", "lk:1", {"a": 1})
    provider.control(lookup_mode="hang", hang_seconds=1)
    with pytest.raises(TimeoutError):
        provider.lookup("charge_card", "lk:1", timeout=0.5)
    assert provider.lookup("charge_card", "lk:1", timeout=3).status == 503


# --------------------------------------------------------------------------- fault control


def test_remaining_faults_then_back_to_ok(provider: Provider) -> None:
    provider.control(send_mode="error_5xx", remaining_faults=2)
    statuses = [provider.send("charge_card", "r:1", {"a": 1}).status for _ in range(4)]
    assert statuses == [503, 503, 201, 200]
    assert provider.request("GET", "/_control").body["remaining_faults"] == 0
    assert provider.summary()["total"] == 1


def test_fault_rate_is_applied_and_reproducible_with_the_seed(provider: Provider) -> None:
    def pattern() -> list[int]:
        provider.control(honour_keys=False, send_mode="error_5xx", send_fault_rate=0.5)
        return [provider.send("flaky", "x", {}).status for _ in range(30)]

    first = pattern()
    assert 0 < first.count(503) < 30
    assert set(first) == {201, 503}
    provider.request("POST", "/_control/reset")
    assert pattern() == first
    provider.control(send_fault_rate=0)
    assert provider.send("flaky", "x", {}).status == 201


def test_per_tool_fault_override(provider: Provider) -> None:
    provider.control(tools={"charge_card": {"send_mode": "error_5xx"}})
    assert provider.send("charge_card", "p:1", {}).status == 503
    assert provider.send("send_email", "p:1", {}).status == 201


def test_control_rejects_bad_patches_and_reset_restores_defaults(provider: Provider) -> None:
    for patch in (
        {"bogus": 1},
        {"send_mode": "explode"},
        {"send_fault_rate": 2},
        {"tools": {"x": {"remaining_faults": -1}}},
    ):
        answer = provider.request("POST", "/_control", patch)
        assert answer.status == 400, patch
    assert provider.request("GET", "/_control").body["send_mode"] == "ok"
    provider.control(send_mode="refuse", tools={"x": {"lookup_mode": "hang"}})
    reset = provider.request("POST", "/_control/reset").body
    assert (reset["send_mode"], reset["tools"]) == ("ok", {})


# --------------------------------------------------------------------------- durability


def test_sigkill_after_drop_after_effect_keeps_the_effect(
    start_provider: Callable[..., Provider],
) -> None:
    first = start_provider()
    first.control(send_mode="drop_after_effect")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        first.send("charge_card", "crash:1", {"amount": 7})
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = start_provider()
    found = second.lookup("charge_card", "crash:1")
    assert found.status == 200
    assert found.body["args_hash"] == canonical_hash({"amount": 7})
    assert second.request("GET", "/_control").body["send_mode"] == "ok"
    replay = second.send("charge_card", "crash:1", {"amount": 7})
    assert (replay.status, replay.body["id"]) == (200, found.body["id"])


def test_sigkill_while_hanging_after_effect_keeps_the_effect(
    start_provider: Callable[..., Provider],
) -> None:
    first = start_provider()
    first.control(send_mode="hang_after_effect", hang_seconds=30)
    with pytest.raises(TimeoutError):
        first.send("charge_card", "crash:2", {"amount": 8}, timeout=0.5)
    first.stop(signal.SIGKILL)
    second = start_provider()
    assert second.lookup("charge_card", "crash:2").status == 200
    assert second.summary()["total"] == 1
