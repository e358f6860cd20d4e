"""Demo agents: realistic agent tasks run through the ledger's HTTP API against the demo provider,
with real crashes and timeouts, so the dashboard's queues fill with genuine work.

Standard library and ``ledgerweb_client`` only (no Django): this is agent code, and it talks to
the ledger exactly as a customer's agent would. ``manage.py demo_agents`` wraps it (and can issue
a short-lived token); ``python -m reconciliation.demo_agents --help`` runs it directly.

What happens to a task:

* Most run the safe order through ``LedgerClient.call``: record, claim, send to the provider with
  the idempotency key, attach the provider's id, confirm by looking the effect up (a durable
  answer, not a bare 200).
* ``--timeout-rate``: the provider is told to misbehave on that share of sends, per tool, the way
  such providers do: the mailer answers late after sending (``hang_after_effect``), the ticket
  system drops the connection after creating the ticket (``drop_after_effect``), the payment
  gateway hangs before charging (``hang_before_effect``), the deploy system answers late after
  deploying. The agent's read times out and the attempt is marked UNKNOWN.
* ``--crash-rate``: the task runs in a child process that is SIGKILLed at a real point: after the
  intent commit (A), after the dispatch claim before sending (B), or after the provider answered
  before anything was recorded (C). The ledger keeps an INTENT_RECORDED or DISPATCHED attempt that
  recovery later finds stale.
* ``--mismatch-rate``: a buggy agent mutates the payment payload after recording it; the provider
  performs a different payload, which reconciliation reports as a payload mismatch. The agent's
  own lookup sees the difference and marks the attempt UNKNOWN rather than confirming it.
* One CRM update per run (a non-critical tool) is made by the same buggy agent, so the review
  queue always shows an item one reviewer can settle alone, by approving a linked retry; the
  critical tools' items need two reviewers.
* ``--lookup-fault-rate``: the mailer's lookup API answers 503 that often, so some UNKNOWN work
  stays UNKNOWN for a while (with backoff) instead of settling at once.
* ``--lookup-outage``: the ticket system has an incident for the whole demo: its lookup API is
  down (always 503) and at least half of its sends lose their answer, so its UNKNOWN work stays
  in the UNKNOWN queue, backing off, until a person decides.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from ledgerweb_client import (
    LedgerClient,
    LedgerError,
    ProviderLostResponse,
    ProviderRefused,
    ProviderTimeout,
    SendResult,
)

TENANTS = ("acme", "globex")
CRASH_POINTS = ("A_after_intent", "B_after_claim", "C_after_send")
# How each tool's provider misbehaves when a timeout is injected.
TIMEOUT_MODES = {
    "send_invoice_email": "hang_after_effect",
    "open_ticket": "drop_after_effect",
    "charge_card": "hang_before_effect",
    "deploy_service": "hang_after_effect",
    "update_crm": "drop_after_effect",
}
# Providers of idempotent tools honour the key; the others perform every send they receive.
HONOUR_KEYS = {
    "send_invoice_email": True,
    "open_ticket": False,
    "charge_card": False,
    "deploy_service": False,
    "update_crm": True,
}
LOOKUP_FLAKY = ("send_invoice_email",)
# The ticket system's lookup API is down for the whole demo (always 503): its UNKNOWN work stays
# UNKNOWN, backing off, until a person decides or the maximum age hands it to review.
LOOKUP_OUTAGE_DEFAULT = ("open_ticket",)
OUTAGE_LABELS = {"open_ticket": "ticket", "send_invoice_email": "mailer"}
CUSTOMERS = [
    ("Northwind Traders", "ap@northwind.example"),
    ("Initech", "billing@initech.example"),
    ("Umbrella Health", "finance@umbrella.example"),
    ("Stark Logistics", "accounts@stark.example"),
    ("Wayne Foods", "invoices@waynefoods.example"),
    ("Hooli Cloud", "pay@hooli.example"),
]
CRM_FIELDS = [("lifecycle_stage", "customer"), ("account_owner", "j.doe"), ("tier", "gold")]
SERVICES = ["checkout-api", "search", "billing-worker", "web-frontend", "notifications"]
TICKET_TOPICS = [
    ("Refund not received", 2),
    ("Cannot log in after password reset", 1),
    ("Invoice shows the wrong VAT rate", 2),
    ("Export to CSV times out", 3),
    ("Card declined but money reserved", 1),
]


@dataclass(frozen=True)
class Task:
    """One agent task wanting one side effect."""

    task_id: str
    tenant: str
    tool_name: str
    idempotency_key: str
    args: dict[str, Any]
    crash_point: str | None = None
    mismatch: bool = False


def make_tasks(
    count: int, *, seed: int, run_id: str, crash_rate: float, mismatch_rate: float, tenants=TENANTS
) -> list[Task]:
    """``count`` realistic tasks across the five demo tools, reproducible from ``seed``. The
    first CRM update is always a buggy one (see the module docstring)."""
    rng = random.Random(seed)
    tasks = []
    buggy_crm_update = True
    for n in range(count):
        tenant = rng.choice(tenants)
        kind = rng.choices(["invoice", "ticket", "charge", "deploy", "crm"], [35, 25, 20, 10, 10])[
            0
        ]
        if n == count - 1 and buggy_crm_update:
            kind = "crm"  # every run shows one
        customer, email = rng.choice(CUSTOMERS)
        task_id = f"{kind}-{run_id}-{n:04d}"
        if kind == "invoice":
            number = f"INV-{run_id.upper()}-{n:04d}"
            tool = "send_invoice_email"
            key = f"invoice:{tenant}:{number}:send"
            args = {
                "to": email,
                "customer": customer,
                "invoice_number": number,
                "amount_cents": rng.randrange(1_000, 500_000),
                "currency": rng.choice(["EUR", "USD", "GBP"]),
                "template": "invoice-v3",
            }
        elif kind == "ticket":
            title, priority = rng.choice(TICKET_TOPICS)
            conversation = f"conv-{run_id}-{n:04d}"
            tool = "open_ticket"
            key = f"ticket:{tenant}:{conversation}:open"
            args = {
                "title": title,
                "priority": priority,
                "customer": customer,
                "conversation_id": conversation,
                "body": f"{customer} wrote in about: {title.lower()}.",
            }
        elif kind == "charge":
            order = f"ord-{run_id}-{n:04d}"
            tool = "charge_card"
            key = f"charge:{tenant}:{order}:capture"
            args = {
                "customer": customer,
                "order_id": order,
                "amount_cents": rng.randrange(500, 250_000),
                "currency": "EUR",
                "payment_method": f"pm_{rng.randrange(16**8):08x}",
            }
        elif kind == "crm":
            field, value = rng.choice(CRM_FIELDS)
            contact = f"contact-{run_id}-{n:04d}"
            tool = "update_crm"
            key = f"crm:{tenant}:{contact}:{field}"
            args = {"contact_id": contact, "customer": customer, "field": field, "value": value}
        else:
            service = rng.choice(SERVICES)
            version = f"2026.{rng.randrange(1, 12)}.{n}"
            tool = "deploy_service"
            key = f"deploy:{tenant}:{service}:{version}:production"
            args = {"service": service, "version": version, "environment": "production"}
        crash = rng.choice(CRASH_POINTS) if rng.random() < crash_rate else None
        mismatch = tool == "charge_card" and rng.random() < mismatch_rate
        if tool == "update_crm" and buggy_crm_update:
            crash, mismatch, buggy_crm_update = None, True, False
        tasks.append(Task(task_id, tenant, tool, key, args, crash, mismatch))
    return tasks


# --------------------------------------------------------------------------------------------
# Talking to the provider (the generic HTTP provider protocol, section 10)


class Provider:
    """A tiny client for the demo provider: send, look up, and its fault controls."""

    def __init__(self, base_url: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"provider URL must be http://host:port, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.timeout = timeout

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            connection.request(
                method,
                path,
                body=data,
                headers={"Content-Type": "application/json", **(headers or {})},
            )
            answer = connection.getresponse()
            raw = answer.read()
            return answer.status, (json.loads(raw) if raw else None)
        finally:
            connection.close()

    def control(self, patch: dict[str, Any]) -> dict[str, Any]:
        status, body = self.request("POST", "/_control", patch)
        if status != 200:
            raise RuntimeError(f"the demo provider refused the fault settings: {body}")
        return body

    def send(self, attempt: Any, args: dict[str, Any]) -> SendResult:
        """Send one effect; translate what happened into the client's provider reports."""
        headers = {
            "Idempotency-Key": attempt.idempotency_key,
            "X-Ledger-Attempt-Id": attempt.attempt_id,
            "X-Ledger-Args-Hash": attempt.args_hash,
        }
        try:
            status, body = self.request("POST", f"/tools/{attempt.tool_name}/send", args, headers)
        except TimeoutError as exc:
            raise ProviderTimeout(f"no answer from the provider within {self.timeout}s") from exc
        except (http.client.RemoteDisconnected, ConnectionError) as exc:
            raise ProviderLostResponse(f"connection closed before the answer: {exc}") from exc
        if status in (200, 201):
            if attempt.tool_name == "deploy_service":
                # The deploy system has no lookup; its answer is a durable deployment receipt.
                return SendResult(provider_request_id=body["id"], result_ref=f"deploy:{body['id']}")
            return SendResult(provider_request_id=body["id"])
        error = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        code = error.get("code", str(status)) if isinstance(error, dict) else str(status)
        retryable = bool(error.get("retryable")) if isinstance(error, dict) else status >= 500
        raise ProviderRefused(f"provider answered {status} {code}", retryable=retryable)

    def lookup(self, tool: str, key: str) -> dict[str, Any] | None:
        """The provider's durable record of the effect, or None (not found or unavailable)."""
        try:
            status, body = self.request(
                "GET", f"/tools/{tool}/lookup?{urlencode({'idempotency_key': key})}"
            )
        except (OSError, http.client.HTTPException):
            return None
        return body if status == 200 else None


