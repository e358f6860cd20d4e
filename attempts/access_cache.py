"""Who may do what, remembered between API calls, on the embedded SQLite database only.

Every intent asks two things before it is recorded: whose bearer token this is (the agent's
identity and tenants) and what the tenant's grant for the tool allows now. Asked of the
database, they were a query each per call, a fifth of an intent's CPU. A web worker instead
keeps the answers it has read and trusts one only while both hold:

- nothing they depend on changed since it was read. Every change to a token, its tenants, a
  grant or a tool (save, delete, ``update()``; in the admin, by command or in code; not the
  record of a token's last use, ``AccessQuerySet.record_use``) appends a byte to
  ``<database>-access.stamp`` beside the database; an answer read when the stamp had another
  size is asked again. The size only grows, so no change is missed, and as the stamp
  is read *before* the query, an answer read while a change commits is already stale. The
  stamp is touched when the change is made and again when it commits;
- it was read less than ``MAX_AGE`` seconds ago: the backstop for a change made behind the
  product's back (SQL typed into the database), which then reaches every worker within that.

Unknown and revoked tokens, and missing grants, are never remembered: refusals always ask.
Claims and sends check the grant afresh (``authority``), whatever is remembered here. On
PostgreSQL the machines share no file, so nothing is remembered: every call asks.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, transaction

if TYPE_CHECKING:
    from attempts.authority import GrantTerms
    from attempts.models import AgentIdentity

STAMP_SUFFIX = "-access.stamp"
MAX_AGE = 10.0
MAX_ENTRIES = 4096  # answers one worker keeps (tokens, tenant-tool pairs); past that it starts over

_entries: dict[Any, tuple[Any, int, float]] = {}
_lock = threading.Lock()


def stamp_path(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """The stamp file for the database ``using``, or None where nothing is remembered."""
    from attempts.states import sqlite_file  # states imports models, which imports this module

    database = sqlite_file(using)
    return database + STAMP_SUFFIX if database else None


def read_stamp(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _get(key: Any, stamp: int) -> Any:
    entry = _entries.get(key)
    if entry is None:
        return None
    value, seen, read_at = entry
    if seen != stamp or time.monotonic() - read_at >= MAX_AGE:
        return None
    return value


def _put(key: Any, value: Any, stamp: int) -> None:
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[key] = (value, stamp, time.monotonic())


class Reading:
    """One lookup: the stamp as it was before the database is asked, and what was remembered.

    ``Reading(key)``; ``.hit`` is the remembered answer or None; after asking the database,
    ``.keep(answer)`` remembers it under the stamp read first."""

    __slots__ = ("key", "stamp", "hit")

    def __init__(self, key: Any) -> None:
        path = stamp_path()
        self.key = key
        self.stamp = None if path is None else read_stamp(path)
        self.hit = None if self.stamp is None else _get(key, self.stamp)

    def keep(self, answer: Any) -> None:
        if self.stamp is not None and answer is not None:
            _put(self.key, answer, self.stamp)


def identity(token_hash: str) -> Reading:
    return Reading(("token", token_hash))


def grant_terms(tenant: str, tool_name: str) -> Reading:
    return Reading(("grant", tenant, tool_name))


def _peek(key: Any) -> Any:
    entry = _entries.get(key)
    return entry[0] if entry else None


def identity_if_remembered(token_hash: str) -> AgentIdentity | None:
    """For tests and the shell: the identity this process remembers for ``token_hash``."""
    return _peek(("token", token_hash))


def terms_if_remembered(tenant: str, tool_name: str) -> GrantTerms | None:
    """For tests and the shell: the grant terms this process remembers for the pair."""
    return _peek(("grant", tenant, tool_name))


def access_changed(using: str = DEFAULT_DB_ALIAS) -> None:
    """A token, its tenants, a grant or a tool changed in database ``using``: forget what
    this process remembers and tell the others, now and again when the change commits
    (before it, another worker may still read the old row under the new stamp)."""
    _touch(using)
    transaction.on_commit(lambda: _touch(using), using=using)


def _touch(using: str) -> None:
    with _lock:
        _entries.clear()
    path = stamp_path(using)
    if path is None:
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, b".")
    finally:
        os.close(descriptor)


def on_access_change(sender, using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """Signal receiver for saves and deletes of tokens, token tenants, grants and tools."""
    if str(kwargs.get("action", "post_")).startswith("post_"):
        access_changed(using)
