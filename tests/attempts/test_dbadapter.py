"""attempts.dbadapter: the private Django names the write path relies on still hold, and what
Django's own cursor guards is still guarded on the driver's cursor."""

from __future__ import annotations

import re

import pytest
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.transaction import TransactionManagementError

from attempts import dbadapter
from attempts.models import Tenant


def test_the_private_names_relied_on_hold_for_the_pinned_django() -> None:
    assert dbadapter.private_api_problems(connections[DEFAULT_DB_ALIAS]) == []


def test_a_renamed_or_reshaped_private_name_is_reported(monkeypatch) -> None:
    db = connections[DEFAULT_DB_ALIAS]
    monkeypatch.setitem(
        dbadapter.PRIVATE_API, "validate_no_broken_transaction", ("method", ("force",))
    )
    monkeypatch.setitem(dbadapter.PRIVATE_API, "no_such_helper", ("method", ()))
    problems = dbadapter.private_api_problems(db)
    assert any("validate_no_broken_transaction" in p for p in problems)
    assert any("no_such_helper() is gone" in p for p in problems)


def test_a_datetime_parameter_is_what_djangos_adaptation_makes_of_it() -> None:
    """The short path for a UTC datetime (SQLite) gives the same parameter as Django's own."""
    import datetime as dt
    import zoneinfo

    db = connections[DEFAULT_DB_ALIAS]
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    for value in (
        dt.datetime(2026, 12, 5, 13, 44, 57, 130001, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 5, 13, 44, 57, tzinfo=dt.UTC),
        dt.datetime(2026, 3, 29, 2, 30, tzinfo=berlin),
        dt.datetime(2026, 12, 5, 13, 44, 57, 5, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    ):
        for _ in range(2):  # the second time from the text kept for the same datetime
            assert dbadapter.datetime_param(db, value) == db.ops.adapt_datetimefield_value(value)
    moment = dt.datetime(2026, 12, 5, 13, 44, 57, 130001, tzinfo=dt.UTC)
    later = moment + dt.timedelta(microseconds=1)
    for value in (moment, later, moment, moment.replace(microsecond=0)):
        assert dbadapter.datetime_param(db, value) == db.ops.adapt_datetimefield_value(value)


def test_a_json_parameter_is_what_djangos_adaptation_makes_of_it() -> None:
    """The encoder built once writes the text json.dumps writes, as Django adapts it."""
    db = connections[DEFAULT_DB_ALIAS]
    for value in (
        {"title": "Drucker brennt \u2014 \U0001f525", "n": [1, 2.5, None, True], "e": {}},
        {"b": 1, "a": {"z": [], "y": '\x00\n"quoted"'}},
        ["tickets:write"],
        [],
    ):
        ours, django = dbadapter.json_param(db, value), db.ops.adapt_json_value(value, None)
        if db.vendor == "postgresql":
            assert (ours.obj, ours.dumps(ours.obj)) == (django.obj, django.dumps(django.obj))
        else:
            assert ours == django


@pytest.mark.django_db(transaction=True)
def test_driver_cursor_raises_djangos_integrity_error() -> None:
    Tenant.objects.create(slug="acme", name="Acme")
    db = connections[DEFAULT_DB_ALIAS]
    table = Tenant._meta.db_table
    with pytest.raises(IntegrityError), dbadapter.DriverCursor(db) as cursor:
        cursor.execute(
            f"INSERT INTO {table} (slug, name, created_at) VALUES (%s, %s, CURRENT_TIMESTAMP)",  # noqa: S608
            ["acme", "Again"],
        )


@pytest.mark.django_db(transaction=True)
def test_driver_cursor_refuses_a_broken_transaction() -> None:
    db = connections[DEFAULT_DB_ALIAS]
    with transaction.atomic():
        transaction.set_rollback(True)
        db.needs_rollback = True
        with pytest.raises(TransactionManagementError), dbadapter.DriverCursor(db) as cursor:
            cursor.execute("SELECT 1", [])


@pytest.mark.django_db(transaction=True)
def test_sqlite_own_transaction_is_refused_inside_atomic() -> None:
    db = connections[DEFAULT_DB_ALIAS]
    with transaction.atomic(), pytest.raises(RuntimeError, match="inside atomic"):
        with dbadapter.sqlite_own_transaction(db, lambda raw: None):
            pass


@pytest.mark.django_db(transaction=True)
def test_the_driver_cursor_is_kept_per_statement_and_connection_on_postgresql() -> None:
    """On PostgreSQL a statement runs on its own driver cursor of the connection each time,
    another statement on another; a new connection (after a close) gets new cursors. SQLite
    closes each statement's cursor after it."""
    db = connections[DEFAULT_DB_ALIAS]
    select = "SELECT %s"
    cursors = []
    for value in (1, 2):
        with dbadapter.DriverCursor(db) as cursor:
            cursor.execute(select, [value])
            assert cursor.fetchone() == (value,)
            cursors.append(cursor.cursor)
    with dbadapter.DriverCursor(db) as other:
        other.execute("SELECT 3", [])
        assert other.fetchone() == (3,)
    postgresql = db.vendor == "postgresql"
    assert (cursors[0] is cursors[1]) is postgresql
    assert other.cursor is not cursors[0]
    db.close()
    with dbadapter.DriverCursor(db) as again:
        again.execute(select, [4])
        assert again.fetchone() == (4,)
    assert again.cursor is not cursors[0]


# The private names of ``PRIVATE_API`` as code spells them at a use (``dbadapter.x`` aside).
PRIVATE_USES = re.compile(
    r"(?<!dbadapter)\.(in_atomic_block\b|ops\.quote_name\(|ops\.adapt_datetimefield_value\("
    r"|ops\.adapt_json_value\("
    r"|sql_with_params\(|introspection\.)"
)
# Modules still to move their uses here. Remove each entry with its last use: the test below
# fails on an entry that has none left.
NOT_YET: set[str] = set()


def _private_uses() -> dict[str, list[str]]:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found: dict[str, list[str]] = {}
    for package in ("attempts", "reconciliation", "ledgerweb"):
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name == "attempts/dbadapter.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if PRIVATE_USES.search(line):
                    found.setdefault(name, []).append(f"{name}:{number}: {line.strip()}")
    return found


def test_every_private_django_name_goes_through_dbadapter() -> None:
    """So that ``private_api_problems`` covers every private name the server relies on."""
    found = _private_uses()
    outside = [use for name, uses in found.items() if name not in NOT_YET for use in uses]
    assert outside == []
    assert sorted(NOT_YET - found.keys()) == []