def configure_provider(
    provider: Provider,
    *,
    timeout_rate: float,
    lookup_fault_rate: float,
    hang_seconds: float,
    lookup_outage: tuple[str, ...] = LOOKUP_OUTAGE_DEFAULT,
) -> None:
    tools: dict[str, Any] = {}
    for tool, mode in TIMEOUT_MODES.items():
        tools[tool] = {
            "honour_keys": HONOUR_KEYS[tool],
            "send_mode": mode,
            "send_fault_rate": timeout_rate,
        }
        if tool in lookup_outage:
            # An incident: lookups are down and at least half of the sends lose their answer.
            tools[tool].update(
                {
                    "lookup_mode": "error_5xx",
                    "lookup_fault_rate": 1.0,
                    # Shown wherever the ledger shows the provider's error (the overview's
                    # health band, the attempt page): the outage is the demo's, on purpose.
                    "outage_message": outage_message(tool),
                    "send_fault_rate": max(timeout_rate, 0.5) if timeout_rate else 0,
                }
            )
        elif tool in LOOKUP_FLAKY:
            tools[tool].update({"lookup_mode": "error_5xx", "lookup_fault_rate": lookup_fault_rate})
    provider.control({"hang_seconds": hang_seconds, "tools": tools})


def outage_message(tool: str) -> str:
    """What the demo's outage of ``tool`` says, so nobody takes it for a real one."""
    label = OUTAGE_LABELS.get(tool, tool)
    return f"demo: the {label} provider is down on purpose"


