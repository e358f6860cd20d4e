"""The Stripe adapter end to end: real agent processes killed at crash points A-C, the real
``manage.py reconcile`` worker, and localstripe (a stateful fake Stripe from PyPI) as a real
separate process on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe

from attempts import ledger
from attempts.models import Attempt, EffectClass, Grant, State, Tool
from reconciliation.demo_provider import wait_for_port_file
from reconciliation.providers.base import Call, LookupStatus, SendStatus
from reconciliation.providers.registry import adapter_for
from reconciliation.providers.stripe import StripePaymentIntentAdapter
from tests.conftest import PYTHON, REPO, agent_intent, child_env, manage
from tests.reconciliation.conftest import make_due

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY = "sk_test_ledgerweb"
TOOL = "stripe_charge"
START_TIMEOUT = 20.0


class LocalStripe:
    """A running localstripe process (tests/reconciliation/localstripe_server.py)."""

    def __init__(self, workdir: Path) -> None:
        port_file = workdir / "localstripe.port"
        self.log = workdir / "localstripe.log"
        command = [PYTHON, "-m", "tests.reconciliation.localstripe_server"]
        command += ["--port-file", str(port_file), "--store", str(workdir / "localstripe.pickle")]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=out)
        port = wait_for_port_file(port_file, self.process, seconds=START_TIMEOUT, poll=0.05)
        if port is None:
            raise RuntimeError(f"localstripe did not start: {self.log.read_text()}")
        self.base = f"http://127.0.0.1:{port}"
        self.client = stripe.StripeClient(
            API_KEY, base_addresses={"api": self.base}, max_network_retries=0
        )

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)

    def payments(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every payment intent localstripe holds (under one ledger key, if given)."""
        found = [p.to_dict() for p in self.client.v1.payment_intents.list().auto_paging_iter()]
        if key is None:
            return found
        return [p for p in found if p["metadata"].get("ledger_idempotency_key") == key]


@pytest.fixture
def localstripe(tmp_path: Path) -> Iterator[LocalStripe]:
    server = LocalStripe(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def charge_tool(world, localstripe: LocalStripe, settings) -> Tool:
    """A critical, reconcilable payment tool at localstripe, granted to acme."""
    settings.LEDGER = {**settings.LEDGER, "STRIPE_API_KEY": API_KEY}
    tool = Tool.objects.create(
        name=TOOL,
        effect_class=EffectClass.RECONCILABLE,
        critical=True,
        adapter="stripe",
        dispatch_url=localstripe.base,
        timeout_seconds=5,
    )
    Grant.objects.create(tenant=world.acme, tool=tool, policy_version="v1", allowed_scopes=[])
    return tool


@pytest.fixture
def customer(localstripe: LocalStripe) -> str:
    return localstripe.client.v1.customers.create(params={"email": "billing@acme.test"}).id


def payment(customer: str, amount: int = 1200, **extra: Any) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "EUR",
        "customer": customer,
        "payment_method": "pm_card_visa",
        **extra,
    }


def run_agent(tmp_path: Path, key: str, args: dict[str, Any], crash_at: str | None = None):
    plan = tmp_path / f"plan-{key.replace(':', '-')}.json"
    call = {"tenant": "acme", "task_id": f"task-{key}", "tool_name": TOOL}
    plan.write_text(json.dumps([{**call, "idempotency_key": key, "args": args}]))
    env = {"LEDGERWEB_STRIPE_API_KEY": API_KEY}
    if crash_at:
        env["LEDGERWEB_CRASH_AT"] = crash_at
        env["LEDGERWEB_FAULTS_ALLOWED"] = "1"
    return manage("crashtest_agent", str(plan), env=child_env(**env))


def reconcile() -> dict[str, Any]:
    """One pass of the real worker over everything, made due first."""
    for attempt in Attempt.objects.exclude(state__in=[State.OUTCOME_CONFIRMED, State.FAILED]):
        make_due(attempt)
    done = manage("reconcile", "--once", "--json", env=child_env(LEDGERWEB_STRIPE_API_KEY=API_KEY))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# What each crash point leaves at Stripe, and where recovery settles it.
CRASHES = {
    # A: nothing was sent; recovery sends it under today's authority and confirms by lookup.
    "intent_committed": (0, State.OUTCOME_CONFIRMED),
    # B: claimed, killed before the send: not found, and a payment is never resent blindly.
    "dispatch_claimed": (0, State.MANUAL_REVIEW),
    # B: the request reached Stripe, the answer was never read: found by its metadata.
    "request_sent": (1, State.OUTCOME_CONFIRMED),
    # C: the answer was read, nothing of it committed: found by its metadata.
    "response_received": (1, State.OUTCOME_CONFIRMED),
}


