"""Configuration as code (docs/config.md): ``ledger_config plan/apply/dump`` over one TOML file
checked against the published schema. Applying is all or nothing, errors name the file's line,
apply(dump) changes nothing, and every change is in the verified configuration history."""

from __future__ import annotations

import io
import json
import subprocess
import textwrap
from pathlib import Path

import jsonschema
import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from attempts.models import (
    ConfigEvent,
    Grant,
    Membership,
    OwnershipRule,
    SsoGroupRole,
    Tenant,
    Tool,
)
from reconciliation import config
from tests.conftest import PASSWORD, PYTHON, REPO, agent_intent, child_env

pytestmark = pytest.mark.django_db

FILE = textwrap.dedent(
    """\
    version = 1

    [[tenants]]
    slug = "initech"
    name = "Initech"

    [[tools]]
    name = "send_fax"
    effect_class = "reconcilable"
    dispatch_url = "https://fax.example/send"
    lookup_url = "https://fax.example/lookup"
    timeout_seconds = 4

    [[users]]
    username = "rita"
    email = "rita@initech.example"
    roles = { initech = "reviewer", acme = "viewer" }

    [[grants]]
    tenant = "initech"
    tool = "send_fax"
    policy_version = "2026-12"
    scopes = ["fax:send"]

    [[ownership_rules]]
    tenant = "initech"
    tool = "*"
    owner = "rita"
    priority = 20

    [[sso_groups]]
    group = "fax-reviewers"
    roles = { initech = "reviewer" }
    """
)


def write(tmp_path: Path, text: str, name: str = "ledger.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger_config", *args, stdout=out)
    return out.getvalue()


def snapshot() -> str:
    return config.dump()


