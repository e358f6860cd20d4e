"""Redaction of secret argument fields (``LEDGER['REDACT_FIELDS']``): the one home of what a
person may see of an attempt's arguments, on the dashboard and in chat alike."""

from __future__ import annotations

from typing import Any

from django.conf import settings

REDACTED = "•••• redacted ••••"


def _is_secret(key: str, names: list[str]) -> bool:
    lowered = key.lower()
    return any(name and name.lower() in lowered for name in names)


def redact(value: Any, names: list[str] | None = None) -> tuple[Any, int]:
    """A copy of ``value`` with every field whose name contains a configured secret name
    (``LEDGER['REDACT_FIELDS']``, case-insensitive) replaced; returns (copy, fields redacted)."""
    names = settings.LEDGER["REDACT_FIELDS"] if names is None else names
    count = 0

    def walk(node: Any) -> Any:
        nonlocal count
        if isinstance(node, dict):
            out = {}
            for key, item in node.items():
                if _is_secret(str(key), names):
                    out[key] = REDACTED
                    count += 1
                else:
                    out[key] = walk(item)
            return out
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(value), count


def unredact(edited: Any, original: Any, names: list[str] | None = None) -> Any:
    """``edited`` (what a person typed over a ``redact``-ed copy of ``original``) with every
    secret field still showing the redaction mark given back its original value: a person may
    replace a secret, never read it, and leaving it as shown keeps it unchanged."""
    names = settings.LEDGER["REDACT_FIELDS"] if names is None else names
    if isinstance(edited, dict) and isinstance(original, dict):
        out = {}
        for key, item in edited.items():
            if item == REDACTED and key in original and _is_secret(str(key), names):
                out[key] = original[key]
            else:
                out[key] = unredact(item, original.get(key), names)
        return out
    if isinstance(edited, list) and isinstance(original, list):
        return [
            unredact(item, original[i] if i < len(original) else None, names)
            for i, item in enumerate(edited)
        ]
    return edited