def test_agents_killed_at_crash_points_a_to_c_pay_at_most_once(
    charge_tool, localstripe: LocalStripe, customer: str, tmp_path: Path
) -> None:
    for point in CRASHES:
        done = run_agent(tmp_path, f"pay:{point}", payment(customer), crash_at=point)
        assert done.returncode == -signal.SIGKILL, (point, done.stderr)
        assert f"crash point {point}" in done.stderr
    for point, (paid, _) in CRASHES.items():
        assert len(localstripe.payments(f"pay:{point}")) == paid, point
        attempt = Attempt.objects.get(idempotency_key=f"pay:{point}")
        expected = State.INTENT_RECORDED if point == "intent_committed" else State.DISPATCHED
        assert (attempt.state, attempt.provider_request_id) == (expected, ""), point

    summary = reconcile()
    assert summary["confirmed"] == 3 and summary["manual_review"] == 1, summary
    for point, (_, settled) in CRASHES.items():
        attempt = Attempt.objects.get(idempotency_key=f"pay:{point}")
        [*paid] = localstripe.payments(f"pay:{point}")
        assert attempt.state == settled, (point, attempt.state, attempt.review_reason)
        if settled == State.OUTCOME_CONFIRMED:
            assert len(paid) == 1
            assert attempt.provider_request_id == paid[0]["id"]
            assert attempt.result_ref == f"stripe:{paid[0]['id']}"
            assert paid[0]["metadata"]["ledger_attempt_id"] == attempt.attempt_id
            assert paid[0]["metadata"]["ledger_args_hash"] == attempt.args_hash
        else:
            assert (paid, attempt.review_reason) == ([], "not_found")

    # Recovery run again changes nothing, and sends nothing.
    before = list(Attempt.objects.order_by("id").values_list("state", "version"))
    reconcile()
    assert list(Attempt.objects.order_by("id").values_list("state", "version")) == before
    assert len(localstripe.payments()) == 3


def test_without_a_crash_the_agent_confirms_on_the_looked_up_payment(
    charge_tool, localstripe: LocalStripe, customer: str, tmp_path: Path
) -> None:
    done = run_agent(tmp_path, "pay:clean", payment(customer))
    assert done.returncode == 0, done.stderr
    attempt = Attempt.objects.get(idempotency_key="pay:clean")
    [paid] = localstripe.payments("pay:clean")
    assert (paid["amount"], paid["currency"], paid["customer"]) == (1200, "eur", customer)
    assert paid["metadata"]["ledger_attempt_id"] == attempt.attempt_id
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert (attempt.provider_request_id, attempt.result_ref) == (paid["id"], f"stripe:{paid['id']}")


def test_a_declined_card_fails_for_good_and_is_not_found_later(
    charge_tool, localstripe: LocalStripe, customer: str, tmp_path: Path
) -> None:
    args = payment(customer, payment_method="pm_card_chargeCustomerFail")
    done = run_agent(tmp_path, "pay:declined", args)
    assert done.returncode == 0, done.stderr
    attempt = Attempt.objects.get(idempotency_key="pay:declined")
    assert attempt.state == State.FAILED
    assert "card_declined" in attempt.events.latest("id").reason
    [declined] = localstripe.payments("pay:declined")
    assert declined["status"] == "requires_payment_method"
    answer = adapter_for(charge_tool).lookup(Call.of(attempt))
    assert answer.status == LookupStatus.NOT_FOUND
    assert declined["id"] in answer.detail


def test_an_amount_mismatch_goes_to_manual_review(
    world, charge_tool, localstripe: LocalStripe, customer: str
) -> None:
    """Stripe holds a payment under this attempt's key, for another amount than was recorded."""
    attempt, _ = agent_intent(
        world, "pay:mismatch", tool=TOOL, args=payment(customer), task="task-mismatch"
    )
    attempt, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert claimed
    sent_by_a_buggy_agent = payment(customer, amount=1500)
    localstripe.client.v1.payment_intents.create(
        params={
            **sent_by_a_buggy_agent,
            "currency": "eur",
            "confirm": True,
            "metadata": {
                "ledger_attempt_id": attempt.attempt_id,
                "ledger_args_hash": attempt.args_hash,
                "ledger_idempotency_key": "pay:mismatch",
            },
        }
    )
    summary = reconcile()
    assert summary["manual_review"] == 1, summary
    attempt.refresh_from_db()
    assert (attempt.state, attempt.review_reason) == (State.MANUAL_REVIEW, "payload_mismatch")
    assert attempt.owner is not None
    lookup = attempt.events.latest("id").details["lookup"]
    assert "amount: recorded 1200, Stripe 1500" in lookup["detail"]
    assert lookup["provider_args_hash"] != attempt.args_hash
    assert len(localstripe.payments("pay:mismatch")) == 1


