"""Small display helpers for the dashboard's templates."""

from __future__ import annotations

import datetime as dt
import json

from django import template

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
