"""Protocol section 2: args_hash is the lowercase hex SHA-256 of the RFC 8785 canonical JSON."""

import hashlib

import pytest

from attempts.canonical import InvalidArguments, canonical_bytes, normalize_args

# Vectors from RFC 8785 (sections 3.2.2, 3.2.3 and appendix B), written out here.
NUMBER_VECTORS = [
    (0.0, "0"),
    (-0.0, "0"),
    (1.0, "1"),
    (1e21, "1e+21"),
    (1e-7, "1e-7"),
    (0.000001, "0.000001"),
    (123456789012345680000.0, "123456789012345680000"),
    (4.50, "4.5"),
    (2e-3, "0.002"),
    (0.000001e-2, "1e-8"),
    (9007199254740991, "9007199254740991"),
    (-9007199254740991, "-9007199254740991"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (333333333.3333333, "333333333.3333333"),
]


@pytest.mark.parametrize(("number", "expected"), NUMBER_VECTORS)
def test_numbers_use_the_ecmascript_shortest_form(number, expected):
    assert canonical_bytes(number).decode() == expected


def test_keys_sort_by_utf16_code_units_and_strings_keep_unicode():
    # RFC 8785 section 3.2.3: sorting by UTF-16 code units, not by code points or UTF-8 bytes.
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    out = canonical_bytes(value).decode()
    keys_in_order = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    positions = [out.index(f'"{k}"' if k != "\r" else '"\\r"') for k in keys_in_order]
    assert positions == sorted(positions)


def test_rfc_example_object():
    value = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
        "literals": [None, True, False],
    }
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_bytes(value).decode() == expected


def test_hash_is_independent_of_key_order_and_number_spelling():
    a = normalize_args({"to": "ada@example.test", "amount": 10.0, "tags": ["x", "y"]})
    b = normalize_args({"tags": ["x", "y"], "amount": 10, "to": "ada@example.test"})
    assert a.args_hash == b.args_hash
    assert a.args_hash == hashlib.sha256(a.canonical).hexdigest()
    assert a.args_hash == a.args_hash.lower() and len(a.args_hash) == 64
    assert a.value == {"amount": 10, "tags": ["x", "y"], "to": "ada@example.test"}


def test_different_arguments_hash_differently():
    assert normalize_args({"n": 1}).args_hash != normalize_args({"n": 2}).args_hash


@pytest.mark.parametrize("bad", [[1, 2], "text", 3, None, True])
def test_args_must_be_an_object(bad):
    with pytest.raises(InvalidArguments) as exc:
        normalize_args(bad)
    assert exc.value.code == "args_not_object"


@pytest.mark.parametrize(
    "bad", [{"n": float("nan")}, {"n": float("inf")}, {"n": 2**60}, {"n": object()}]
)
def test_values_jcs_cannot_carry_are_refused(bad):
    with pytest.raises(InvalidArguments):
        normalize_args(bad)


def test_size_limit_counts_canonical_bytes():
    with pytest.raises(InvalidArguments) as exc:
        normalize_args({"blob": "x" * 200}, max_bytes=100)
    assert exc.value.code == "args_too_large"
    assert normalize_args({"blob": "x" * 50}, max_bytes=100).value == {"blob": "x" * 50}


def test_deep_nesting_is_refused():
    value: dict = {}
    cursor = value
    for _ in range(40):
        cursor["a"] = {}
        cursor = cursor["a"]
    with pytest.raises(InvalidArguments):
        normalize_args(value)


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"title": "Printer on fire", "priority": 2},
        {"z": [1, 2.5, None, True, {"b": "\u20ac", "a": "\U0001f525"}], "\u20ac": 0.1, "e": 1e15},
        {"nested": {"deeper": {"n": -0.0, "s": 'line\nbreak "quoted"'}}},
    ],
)
def test_the_args_digest_from_canonical_bytes_is_the_reference_digest(args):
    # The writer commits to the arguments from the bytes it hashed them by (states.create gets
    # normalize_args' canonical bytes); the verifiers encode {"args": ...} with the reference.
    from attempts import chain, verify_export

    salt = chain.new_salt()
    normalized = normalize_args(args)
    reference = verify_export.args_commitment(salt, normalized.value)
    assert chain.args_digest(salt, normalized.value, canonical=normalized.canonical) == reference
    assert chain.args_digest(salt, normalized.value) == reference
