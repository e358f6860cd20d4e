"""attempts.jcs: the fast path writes exactly the reference's (rfc8785) bytes, or defers to it."""

import enum
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from attempts import jcs

# Does not depend on the database: one pass runs it.
pytestmark = pytest.mark.one_database("postgres")

# Characters from every region that matters to JCS: controls (escaped), quotes and backslashes,
# ASCII, U+E000..U+FFFF (where code point and UTF-16 order disagree with astral characters),
# astral characters, and (in the surrogate strategy) lone surrogates.
interesting_text = st.text(
    alphabet=st.one_of(
        st.characters(min_codepoint=0, max_codepoint=0x7F),
        st.sampled_from(['"', "\\", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f"]),
        st.characters(min_codepoint=0x80, max_codepoint=0xD7FF),
        st.characters(min_codepoint=0xE000, max_codepoint=0xFFFF),
        st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF),
    ),
    max_size=12,
)
integers = st.one_of(
    st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    st.sampled_from([2**53 - 1, -(2**53) + 1, 2**53, -(2**53), 2**64, 0]),
)
scalars = st.one_of(
    st.none(), st.booleans(), integers, interesting_text, st.floats(allow_nan=False)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(interesting_text, inner, max_size=6),
    ),
    max_leaves=30,
)


DEEP: list = [1]
for _ in range(70):
    DEEP = [DEEP]


def outcome(function, value):
    try:
        return ("ok", function(value))
    except (rfc8785.CanonicalizationError, ValueError) as exc:
        # rfc8785 refuses a lone surrogate in a key with the codec's UnicodeEncodeError.
        return ("error", type(exc).__name__)


@settings(max_examples=600, deadline=None)
@given(values)
def test_fast_path_matches_the_reference_on_generated_values(value):
    assert outcome(jcs.dumps, value) == outcome(rfc8785.dumps, value)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(interesting_text, st.integers(-5, 5), min_size=2, max_size=8))
def test_key_order_matches_utf16_order_including_astral_keys(value):
    assert jcs.dumps(value) == rfc8785.dumps(value)


@pytest.mark.parametrize(
    "value",
    [
        {"\U0001f600": 1, "\ufb33": 2, "a": 3},  # astral vs U+FB33: the orders differ here
        {"k": "\ud800"},  # lone surrogate in a value
        {"\udfff": 1},  # lone surrogate in a key
        {"n": 2**53},  # beyond the interoperable range
        {"n": -(2**53)},
        {"f": 1.0, "g": 1e21, "h": -0.0, "i": 5e-324},
        {"t": (1, 2, [3, (4,)])},
        {"deep": DEEP},
        "",
        "\x00\x1f\x7f\u2028\u2029",
        True,
        None,
        [],
        {},
    ],
)
def test_edge_values_match_the_reference(value):
    assert outcome(jcs.dumps, value) == outcome(rfc8785.dumps, value)


class Colour(enum.IntEnum):
    RED = 1


class Label(enum.StrEnum):
    A = "a\n"


def test_int_subclasses_take_the_reference_path():
    value = {"c": Colour.RED, "b": [True, False]}
    assert jcs.dumps(value) == rfc8785.dumps(value) == b'{"b":[true,false],"c":1}'
    assert not jcs._plain(value)


def test_str_subclasses_are_written_from_their_characters_on_the_fast_path():
    value = {"l": Label.A, Label.A: [Label.A]}
    assert jcs._plain(value)
    assert jcs.dumps(value) == rfc8785.dumps(value) == b'{"a\\n":["a\\n"],"l":"a\\n"}'


def test_plain_values_take_the_fast_path():
    value = {"title": "Printer on fire", "n": [1, -2, None, True], "nested": {"é": "ü\n"}}
    assert jcs._plain(value)
    assert jcs.dumps(value) == rfc8785.dumps(value)


def test_refusals_are_the_references():
    for value in ({"x": float("nan")}, {"x": float("inf")}, {"x": 2**60}, {"x": "\ud800"}):
        with pytest.raises(rfc8785.CanonicalizationError):
            jcs.dumps(value)
    with pytest.raises(rfc8785.CanonicalizationError):
        jcs.dumps({1: "non-string key"})


