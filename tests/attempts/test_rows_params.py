"""The write path's parameters (``attempts.rows``) are what Django's field preparation makes of
the same values: the short paths for plain values, datetimes, JSON and None change nothing."""

from __future__ import annotations

import datetime as dt

from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connections

from attempts import rows
from attempts.models import State


def _comparable(value):
    # psycopg's Jsonb wrapper compares by identity: compare what it writes.
    if hasattr(value, "obj") and hasattr(value, "dumps"):
        try:
            return ("json", value.dumps(value.obj))
        except TypeError:  # not JSON (a datetime): refused when written, by either
            return ("not json", repr(value.obj))
    return value


def test_every_column_gets_what_djangos_preparation_makes_of_its_value() -> None:
    db = connections[DEFAULT_DB_ALIAS]
    samples = (
        None,
        "",
        "text",
        0,
        7,
        True,
        State.INTENT_RECORDED,
        dt.datetime(2026, 12, 5, 13, 44, 57, 130001, tzinfo=dt.UTC),
        {"title": "Printer on fire", "n": [1, None]},
        ["tickets:write"],
    )
    columns = (*rows._attempt_fields(), *rows._event_fields())
    checked = 0
    for column in columns:
        for value in samples:
            try:
                django = column.field.get_db_prep_save(value, db)
            except (TypeError, ValueError, AttributeError, ValidationError):
                continue  # not a value this column takes
            ours = rows._prepared((column,), [value], db)[0]
            assert _comparable(ours) == _comparable(django), (column.field.name, value)
            checked += 1
    assert checked > len(columns)


def test_a_date_field_that_sets_itself_is_asked_for_its_value() -> None:
    # Read as its attribute only when pre_save would return the attribute: not with auto_now
    # or auto_now_add, which set the field when it is saved.
    from django.db import models

    for field, read in (
        (models.DateTimeField(), True),
        (models.DateField(), True),
        (models.DateTimeField(auto_now=True), False),
        (models.DateField(auto_now_add=True), False),
        (models.CharField(max_length=5), True),
    ):
        field.set_attributes_from_name("when")
        assert bool(rows._Column(field).attname) is read, field
