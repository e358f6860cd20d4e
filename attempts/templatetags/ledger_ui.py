"""Small display helpers for the dashboard's templates."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django import template
from django.utils.html import format_html

from attempts.models import Tool
from attempts.money import amount_of, locale_of
from attempts.reasons import EFFECT_CLASSES, reason_text
from ledgerweb.cli import command_line

register = template.Library()


@register.filter
def duration(value: dt.timedelta | None) -> str:
    """A compact age: 45s, 12m, 3h 05m, 4d 2h."""
    if value is None:
        return "—"
    seconds = max(0, int(value.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


@register.simple_tag
def command(text: str) -> str:
    """A management command as the people running this server type it (``manage.py verify_audit``
    in a checkout, ``ledgerweb verify_audit`` installed)."""
    return command_line(text)


@register.filter
def state_class(state: str) -> str:
    """The CSS class of a state badge."""
    return "st-" + (state or "").lower().replace("_", "-")


@register.filter
def details_text(details: dict | None, skip: str = "") -> str:
    """An event's details as ``key=value`` pairs, JSON for lists and objects."""
    if not details:
        return ""
    parts = []
    for key, value in details.items():
        if key == skip:
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"{key}={shown}")
    return " ".join(parts)


# Labels for the details events carry most often; any other key is shown with its words.
DETAIL_LABELS = {
    "args_hash": "args hash",
    "args_digest": "args digest (salted)",
    "idempotency_key": "idempotency key",
    "provider_request_id": "provider request id",
    "result_ref": "result ref",
    "owner_id": "owner",
    "previous_owner_id": "previous owner",
    "parent_attempt_id": "parent attempt",
    "linked_attempt_id": "linked attempt",
    "credential_scope": "credential scopes",
    "policy_version": "policy version",
    "http_status": "HTTP status",
    "retry_after": "Retry-After",
    "latency_ms": "latency (ms)",
}


@register.filter
def details_fields(details: dict | None, skip: str = "") -> list[tuple[str, str]]:
    """An event's details as (label, value) pairs for a list of labelled fields, JSON for lists
    and objects."""
    if not isinstance(details, dict):
        return []
    fields = []
    for key, value in details.items():
        if key == skip:
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        fields.append((DETAIL_LABELS.get(key, str(key).replace("_", " ")), shown))
    return fields


def display_tools(request: Any) -> dict[str, Tool]:
    """The tools that declare an amount (their display hints), by name: read once per request,
    by the page's own code and this tag alike."""
    tools = getattr(request, "_display_tools", None)
    if tools is None:
        tools = Tool.objects.exclude(amount_arg="").in_bulk()
        if request is not None:
            request._display_tools = tools
    return tools


@register.simple_tag(takes_context=True)
def money(context: template.Context, attempt: Any) -> str:
    """The attempt's amount as money in the person's locale, with the raw argument one click
    away; nothing when its tool declares no amount or the currency is not known (the raw
    arguments then show it as stored: an amount is never guessed)."""
    request = context.get("request")
    tools = display_tools(request)
    if isinstance(attempt, dict):  # a queue's row: its arguments are read only when needed
        tool_name, args = attempt.get("tool_name"), attempt.get("args")
    else:
        tool_name, args = attempt.tool_name, attempt.args
    amount = amount_of(tools.get(tool_name), args, locale_of(request))
    if amount is None:
        return ""
    return format_html(
        '<details class="money" data-testid="money" data-minor="{}" data-currency="{}">'
        "<summary>{}</summary><code>{} ({})</code></details>",
        amount.minor,
        amount.currency,
        amount.text,
        amount.raw,
        amount.currency,
    )


@register.filter
def why(code: str) -> str:
    """A ``review_reason`` code as the sentence an operator acts on."""
    return reason_text(code)


@register.filter
def effect_class_text(effect_class: str) -> str:
    """What an effect class means for recovery, in words."""
    return EFFECT_CLASSES.get(effect_class, "")
