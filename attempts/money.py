"""Money shown as money: a tool may declare which argument is an amount in its currency's minor
units, and the currency (a code, or the argument that holds one). ``amount_of`` reads such an
amount from an attempt's arguments and formats it with the currency's own minor units (JPY has
none, KWD three) in the person's locale; anything it cannot be sure of (no declaration, a
currency it does not know, a value that is not a whole number) is None, and pages show the raw
value instead: an amount is never guessed. The raw value stays one click away."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from babel import Locale, UnknownLocaleError
from babel.numbers import format_currency, get_currency_precision, list_currencies

DEFAULT_LOCALE = "en_US"
_CURRENCIES = frozenset(list_currencies())
_LANGUAGE_TAG = re.compile(r"^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$")


@dataclass(frozen=True)
class Amount:
    """An amount an attempt's arguments carry: ``minor`` units of ``currency``, ``text`` as the
    person reads it, ``raw`` the argument as stored (name = value)."""

    minor: int
    currency: str
    text: str
    raw: str


def known_currency(code: Any) -> bool:
    return isinstance(code, str) and code in _CURRENCIES


def format_minor(minor: int, currency: str, locale: str = DEFAULT_LOCALE) -> str | None:
    """``minor`` units of ``currency`` as money in ``locale`` (None for a currency unknown)."""
    if not known_currency(currency) or isinstance(minor, bool) or not isinstance(minor, int):
        return None
    digits = get_currency_precision(currency)
    value = Decimal(minor).scaleb(-digits)
    try:
        return format_currency(value, currency, locale=locale, currency_digits=True)
    except (UnknownLocaleError, ValueError):
        return format_currency(value, currency, locale=DEFAULT_LOCALE, currency_digits=True)


def to_minor(text: str, currency: str) -> int:
    """``text``, an amount a person typed in ``currency``'s units (commas between thousands
    allowed), in the currency's minor units. ValueError says why it is none."""
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:
        raise ValueError(f"must be a number, not {text[:20]!r}") from None
    if not value.is_finite() or abs(value) > 10**12:
        raise ValueError("is out of range")
    return int(value.scaleb(get_currency_precision(currency)).to_integral_value())


def amount_of(tool: Any, args: Any, locale: str = DEFAULT_LOCALE) -> Amount | None:
    """The amount ``args`` carry under ``tool``'s display hints (``amount_arg``, ``currency`` or
    ``currency_arg``), or None when there is none to show as money."""
    if tool is None or not tool.amount_arg or not isinstance(args, dict):
        return None
    minor = args.get(tool.amount_arg)
    currency = args.get(tool.currency_arg) if tool.currency_arg else tool.currency
    if isinstance(currency, str):
        currency = currency.strip().upper()
    text = format_minor(minor, currency, locale) if isinstance(currency, str) else None
    if text is None:
        return None
    return Amount(minor, currency, text, f"{tool.amount_arg} = {minor}")


def locale_of(request: Any) -> str:
    """The person's locale: the first language of their browser's Accept-Language that CLDR
    knows (en_US when none does)."""
    header = getattr(request, "headers", {}).get("Accept-Language", "") if request else ""
    ranked = []
    for position, part in enumerate(header.split(",")[:10]):
        tag, _, params = part.strip().partition(";")
        quality = 1.0
        if params.strip().startswith("q="):
            try:
                quality = float(params.strip()[2:])
            except ValueError:
                continue
        if _LANGUAGE_TAG.match(tag):
            ranked.append((-quality, position, tag))
    for _, _, tag in sorted(ranked):
        try:
            return str(Locale.parse(tag, sep="-"))
        except (UnknownLocaleError, ValueError):
            continue
    return DEFAULT_LOCALE
