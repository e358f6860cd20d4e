"""Audit exports: an untouched export verifies offline (without Django); an export edited,
shortened, lengthened or reordered in each way fails with the right event named; CSV cells are
safe to open in a spreadsheet; a person's export holds only their tenants' history."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from attempts import audit_export, review, verify_export
from attempts.models import AttemptEvent, Checkpoint
from tests.attempts.audit_helpers import (
    build_history,
    fast_passwords,  # noqa: F401  (autouse)
    seal_all,
    sealed_before_the_log,
)
from tests.conftest import PYTHON, REPO

VERIFIER = REPO / "attempts" / "verify_export.py"
# Runs the verifier as a script with Django made unimportable: proof it needs neither.
NO_DJANGO = (
    "import runpy, sys; sys.modules['django'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def offline(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-c", NO_DJANGO, str(VERIFIER), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )


def export(tmp_path: Path, fmt: str = "jsonl", name: str | None = None, **options) -> Path:
    out = tmp_path / (name or f"audit.{fmt}")
    call_command(
        "export_audit", "--format", fmt, "--out", str(out), **options, stdout=io.StringIO()
    )
    return out


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in lines(path)]


def write(path: Path, content: list[str]) -> Path:
    path.write_text("".join(content), encoding="utf-8")
    return path


def first_problem(path: Path, **kwargs) -> verify_export.Problem:
    report = verify_export.verify_file(path, **kwargs)
    assert not report.ok, report.render()
    return report.problems[0]


@pytest.fixture
def history(world):
    made = build_history(world, 4)
    build_history(world, 2, tenant="globex", prefix="g")
    review.add_note(made[1], user=world.operator, text="=cmd|' /C calc'!A0")
    review.add_note(made[2], user=world.operator, text='He said "stop, now",\nthen left; ünïcode ✓')
    # A control character the CSV fast path uses internally: the exact path takes over.
    review.add_note(made[3], user=world.operator, text='odd \x01 "byte"')
    return made


def test_untouched_jsonl_export_verifies_offline_without_django(history, tmp_path):
    path = export(tmp_path)
    result = offline(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK:")
    total = AttemptEvent.objects.count()
    assert f"{total} events verify" in result.stdout
    head = AttemptEvent.objects.order_by("-id").first()
    assert head.hash in result.stdout
    # And through manage.py, and with the head kept elsewhere.
    out = io.StringIO()
    call_command("verify_audit", "--export", str(path), "--expect-head", head.hash, stdout=out)
    assert out.getvalue().startswith("OK:")


def test_jsonl_export_has_a_manifest(history, tmp_path):
    recs = records(export(tmp_path))
    assert recs[0]["type"] == "header" and recs[-1]["type"] == "manifest"
    manifest = recs[-1]
    events = [r for r in recs if r["type"] == "event"]
    assert manifest["row_count"] == len(events) == AttemptEvent.objects.count()
    assert manifest["first_event"]["id"] == events[0]["id"]
    assert manifest["last_event"]["hash"] == events[-1]["hash"]
    assert manifest["complete_chains"] is True and manifest["checkpoint"] is None
    assert manifest["filters"] == {
        "tenant": None,
        "state": None,
        "tool": None,
        "since": None,
        "until": None,
    }


def _event_lines(path: Path) -> list[int]:
    return [i for i, line in enumerate(lines(path)) if json.loads(line)["type"] == "event"]


def test_editing_an_exported_event_names_it(history, tmp_path):
    path = export(tmp_path)
    content = lines(path)
    index = _event_lines(path)[5]
    record = json.loads(content[index])
    record["actor"] = "someone-else"
    content[index] = json.dumps(record) + "\n"
    problem = first_problem(write(path, content))
    assert problem.kind == "content" and problem.event_id == record["id"]
    assert problem.line == index + 1
    result = offline(path)
    assert result.returncode == 1
    assert f"event {record['id']}" in result.stdout.splitlines()[0]


def test_an_exported_event_that_cannot_be_hashed_is_reported_whatever_its_hash_says(
    history, tmp_path
):
    """Details no encoder can hash (a number beyond the float range) are edited history, even
    with the hash set to the verifier's own words for such an event."""
    path = export(tmp_path)
    content = lines(path)
    events = [(i, json.loads(content[i])) for i in _event_lines(path)]
    # The last event of the first attempt: no later event of the attempt links to its hash.
    index, record = [(i, r) for i, r in events if r["attempt_id"] == events[0][1]["attempt_id"]][-1]
    record["details"] = {**record["details"], "count": "INFINITE"}  # a public detail
    edited = json.dumps(record).replace('"INFINITE"', "1e400")
    with pytest.raises(verify_export.rfc8785.CanonicalizationError) as error:
        verify_export.event_hash(json.loads(edited))
    record = json.loads(edited)
    record["hash"] = f"unhashable ({error.value})"
    content[index] = json.dumps(record).replace("Infinity", "1e400") + "\n"
    problem = first_problem(write(path, content))
    assert problem.kind == "content" and problem.event_id == record["id"]
    assert "cannot be hashed" in problem.message