def calm_sends(provider: Provider) -> None:
    """After the run: sends behave again (the reconciler's resends are not sabotaged); the
    lookup flakiness stays, so some UNKNOWN work keeps waiting with backoff."""
    provider.control(
        {"tools": {tool: {"send_mode": None, "send_fault_rate": None} for tool in TIMEOUT_MODES}}
    )


# --------------------------------------------------------------------------------------------
# Running tasks


def _payload(task: Task) -> dict[str, Any]:
    if task.mismatch and task.tool_name == "update_crm":
        # The bug: the value is "normalised" after the intent was recorded.
        return {**task.args, "value": str(task.args["value"]).upper()}
    if task.mismatch:
        # The bug: the amount is "corrected" after the intent was recorded.
        return {**task.args, "amount_cents": task.args["amount_cents"] + 1}
    return task.args


def _intent(task: Task) -> dict[str, Any]:
    return {
        "tenant": task.tenant,
        "task_id": task.task_id,
        "tool_name": task.tool_name,
        "idempotency_key": task.idempotency_key,
        "args": task.args,
    }


def _confirm_by_lookup(provider: Provider, attempt: Any) -> str | None:
    """A durable result reference: the provider's lookup, with a matching payload hash."""
    for pause in (0.0, 0.2, 0.5):
        time.sleep(pause)
        found = provider.lookup(attempt.tool_name, attempt.idempotency_key)
        if found is not None:
            # A different payload hash is not a confirmation: leave it to reconciliation.
            return f"lookup:{found['id']}" if found.get("args_hash") == attempt.args_hash else None
    return None