def test_localstripe_ignores_idempotency_keys_and_the_adapter_does_not_rely_on_them(
    world, charge_tool, localstripe: LocalStripe, customer: str
) -> None:
    """Sending twice with one key makes two payments at localstripe (live Stripe would answer
    the second with the first). The adapter counts every payment under the key, so recovery
    hands the duplicate to a person instead of confirming one of them."""
    attempt, _ = agent_intent(
        world, "pay:twice", tool=TOOL, args=payment(customer), task="task-twice"
    )
    attempt, _ = ledger.claim_dispatch(attempt, actor=world.agent)
    adapter = adapter_for(charge_tool)
    first = adapter.send(Call.of(attempt))
    second = adapter.send(Call.of(attempt))
    assert first.status == second.status == SendStatus.ACCEPTED
    assert first.provider_request_id != second.provider_request_id
    assert len(localstripe.payments("pay:twice")) == 2

    answer = adapter.lookup(Call.of(attempt))
    assert (answer.status, answer.count) == (LookupStatus.FOUND, 2)
    ledger.mark_unknown(attempt, reason="agent timed out", actor=world.agent)
    reconcile()
    attempt.refresh_from_db()
    assert (attempt.state, attempt.review_reason) == (State.MANUAL_REVIEW, "duplicate_effects")
    assert attempt.provider_request_id == ""


@pytest.mark.one_database  # no database behaviour under test
def test_an_unreachable_stripe_is_unavailable_and_nothing_is_sent(world, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "STRIPE_API_KEY": API_KEY}
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    tool = Tool(name=TOOL, adapter="stripe", dispatch_url=f"http://127.0.0.1:{port}")
    tool.effect_class, tool.timeout_seconds = EffectClass.RECONCILABLE, 2
    adapter = adapter_for(tool)
    assert isinstance(adapter, StripePaymentIntentAdapter) and adapter.check() == []
    call = Call("att_x", "acme", TOOL, "pay:x", payment("cus_x"), "0" * 64)
    sent = adapter.send(call)
    assert (sent.status, sent.retryable) == (SendStatus.REFUSED, True)
    assert sent.detail.startswith("not sent:")
    assert adapter.lookup(call).status == LookupStatus.UNAVAILABLE
    bad = adapter.send(Call("att_x", "acme", TOOL, "pay:x", {"amount": "12"}, "0" * 64))
    assert (bad.status, bad.retryable) == (SendStatus.REFUSED, False)
    assert "amount must be a positive integer" in bad.detail

    settings.LEDGER = {**settings.LEDGER, "STRIPE_API_KEY": ""}
    assert adapter.check() == ["LEDGERWEB_STRIPE_API_KEY is not set"]


def doc_blocks(language: str) -> list[str]:
    """The fenced ``language`` blocks of docs/integrations-stripe-ts.md's Stripe section (the
    Python one is marked ``runs=stripe-payment``: this test runs it)."""
    text = (REPO / "docs" / "integrations-stripe-ts.md").read_text()
    section = text.split("## Stripe payment intents", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"^```{language}\b[^\n]*\n(.*?)^```$", section, flags=re.M | re.S)


def test_the_documented_stripe_example_runs(
    world, localstripe: LocalStripe, customer: str, settings, tmp_path: Path, capsys
) -> None:
    from django.core.management import call_command

    settings.LEDGER = {**settings.LEDGER, "STRIPE_API_KEY": API_KEY}
    [tools] = doc_blocks("json")
    (tmp_path / "tools.json").write_text(tools)
    call_command("load_tools", str(tmp_path / "tools.json"), stdout=open(os.devnull, "w"))
    tool = Tool.objects.get(name=TOOL)
    Tool.objects.filter(pk=tool.pk).update(dispatch_url=localstripe.base)  # not api.stripe.com
    Grant.objects.create(tenant=world.acme, tool=tool, policy_version="v1", allowed_scopes=[])

    [example] = doc_blocks("python")
    exec(compile(example, "integrations-stripe-ts.md", "exec"), {"customer": customer})  # noqa: S102
    [paid] = localstripe.payments("order:1001:charge")
    assert capsys.readouterr().out.strip() == f"OUTCOME_CONFIRMED stripe:{paid['id']}"


@pytest.mark.one_database  # no database behaviour under test
@pytest.mark.parametrize(
    ("error", "status", "retryable"),
    [
        (stripe.CardError("declined", None, "card_declined", http_status=402), "refused", False),
        (
            stripe.CardError(
                "declined",
                None,
                "card_declined",
                http_status=402,
                json_body={"error": {"decline_code": "insufficient_funds"}},
            ),
            "refused",
            True,
        ),
        (stripe.RateLimitError("slow down", http_status=429), "refused", True),
        (
            stripe.InvalidRequestError("no such customer", "customer", http_status=400),
            "refused",
            False,
        ),
        (stripe.IdempotencyError("key in use", http_status=409), "uncertain", False),
        (stripe.APIError("internal", http_status=500), "uncertain", False),
        (stripe.APIConnectionError("reset after the request left"), "uncertain", False),
    ],
)
def test_stripe_errors_map_onto_send_answers(error, status: str, retryable: bool) -> None:
    """Stripe's documented errors, as the library raises them (no server can be made to answer
    every one of them: localstripe has no decline codes, no 409, no 5xx)."""
    from reconciliation.providers.stripe import _send_error

    answer = _send_error(error, 5)
    assert (str(answer.status), answer.retryable) == (status, retryable)