def _same_attempt_pair(path: Path) -> tuple[int, int]:
    """Line indexes of two consecutive exported events of one attempt."""
    content = lines(path)
    seen: dict[str, int] = {}
    for index in _event_lines(path):
        attempt_id = json.loads(content[index])["attempt_id"]
        if attempt_id in seen and len([1 for _ in seen]) > 2:
            return seen[attempt_id], index
        seen[attempt_id] = index
    raise AssertionError("no attempt with two events")


def test_deleting_an_exported_event_names_the_gap(history, tmp_path):
    path = export(tmp_path)
    content = lines(path)
    first, second = _same_attempt_pair(path)
    # The attempt's event after ``first``, whichever line it is on.
    after = json.loads(content[second])["id"]
    del content[first]
    report = verify_export.verify_file(write(path, content))
    link = [p for p in report.problems if p.kind == "link"]
    assert link and link[0].event_id == after


def test_inserting_an_event_into_an_export_names_it(history, tmp_path):
    path = export(tmp_path)
    content = lines(path)
    index = _event_lines(path)[5]
    before = json.loads(content[index])
    forged = dict(before, id=before["id"], reason="approved by the CFO", prev_hash=before["hash"])
    forged["hash"] = verify_export.event_hash(forged)
    content.insert(index + 1, json.dumps(forged) + "\n")
    problem = first_problem(write(path, content))
    # The forgery repeats an id, and the attempt's real next event no longer links.
    assert problem.event_id == before["id"]
    assert problem.kind == "order"
    report = verify_export.verify_file(path)
    assert any(p.kind == "link" for p in report.problems)


def test_reordering_exported_events_is_seen(history, tmp_path):
    path = export(tmp_path)
    content = lines(path)
    i, j = _event_lines(path)[3], _event_lines(path)[4]
    moved = json.loads(content[i])["id"]
    content[i], content[j] = content[j], content[i]
    problem = first_problem(write(path, content))
    assert problem.kind in ("order", "link") and problem.event_id == moved


def test_deleting_an_attempt_and_its_history_from_an_export_is_seen(history, tmp_path):
    path = export(tmp_path)
    victim = history[1].attempt_id
    content = [
        line for line in lines(path) if victim not in line or json.loads(line)["type"] == "manifest"
    ]
    problem = first_problem(write(path, content))
    assert problem.kind == "manifest" and "events were added or removed" in problem.message


def test_a_sealed_export_carries_proofs_that_verify(history, tmp_path):
    seal_all()
    newest = Checkpoint.objects.order_by("-seq").first()
    path = export(tmp_path)
    recs = records(path)
    seals = [r for r in recs if r["type"] == "seal"]
    checkpoints = [r for r in recs if r["type"] == "checkpoint"]
    assert len(seals) == 6 and checkpoints[-1]["hash"] == newest.hash
    assert recs[-1]["checkpoint"] == {"seq": newest.seq, "hash": newest.hash}
    result = offline(path, "--expect-head", newest.hash)
    assert result.returncode == 0, result.stdout
    assert newest.hash in result.stdout


def test_an_attempt_sealed_again_is_proved_once_at_its_newest_head(history, world, tmp_path):
    seal_all()
    review.add_note(history[0], user=world.operator, text="after the first seal")
    seal_all()
    path = export(tmp_path)
    seals = [r for r in records(path) if r["type"] == "seal"]
    assert len(seals) == len({r["attempt_id"] for r in seals}) == 6
    (mine,) = [r for r in seals if r["attempt_id"] == history[0].attempt_id]
    history[0].refresh_from_db()
    assert (mine["length"], mine["head"]) == (history[0].chain_length, history[0].chain_head)
    assert offline(path).returncode == 0


