#!/usr/bin/env python3
"""Check a ledgerweb audit export without ledgerweb, Django or a database.

An auditor who does not trust the server copies this one file and runs::

    python verify_export.py audit.jsonl [--expect-head HASH ...]
    python verify_export.py audit.csv [--manifest audit.csv.manifest.json]

It needs only the Python standard library and the ``rfc8785`` package (the RFC 8785 JSON
canonicalization the chain hashes). It recomputes every event's hash from its fields, follows the
``prev_hash`` links in event-id order, checks the manifest (row count, first and last event, head
hash, and for CSV the file's SHA-256), and names the first broken link. Exit status 0 means the
export verifies; 1 means it does not; 2 means it could not be read.

The same ``ChainChecker`` walks the live database in ``attempts.audit_verify``, so the export and
the database are judged by one algorithm. See docs/audit-chain.md for what it proves.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rfc8785

GENESIS = "0" * 64
CHAIN_FORMAT = 1
EXPORT_FORMAT = "ledgerweb-audit-export"
EXPORT_VERSION = 1

# The fields an event's hash covers (with ``v`` and ``prev_hash``); everything else in an export
# row (tenant, tool, the attempt's current state) is a convenience copy and is not proven.
HASHED_FIELDS = (
    "attempt_id",
    "action",
    "actor_kind",
    "actor",
    "from_state",
    "to_state",
    "reason",
    "details",
    "created_at",
)
# CSV columns, in order. The first columns are the hashed ones so a reader sees the proof first.
CSV_COLUMNS = (
    "event_id",
    *HASHED_FIELDS,
    "prev_hash",
    "hash",
    "tenant",
    "tool_name",
    "idempotency_key",
    "attempt_state",
    "provider_request_id",
)
# A cell starting with one of these is read as a formula by spreadsheets; it gets a leading quote.
# A leading quote is itself quoted so the escaping can be undone exactly.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


def chain_time(value: Any) -> str:
    """The one text form of a timestamp inside the chain: UTC, microseconds, ``Z``.

    Accepts a datetime, the chain's own text form, or the text SQLite stores
    (``YYYY-MM-DD HH:MM:SS[.ffffff]`` in UTC).
    """
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    text = str(value)
    if len(text) == 27 and text[10] == "T" and text.endswith("Z"):
        return text
    if len(text) == 26 and text[10] == " ":  # SQLite with microseconds: the common case, fast
        return f"{text[:10]}T{text[11:]}Z"
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return chain_time(parsed)


def event_payload(row: dict[str, Any]) -> dict[str, Any]:
    """What an event's hash covers. Must equal ``attempts.audit.event_payload`` (a test checks)."""
    return {
        "v": CHAIN_FORMAT,
        "attempt_id": row["attempt_id"],
        "action": row["action"],
        "actor_kind": row["actor_kind"],
        "actor": row["actor"],
        "from_state": row["from_state"],
        "to_state": row["to_state"],
        "reason": row["reason"],
        "details": row["details"],
        "created_at": chain_time(row["created_at"]),
        "prev_hash": row["prev_hash"],
    }


def event_hash(row: dict[str, Any]) -> str:
    """Recompute an event's hash from its fields."""
    return hashlib.sha256(rfc8785.dumps(event_payload(row))).hexdigest()


def escape_cell(value: str) -> str:
    """Make a text cell safe to open in a spreadsheet (no formula injection), reversibly."""
    if value and value[0] in FORMULA_STARTS:
        return "'" + value
    return value


def unescape_cell(value: str) -> str:
    return value[1:] if value.startswith("'") else value


@dataclass(frozen=True)
class Problem:
    """One thing that does not verify, naming the event (or line) where it shows."""

    kind: str
    message: str
    event_id: int | None = None
    attempt_id: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.event_id is not None:
            where.append(f"event {self.event_id}")
        if self.attempt_id:
            where.append(f"attempt {self.attempt_id}")
        return f"[{self.kind}] {', '.join(where) + ': ' if where else ''}{self.message}"


