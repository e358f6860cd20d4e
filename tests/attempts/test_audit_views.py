"""Audit screens: reviewers and admins export and print within their tenants; others are refused;
downloads stream and verify offline; bad input is a clear 400, never a 500."""

from __future__ import annotations

import json

import pytest
from django.http import StreamingHttpResponse
from django.urls import reverse

from attempts import ledger, linked, review, verify_export
from attempts.models import AttemptEvent, Checkpoint
from attempts.states import Actor
from tests.attempts.audit_helpers import build_history, fast_passwords, seal_all  # noqa: F401
from tests.conftest import PASSWORD


@pytest.fixture
def history(world):
    made = build_history(world, 3)
    build_history(world, 2, tenant="globex", prefix="g")
    return made + build_history(world, 1, prefix="later")


def login(client, name: str):
    assert client.login(username=name, password=PASSWORD)
    return client


def body(response) -> bytes:
    if isinstance(response, StreamingHttpResponse):
        return b"".join(response.streaming_content)
    return response.content


def test_anonymous_is_sent_to_login(client, history):
    response = client.get(reverse("audit_exports"))
    assert response.status_code == 302 and "/login/" in response["Location"]
    response = client.get(reverse("audit_download", args=["csv"]))
    assert response.status_code == 302


@pytest.mark.parametrize("name", ["viewer", "operator"])
def test_viewers_and_operators_are_refused(client, history, name):
    login(client, name)
    assert client.get(reverse("audit_exports")).status_code == 403
    assert client.get(reverse("audit_download", args=["jsonl"])).status_code == 403
    report = reverse("audit_report", args=[history[0].attempt_id])
    assert client.get(report).status_code == 403


def test_reviewer_sees_the_form_with_the_newest_checkpoint_and_the_window(client, history):
    login(client, "reviewer")
    text = client.get(reverse("audit_exports"), {"tenant": "acme"}).content.decode()
    assert "none sealed yet" in text
    assert "Not sealed yet: <strong>6</strong> attempts" in " ".join(text.split())
    seal_all()
    response = client.get(reverse("audit_exports"), {"tenant": "acme"})
    assert response.status_code == 200
    head = Checkpoint.objects.order_by("-seq").first()
    text = response.content.decode()
    assert head.hash in text
    assert "Not sealed yet: <strong>0</strong> attempts" in " ".join(text.split())
    newest_event = AttemptEvent.objects.order_by("-id").first()
    acme_events = AttemptEvent.objects.filter(attempt__tenant_id="acme").count()
    assert f"<strong>{acme_events}</strong> events match" in text
    assert f"upto={newest_event.id}" in text
    assert 'option value="globex"' not in text


def test_reviewer_downloads_stream_and_verify(client, history, tmp_path):
    login(client, "reviewer")
    head = AttemptEvent.objects.order_by("-id").first()
    for fmt, name in (("jsonl", "a.jsonl"), ("csv", "a.csv")):
        response = client.get(reverse("audit_download", args=[fmt]), {"upto": head.id})
        assert response.status_code == 200
        assert isinstance(response, StreamingHttpResponse)
        assert "attachment" in response["Content-Disposition"]
        (tmp_path / name).write_bytes(body(response))
    manifest = client.get(reverse("audit_download", args=["manifest"]), {"upto": head.id})
    assert manifest.status_code == 200
    (tmp_path / "a.csv.manifest.json").write_bytes(manifest.content)
    data = json.loads(manifest.content)
    assert data["row_count"] == AttemptEvent.objects.filter(attempt__tenant_id="acme").count()
    assert data["exported_by"] == "reviewer"
    assert data["complete_chains"] is True
    jsonl = verify_export.verify_file(tmp_path / "a.jsonl")
    assert jsonl.ok, jsonl.render()
    csv_report = verify_export.verify_file(tmp_path / "a.csv")
    assert csv_report.ok, csv_report.render()
    assert b"globex" not in (tmp_path / "a.jsonl").read_bytes()
    assert b"globex" not in (tmp_path / "a.csv").read_bytes()


