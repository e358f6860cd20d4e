"""RFC 8785 (JCS) canonical JSON bytes, fast for the values the ledger hashes on every write.

The ``rfc8785`` package is the reference here, and it is pure Python: on the write path it
was one of the largest costs of an intent (the args hash and the chain hash of the first event;
docs/scaling.md). Most values
are plain: objects with string keys, arrays, strings, booleans, null and integers in the
interoperable range. For those, the standard library's C encoder with sorted keys and no
whitespace writes exactly JCS's bytes:

- key order: Python compares code points, JCS compares UTF-16 code units; the two orders differ
  only between a character above U+FFFF and one in U+E000..U+FFFF, so keys with characters above
  U+FFFF go to the reference;
- strings: both escape ``"``, ``\\``, the five short control escapes and the other control
  characters as lowercase ``\\u00xx``, and write everything else as UTF-8 (a lone surrogate fails
  the UTF-8 encoding, and then the reference gives its own error);
- integers within +-(2**53 - 1) print the same in both.

Everything else (floats, which JCS prints the ECMAScript way; larger integers; subclasses of
int; keys above U+FFFF) goes through ``rfc8785`` unchanged. The differential tests in
``tests/attempts/test_jcs.py`` hold both paths to the same bytes on generated values.
"""

from __future__ import annotations

import json
from typing import Any

import rfc8785

CanonicalizationError = rfc8785.CanonicalizationError
IntegerDomainError = rfc8785.IntegerDomainError
FloatDomainError = rfc8785.FloatDomainError

_INT_LIMIT = 2**53 - 1
# Deeper values are rare and take the reference path (which has no depth shortcut to trip).
_FAST_DEPTH = 64

_encoder = json.JSONEncoder(
    ensure_ascii=False,
    sort_keys=True,
    separators=(",", ":"),
    allow_nan=False,
)
_encode = _encoder.encode
# The encoder's C core, built once: ``JSONEncoder.encode`` builds it again on every call, which
# cost a verifier more than the encoding itself. Without circular-reference markers, which
# ``_plain`` makes unneeded (it gives up past _FAST_DEPTH, so a cycle takes the reference path).
try:
    from json.encoder import c_encode_basestring as _c_string
    from json.encoder import c_make_encoder as _c_make_encoder
except ImportError:  # an interpreter without the C accelerator
    _c_string = _c_make_encoder = None
if _c_make_encoder is not None and _c_string is not None:
    _c_encode = _c_make_encoder(
        None, _encoder.default, _c_string, None, ":", ",", True, False, False
    )

    def encode_plain_text(value: Any) -> str:
        """``encode_plain`` as text."""
        return "".join(_c_encode(value, 0))

    encode_string = _c_string
else:  # pragma: no cover - CPython always has it
    encode_plain_text = _encode
    encode_string = json.encoder.py_encode_basestring


def _astral(text: str) -> bool:
    return any(ord(char) > 0xFFFF for char in text)


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is made only of what the C encoder writes exactly as JCS does."""
    kind = type(value)
    if kind is dict:
        if depth >= _FAST_DEPTH:
            return False
        # The keys at once: joined, they are text only if each is a string, and ASCII only if
        # each is (the common case; else each non-ASCII key is looked at for astral characters).
        try:
            keys = "".join(value)
        except TypeError:
            return False
        if not keys.isascii() and any(_astral(key) for key in value):
            return False
        items = value.values()
    elif kind is list or kind is tuple:
        if depth >= _FAST_DEPTH:
            return False
        items = value
    else:
        return _plain_leaf(value)
    for item in items:
        kind = type(item)
        # The commonest leaves without a call; the rest as _plain_leaf says, containers within.
        if kind is str or item is None or kind is bool:
            continue
        if not _plain_leaf(item) and not _plain(item, depth + 1):
            return False
    return True


def _plain_leaf(value: Any) -> bool:
    """A scalar the C encoder writes as JCS does (False for containers: the caller recurses).

    A str subclass (the ledger's state and actor-kind enums) is written from its characters by
    both encoders; int subclasses and everything else go to the reference."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -_INT_LIMIT <= value <= _INT_LIMIT
    return isinstance(value, str)


def dumps(value: Any) -> bytes:
    """The RFC 8785 canonical JSON of ``value``; raises what ``rfc8785.dumps`` raises."""
    if _plain(value):
        try:
            return encode_plain_text(value).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: let the reference refuse it in its own words
    return rfc8785.dumps(value)


def plain(value: Any) -> bool:
    """Whether ``encode_plain`` writes ``value`` exactly as RFC 8785 does (see above)."""
    return _plain(value)


def encode_plain(value: Any) -> bytes:
    """The C encoder's bytes for a value the caller checked with ``plain`` (or knows to be made
    of plain parts: a verifier checks only the one free-form field of a record); raises
    UnicodeEncodeError for a lone surrogate."""
    return encode_plain_text(value).encode("utf-8")