@dataclass
class ChainChecker:
    """Walks events in id order and records every place the chain does not hold.

    ``start_prev`` is the ``prev_hash`` the first event must carry (GENESIS for a whole ledger;
    None when the first event of an export segment is taken as its anchor).
    """

    start_prev: str | None = GENESIS
    max_problems: int = 50
    problems: list[Problem] = field(default_factory=list)
    count: int = 0
    full_count: int = 0
    last_id: int | None = None
    last_hash: str | None = None
    first_id: int | None = None
    first_hash: str | None = None
    # Head hashes kept elsewhere that must appear in the chain; ``found`` collects those seen.
    anchors: frozenset[str] = frozenset()
    found: set[str] = field(default_factory=set)
    truncated: bool = False

    def problem(self, problem: Problem) -> None:
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)
        else:
            self.truncated = True

    def _link(
        self,
        event_id: int,
        attempt_id: str | None,
        prev_hash: str,
        line: int | None,
        check_link: bool = True,
    ) -> None:
        if self.last_id is not None and event_id <= self.last_id:
            self.problem(
                Problem(
                    "order",
                    f"event ids go backwards ({event_id} after {self.last_id}): "
                    "history was reordered",
                    event_id,
                    attempt_id,
                    line,
                )
            )
        expected = self.last_hash if self.last_id is not None else self.start_prev
        if check_link and expected is not None and prev_hash != expected:
            if self.last_id is None:
                message = (
                    f"the first event's prev_hash is {prev_hash[:16]}…, not the chain's start "
                    f"{expected[:16]}…: events before it were deleted"
                )
            else:
                message = (
                    f"broken link after event {self.last_id}: this event records prev_hash "
                    f"{prev_hash[:16]}… but event {self.last_id} has hash {expected[:16]}…; "
                    f"event {self.last_id} or this one was changed, or events between them "
                    "were deleted, inserted or reordered"
                )
            self.problem(Problem("link", message, event_id, attempt_id, line))

    def _advance(self, event_id: int, stored_hash: str) -> None:
        if self.first_id is None:
            self.first_id, self.first_hash = event_id, stored_hash
        self.last_id, self.last_hash = event_id, stored_hash
        self.count += 1
        if stored_hash in self.anchors:
            self.found.add(stored_hash)

    def full(
        self, row: dict[str, Any], *, line: int | None = None, check_link: bool = True
    ) -> None:
        """Check one event whose hashed fields are all present (``check_link`` False: its own
        hash and its order only, for an export whose filter left events out between rows)."""
        event_id = int(row["id"])
        attempt_id = row.get("attempt_id")
        self._link(event_id, attempt_id, row["prev_hash"], line, check_link)
        if attempt_id is None:
            self.problem(
                Problem(
                    "orphan",
                    "the event's attempt no longer exists: the attempt was deleted",
                    event_id,
                    None,
                    line,
                )
            )
        else:
            try:
                recomputed = event_hash(row)
            except (TypeError, ValueError, KeyError, rfc8785.CanonicalizationError) as exc:
                recomputed = f"unhashable ({exc})"
            if recomputed != row["hash"]:
                self.problem(
                    Problem(
                        "content",
                        f"the event's fields do not match its hash {str(row['hash'])[:16]}…: "
                        "it was edited",
                        event_id,
                        attempt_id,
                        line,
                    )
                )
        self.full_count += 1
        self._advance(event_id, row["hash"])

    def link_only(self, event_id: int, prev_hash: str, stored_hash: str, *, line: int | None):
        """An event outside an export's filter: only its place in the chain is known."""
        self._link(event_id, None, prev_hash, line)
        self._advance(event_id, stored_hash)


# ---------------------------------------------------------------------------------------------
# Export files


@dataclass
class Report:
    """The outcome of a verification."""

    what: str
    problems: list[Problem]
    events: int = 0
    links: int = 0
    head_hash: str | None = None
    head_id: int | None = None
    notes: list[str] = field(default_factory=list)
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = []
        if self.ok:
            lines.append(
                f"OK: {self.what}: {self.events} events verify"
                + (f" (+{self.links} chain links outside the filter)" if self.links else "")
                + (f"; head {self.head_hash} (event {self.head_id})" if self.head_hash else "")
            )
        else:
            lines.append(f"BROKEN: {self.what}: first broken link: {self.problems[0]}")
            for problem in self.problems[1:]:
                lines.append(f"  also: {problem}")
            if self.truncated:
                lines.append("  (more problems not listed)")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