def _performed_differently(provider: Provider, attempt: Any) -> bool:
    found = provider.lookup(attempt.tool_name, attempt.idempotency_key)
    return found is not None and found.get("args_hash") != attempt.args_hash


def run_task(client: LedgerClient, provider: Provider, task: Task) -> str:
    """Run one task in the safe order; returns what happened, in a word."""

    def send(attempt: Any) -> SendResult:
        return provider.send(attempt, _payload(task))

    for _try in range(3):
        result = client.call(**_intent(task), send=send)
        if not result.sent:
            return f"not_sent:{result.state}"
        if result.state == "FAILED_RETRYABLE":
            continue  # the provider said "later, nothing happened": try again, same key
        if result.state == "DISPATCHED":
            ref = _confirm_by_lookup(provider, result.attempt)
            if ref is None and _performed_differently(provider, result.attempt):
                # Sent, but what the provider did is not what was recorded: not a confirmation.
                client.mark_unknown(
                    result.attempt.attempt_id, "the provider's record has another payload hash"
                )
                return "unknown_mismatch"
            if ref is None:
                return "dispatched_unverified"
            client.confirm(result.attempt.attempt_id, ref)
            return "confirmed"
        return result.state.lower()
    return "failed_retryable"


def crashing_task(
    api: str, token: str, provider_url: str, send_timeout: float, task: dict[str, Any]
) -> None:
    """Child process body: run the task and SIGKILL ourselves at the task's crash point."""
    task_obj = Task(**task)
    provider = Provider(provider_url, send_timeout)
    with LedgerClient(api, token, timeout=30) as client:
        attempt = client.record_intent(**_intent(task_obj))
        if task_obj.crash_point == "A_after_intent":
            os.kill(os.getpid(), signal.SIGKILL)
        if not client.dispatch(attempt.attempt_id):
            os._exit(3)  # nothing to do: already claimed or settled
        if task_obj.crash_point == "B_after_claim":
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            provider.send(attempt, _payload(task_obj))
        except Exception:  # noqa: S110 - the crash follows whatever the provider said
            pass
        os.kill(os.getpid(), signal.SIGKILL)


