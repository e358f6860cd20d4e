"""The verifier's fast digests: each event's hash, leaf and args digest written with the fast
encoder (``attempts.jcs``) where its bytes are known to be RFC 8785's, the reference encoder
(``verify_export``, ``rfc8785``) otherwise and before any mismatch is reported. Held to the
reference by tests/attempts/test_jcs.py."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from itertools import islice
from typing import Any

import rfc8785

from attempts import jcs
from attempts.verify_export import (
    GENESIS,
    PUBLIC_DETAILS,
    SALTED_FORMAT,
    chain_time,
    leaf_hash,
    salted_payload,
    split_details,
)

_scan_json = json.JSONDecoder().scan_once


def load_json(value: Any) -> Any:
    """A JSON column as Python: SQLite gives text, psycopg may give text or parsed values."""
    if type(value) is str:
        # The decoder's C scanner, without ``json.loads``' per-call set-up: a column written by
        # the ledger is one JSON value with no surrounding space; anything else takes loads.
        try:
            parsed, end = _scan_json(value, 0)
        except StopIteration:
            return json.loads(value)  # raises the decoder's own error
        return parsed if end == len(value) else json.loads(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return load_json(bytes(value).decode("utf-8"))
    if isinstance(value, str):
        return json.loads(value)
    return value


def event_time(value: Any) -> dt.datetime:
    return dt.datetime.fromisoformat(chain_time(value).replace("Z", "+00:00"))


_string = jcs.encode_string
_sha256 = hashlib.sha256
_encode_text = jcs.encode_plain_text
# What a format-3 event with no reason and no private details commits to (salted per attempt).
NO_TEXT = jcs.dumps({"details": {}, "reason": ""})


class _NotPlain(Exception):
    pass


def _no_float(text: str) -> Any:
    raise _NotPlain


def _small_int(text: str) -> int:
    # 15 digits are always within JCS's range (below 2**53); longer ones ask jcs.plain.
    if len(text) > 15:
        raise _NotPlain
    return int(text)


_scan_plain = json.JSONDecoder(
    parse_float=_no_float, parse_int=_small_int, parse_constant=_no_float
).scan_once


def load_details(value: Any) -> tuple[Any, bool | None]:
    """An event's ``details`` column as Python, and whether the fast encoder writes it exactly as
    RFC 8785 does (``jcs.plain``), told from the text where that is cheap: ASCII JSON with no
    ``\\u`` escape (so no astral or lone surrogate characters), no number with a fraction or an
    exponent, no integer that could be out of range. None: not known, ask ``jcs.plain``."""
    if type(value) is str and value.isascii() and "\\u" not in value:
        try:
            parsed, end = _scan_plain(value, 0)
        except (_NotPlain, StopIteration):
            return load_json(value), None
        if end == len(value):
            return parsed, True
    return load_json(value), None


def event_payload(attempt_id: Any, event: tuple, details: Any) -> dict[str, Any]:
    """What an event's hash covers (``verify_export.event_payload``), from EVENT_SQL's columns,
    for the reference encoder."""
    payload = {
        "v": int(event[12]),
        "attempt_id": attempt_id,
        "action": event[2],
        "actor_kind": event[3],
        "actor": event[4],
        "from_state": event[5],
        "to_state": event[6],
        "reason": event[7],
        "details": details,
        "created_at": created_text(chain_time(event[9])),
        "prev_hash": event[10],
    }
    if payload["v"] >= SALTED_FORMAT:
        return salted_payload(payload, event[13] or "")
    return payload


def event_digest(
    attempt_id: Any,
    event: tuple,
    details: Any,
    plain: bool | None,
    *,
    text: str | None = None,
    quoted: tuple[str | None, str | None] = (None, None),
) -> str:
    """The event's hash with the fast encoder: the payload's keys are fixed, so its canonical
    text is written in their sorted order here (the bytes ``jcs.encode_plain`` gives for
    ``event_payload``, held to the reference by the tests) rather than sorting the keys of
    every event again. ``text``: a format-3 event's salted text digest (``details`` are then
    its public details; ``quoted``: the attempt id and the prev_hash already written as JSON
    strings, or None). Every field but ``details`` is text (or the format number) as read from
    the database, which the C encoder writes as RFC 8785 does, so only ``details`` needs
    checking (``plain``: known from its text, None: ask ``jcs.plain``); anything else, and a
    field that is not text, goes through ``jcs.dumps``. A mismatch is always recomputed with
    the reference encoder before it is reported."""
    if plain or (plain is None and jcs.plain(details)):
        try:
            quoted_id, quoted_prev = quoted
            prev = quoted_prev or _string(event[10])
            if text is not None:  # format 3: public details and the text digest, no reason
                body = (
                    f'"from_state":{_string(event[5])},"prev_hash":{prev},'
                    f'"text":{_string(text)},"to_state":{_string(event[6])},'
                )
            else:
                body = (
                    f'"from_state":{_string(event[5])},"prev_hash":{prev},'
                    f'"reason":{_string(event[7])},"to_state":{_string(event[6])},'
                )
            payload = (
                f'{{"action":{_string(event[2])},"actor":{_string(event[4])},'
                f'"actor_kind":{_string(event[3])},"attempt_id":{quoted_id or _string(attempt_id)},'
                f'"created_at":{_string(chain_time(event[9]))},'
                f'"details":{jcs.encode_plain_text(details)},{body}"v":{int(event[12])}}}'
            )
            return hashlib.sha256(payload.encode("utf-8")).hexdigest()
        except (TypeError, UnicodeEncodeError):
            pass  # a field that is not text (NULL, say), or a lone surrogate
    return hashlib.sha256(jcs.dumps(event_payload(attempt_id, event, details))).hexdigest()


# Details of one text field as the databases give them back, ``{"name": "text"}``, where the
# text is printable ASCII without a quote or a backslash (and so without an escape).
_one_text = re.compile(r'\{"([a-z_]+)": ?"([ !#-\[\]-~]*)"\}').fullmatch


class Quoted(dict):
    """JSON string literals of the texts events repeat (actions, states, actor kinds, actors),
    written once each; bounded, since actors are as many as the people and agents."""

    def __missing__(self, text: str) -> str:
        if len(self) >= 4096:
            self.clear()
        quoted = self[text] = _string(text)  # TypeError for anything but text
        return quoted


def common_events(
    quoted: Quoted,
    quoted_id: str,
    events: list[tuple],
    start: int,
    key: SaltKey,
    no_text: str,
    hashes: list[str],
    details: list[Any],
) -> int:
    """The events most of a ledger is made of, from ``events[start]`` on while each is one
    (format 3, linked to the hash of the event before it, GENESIS for the first, no reason,
    details in the plain form ``load_details`` recognizes, whose private part, if any, is what
    the text digest commits to under the attempt's ``key``; ``no_text``: that digest when there
    is none) and hashes to its stored hash: written as ``event_digest`` writes them with fewer
    steps, their hashes and details appended to ``hashes`` and ``details``. Returns the index
    of the first event that is not such an event (``len(events)`` when all are), which
    ``event_digest`` and the reference decide. ``quoted_id``: the attempt id as a JSON string."""
    prev = hashes[-1] if hashes else GENESIS
    index = start
    # Each row unpacked at once (EVENT_SQL's fourteen columns), the commonest details read and
    # written inline: this runs for nearly every event of a ledger.
    for (
        _,
        _,
        action,
        actor_kind,
        actor,
        from_state,
        to_state,
        reason,
        text,
        created,
        prev_hash,
        stored,
        v,
        text_digest,
    ) in islice(events, start, None):
        if v != SALTED_FORMAT or reason or prev_hash != prev:
            break
        if text == "{}" and text_digest == no_text:
            value, encoded = {}, "{}"
        elif (
            text_digest == no_text
            and type(text) is str
            and (one := _one_text(text))
            and one[1] in PUBLIC_DETAILS
        ):
            # One public text field (a provider request id, a result reference) that JSON and
            # JCS both write without an escape: its bytes need no encoder.
            value, encoded = {one[1]: one[2]}, f'{{"{one[1]}":"{one[2]}"}}'
        elif (read := _scanned_details(text, key, no_text, text_digest)) is not None:
            value, encoded = read  # a creation event's, say
        else:
            break  # the general path says what is wrong with the details or the text
        if not (
            type(created) is str
            and len(created) == 27
            and created[10] == "T"
            and created[26] == "Z"
        ):
            created = chain_time(created)
        try:
            payload = (
                f'{{"action":{quoted[action]},"actor":{quoted[actor]},'
                f'"actor_kind":{quoted[actor_kind]},"attempt_id":{quoted_id},'
                f'"created_at":{_string(created)},"details":{encoded},'
                f'"from_state":{quoted[from_state]},"prev_hash":"{prev}","text":"{text_digest}",'
                f'"to_state":{quoted[to_state]},"v":3}}'
            ).encode()
        except (TypeError, UnicodeEncodeError):
            break  # a field that is not text, or a lone surrogate
        if _sha256(payload).hexdigest() != stored:
            break
        hashes.append(stored)
        details.append(value)
        prev = stored
        index += 1
    return index


def _scanned_details(
    text: Any, key: SaltKey, no_text: str, text_digest: str
) -> tuple[Any, str] | None:
    """``common_events``' details other than the commonest: read by the JSON scanner when they
    are plain (``load_details``' plain case: ASCII without escapes, no float, no long integer),
    with their public part written as JCS does and their private part, if any, what the text
    digest commits to; None for anything else."""
    if type(text) is not str or not text.isascii() or "\\u" in text:
        return None
    try:
        value, end = _scan_plain(text, 0)
    except (_NotPlain, StopIteration, ValueError):
        return None  # not JSON (SQLite stores text) is for the general path to report
    if end != len(text) or type(value) is not dict:
        return None
    if value.keys() <= PUBLIC_DETAILS:
        return (value, _encode_text(value)) if text_digest == no_text else None
    if value.keys() == _CREATED_KEYS:  # a creation event as ``states.create`` writes it
        try:
            encoded, private = _created_details(value)
        except TypeError:
            return None  # a field of another type than the writer's: the general path
    else:  # public and private parts of any other shape
        public, rest = split_details(value)
        encoded = _encode_text(public)
        # {"details": private, "reason": ""} as JCS writes it (its keys in that order).
        private = b'{"details":' + jcs.encode_plain(rest) + b',"reason":""}'
    return (value, encoded) if key.hex(private) == text_digest else None


# Attempt columns that must equal the creation event's details.
KEY_FIELDS = (
    "tenant",
    "task_id",
    "tool_name",
    "idempotency_key",
    "args_hash",
    "policy_version",
    "credential_scope",
    "parent_attempt_id",
)
# The details of a creation event with nothing optional (``states.create``): its public fields
# and the args hash, its one private field.
_CREATED_KEYS = frozenset({*KEY_FIELDS, "args_digest"})


def _created_details(value: dict[str, Any]) -> tuple[str, bytes]:
    """A creation event's public details as JCS writes them (their keys in its order), and
    what its text digest commits to, ``{"details": {"args_hash": ...}, "reason": ""}``; from
    details ``load_details`` found plain, with the keys ``_CREATED_KEYS``. TypeError for a
    field that is not the writer's type (text; a list of scopes; a parent's id or null), which
    ``_encode_text`` then writes."""
    scope, parent = value["credential_scope"], value["parent_attempt_id"]
    if type(scope) is not list:
        raise TypeError("credential_scope is not a list")
    public = (
        f'{{"args_digest":{_string(value["args_digest"])},'
        f'"credential_scope":{_encode_text(scope) if scope else "[]"},'
        f'"idempotency_key":{_string(value["idempotency_key"])},'
        f'"parent_attempt_id":{"null" if parent is None else _string(parent)},'
        f'"policy_version":{_string(value["policy_version"])},'
        f'"task_id":{_string(value["task_id"])},"tenant":{_string(value["tenant"])},'
        f'"tool_name":{_string(value["tool_name"])}}}'
    )
    private = f'{{"details":{{"args_hash":{_string(value["args_hash"])}}},"reason":""}}'
    return public, private.encode()


def created_text(text: Any) -> Any:
    """The writer's text for an event time PostgreSQL gave as ``to_char`` text: the same, except
    a year before 1000, which ``chain_time`` writes unpadded."""
    if isinstance(text, str) and text.startswith("0") and len(text) == 27:
        return chain_time(event_time(text))
    return text


def leaf_digest(attempt_id: Any, length: Any, head: Any) -> bytes:
    """``leaf_hash`` with the fast encoder (text and a small integer, as JCS writes them)."""
    if type(attempt_id) is str and type(head) is str and attempt_id.isascii() and head.isascii():
        leaf = f'\x00{{"attempt_id":{_string(attempt_id)},"head":{_string(head)},"length":{int(length)}}}'
        return hashlib.sha256(leaf.encode()).digest()
    return leaf_hash(attempt_id, length, head)


_INNER_PAD = bytes(byte ^ 0x36 for byte in range(256))
_OUTER_PAD = bytes(byte ^ 0x5C for byte in range(256))


class SaltKey:
    """HMAC-SHA256 (RFC 2104) under one attempt's salt, for the several digests of its history
    (its args commitment, its events' text digests): the key's two padded blocks are hashed once,
    and each message costs two copies of those hashes, where ``hmac.digest`` sets the key up for
    every message. A digest that does not match is recomputed by the reference before any
    problem is reported, like every fast digest here."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:  # the block size: longer keys are hashed first
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(key.translate(_INNER_PAD))
        self._outer = hashlib.sha256(key.translate(_OUTER_PAD))

    def hex(self, message: bytes) -> str:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()


def reference_digest(args: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(args)).hexdigest()


class Args:
    """An attempt's args column, read and encoded once for the checks that hash it (the
    unsalted args_hash and format 3's salted commitment, ``{"args": ...}`` around the same
    canonical bytes); each raises what reading or encoding raises."""

    def __init__(self, column: Any) -> None:
        self.column = column
        self._value: Any = Args
        self._plain: bool | None = None
        self._encoded: bytes | None = None

    def value(self) -> Any:
        if self._value is Args:
            # Read as ``load_details`` reads details: plain text is known plain without a walk.
            self._value, self._plain = load_details(self.column)
        return self._value

    def encoded(self) -> bytes:
        if self._encoded is None:
            value = self.value()
            self._encoded = jcs.encode_plain(value) if self._plain else jcs.dumps(value)
        return self._encoded

    def digest(self) -> str:
        return hashlib.sha256(self.encoded()).hexdigest()

    def commitment(self, key: SaltKey) -> str:
        return key.hex(b'{"args":' + self.encoded() + b"}")
