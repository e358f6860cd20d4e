"""Tools configured without code (load_tools, admin), adapters from the registry, and the system
checks that report what recovery could not work with."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from attempts.models import EffectClass, OwnershipRule, Tool
from reconciliation.providers.base import (
    Adapter,
    Call,
    LookupAnswer,
    LookupStatus,
    ProviderError,
    SendAnswer,
    SendStatus,
)
from reconciliation.providers.http import GenericHttpAdapter
from reconciliation.providers.registry import Registry, adapter_class, adapter_for
from reconciliation.reconciler import Reconciler
from tests.conftest import PYTHON, REPO
from tests.reconciliation.conftest import make_due, unknown

TOOLS = {
    "tools": [
        {
            "name": "send_sms",
            "effect_class": "idempotent",
            "critical": True,
            "dispatch_url": "https://sms.example.test/send",
            "lookup_url": "https://sms.example.test/lookup",
            "timeout_seconds": 5,
            "max_sends": 2,
        },
        {
            "name": "open_ticket",
            "effect_class": "reconcilable",
            "dispatch_url": "https://tickets.example.test/t",
            "lookup_url": "https://tickets.example.test/t?ref={attempt_id}",
        },
    ]
}


def load(tmp_path: Path, data, *args: str) -> str:
    path = tmp_path / "tools.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    out = io.StringIO()
    call_command("load_tools", str(path), *args, stdout=out)
    return out.getvalue()


# ------------------------------------------------------------------------------ load_tools


def test_load_tools_creates_and_updates_tools(world, tmp_path) -> None:
    out = load(tmp_path, TOOLS)
    assert "created send_sms (idempotent, critical, adapter http)" in out
    assert "updated open_ticket" in out
    sms = Tool.objects.get(name="send_sms")
    assert (sms.effect_class, sms.critical, sms.max_sends, sms.timeout_seconds) == (
        EffectClass.IDEMPOTENT,
        True,
        2,
        5,
    )
    assert Tool.objects.get(name="open_ticket").lookup_url.endswith("ref={attempt_id}")
    assert Tool.objects.filter(name="charge_card").exists()  # not in the file: left alone


def test_load_tools_warns_about_tools_recovery_cannot_use_yet(world, tmp_path) -> None:
    entry = {"name": "x", "effect_class": "idempotent", "dispatch_url": "https://p.test/s"}
    out = load(tmp_path, [entry])
    assert "warning: lookup_url is empty: recovery cannot look this tool up" in out
    assert Tool.objects.filter(name="x").exists()


def test_load_tools_dry_run_changes_nothing(world, tmp_path) -> None:
    out = load(tmp_path, TOOLS, "--dry-run")
    assert "would load 2 tool(s)" in out
    assert not Tool.objects.filter(name="send_sms").exists()


def test_dump_round_trips(world, tmp_path) -> None:
    load(tmp_path, TOOLS)
    out = io.StringIO()
    call_command("load_tools", "--dump", stdout=out)
    dumped = json.loads(out.getvalue())
    assert {t["name"] for t in dumped["tools"]} >= {"send_sms", "open_ticket", "charge_card"}
    Tool.objects.filter(name="send_sms").update(max_sends=9)
    load(tmp_path, dumped)
    assert Tool.objects.get(name="send_sms").max_sends == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{nope", "not valid JSON"),
        ({"tools": {"a": 1}}, "expected a list"),
        ([{"name": "x"}], "missing effect_class"),
        ([{"name": "x", "effect_class": "magic"}], "effect_class must be one of"),
        ([{"name": "x", "effect_class": "manual", "colour": "red"}], "unknown field(s) colour"),
        (
            [{"name": "x", "effect_class": "manual", "critical": "yes"}],
            "critical has the wrong type",
        ),
        ([{"name": "x", "effect_class": "manual", "timeout_seconds": True}], "must be a number"),
        (
            [{"name": "x", "effect_class": "idempotent", "dispatch_url": "ftp://x/y"}],
            "dispatch_url",
        ),
        (
            [{"name": "x", "effect_class": "manual", "adapter": "no.such.Adapter"}],
            "unknown adapter",
        ),
        (
            [{"name": "x", "effect_class": "manual"}, {"name": "x", "effect_class": "manual"}],
            "twice",
        ),
    ],
)
def test_load_tools_refuses_bad_files_and_writes_nothing(world, tmp_path, data, message) -> None:
    good = {"name": "fresh_tool", "effect_class": "manual"}
    if isinstance(data, list):
        data = [good, *data]
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(tmp_path, data)
    assert not Tool.objects.filter(name="fresh_tool").exists()


def test_load_tools_missing_file_is_a_clear_error(db) -> None:
    with pytest.raises(CommandError, match="cannot read"):
        call_command("load_tools", "/nonexistent/tools.json")


@pytest.mark.parametrize("command", ["reconcile", "load_tools"])
def test_commands_have_help(command: str) -> None:
    done = subprocess.run(
        [PYTHON, "manage.py", command, "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize(
    "args", [["--concurrency", "0"], ["--batch-size", "x"], ["--interval", "-1"]]
)
def test_reconcile_refuses_bad_arguments(args: list[str]) -> None:
    done = subprocess.run(
        [PYTHON, "manage.py", "reconcile", "--once", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ registry


class RecordingAdapter(Adapter):
    """A custom adapter that answers from memory (the outside world, mocked)."""

    effects: dict[str, str] = {}

    def send(self, call: Call) -> SendAnswer:
        self.effects[call.idempotency_key] = call.args_hash
        return SendAnswer(SendStatus.ACCEPTED, provider_request_id=f"rec-{call.idempotency_key}")

    def lookup(self, call: Call) -> LookupAnswer:
        if call.idempotency_key not in self.effects:
            return LookupAnswer(LookupStatus.NOT_FOUND)
        return LookupAnswer(
            LookupStatus.FOUND,
            provider_request_id=f"rec-{call.idempotency_key}",
            args_hash=self.effects[call.idempotency_key],
        )


HERE = "tests.reconciliation.test_configuration"


@pytest.fixture
def custom_adapters(settings):
    settings.LEDGER = {
        **settings.LEDGER,
        "ADAPTERS": {
            **settings.LEDGER["ADAPTERS"],
            "recording": f"{HERE}.RecordingAdapter",
            "ambiguous": f"{HERE}.AmbiguousAdapter",
            "not-an-adapter": "json.dumps",
            "missing": "no.such.Thing",
        },
    }


def test_registry_resolves_names_that_settings_list(world, custom_adapters) -> None:
    tool = Tool.objects.get(name="update_crm")
    assert adapter_class("http") is GenericHttpAdapter
    tool.adapter = "recording"
    assert isinstance(adapter_for(tool), RecordingAdapter)
    for bad, message in [
        ("nothing", "unknown adapter"),
        ("missing", "cannot import"),
        ("not-an-adapter", "is not a reconciliation.providers.base.Adapter"),
    ]:
        tool.adapter = bad
        with pytest.raises(ProviderError, match=message):
            adapter_for(tool)
    with pytest.raises(ProviderError, match="not configured"):
        Registry([]).get("ghost")


def test_a_dotted_path_stored_in_the_database_is_never_imported(world, custom_adapters) -> None:
    """Whoever can edit a tool chooses among listed adapters, not what code the worker runs."""
    tool = Tool.objects.get(name="update_crm")
    tool.adapter = f"{HERE}.RecordingAdapter"
    with pytest.raises(ProviderError, match="unknown adapter"):
        adapter_for(tool)
    with pytest.raises(ValidationError, match="unknown adapter"):
        tool.full_clean()
    tool.adapter = "recording"
    tool.full_clean()


def test_a_custom_adapter_is_reconciled_like_any_other(world, custom_adapters) -> None:
    Tool.objects.filter(name="update_crm").update(adapter="recording")
    RecordingAdapter.effects.clear()
    attempt = make_due(unknown(world, "update_crm", "c:custom", {"a": 1}))

    summary = Reconciler(worker_id="t").run_pass()

    attempt.refresh_from_db()
    assert (attempt.state, attempt.provider_request_id) == ("OUTCOME_CONFIRMED", "rec-c:custom")
    assert summary.sends == 1


def test_an_unusable_tool_blocks_recovery_without_guessing(world, settings) -> None:
    """No lookup URL: nothing is sent or decided; the attempt waits (then goes to a person)."""
    attempt = make_due(unknown(world, "update_crm", "c:nourl", {"a": 1}))

    summary = Reconciler(worker_id="t").run_pass()

    attempt.refresh_from_db()
    assert attempt.state == "UNKNOWN"
    assert attempt.events.last().action == "attempt.recovery_blocked"
    assert summary.outcomes["blocked"] == 1


def test_lookup_url_placeholders_name_the_correlation_field(world) -> None:
    tool = Tool(
        name="t",
        effect_class="reconcilable",
        dispatch_url="https://p.test/send",
        lookup_url="https://p.test/find?ref={attempt_id}&k={idempotency_key}",
    )
    call = Call("att_1", "acme", "t", "a b/c", {}, "h")
    assert (
        GenericHttpAdapter(tool).lookup_url_for(call) == "https://p.test/find?ref=att_1&k=a%20b%2Fc"
    )
    tool.lookup_url = "https://p.test/find?x=1"
    assert GenericHttpAdapter(tool).lookup_url_for(call) == (
        "https://p.test/find?x=1&idempotency_key=a+b%2Fc"
    )


def test_unreachable_provider_is_unavailable_never_an_exception(world) -> None:
    tool = Tool(
        name="t",
        effect_class="idempotent",
        dispatch_url="http://127.0.0.1:9/send",
        lookup_url="http://127.0.0.1:9/lookup",
        timeout_seconds=1,
    )
    call = Call("att_1", "acme", "t", "k", {"a": 1}, "h")
    assert GenericHttpAdapter(tool).lookup(call).status == LookupStatus.UNAVAILABLE
    sent = GenericHttpAdapter(tool).send(call)
    assert (sent.status, sent.retryable) == (SendStatus.REFUSED, True)


# ------------------------------------------------------------------------------ system checks


def _ids() -> set[str]:
    # These checks read the database (Tags.database): they run when a database is named.
    return {
        message.id for message in run_checks(include_deployment_checks=False, databases=["default"])
    }


def test_checks_report_unusable_tools_and_short_stale_threshold(world, settings) -> None:
    assert "reconciliation.W001" in _ids()  # the test world's tools have no URLs
    Tool.objects.update(
        dispatch_url="https://p.test/send", lookup_url="https://p.test/lookup", timeout_seconds=5
    )
    assert "reconciliation.W001" not in _ids()
    settings.LEDGER = {**settings.LEDGER, "STALE_AFTER": 5}
    assert "reconciliation.W002" in _ids()


def test_check_reports_a_deployment_without_any_owner(world, settings) -> None:
    assert "attempts.W001" not in _ids()
    OwnershipRule.objects.all().delete()
    settings.LEDGER = {**settings.LEDGER, "DEFAULT_OWNER": ""}
    assert "attempts.W001" in _ids()
    settings.LEDGER = {**settings.LEDGER, "DEFAULT_OWNER": "admin"}
    assert "attempts.W001" not in _ids()


class AmbiguousAdapter(RecordingAdapter):
    """A provider whose lookup answers something that is neither found nor not found."""

    def lookup(self, call: Call) -> LookupAnswer:
        return LookupAnswer(LookupStatus.AMBIGUOUS, detail="two partial matches")


def test_an_ambiguous_answer_keeps_the_attempt_unknown(world, custom_adapters) -> None:
    Tool.objects.filter(name="update_crm").update(adapter="ambiguous")
    attempt = make_due(unknown(world, "update_crm", "c:amb", {"a": 1}))

    summary = Reconciler(worker_id="t").run_pass()

    attempt.refresh_from_db()
    assert attempt.state == "UNKNOWN"
    assert attempt.send_count == 1
    assert attempt.events.last().details["lookup"]["answer"] == "ambiguous"
    assert summary.outcomes["still_unknown"] == 1