def test_cutting_sealed_events_from_an_export_is_seen_even_with_the_manifest_fixed(
    history, tmp_path
):
    seal_all()
    path = export(tmp_path)
    content = lines(path)
    victim = history[0].attempt_id
    mine = [i for i in _event_lines(path) if json.loads(content[i])["attempt_id"] == victim]
    del content[mine[-1]]
    manifest = json.loads(content[-1])
    manifest["row_count"] -= 1
    last = json.loads(content[_event_lines(write(path, content))[-1]])
    manifest["last_event"] = {"id": last["id"], "hash": last["hash"]}
    content[-1] = json.dumps(manifest) + "\n"
    report = verify_export.verify_file(write(path, content))
    seal = [p for p in report.problems if p.kind == "seal"]
    assert seal and seal[0].attempt_id == victim and "removed" in seal[0].message


@pytest.mark.parametrize("kind", ["seal", "checkpoint"])
def test_editing_a_seal_or_checkpoint_line_is_seen(history, tmp_path, kind):
    seal_all()
    path = export(tmp_path)
    content = lines(path)
    index = next(i for i, line in enumerate(content) if json.loads(line)["type"] == kind)
    record = json.loads(content[index])
    if kind == "seal":
        record["head"] = "0" * 64
    else:
        record["root"] = "0" * 64
    content[index] = json.dumps(record) + "\n"
    problem = first_problem(write(path, content))
    assert problem.kind in ("seal", "checkpoint")


def test_cutting_the_end_of_an_export_is_seen(history, tmp_path):
    path = export(tmp_path)
    content = lines(path)
    # Drop the last event and keep the manifest: the counts and the head no longer match.
    del content[_event_lines(path)[-1]]
    problem = first_problem(write(path, content))
    assert problem.kind == "manifest"
    # Drop the manifest as well: the export is known to be cut short.
    problem = first_problem(write(path, content[:-1]))
    assert problem.kind == "manifest" and "cut short" in problem.message


def test_a_reviewers_export_holds_only_their_tenants_and_still_verifies(history, world, tmp_path):
    path = export(tmp_path, as_user="reviewer")
    text = path.read_text()
    assert "globex" not in text and "g:globex" not in text
    recs = records(path)
    events = [r for r in recs if r["type"] == "event"]
    assert {e["tenant"] for e in events} == {"acme"}
    # No one else's hashes: only acme's events and the config changes an acme reviewer may read.
    assert {r["type"] for r in recs} == {"header", "event", "config", "manifest"}
    assert verify_export.verify_file(path).ok
    # An operator (or viewer) may not export; an outsider sees only globex.
    with pytest.raises(CommandError):
        export(tmp_path, name="x.jsonl", as_user="nobody")
    with pytest.raises(CommandError, match="reviewer or admin"):
        export(tmp_path, name="op.jsonl", as_user="operator")
    outsider = records(export(tmp_path, name="out.jsonl", as_user="outsider"))
    assert {r["tenant"] for r in outsider if r["type"] == "event"} == {"globex"}


def test_filters_by_state_tool_tenant_and_dates(history, tmp_path):
    confirmed = records(export(tmp_path, name="c.jsonl", state="OUTCOME_CONFIRMED"))
    events = [r for r in confirmed if r["type"] == "event"]
    assert events and {r["attempt_state"] for r in events} == {"OUTCOME_CONFIRMED"}
    assert confirmed[-1]["filters"]["state"] == "OUTCOME_CONFIRMED"
    assert verify_export.verify_file(tmp_path / "c.jsonl").ok
    none = records(export(tmp_path, name="n.jsonl", tool="charge_card"))
    assert none[-1]["row_count"] == 0
    assert verify_export.verify_file(tmp_path / "n.jsonl").ok
    future = records(export(tmp_path, name="f.jsonl", since="2999-01-01"))
    assert future[-1]["row_count"] == 0
    everything = records(
        export(tmp_path, name="e.jsonl", since="2000-01-01", until="2999-01-01T00:00:00Z")
    )
    assert everything[-1]["row_count"] == AttemptEvent.objects.count()
    for bad in (
        {"state": "DONE"},
        {"since": "yesterday"},
        {"since": "2030-01-01", "until": "2020-01-01"},
    ):
        with pytest.raises(CommandError):
            export(tmp_path, name="bad.jsonl", **bad)


