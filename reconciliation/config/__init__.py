"""Configuration as code: one TOML file for tenants, tools, grants, users and their roles,
ownership rules and SSO group mappings (docs/config.md, schema docs/config.schema.json).

``plan(document)`` compares the file with the database; ``apply(document, actor=...)`` makes every
change in one write transaction, or none, and records each one in the verified configuration
history (``attempts.config_history``, row by row); ``dump()`` writes today's state in the same
format, so ``apply(dump())`` changes nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, IntegrityError

from attempts.states import Actor
from ledgerweb.cli import command_line
from reconciliation.config.document import FORMAT_VERSION, ConfigError, Document, read
from reconciliation.config.sections import (
    CREATE,
    REMOVE,
    SECTIONS,
    UPDATE,
    By,
    Change,
    Refused,
    Section,
)

__all__ = ["ConfigError", "Document", "Plan", "apply", "dump", "plan", "read"]


@dataclass
class Plan:
    """What applying a file changes, in the order it is done."""

    changes: list[Change] = field(default_factory=list)
    unchanged: int = 0
    warnings: list[str] = field(default_factory=list)
    # What a change would do, said beside it (approval policies: the attempts they would hold).
    notes: list[str] = field(default_factory=list)

    def ordered(self) -> list[Change]:
        order = {section.name: index for index, section in enumerate(SECTIONS)}
        kept = [c for c in self.changes if c.action != REMOVE]
        removed = [c for c in self.changes if c.action == REMOVE]
        removed.sort(key=lambda c: -order[c.section.name])
        return kept + removed

    def lines(self) -> list[str]:
        lines = [change.describe() for change in self.ordered()]
        lines += [f"warning: {warning}" for warning in self.warnings]
        lines += [f"note: {note}" for note in self.notes]
        counts = {action: 0 for action in (CREATE, UPDATE, REMOVE)}
        for change in self.changes:
            counts[change.action] += 1
        summary = ", ".join(f"{count} {action}" for action, count in counts.items())
        lines.append(f"{summary}, {self.unchanged} unchanged")
        return lines


def plan(document: Document) -> Plan:
    """The changes applying ``document`` would make; ConfigError (with lines) if it cannot be
    applied as a whole."""
    result = Plan()
    problems: list[tuple[int | None, str]] = []
    # Keys each section will have once the file is applied, for reference checks.
    final: dict[str, set[str]] = {}
    # Each section's entries once the file is applied, for checks across sections.
    state: dict[str, dict[str, dict[str, Any]]] = {}
    entries: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for section in SECTIONS:
        current = section.current()
        keys = set(current)
        state[section.name] = dict(current)
        seen: dict[str, int] = {}
        for index, entry in enumerate(document.entries(section.name)):
            where = (section.name, index)
            key = section.key(entry)
            if key in seen:
                problems.append(
                    document.error(
                        where,
                        f"{section.noun} {key} is listed twice (first at line "
                        f"{document.line_of((section.name, seen[key]))})",
                    )
                )
                continue
            seen[key] = index
            if entry.get("remove"):
                if key in current:
                    result.changes.append(Change(section, key, REMOVE, current[key], None, where))
                    keys.discard(key)
                    state[section.name].pop(key, None)
                continue
            normal = section.normalize(entry)
            for name, message in section.problems(normal):
                problems.append(
                    document.error(
                        where + ((name,) if name else ()), f"{section.noun} {key}: {message}"
                    )
                )
            result.warnings += [
                f"{section.noun} {key}: {text}" for text in section.warnings(normal)
            ]
            entries.setdefault(section.name, []).append((index, normal))
            state[section.name][key] = normal
            result.notes += getattr(section, "notes", lambda _: [])(normal)
            before = current.get(key)
            if before is None:
                result.changes.append(Change(section, key, CREATE, None, normal, where))
                keys.add(key)
            elif before != normal:
                result.changes.append(Change(section, key, UPDATE, before, normal, where))
            else:
                result.unchanged += 1
        final[section.name] = keys
    for section in SECTIONS:
        for index, normal in entries.get(section.name, []):
            problems += _reference_problems(document, section, index, normal, final)
            for name, message in section.final_problems(normal, state):
                where = (section.name, index) + ((name,) if name else ())
                problems.append(
                    document.error(where, f"{section.noun} {section.key(normal)}: {message}")
                )
    if problems:
        raise ConfigError(document.path, problems)
    return result


def _reference_problems(
    document: Document,
    section: Section,
    index: int,
    entry: dict[str, Any],
    final: dict[str, set[str]],
) -> list[tuple[int | None, str]]:
    where = (section.name, index)
    key = section.key(entry)
    problems = []
    for name, target in section.references.items():
        # A field may name several (a list), none (None: optional), or all ("*" where the
        # section says so: ``wildcard_fields``).
        value = entry[name]
        named = value if isinstance(value, list) else [value]
        for item in named:
            if item is None or (item == "*" and name in getattr(section, "wildcard_fields", ())):
                continue
            if item not in final.get(target, set()):
                noun = next(s.noun for s in SECTIONS if s.name == target)
                problems.append(
                    document.error(
                        where + (name,),
                        f"{section.noun} {key}: unknown {noun} {item!r} (add it under "
                        f"[[{target}]] or correct the name)",
                    )
                )
    for tenant in getattr(section, "tenants_named", lambda _: [])(entry):
        if tenant not in final["tenants"]:
            problems.append(
                document.error(
                    where + ("roles",),
                    f"{section.noun} {key}: unknown tenant {tenant!r} in roles (add it under "
                    "[[tenants]])",
                )
            )
    return problems


def applied_by(name: str | None) -> Actor:
    """Who applies a file, as the history records it: ``name``, else the operating-system
    user running the command. ValueError when neither is usable."""
    from attempts.config_history import operator

    return operator(name)


def apply(document: Document, *, actor: Actor, reason: str = "") -> Plan:
    """Make every change of ``document`` in one write transaction, recording each in the
    configuration history with ``actor``; on any error nothing is changed (ConfigError)."""
    from attempts.config_history import acting
    from attempts.locking import write_transaction

    by = By(actor, reason or f"ledger_config apply {document.path}")
    # Each row a change creates, updates or removes is recorded by the model's own history
    # (attempts.config_history), as ``actor``'s.
    with acting(actor, by.reason), write_transaction():
        result = plan(document)
        for change in result.ordered():
            try:
                _make(change, by)
            except Refused as exc:
                raise ConfigError(document.path, [document.error(change.where, str(exc))]) from None
            except (IntegrityError, DatabaseError) as exc:
                message = f"{change.section.noun} {change.key}: the database refused it: {exc}"
                raise ConfigError(document.path, [document.error(change.where, message)]) from None
    return result


def _make(change: Change, by: By) -> str:
    section = change.section
    if change.action == CREATE:
        return section.create(change.after, by)
    if change.action == UPDATE:
        return section.update(change.key, change.before, change.after, by)
    return section.remove(change.key, change.before, by)


def dump() -> str:
    """Today's configuration as a file ``apply`` accepts (and finds nothing to change in)."""
    out = [
        "# ledgerweb configuration (docs/config.md; schema: docs/config.schema.json).",
        f"# Passwords are never here: each person sets theirs "
        f"({command_line('password_link USERNAME')}).",
        f"version = {FORMAT_VERSION}",
    ]
    for section in SECTIONS:
        for entry in section.current().values():
            out.append("")
            out.append(f"[[{section.name}]]")
            for name, value in section.dump_entry(entry).items():
                out.append(f"{_toml_key(name)} = {_toml_value(value)}")
    return "\n".join(out) + "\n"


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    """TOML for the values a configuration holds (JSON's string escapes are TOML's too)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"no TOML form for {value!r}")