# The verifier writes an event's payload in its fixed key order (audit_verify.digests.event_digest)
# instead of sorting the keys of each event: its digest must be the reference's for any text in
# the fields and any details, and a field that is not text (a NULL) must still hash.
event_fields = st.one_of(interesting_text, st.none())


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "v": st.integers(min_value=1, max_value=9),
            "attempt_id": event_fields,
            "action": event_fields,
            "actor_kind": event_fields,
            "actor": event_fields,
            "from_state": event_fields,
            "to_state": event_fields,
            "reason": event_fields,
            "details": values,
            "prev_hash": event_fields,
        }
    )
)
def test_the_verifiers_event_digest_is_the_references(payload):
    import hashlib

    from attempts.audit_verify.digests import event_digest as _event_digest

    # EVENT_SQL's columns: attempt pk, id, action, actor_kind, actor, from_state, to_state,
    # reason, details (as text: not read here), created_at, prev_hash, hash, chain_format.
    p = payload
    event = (1, 1, p["action"], p["actor_kind"], p["actor"], p["from_state"], p["to_state"])
    event += (p["reason"], None, "2026-01-01T00:00:00.000000Z", p["prev_hash"], "", p["v"])
    event += ("",)  # text_digest (format 3)
    expected = {**payload, "v": 2, "created_at": event[9]}
    event = (*event[:12], 2, event[13])

    def reference(value):
        return hashlib.sha256(rfc8785.dumps(value)).hexdigest()

    def fast(plain):
        return _event_digest(p["attempt_id"], event, p["details"], plain)

    for plain in (None, jcs.plain(payload["details"]) or None):
        assert outcome(fast, plain) == outcome(reference, expected)


@settings(max_examples=400, deadline=None)
@given(values, st.booleans(), st.sampled_from([(",", ":"), (", ", ": ")]))
def test_the_verifiers_plain_from_text_agrees_with_jcs_plain(value, ascii_only, separators):
    # Details as the databases give them back (SQLite: Django's escaped JSON text; PostgreSQL:
    # jsonb's own spacing, UTF-8 as is): told plain from the text only when jcs.plain agrees.
    import json
    import math

    from attempts.audit_verify.digests import load_details as _load_details

    text = json.dumps(value, ensure_ascii=ascii_only, separators=separators)
    parsed, plain = _load_details(text)
    if not (isinstance(value, float) and math.isnan(value)):
        assert json.dumps(parsed) == json.dumps(json.loads(text))
    if plain:
        assert jcs.plain(parsed)


@settings(max_examples=300, deadline=None)
@given(values, interesting_text, interesting_text, interesting_text)
def test_the_verifiers_format_3_digest_is_the_references(details, reason, actor, text):
    # Format 3 covers the public details and the salted text digest, not the reason.
    import hashlib

    from attempts.audit_verify.digests import event_digest as _event_digest
    from attempts.verify_export import salted_payload

    event = (1, 1, "attempt.updated", "agent", actor, "DISPATCHED", "DISPATCHED", reason, None)
    event += ("2026-01-01T00:00:00.000000Z", "0" * 64, "", 3, text)
    payload = {
        "v": 3,
        "attempt_id": "att_1",
        "action": event[2],
        "actor_kind": event[3],
        "actor": actor,
        "from_state": event[5],
        "to_state": event[6],
        "reason": reason,
        "details": {"provider_request_id": "req_1", "note": details},
        "created_at": event[9],
        "prev_hash": event[10],
    }

    def reference(_):
        return hashlib.sha256(rfc8785.dumps(salted_payload(payload, text))).hexdigest()

    public = {"provider_request_id": "req_1"}
    for plain in (None, True):
        fast = outcome(lambda _: _event_digest("att_1", event, public, plain, text=text), 0)  # noqa: B023
        assert fast == outcome(reference, 0)


@given(
    st.one_of(interesting_text.filter(str.isascii), st.text(max_size=30)),
    st.integers(min_value=0, max_value=2**40),
    st.one_of(interesting_text.filter(str.isascii), st.text(max_size=64)),
)
def test_the_verifiers_leaf_digest_is_the_references(attempt_id, length, head):
    from attempts.audit_verify.digests import leaf_digest as _leaf_digest
    from attempts.verify_export import leaf_hash

    assert _leaf_digest(attempt_id, length, head) == leaf_hash(attempt_id, length, head)


@settings(max_examples=200, deadline=None)
@given(key=st.binary(max_size=100), messages=st.lists(st.binary(max_size=300), max_size=4))
def test_the_verifiers_salted_digest_is_hmac_sha256(key, messages):
    """One attempt's salt key serves several messages (its args commitment, its events' text
    digests): each is the standard library's HMAC-SHA256, keys longer than a block included."""
    import hashlib
    import hmac

    from attempts.audit_verify.digests import SaltKey

    salt_key = SaltKey(key)
    for message in messages:
        assert salt_key.hex(message) == hmac.new(key, message, hashlib.sha256).hexdigest()


