"""Retention rules as code: plan, apply, dump and the history like every other section, errors
at the file's line, and the plan says what a rule would archive."""

from __future__ import annotations

import textwrap

import pytest

from attempts import audit_verify
from attempts.models import ConfigEvent, RetentionRule
from reconciliation import config

pytestmark = pytest.mark.django_db

FILE = textwrap.dedent(
    """\
    version = 1

    [[retention_rules]]
    tenant = "acme"
    tool = "update_crm"
    archive_after_days = 30
    """
)


def apply(text: str) -> str:
    document = config.read("f.toml", text)
    return "\n".join(config.apply(document, actor=config.applied_by("ops")).lines())


def test_apply_dump_and_history(ledger_with_rules):
    RetentionRule.objects.all().delete()
    plan = "\n".join(config.plan(config.read("f.toml", FILE)).lines())
    assert "+ retention rule acme/update_crm" in plan
    assert "would archive 5 attempts" in plan
    out = apply(FILE)
    assert "1 created" in out
    assert (
        RetentionRule.objects.get(tenant_id="acme", tool_id="update_crm").archive_after_days == 30
    )
    dumped = config.dump()
    assert '[[retention_rules]]\ntenant = "acme"\ntool = "update_crm"\narchive_after_days = 30' in (
        dumped
    )
    assert "0 created, 0 updated, 0 removed" in apply(dumped)
    out = apply(FILE.replace("= 30", "= 90"))
    assert "~ retention rule acme/update_crm: archive_after_days 30 -> 90" in out
    out = apply(FILE + "remove = true\n")
    assert "- retention rule acme/update_crm" in out
    assert not RetentionRule.objects.exists()
    actions = list(
        ConfigEvent.objects.filter(subject="retention_rule:acme/update_crm")
        .order_by("seq")
        .values_list("action", flat=True)
    )
    # The fixture made the rule and the test removed it; then the file: create, change, remove.
    assert actions == ["created", "deleted", "created", "changed", "deleted"]
    # The history replays to the live rules: no drift.
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()


def test_a_rule_changed_behind_the_history_is_drift(world):
    apply(FILE)
    RetentionRule.objects.filter(tenant_id="acme").update(archive_after_days=1)
    report = audit_verify.verify_django_database()
    assert [p.kind for p in report.problems] == ["config-drift"]
    assert "retention_rule:acme/update_crm" in report.render()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (FILE.replace("= 30", "= 0"), "archive_after_days"),
        (FILE.replace('"acme"', '"nowhere"'), "unknown tenant 'nowhere'"),
        (FILE.replace('"update_crm"', '"no_tool"'), "unknown tool 'no_tool'"),
        (FILE.replace("archive_after_days = 30\n", ""), "archive_after_days"),
    ],
)
def test_bad_rules_are_refused_at_their_line(world, text, message):
    with pytest.raises(config.ConfigError) as caught:
        config.plan(config.read("f.toml", text))
    assert message in str(caught.value)
    assert not RetentionRule.objects.exists()


def test_a_rules_history_is_seen_by_its_tenants_reviewers_only(world):
    apply(FILE)
    subject = "retention_rule:acme/update_crm"
    assert ConfigEvent.objects.visible_to(world.reviewer).filter(subject=subject).exists()
    assert not ConfigEvent.objects.visible_to(world.outsider).filter(subject=subject).exists()
    assert not ConfigEvent.objects.visible_to(world.viewer).filter(subject=subject).exists()
