"""Money shown as money (attempts/money.py): a tool declares which argument is an amount in
minor units and its currency; the amount is formatted with the currency's own minor units in
the person's locale, and anything unknown is shown raw, never guessed."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import RequestFactory

from attempts.models import Tool
from attempts.money import amount_of, format_minor, locale_of, to_minor


def tool(**hints) -> Tool:
    return Tool(name="charge_card", effect_class="reconcilable", **hints)


@pytest.mark.parametrize(
    ("minor", "currency", "locale", "shown"),
    [
        (115982, "EUR", "en_US", "€1,159.82"),
        (115982, "EUR", "de_DE", "1.159,82\xa0€"),
        (115982, "JPY", "en_US", "¥115,982"),  # no minor units: the yen is the unit
        (115982, "KWD", "en_US", "KWD115.982"),  # three minor units
        (-5, "USD", "en_US", "-$0.05"),
    ],
)
def test_each_currency_with_its_own_minor_units_in_the_persons_locale(
    minor, currency, locale, shown
):
    assert format_minor(minor, currency, locale) == shown


@pytest.mark.parametrize(
    "args",
    [
        {"amount_cents": 100, "currency": "XQQ"},  # unknown currency
        {"amount_cents": 100, "currency": "eur!"},
        {"amount_cents": 100},  # no currency
        {"amount_cents": "100", "currency": "EUR"},  # not a whole number
        {"amount_cents": 1.5, "currency": "EUR"},
        {"amount_cents": True, "currency": "EUR"},
        {"currency": "EUR"},
    ],
)
def test_anything_unknown_is_not_guessed(args):
    assert amount_of(tool(amount_arg="amount_cents", currency_arg="currency"), args) is None


def test_the_amount_carries_its_raw_value():
    amount = amount_of(
        tool(amount_arg="amount_cents", currency_arg="currency"),
        {"amount_cents": 115982, "currency": "eur"},
    )
    assert (amount.minor, amount.currency, amount.text) == (115982, "EUR", "€1,159.82")
    assert amount.raw == "amount_cents = 115982"
    fixed = amount_of(tool(amount_arg="yen", currency="JPY"), {"yen": 500})
    assert fixed.text == "¥500"
    assert amount_of(tool(), {"amount_cents": 1}) is None  # nothing declared


def test_the_locale_is_the_browsers_first_one_cldr_knows():
    def request(header):
        return RequestFactory().get("/", HTTP_ACCEPT_LANGUAGE=header)

    assert locale_of(request("de-DE,de;q=0.9,en;q=0.8")) == "de_DE"
    assert locale_of(request("en;q=0.5, fr-CH")) == "fr_CH"
    assert locale_of(request("xx-nope, ja")) == "ja"
    assert locale_of(request("")) == "en_US"
    assert locale_of(request("*;q=x,<script>")) == "en_US"


def test_a_tool_names_its_currency_one_way_and_a_real_one():
    tool(amount_arg="amount_cents", currency="EUR").clean()
    for hints, field in (
        ({"amount_arg": "amount_cents"}, "amount_arg"),
        ({"amount_arg": "a", "currency": "EUR", "currency_arg": "c"}, "currency_arg"),
        ({"amount_arg": "a", "currency": "XQQ"}, "currency"),
    ):
        with pytest.raises(ValidationError) as caught:
            tool(**hints).clean()
        assert field in caught.value.message_dict


def test_an_amount_typed_in_units_is_read_in_the_currencys_minor_units():
    assert to_minor("12.50", "EUR") == 1250
    assert to_minor("1,250", "JPY") == 1250  # no minor units
    assert to_minor("1.5", "KWD") == 1500  # three
    for text, why in (("abc", "must be a number"), ("1e13", "out of range"), ("NaN", "range")):
        with pytest.raises(ValueError, match=why):
            to_minor(text, "EUR")