def anchor_check(checker: ChainChecker) -> None:
    """Report every kept head hash that the chain no longer contains."""
    for anchor in sorted(checker.anchors - checker.found):
        checker.problem(
            Problem(
                "anchor",
                f"the head hash {anchor} kept elsewhere is not in this chain: the event it "
                "named, or history after it, was removed or rewritten",
            )
        )


def verify_jsonl(path: Path, *, anchors: Iterable[str] = ()) -> Report:
    """Verify a JSON Lines export: header, events and links, manifest."""
    checker = ChainChecker(start_prev=None, anchors=frozenset(anchors))
    report = Report(what=str(path), problems=checker.problems)
    header: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    first_event: dict[str, Any] | None = None
    last_event: dict[str, Any] | None = None
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError as exc:
                checker.problem(Problem("format", f"not JSON: {exc}", line=number))
                continue
            if not isinstance(record, dict):
                checker.problem(Problem("format", "a line that is not a JSON object", line=number))
                continue
            kind = record.get("type")
            if manifest is not None:
                checker.problem(
                    Problem(
                        "format", "lines after the manifest: the file was appended to", line=number
                    )
                )
                break
            if kind == "header":
                if header is not None or checker.count:
                    checker.problem(Problem("format", "a second header", line=number))
                header = record
                if record.get("format") != EXPORT_FORMAT or record.get("version") != EXPORT_VERSION:
                    checker.problem(
                        Problem(
                            "format", "not a ledgerweb audit export (format/version)", line=number
                        )
                    )
                continue
            if header is None:
                checker.problem(Problem("format", "the header line is missing", line=number))
                header = {}
            try:
                if kind == "event":
                    missing = [
                        name
                        for name in ("id", *HASHED_FIELDS, "prev_hash", "hash")
                        if name not in record
                    ]
                    if missing:
                        checker.problem(
                            Problem(
                                "format",
                                f"event without {', '.join(missing)}",
                                record.get("id"),
                                record.get("attempt_id"),
                                number,
                            )
                        )
                        continue
                    checker.full(record, line=number)
                    if first_event is None:
                        first_event = record
                    last_event = record
                elif kind == "link":
                    checker.link_only(
                        int(record["id"]), record["prev_hash"], record["hash"], line=number
                    )
                    report.links += 1
                elif kind == "manifest":
                    manifest = record
                else:
                    checker.problem(Problem("format", f"unknown record type {kind!r}", line=number))
            except (KeyError, TypeError, ValueError) as exc:
                checker.problem(Problem("format", f"malformed {kind} record: {exc}", line=number))
    report.events = checker.full_count
    report.head_hash, report.head_id = checker.last_hash, checker.last_id
    if manifest is None:
        checker.problem(
            Problem("manifest", "no manifest line at the end: the export was cut short or edited")
        )
    else:
        _check_manifest(checker, manifest, header or {}, first_event, last_event, report.links)
    anchor_check(checker)
    report.truncated = checker.truncated
    return report


def _event_ref(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"id": int(record["id"]), "hash": record["hash"]}


def _check_manifest(
    checker: ChainChecker,
    manifest: dict[str, Any],
    header: dict[str, Any],
    first_event: dict[str, Any] | None,
    last_event: dict[str, Any] | None,
    links: int,
) -> None:
    def bad(message: str) -> None:
        checker.problem(Problem("manifest", message))

    if manifest.get("row_count") != checker.full_count:
        bad(
            f"the manifest counts {manifest.get('row_count')} events but the file holds "
            f"{checker.full_count}: events were added or removed"
        )
    if "link_count" in manifest and manifest.get("link_count") != links:
        bad(f"the manifest counts {manifest.get('link_count')} chain links, the file {links}")
    for name, record in (("first_event", first_event), ("last_event", last_event)):
        claimed = manifest.get(name)
        actual = _event_ref(record)
        if (claimed and {"id": claimed.get("id"), "hash": claimed.get("hash")}) != actual:
            bad(f"the manifest's {name} {claimed} is not the file's {actual}")
    if manifest.get("head_hash") != checker.last_hash:
        bad(
            f"the manifest's head hash {manifest.get('head_hash')} is not the hash of the last "
            f"event in the file ({checker.last_hash})"
        )
    if header and manifest.get("filters") != header.get("filters"):
        bad("the manifest's filters differ from the header's")