def test_the_published_schema_is_a_valid_json_schema_and_the_demo_file_follows_it() -> None:
    schema = json.loads((REPO / "docs" / "config.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    demo = (REPO / "reconciliation" / "demo.toml").read_text()
    config.read("demo.toml", demo.replace("{provider}", "http://127.0.0.1:9"))


def test_the_guide_example_is_a_valid_file(world) -> None:
    import re

    guide = (REPO / "docs" / "config.md").read_text()
    example = re.search(r"```toml\n(version = 1\n.*?)```", guide, flags=re.S).group(1)
    plan = config.plan(config.read("docs/config.md", example))
    assert {change.key for change in plan.changes} >= {"charge_card", "acme/charge_card", "rita"}


def test_plan_shows_the_changes_and_changes_nothing(world, tmp_path) -> None:
    before = snapshot()
    out = run("plan", write(tmp_path, FILE))
    assert "+ tenant initech" in out
    assert "+ tool send_fax" in out
    assert "+ grant initech/send_fax" in out
    assert "6 created, 0 updated, 0 removed" in out
    assert snapshot() == before


def test_apply_makes_everything_in_the_file(world, tmp_path) -> None:
    out = run("apply", write(tmp_path, FILE), "--actor", "alice")
    assert "6 created" in out
    assert "password_link rita" in out
    assert Tenant.objects.get(slug="initech").name == "Initech"
    tool = Tool.objects.get(name="send_fax")
    assert (tool.effect_class, tool.timeout_seconds, tool.critical) == ("reconcilable", 4.0, False)
    grant = Grant.objects.get(tenant="initech", tool="send_fax")
    assert (grant.policy_version, grant.allowed_scopes) == ("2026-12", ["fax:send"])
    rita = User.objects.get(username="rita")
    assert not rita.has_usable_password()  # she sets it herself
    roles = dict(Membership.objects.filter(user=rita).values_list("tenant_id", "role"))
    assert roles == {"initech": "reviewer", "acme": "viewer"}
    rule = OwnershipRule.objects.get(tenant_pattern="initech")
    assert (rule.owner, rule.priority) == (rita, 20)
    assert SsoGroupRole.objects.get(group="fax-reviewers").role == "reviewer"


def test_apply_of_dump_changes_nothing(world, tmp_path) -> None:
    run("apply", write(tmp_path, FILE), "--actor", "alice")
    dumped = tmp_path / "dumped.toml"
    run("dump", "--out", str(dumped))
    before = dumped.read_text()
    out = run("plan", str(dumped))
    assert "0 created, 0 updated, 0 removed" in out
    out = run("apply", str(dumped), "--actor", "alice")
    assert "0 created, 0 updated, 0 removed" in out
    assert snapshot() == before
    # The dump is a valid file by the published schema, and holds today's state.
    assert "[[users]]" in before and 'username = "rita"' in before
    assert 'roles = { acme = "viewer", initech = "reviewer" }' in before


def test_an_update_changes_only_what_differs_and_omitted_fields_take_their_defaults(
    world, tmp_path
) -> None:
    run("apply", write(tmp_path, FILE), "--actor", "alice")
    changed = FILE.replace("timeout_seconds = 4\n", "timeout_seconds = 4\ncritical = true\n")
    changed = changed.replace('acme = "viewer"', 'acme = "operator"')
    out = run("plan", write(tmp_path, changed))
    assert "~ tool send_fax: critical False -> True" in out
    assert "~ user rita: roles" in out
    assert "2 updated" in out and "4 unchanged" in out


def test_removing_is_explicit(world, tmp_path) -> None:
    run("apply", write(tmp_path, FILE), "--actor", "alice")
    # A file that does not mention an object leaves it alone.
    partial = 'version = 1\n\n[[tenants]]\nslug = "initech"\nname = "Initech"\n'
    assert "0 removed" in run("apply", write(tmp_path, partial, "p.toml"), "--actor", "a")
    assert Tool.objects.filter(name="send_fax").exists()
    removal = textwrap.dedent(
        """\
        version = 1

        [[grants]]
        tenant = "initech"
        tool = "send_fax"
        remove = true

        [[sso_groups]]
        group = "fax-reviewers"
        remove = true
        """
    )
    out = run("apply", write(tmp_path, removal, "r.toml"), "--actor", "alice")
    assert "- grant initech/send_fax" in out and "2 removed" in out
    assert not Grant.objects.filter(tenant="initech").exists()
    assert not SsoGroupRole.objects.exists()
    # Removing what is already gone is not an error and changes nothing.
    assert "0 removed" in run("apply", write(tmp_path, removal, "r.toml"), "--actor", "alice")


def test_a_bad_file_changes_nothing_and_the_error_names_the_line(world, tmp_path) -> None:
    before = snapshot()
    bad = FILE.replace('tool = "send_fax"\npolicy', 'tool = "send_telex"\npolicy')
    line = bad.splitlines().index('tool = "send_telex"') + 1
    with pytest.raises(CommandError) as caught:
        run("apply", write(tmp_path, bad), "--actor", "alice")
    message = str(caught.value)
    assert f"ledger.toml:{line}: grant initech/send_telex: unknown tool 'send_telex'" in message
    assert "nothing was changed" in message
    assert snapshot() == before  # the tenant, tool and user before it were not made either


@pytest.mark.parametrize(
    ("mutation", "at", "expected"),
    [
        (
            ('effect_class = "reconcilable"', 'effect_class = "sometimes"'),
            "effect_class =",
            "'sometimes' is not one of",
        ),
        (
            ("timeout_seconds = 4", "timeout_seconds = -1"),
            "timeout_seconds =",
            "timeout_seconds: -1 is less than or equal to the minimum of 0",
        ),
        (
            ("priority = 20", "priority = 20\nweight = 3"),
            "[[ownership_rules]]",
            "Additional properties are not allowed ('weight' was unexpected)",
        ),
        (('name = "Initech"', 'name = "Initech'), 'name = "Initech', "not valid TOML"),
        (('acme = "viewer"', 'acme = "boss"'), "roles =", "'boss' is not one of"),
        (
            ('roles = { initech = "reviewer" }', 'roles = { nowhere = "viewer" }'),
            "roles = { nowhere",
            "unknown tenant 'nowhere'",
        ),
        (('owner = "rita"', 'owner = "nobody"'), 'owner = "nobody"', "unknown user 'nobody'"),
        # An ownership rule may only route work to someone who can act on it there.
        (
            ('roles = { initech = "reviewer", acme', 'roles = { initech = "viewer", acme'),
            'owner = "rita"',
            "rita cannot act on attempts in tenant initech (an owner needs the operator role",
        ),
        (
            ('tenant = "initech"\ntool = "*"', 'tenant = "acme"\ntool = "*"'),
            'owner = "rita"',
            "rita cannot act on attempts in tenant acme",
        ),
        (
            ('email = "rita@initech.example"', 'email = "rita@initech.example"\nactive = false'),
            'owner = "rita"',
            "rita is not active",
        ),
        (('slug = "initech"\nname', 'slug = "acme"\nname'), "[[tenants]]", None),
    ],
)
def test_each_kind_of_error_names_its_line(world, tmp_path, mutation, at, expected) -> None:
    old, new = mutation
    text = FILE.replace(old, new, 1)
    if expected is None:  # a key listed twice
        text += '\n[[tenants]]\nslug = "acme"\n'
        at_line = len(text.splitlines()) - 1
        expected = "tenant acme is listed twice"
    else:
        at_line = next(n for n, line in enumerate(text.splitlines(), 1) if line.startswith(at))
    before = snapshot()
    with pytest.raises(config.ConfigError) as caught:
        config.apply(config.read("f.toml", text), actor=config.applied_by("t"))
    assert any(
        line == at_line and expected in message for line, message in caught.value.problems
    ), (
        caught.value.problems,
        at_line,
    )
    assert snapshot() == before


def test_a_refusal_half_way_rolls_back_every_earlier_change(world, tmp_path) -> None:
    """The file is valid, but the database refuses one change after others were made."""
    agent_intent(world, "k-open", tool="open_ticket", args={"title": "x"})
    text = FILE + textwrap.dedent(
        """
        [[tools]]
        name = "open_ticket"
        remove = true
        """
    )
    line = len(text.splitlines()) - 2
    before = snapshot()
    with pytest.raises(CommandError) as caught:
        run("apply", write(tmp_path, text), "--actor", "alice")
    assert f"ledger.toml:{line}: tool open_ticket has unsettled attempts" in str(caught.value)
    assert snapshot() == before
    assert not Tenant.objects.filter(slug="initech").exists()


def test_every_change_is_in_the_verified_history_with_who_applied_it(world, tmp_path) -> None:
    from attempts import chain
    from tests.attempts.audit_helpers import drop_triggers, seal_all, sql

    path = write(tmp_path, FILE)
    run("apply", path, "--actor", "alice")
    events = {e.subject: e for e in ConfigEvent.objects.filter(actor="alice")}
    rule = OwnershipRule.objects.get(tenant_pattern="initech")
    assert set(events) == {
        "tenant:initech",
        "tool:send_fax",
        "user:rita",
        "membership:acme/rita",
        "membership:initech/rita",
        "grant:initech/send_fax",
        f"ownership_rule:{rule.pk}",
        "sso_group:fax-reviewers/initech",
    }
    assert {(e.actor_kind, e.actor, e.reason) for e in events.values()} == {
        ("user", "alice", f"ledger_config apply {path}")
    }
    grant = events["grant:initech/send_fax"]
    assert (grant.action, grant.before) == ("created", None)
    assert grant.after["policy_version"] == "2026-12"
    assert events["membership:initech/rita"].after == {"role": "reviewer"}

    # A change records before and after; removing records what was there.
    changed = FILE.replace('policy_version = "2026-12"', 'policy_version = "2027-01"')
    run("apply", write(tmp_path, changed, "changed.toml"), "--actor", "bob")
    update = ConfigEvent.objects.filter(subject="grant:initech/send_fax").last()
    assert (update.action, update.actor) == ("changed", "bob")
    assert (update.before["policy_version"], update.after["policy_version"]) == (
        "2026-12",
        "2027-01",
    )
    # The history of an attempt's authority shows it (ConfigEvent.objects.affecting).
    tool = Tool.objects.get(name="send_fax")
    tool.dispatch_url = "https://fax.example/send"
    tool.save()
    attempt, _ = agent_intent(world, "fax-1", tool="send_fax", args={"to": "+1"}, tenant="initech")
    assert update in ConfigEvent.objects.affecting(attempt)

    seal_all()
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert out.getvalue().startswith("OK:")
    assert chain.config_head_now()[0] == ConfigEvent.objects.count()
    # Rewriting who applied a change is seen by verification.
    drop_triggers()
    sql(
        "UPDATE attempts_configevent SET actor = %s WHERE id = %s",
        ["mallory", update.pk],
    )
    with pytest.raises(CommandError):
        call_command("verify_audit", stdout=io.StringIO())


def test_the_applier_defaults_to_the_operating_system_user(world, tmp_path) -> None:
    import getpass

    run("apply", write(tmp_path, FILE))
    applied = ConfigEvent.objects.exclude(actor_kind="system")
    assert set(applied.values_list("actor", flat=True)) == {getpass.getuser()}


def test_load_tools_records_its_changes_too(world, tmp_path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(
        json.dumps([{"name": "open_ticket", "effect_class": "reconcilable", "critical": True}])
    )
    call_command("load_tools", str(path), "--actor", "carol", stdout=io.StringIO())
    event = ConfigEvent.objects.get(subject="tool:open_ticket", action="changed")
    assert (event.actor, event.before["critical"], event.after["critical"]) == (
        "carol",
        False,
        True,
    )


def test_the_command_runs_from_the_shell_with_help(tmp_path) -> None:
    done = subprocess.run(
        [PYTHON, "manage.py", "ledger_config", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=child_env(),
    )
    assert done.returncode == 0 and "plan|apply|dump" in done.stdout


def test_the_one_time_password_link_lets_a_person_set_their_own(world, tmp_path) -> None:
    run("apply", write(tmp_path, FILE), "--actor", "alice")
    out = io.StringIO()
    call_command("password_link", "rita", "--base-url", "https://ledger.example", stdout=out)
    link = out.getvalue().strip()
    assert link.startswith("https://ledger.example/set-password/")
    path = link.removeprefix("https://ledger.example")
    client = Client()
    form = client.get(path, follow=True)
    assert form.status_code == 200 and "Set your password" in form.content.decode()
    new = "a-long-passphrase-rita-chose"
    done = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": new, "new_password2": new},
        follow=True,
    )
    assert "Password set" in done.content.decode()
    assert Client().login(username="rita", password=new)
    # The link works once.
    again = Client().get(path, follow=True)
    assert "already used or has expired" in again.content.decode()
    with pytest.raises(CommandError, match="no user 'ghost'"):
        call_command("password_link", "ghost")
    assert PASSWORD  # the world's people keep theirs