def test_another_tenants_data_cannot_be_asked_for(client, history):
    login(client, "reviewer")
    response = client.get(reverse("audit_download", args=["csv"]), {"tenant": "globex"})
    assert response.status_code == 400
    globex = history[0].__class__.objects.filter(tenant_id="globex").first()
    assert client.get(reverse("audit_report", args=[globex.attempt_id])).status_code == 404


@pytest.mark.parametrize(
    "params",
    [
        {"state": "NOPE"},
        {"since": "not-a-date"},
        {"since": "2030-01-02", "until": "2030-01-01"},
        {"upto": "abc"},
        {"upto": "999999999"},
        # Moments with no UTC form (they overflowed into a 500 before).
        {"since": "0001-01-01T00:00:00+01:00"},
        {"until": "0001-01-01T00:00:00+01:00"},
        {"since": "9999-12-31T23:59:59-01:00"},
        {"until": "9999-12-31T23:59:59-01:00"},
    ],
)
def test_bad_filters_are_400_not_500(client, history, params):
    login(client, "admin")
    assert client.get(reverse("audit_exports"), params).status_code == 400
    for kind in ("csv", "jsonl", "manifest"):
        response = client.get(reverse("audit_download", args=[kind]), params)
        assert response.status_code == 400, (kind, params)


@pytest.mark.parametrize(
    "params",
    [{"since": "0001-01-01T00:00:00Z"}, {"until": "9999-12-31T23:59:59+00:00"}],
)
def test_the_extremes_that_exist_in_utc_are_accepted(client, history, params):
    login(client, "admin")
    assert client.get(reverse("audit_exports"), params).status_code == 200
    assert client.get(reverse("audit_download", args=["jsonl"]), params).status_code == 200


@pytest.mark.parametrize("attempt", ["a/b", "../x", "att_1?x=1", "x" * 33, "a b", "é"])
def test_report_lookup_refuses_what_is_not_an_attempt_id(client, history, attempt):
    login(client, "reviewer")
    response = client.get(reverse("audit_report_lookup"), {"attempt": attempt})
    assert response.status_code == 400
    assert b"attempt id" in response.content


def test_unknown_format_is_404(client, history):
    login(client, "admin")
    assert client.get(reverse("audit_download", args=["xlsx"])).status_code == 404


def test_printable_report_covers_the_lineage_and_who_decided(client, world, history):
    # An UNKNOWN attempt goes to review; a reviewer approves a linked retry (update_crm is not
    # critical: one approval), the child is confirmed.
    original = history[1]
    assert original.state == "UNKNOWN"
    with_review = linked.create_linked_attempt(
        original, actor=Actor.worker("reconciler"), reason="authority changed"
    )
    review.approve_linked_attempt(with_review, user=world.reviewer)
    child = ledger.claim_dispatch(with_review.attempt_id, actor=world.agent)[0]
    ledger.attach_provider_request(child, "req-child", actor=world.agent)
    ledger.confirm(child.attempt_id, result_ref="receipt-child", actor=world.agent)
    login(client, "reviewer")
    response = client.get(reverse("audit_report", args=[child.attempt_id]))
    assert response.status_code == 200
    text = response.content.decode()
    assert original.attempt_id in text and child.attempt_id in text
    assert "Linked attempt 1" in text
    assert "approved the linked attempt" in text
    assert "req-child" in text and "receipt-child" in text
    for event in AttemptEvent.objects.filter(attempt__in=[original, child]):
        assert event.hash in text
    assert "every event below recomputes" in text
    assert (
        "@media print"
        in (
            __import__("pathlib").Path(__file__).resolve().parents[2] / "static/css/audit.css"
        ).read_text()
    )


def test_report_flags_an_edited_event(client, world, history):
    from tests.attempts.audit_helpers import drop_triggers, sql

    event = history[0].events.order_by("id").last()
    drop_triggers()
    sql("UPDATE attempts_attemptevent SET reason = %s WHERE id = %s", ["edited", event.id])
    login(client, "admin")
    text = client.get(reverse("audit_report", args=[history[0].attempt_id])).content.decode()
    assert "SOME EVENTS BELOW DO NOT VERIFY" in text
    assert "✗ edited" in text