def run(
    *,
    api: str,
    token: str,
    provider_url: str,
    tasks: int,
    crash_rate: float,
    timeout_rate: float,
    mismatch_rate: float = 0.05,
    lookup_fault_rate: float = 0.5,
    lookup_outage: tuple[str, ...] = LOOKUP_OUTAGE_DEFAULT,
    seed: int = 1,
    agents: int = 4,
    send_timeout: float = 1.0,
    tenants: tuple[str, ...] = TENANTS,
    out=sys.stdout,
) -> Counter:
    """Run ``tasks`` demo tasks with ``agents`` concurrent agents; returns outcome counts."""
    provider = Provider(provider_url, send_timeout)
    configure_provider(
        provider,
        timeout_rate=timeout_rate,
        lookup_fault_rate=lookup_fault_rate,
        lookup_outage=lookup_outage,
        hang_seconds=max(2.0, send_timeout * 3),
    )
    run_id = hashlib.sha256(f"{seed}:{time.time_ns()}".encode()).hexdigest()[:6]
    plan = make_tasks(
        tasks,
        seed=seed,
        run_id=run_id,
        crash_rate=crash_rate,
        mismatch_rate=mismatch_rate,
        tenants=tenants,
    )
    counts: Counter = Counter()
    lock = threading.Lock()
    queue = list(reversed(plan))
    context = multiprocessing.get_context("spawn")

    def agent_loop(number: int) -> None:
        with LedgerClient(api, token, timeout=30) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    task = queue.pop()
                if task.crash_point:
                    child = context.Process(
                        target=crashing_task,
                        args=(api, token, provider_url, send_timeout, asdict(task)),
                        name=f"demo-agent-{number}-crash",
                    )
                    what = _crashed(child, task)
                else:
                    try:
                        what = run_task(client, provider, task)
                    except LedgerError as exc:
                        what = f"ledger_error:{exc.code}"
                with lock:
                    counts[what] += 1

    threads = [
        threading.Thread(target=agent_loop, args=(n,), name=f"demo-agent-{n}")
        for n in range(max(1, agents))
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calm_sends(provider)
    elapsed = time.monotonic() - started
    out.write(f"demo agents: {tasks} tasks in {elapsed:.1f}s with {agents} agents\n")
    for what, n in sorted(counts.items()):
        out.write(f"  {what:32} {n}\n")
    return counts


def _crashed(child: Any, task: Task) -> str:
    """Run a task that crashes in a process of its own; how it ended."""
    child.start()
    child.join(120)
    if child.exitcode == -signal.SIGKILL:
        return f"crashed:{task.crash_point}"
    return f"crash_child_exit:{child.exitcode}"


def _rate(value: str) -> float:
    rate = float(value)
    if not 0 <= rate <= 1:
        raise argparse.ArgumentTypeError("a rate is between 0 and 1")
    return rate


def add_arguments(parser: argparse.ArgumentParser, *, token_required: bool) -> None:
    parser.add_argument(
        "--api", required=True, help="the ledger's base URL (http://127.0.0.1:8000)"
    )
    parser.add_argument(
        "--token", required=token_required, help="an agent token allowed the demo tenants"
    )
    parser.add_argument("--provider", required=True, help="the demo provider's base URL")
    parser.add_argument("--tasks", type=int, default=60, help="how many tasks (default 60)")
    parser.add_argument("--crash-rate", type=_rate, default=0.1, help="share SIGKILLed (0.1)")
    parser.add_argument("--timeout-rate", type=_rate, default=0.1, help="share timing out (0.1)")
    parser.add_argument(
        "--mismatch-rate",
        type=_rate,
        default=0.05,
        help="share of charges with a mutated payload (one CRM update per run always has one)",
    )
    parser.add_argument(
        "--lookup-fault-rate", type=_rate, default=0.5, help="share of flaky provider lookups"
    )
    parser.add_argument(
        "--lookup-outage",
        nargs="*",
        default=list(LOOKUP_OUTAGE_DEFAULT),
        metavar="TOOL",
        help="tools whose provider lookup is down for the demo (default: open_ticket; none: "
        "pass the option without tools)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed for the task plan")
    parser.add_argument("--agents", type=int, default=4, help="concurrent agents (default 4)")
    parser.add_argument(
        "--send-timeout", type=float, default=1.0, help="agent's provider read timeout (s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reconciliation.demo_agents", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser, token_required=True)
    options = parser.parse_args(argv)
    if options.tasks < 0 or options.agents < 1:
        parser.error("--tasks must be >= 0 and --agents >= 1")
    run(
        api=options.api,
        token=options.token,
        provider_url=options.provider,
        tasks=options.tasks,
        crash_rate=options.crash_rate,
        timeout_rate=options.timeout_rate,
        mismatch_rate=options.mismatch_rate,
        lookup_fault_rate=options.lookup_fault_rate,
        lookup_outage=tuple(options.lookup_outage),
        seed=options.seed,
        agents=options.agents,
        send_timeout=options.send_timeout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
