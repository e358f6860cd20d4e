"""Argument normalization and the RFC 8785 (JCS) hash that names an attempt's payload.

``args_hash`` is the lowercase hex SHA-256 of the JCS canonical JSON of the normalized arguments,
so the same logical arguments always hash the same whatever key order or number spelling the
agent used, and any other arguments hash differently.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from attempts import jcs

MAX_DEPTH = 32


class InvalidArguments(ValueError):
    """The arguments cannot be recorded: not a JSON object, too large, or not representable."""

    def __init__(self, message: str, *, code: str = "invalid_args") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class CanonicalArgs:
    value: dict[str, Any]
    canonical: bytes
    args_hash: str


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 canonical JSON of ``value``; raises InvalidArguments for what JCS cannot carry."""
    try:
        return jcs.dumps(value)
    except jcs.IntegerDomainError as exc:
        raise InvalidArguments(
            f"integer out of the interoperable range (|n| <= 2**53 - 1): {exc}"
        ) from None
    except jcs.FloatDomainError as exc:
        raise InvalidArguments(f"number not representable in JSON: {exc}") from None
    except (jcs.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidArguments(f"arguments are not JSON: {exc}") from None


def hash_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Every number, integer or not, within the range where JSON parsers agree on it exactly
# (I-JSON, RFC 7493): 1e20 and 100000000000000000000 are the same number to JSON Schema and to
# most parsers, so both are refused alike (docs/openapi.json says so).
MAX_NUMBER = 2**53 - 1
# PostgreSQL's jsonb cannot hold U+0000, so no database may: the same args are accepted (or not)
# whatever the ledger runs on.
NUL_REFUSED = "strings and keys in args must not contain U+0000 (NUL)"


def _check_depth(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise InvalidArguments(f"arguments nest deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArguments("object keys must be strings")
            if "\x00" in key:
                raise InvalidArguments(NUL_REFUSED)
            _check_depth(item, depth + 1)
    elif isinstance(value, str):
        if "\x00" in value:
            raise InvalidArguments(NUL_REFUSED)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_depth(item, depth + 1)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not -MAX_NUMBER <= value <= MAX_NUMBER:
            raise InvalidArguments(
                f"number out of the interoperable range (|n| <= 2**53 - 1): {value!r}"
            )


def normalize_args(args: Any, *, max_bytes: int | None = None) -> CanonicalArgs:
    """Validate ``args`` and return its normalized value, canonical bytes and hash.

    The normalized value is the canonical bytes parsed back, so what is stored is exactly what
    was hashed (tuples become lists, 1.0 becomes 1, and so on).
    """
    if not isinstance(args, dict):
        raise InvalidArguments("args must be a JSON object", code="args_not_object")
    _check_depth(args)
    data = canonical_bytes(args)
    limit = max_bytes if max_bytes is not None else settings.LEDGER["MAX_ARGS_BYTES"]
    if len(data) > limit:
        raise InvalidArguments(
            f"args are {len(data)} bytes of canonical JSON; the limit is {limit}",
            code="args_too_large",
        )
    return CanonicalArgs(value=json.loads(data), canonical=data, args_hash=hash_bytes(data))
