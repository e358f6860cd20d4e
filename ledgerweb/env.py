"""Small, strict readers for settings that come from the environment.

Each raises ``ImproperlyConfigured`` naming the variable and what was wrong with it, so a
misconfigured deployment fails at start-up with a sentence, not a traceback deep inside a request.
"""

import os
import re

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}"
    )


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number; got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ImproperlyConfigured(f"{name} must be {bound}; got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def env_names(name: str, default: dict[str, str]) -> dict[str, str]:
    """``short-name=dotted.path`` pairs, comma-separated, added to ``default`` (a name listed
    again replaces the default's entry)."""
    found = dict(default)
    for item in env_list(name, []):
        short, sep, path = (part.strip() for part in item.partition("="))
        if not sep or not _NAME.match(short) or not _DOTTED.match(path):
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not name=dotted.path (name: lowercase letters, digits, "
                "'-' and '_', at most 64)"
            )
        found[short] = path
    return found


def env_int_map(name: str, *, minimum: int = 1) -> dict[str, int]:
    """``key=number`` pairs, comma-separated (a key may hold ``:``, e.g. ``host:port=2``)."""
    found: dict[str, int] = {}
    for item in env_list(name, []):
        key, sep, number = (part.strip() for part in item.rpartition("="))
        if not sep or not key or not number.isdigit() or int(number) < minimum:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not key=number (a whole number >= {minimum})"
            )
        found[key] = int(number)
    return found