def _short_path_takes(event: tuple, key: Any, text: str, details: Any) -> bool:
    """Whether the short path took ``event`` (its details written as ``text``): it must, with
    the event's stored hash and ``details`` read, unless the text escapes a control character,
    which is the general path's to write, and then it must take nothing."""
    from attempts.audit_verify.digests import NO_TEXT, Quoted, common_events

    hashes: list[str] = []
    read: list = []
    short = common_events(Quoted(), '"att_1"', [event], 0, key, key.hex(NO_TEXT), hashes, read)
    if "\\u" in text:
        assert (short, hashes, read) == (0, [], [])
        return False
    assert (short, hashes, read) == (1, [event[11]], [details])
    return True


def _hashed_payload(event: tuple, details: Any) -> dict[str, Any]:
    """The format-3 payload the reference hashes for a short-path test's ``event`` row of
    attempt ``att_1`` (its action, actor, states, time and previous hash) with ``details``."""
    return {
        "v": 3,
        "attempt_id": "att_1",
        "action": event[2],
        "actor_kind": event[3],
        "actor": event[4],
        "from_state": event[5],
        "to_state": event[6],
        "reason": "",
        "details": details,
        "created_at": event[9],
        "prev_hash": event[10],
    }


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["provider_request_id", "result_ref", "count", "kind", "retryable"]),
        st.one_of(st.text(alphabet=st.characters(max_codepoint=127)), st.integers(0, 99)),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([(",", ":"), (", ", ": ")]),
)
def test_the_verifiers_short_path_digest_is_the_references(details, separators):
    """The short path (``common_event_digest``) writes public details of one text field itself,
    and any others with the C encoder: the event's hash is the reference's either way."""
    import hashlib
    import json

    from attempts.audit_verify.digests import NO_TEXT, Quoted, SaltKey, common_events
    from attempts.verify_export import GENESIS, salted_payload

    key = SaltKey(b"salt")
    text = json.dumps(details, separators=separators)  # as the databases give details back
    event = (1, 1, "attempt.updated", "agent", "a", "DISPATCHED", "DISPATCHED", "", text)
    event += ("2026-01-01T00:00:00.000000Z", GENESIS)
    payload = _hashed_payload(event, details)
    reference = hashlib.sha256(rfc8785.dumps(salted_payload(payload, key.hex(NO_TEXT))))
    event += (reference.hexdigest(), 3, key.hex(NO_TEXT))
    if not _short_path_takes(event, key, text, details):
        return
    # A hash the short path does not arrive at is left to the general path.
    forged = [(*event[:11], "0" * 64, *event[12:])]
    assert common_events(Quoted(), '"att_1"', forged, 0, key, key.hex(NO_TEXT), [], []) == 0


ascii_text = st.text(alphabet=st.characters(max_codepoint=127), max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "tenant": ascii_text,
            "task_id": ascii_text,
            "tool_name": ascii_text,
            "idempotency_key": ascii_text,
            "args_hash": ascii_text,
            "policy_version": ascii_text,
            "credential_scope": st.lists(st.one_of(ascii_text, st.integers(0, 99)), max_size=3),
            "parent_attempt_id": st.one_of(st.none(), ascii_text),
            "args_digest": ascii_text,
        }
    ),
    st.sampled_from([(",", ":"), (", ", ": ")]),
)
def test_the_verifiers_short_path_digest_of_a_creation_event_is_the_references(details, separators):
    """The short path writes a creation event's public details (as ``states.create`` records
    them) and the text its digest commits to itself: the event's hash and its text digest are
    the reference's."""
    import hashlib
    import json

    from attempts.audit_verify.digests import SaltKey
    from attempts.verify_export import GENESIS, salted_payload, text_digest

    salt = "ab" * 16
    key = SaltKey(bytes.fromhex(salt))
    text = json.dumps(details, separators=separators)  # as the databases give details back
    digest = text_digest(salt, "", details)
    event = (1, 1, "attempt.created", "agent", "a", "", "INTENT_RECORDED", "", text)
    event += ("2026-01-01T00:00:00.000000Z", GENESIS)
    payload = _hashed_payload(event, details)
    event += (hashlib.sha256(rfc8785.dumps(salted_payload(payload, digest))).hexdigest(), 3)
    event += (digest,)
    if not _short_path_takes(event, key, text, details):
        return