def test_report_lookup_redirects(client, history):
    login(client, "reviewer")
    response = client.get(reverse("audit_report_lookup"), {"attempt": history[0].attempt_id})
    assert response.status_code == 302
    assert response["Location"] == reverse("audit_report", args=[history[0].attempt_id])
    assert client.get(reverse("audit_report_lookup")).status_code == 400
    assert client.get(reverse("audit_report", args=["att_nope"])).status_code == 404


def test_the_audit_page_shows_the_log_and_a_refusing_witness(client, history, tmp_path, settings):
    from attempts import log
    from attempts.models import WitnessState

    path = tmp_path / "log.key"
    log.write_key_file(path, "example.test/ledger")
    witness = log.generate_key("witness.test/w1")[1]
    settings.TLOG = {
        **settings.TLOG,
        "KEY_FILE": str(path),
        "WITNESSES": [f"{witness} http://127.0.0.1:9/"],
    }
    seal_all()
    WitnessState.objects.create(
        name="witness.test/w1", size=0, status="refused", message="HTTP 422: the proof fails"
    )
    login(client, "reviewer")
    text = " ".join(client.get(reverse("audit_exports")).content.decode().split())
    newest = log.newest_signed()
    assert f"Newest signed checkpoint {newest.seq}: {newest.size} sealed heads" in text
    assert 'class="witness-refused"' in text and "HTTP 422: the proof fails" in text
    assert "not witnessed yet" in text


def test_the_printable_report_carries_the_receipt(client, history, tmp_path, settings):
    from attempts import log

    path = tmp_path / "log.key"
    verifier = log.write_key_file(path, "example.test/ledger")
    settings.TLOG = {**settings.TLOG, "KEY_FILE": str(path)}
    login(client, "reviewer")
    text = client.get(reverse("audit_report", args=[history[0].attempt_id])).content.decode()
    assert "its current state is not in a signed checkpoint" in text
    seal_all()
    text = client.get(reverse("audit_report", args=[history[0].attempt_id])).content.decode()
    receipt = log.receipt(type(history[0]).objects.get(pk=history[0].pk))
    assert verify_export.receipt_problems(receipt, [verifier]) == []
    assert receipt["inclusion_proof"][0] in text
    assert "example.test/ledger" in text and "\u2014 example.test/ledger " in text


def test_the_log_page_explains_the_newest_checkpoint_and_how_to_check_an_export(
    client, history, tmp_path, settings
):
    """An operator-facing page: the newest signed checkpoint, who cosigned it and when, the
    verifier key to copy, and the standalone verifier to download (the very file the server
    checks with); for reviewers and admins, as the exports."""
    from pathlib import Path

    from attempts import log
    from attempts.models import CheckpointSignature

    path = tmp_path / "log.key"
    verifier = log.write_key_file(path, "example.test/ledger")
    settings.TLOG = {**settings.TLOG, "KEY_FILE": str(path)}
    login(client, "reviewer")
    text = client.get(reverse("audit_log")).content.decode()
    assert "No checkpoint is signed yet" in text and str(verifier) in text
    seal_all()
    newest = log.newest_signed()
    CheckpointSignature.objects.create(
        checkpoint=newest, kind="witness", name="witness.test/w1", key_id="00000000",
        line="\u2014 witness.test/w1 AAAA\n", created_at=newest.sealed_at,
    )  # fmt: skip
    text = client.get(reverse("audit_log")).content.decode()
    assert f"Checkpoint <strong>{newest.seq}</strong>" in text
    assert f"<strong>{newest.size}</strong> sealed attempt states" in text
    assert "Cosigned by <strong>witness.test/w1</strong>" in text
    assert f'data-copy="{verifier}"' in text and "--log-key" in text
    assert log.signed_note(newest).splitlines()[0] in text
    audit = client.get(reverse("audit_exports")).content.decode()
    assert reverse("audit_verifier_script") in audit and reverse("audit_log") in audit
    assert "<h3>" not in audit  # headings in order: h1, then h2s
    script = client.get(reverse("audit_verifier_script"))
    assert script.status_code == 200 and "attachment" in script["Content-Disposition"]
    assert script.content == Path(verify_export.__file__).read_bytes()
    client.logout()
    login(client, "viewer")
    assert client.get(reverse("audit_log")).status_code == 403
    assert client.get(reverse("audit_verifier_script")).status_code == 403
