"""The arguments the upstream will act on, from what the model sent and the tool's
``inputSchema`` (JSON Schema), before anything is recorded.

Models often send ``"7"`` for an integer field, or fields the tool does not take. The ledger must
hash what the upstream acts on, or a lookup after a crash finds the right effect under a
different payload hash. So the gateway:

1. coerces where the schema says how, and only where the value is unambiguous: a string holding
   an integer for ``"type": "integer"`` (``"7"`` -> 7; ``"7.5"`` is refused), a number for
   ``"number"``, ``"true"``/``"false"`` for ``"boolean"``; inside nested objects and arrays too;
2. drops the fields an object schema with ``"additionalProperties": false`` does not list;
3. validates the result with the ``jsonschema`` library (the ``mcp`` extra installs it), and
   refuses a call that still does not fit with the validator's message and path.

A value whose type the schema leaves open (``anyOf``, several types) is left as sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["SchemaMissing", "SchemaRefusal", "conform"]

_INTEGER = re.compile(r"-?(0|[1-9][0-9]{0,17})")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class SchemaRefusal(ValueError):
    """The arguments do not fit the tool's input schema, even coerced."""


class SchemaMissing(RuntimeError):
    """The jsonschema library is not installed."""


def _validator_for(schema: Mapping[str, Any]) -> Any:
    try:
        import jsonschema  # type: ignore[import-untyped]  # no inline types; stubs not a dependency
    except ImportError:
        raise SchemaMissing(
            "the MCP gateway validates tool arguments with the jsonschema library: "
            "pip install 'ledgerweb-client[mcp]'"
        ) from None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaRefusal(
            f"the upstream tool's inputSchema is not valid: {exc.message}"
        ) from None
    return cls(schema)


def _single_type(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    return None


def _coerce(value: Any, schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return value
    kind = _single_type(schema)
    if kind == "integer" and isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    if kind == "number" and isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        return int(text) if _INTEGER.fullmatch(text) else float(text)
    if kind == "boolean" and isinstance(value, str) and value.strip() in ("true", "false"):
        return value.strip() == "true"
    if kind == "object" and isinstance(value, dict):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        out = {}
        for name, item in value.items():
            if name in properties:
                out[name] = _coerce(item, properties[name])
            elif schema.get("additionalProperties") is False:
                continue  # the upstream does not take it: not recorded, not sent
            else:
                extra = schema.get("additionalProperties")
                out[name] = _coerce(item, extra) if isinstance(extra, Mapping) else item
        return out
    if kind == "array" and isinstance(value, list):
        items = schema.get("items")
        return [_coerce(item, items) for item in value] if isinstance(items, Mapping) else value
    return value


def conform(arguments: dict[str, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The arguments as the upstream will act on them (see the module docstring); raises
    SchemaRefusal when they do not fit, SchemaMissing without the jsonschema library."""
    if not schema:
        return dict(arguments)
    validator = _validator_for(schema)
    conformed: dict[str, Any] = _coerce(  # the schema's type is "object": a dict stays one
        dict(arguments), {**schema, "type": schema.get("type", "object")}
    )
    errors = sorted(validator.iter_errors(conformed), key=lambda e: list(e.absolute_path))
    if errors:
        problems = []
        for error in errors[:5]:
            where = "/".join(str(part) for part in error.absolute_path) or "(arguments)"
            problems.append(f"{where}: {error.message}")
        raise SchemaRefusal("arguments do not fit the tool's inputSchema: " + "; ".join(problems))
    return conformed