def _csv_row(record: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {name: unescape_cell(record.get(name) or "") for name in CSV_COLUMNS}
    row["id"] = int(row.pop("event_id"))
    row["details"] = json.loads(row["details"] or "{}")
    return row


def verify_csv(
    path: Path, *, manifest_path: Path | None = None, anchors: Iterable[str] = ()
) -> Report:
    """Verify a CSV export and, when present, its ``.manifest.json``.

    Each row's hash is recomputed and event ids must rise. When the manifest says the export is
    contiguous (no filter left events out), every ``prev_hash`` link is followed too; otherwise the
    manifest's SHA-256 of the file is what shows a row was removed.
    """
    manifest_path = manifest_path or path.with_name(path.name + ".manifest.json")
    manifest: dict[str, Any] | None = None
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    contiguous = bool(manifest and manifest.get("contiguous"))
    checker = ChainChecker(start_prev=None, anchors=frozenset(anchors))
    report = Report(what=str(path), problems=checker.problems)
    first_event = last_event = None
    digest = hashlib.sha256()
    with path.open("rb") as binary:
        for chunk in iter(lambda: binary.read(1 << 20), b""):
            digest.update(chunk)
    csv.field_size_limit(1 << 30)  # details and reasons may be long; the default is 128 KiB
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
            checker.problem(
                Problem("format", "the header row is not a ledgerweb audit export", line=1)
            )
            report.truncated = checker.truncated
            return report
        for record in reader:
            number = reader.line_num
            try:
                row = _csv_row(record)
            except (ValueError, TypeError) as exc:
                checker.problem(Problem("format", f"malformed row: {exc}", line=number))
                continue
            checker.full(row, line=number, check_link=contiguous)
            if first_event is None:
                first_event = row
            last_event = row
    report.events = checker.full_count
    report.head_hash, report.head_id = checker.last_hash, checker.last_id
    if manifest is None:
        report.notes.append(
            f"no manifest at {manifest_path}: rows were checked one by one, but a removed row "
            "would not show"
        )
    else:
        _check_manifest(checker, manifest, {}, first_event, last_event, 0)
        if manifest.get("sha256") and manifest["sha256"] != digest.hexdigest():
            checker.problem(
                Problem(
                    "manifest",
                    f"the file's SHA-256 {digest.hexdigest()} is not the manifest's "
                    f"{manifest['sha256']}: the file was changed after export",
                )
            )
    anchor_check(checker)
    report.truncated = checker.truncated
    return report


def verify_file(
    path: Path, *, manifest_path: Path | None = None, anchors: Iterable[str] = ()
) -> Report:
    """Verify an export, choosing the reader by content (JSON Lines or CSV)."""
    with path.open("rb") as handle:
        start = handle.read(1)
    if start == b"{":
        return verify_jsonl(path, anchors=anchors)
    return verify_csv(path, manifest_path=manifest_path, anchors=anchors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="verify_export.py",
        description="Verify a ledgerweb audit export (JSON Lines or CSV) offline: recompute each "
        "event's hash, follow the chain, check the manifest, and name the first broken link.",
    )
    parser.add_argument("file", type=Path, help="the exported .jsonl or .csv file")
    parser.add_argument(
        "--manifest", type=Path, help="the CSV's manifest (default: FILE.manifest.json)"
    )
    parser.add_argument(
        "--expect-head",
        action="append",
        default=[],
        metavar="HASH",
        help="a head hash kept elsewhere (e.g. from an earlier export) that must be in the chain",
    )
    args = parser.parse_args(argv)
    try:
        report = verify_file(args.file, manifest_path=args.manifest, anchors=args.expect_head)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