def test_csv_export_is_formula_safe_and_verifies(history, tmp_path):
    path = export(tmp_path, "csv")
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == verify_export.CSV_COLUMNS
    for row in rows[1:]:
        for cell in row:
            assert not cell or cell[0] not in "=+-@\t\r", row
    reasons = [row[verify_export.CSV_COLUMNS.index("reason")] for row in rows[1:]]
    assert "'=cmd|' /C calc'!A0" in reasons
    assert 'He said "stop, now",\nthen left; ünïcode ✓' in reasons
    assert 'odd \x01 "byte"' in reasons
    manifest = json.loads((tmp_path / "audit.csv.manifest.json").read_text())
    assert manifest["row_count"] == len(rows) - 1 and manifest["complete_chains"] is True
    result = offline(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_editing_a_csv_export_names_the_row(history, tmp_path):
    path = export(tmp_path, "csv")
    content = lines(path)
    content[4] = content[4].replace("test-agent", "someone-else", 1)
    event_id = int(content[4].split(",", 1)[0])
    problem = first_problem(write(path, content))
    assert problem.kind == "content" and problem.event_id == event_id
    report = verify_export.verify_file(path)
    assert any("SHA-256" in p.message for p in report.problems)


def test_deleting_a_csv_row_names_the_gap(history, tmp_path):
    path = export(tmp_path, "csv")
    content = lines(path)
    column = verify_export.CSV_COLUMNS.index("attempt_id")
    rows = list(csv.reader(content[1:]))
    victim = rows[1][column]
    after = next(int(r[0]) for r in rows[2:] if r[column] == victim)
    del content[2]
    report = verify_export.verify_file(write(path, content))
    link = [p for p in report.problems if p.kind == "link"]
    assert link and link[0].event_id == after


def test_plan_is_pinned_to_the_head(history, world, tmp_path):
    plan = audit_export.plan_export(user=None, filters=audit_export.ExportFilters())
    before = plan.count()
    build_history(world, 1, prefix="late")
    assert plan.count() == before
    assert audit_export.csv_manifest(plan)["row_count"] == before


def _seal_before_the_log() -> Checkpoint:
    """A format-1 checkpoint over every attempt's head, as a ledger sealed before the log has."""
    from attempts import chain
    from attempts.models import Attempt

    rows = sorted(Attempt.objects.values_list("attempt_id", "chain_length", "chain_head"))
    config_length, config_head = chain.config_head_now()
    old = sealed_before_the_log(rows, config_length=config_length, config_head=config_head)
    Attempt.objects.update(sealed=True)
    return old


def test_heads_sealed_before_the_log_are_proved_from_their_own_checkpoint(history, world, tmp_path):
    from attempts import chain

    old = _seal_before_the_log()
    recs = records(export(tmp_path))
    assert [r["checkpoint"] for r in recs if r["type"] == "seal"] == [old.seq] * 6
    assert offline(tmp_path / "audit.jsonl").returncode == 0
    # The next seal takes one of them into the log: it is proved into the new checkpoint, and
    # the others still from the old one's tree, which the file now carries as well.
    new = chain.seal(limit=1)
    assert new is not None and new.size == 1
    recs = records(export(tmp_path, name="after.jsonl"))
    seals = [r for r in recs if r["type"] == "seal"]
    assert sorted(r["checkpoint"] for r in seals) == [old.seq] * 5 + [new.seq]
    assert [r["seq"] for r in recs if r["type"] == "checkpoint"] == [old.seq, new.seq]
    assert recs[-1]["seal_count"] == 6
    result = offline(tmp_path / "after.jsonl")
    assert result.returncode == 0, result.stdout
    # An attempt written to since is proved once, at its new head, never at its old one; logged
    # heads are proved into the newest checkpoint.
    (logged,) = [r["attempt_id"] for r in seals if r["checkpoint"] == new.seq]
    moved = next(a for a in history if a.attempt_id != logged)
    review.add_note(moved, user=world.operator, text="after the old seal")
    newest = chain.seal(limit=1)
    recs = records(export(tmp_path, name="moved.jsonl"))
    seals = {r["attempt_id"]: r for r in recs if r["type"] == "seal"}
    moved.refresh_from_db()
    assert len(seals) == recs[-1]["seal_count"] == 6
    assert seals[moved.attempt_id]["checkpoint"] == newest.seq
    assert seals[moved.attempt_id]["head"] == moved.chain_head
    assert sorted(r["checkpoint"] for r in seals.values()) == [old.seq] * 4 + [newest.seq] * 2
    assert offline(tmp_path / "moved.jsonl").returncode == 0
