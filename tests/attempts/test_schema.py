"""The ledger's tables carry the indexes the models declare and no others: every index is one
more B-tree insert on every intent and every move, so one that slips in (a squash that forgot a
drop, say) slows every tool call without failing anything else."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from attempts.models import Attempt, AttemptEvent, CheckpointLeaf, ProviderEffect, RecordedKey

# attempts.models.search_key (PostgreSQL only): attempt_id's byte-order copy; the other
# identifiers are byte-order columns (ByteOrderCharField) read through their own index.
PREFIX_INDEXES = {"attempt_id_prefix_idx"}
BYTE_ORDER_COLUMNS = {"idempotency_key", "task_id", "provider_request_id", "args_hash"}


@pytest.mark.django_db
def test_models_and_migrations_agree():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "model",
    [Attempt, AttemptEvent, RecordedKey, ProviderEffect, CheckpointLeaf],
    ids=lambda m: m.__name__,
)
def test_postgresql_has_only_the_declared_indexes(model):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: Django's pattern-ops copies and the byte-order prefix indexes")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.indisunique, i.indisprimary, pg_get_indexdef(i.indexrelid)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass",
            [model._meta.db_table],
        )
        found = cursor.fetchall()
    assert not [name for name, *_, definition in found if "pattern_ops" in definition]
    declared = {index.name for index in model._meta.indexes}
    constraints = {constraint.name for constraint in model._meta.constraints}
    if model is Attempt:
        declared |= PREFIX_INDEXES
    unique_columns = {f.column for f in model._meta.concrete_fields if f.unique}
    other = [
        (name, definition)
        for name, unique, primary, definition in found
        if name not in declared and not primary and not unique
    ]
    assert other == []
    assert declared <= {name for name, *_ in found}
    assert constraints <= {name for name, *_ in found}
    uniques = [
        name
        for name, unique, primary, _ in found
        if unique and not primary and name not in constraints
    ]
    assert len(uniques) == len(unique_columns - {model._meta.pk.column}), uniques


@pytest.mark.django_db
def test_postgresql_compares_the_searched_identifiers_in_byte_order():
    """A prefix search's range is a range of the column's own index only when the column is
    ``COLLATE "C"``: a migration that rebuilt a column without it would turn every prefix
    search into a scan of the whole table, and fail nothing else."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: SQLite compares bytes already")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, collation_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = %s",
            [Attempt._meta.db_table],
        )
        collations = dict(cursor.fetchall())
    assert {column: collations[column] for column in BYTE_ORDER_COLUMNS} == {
        column: "C" for column in BYTE_ORDER_COLUMNS
    }
    assert collations["attempt_id"] is None  # foreign keys compare it with other tables


@pytest.mark.django_db
def test_every_history_table_is_guarded_by_the_migrations_alone():
    """The migrations install every append-only trigger (nothing re-installs them after a
    migrate): a migration that rebuilds a history table must guard it again."""
    from attempts import history_guard

    assert history_guard.unguarded(connection) == []
    assert history_guard.installed(connection)


@pytest.mark.django_db(transaction=True)
def test_a_missing_guard_fails_the_database_check():
    from django.core.checks import run_checks

    from attempts import history_guard

    assert "attempts.E003" not in {e.id for e in run_checks(databases=["default"])}
    history_guard.remove(connection)
    try:
        errors = [e for e in run_checks(databases=["default"]) if e.id == "attempts.E003"]
        assert len(errors) == 1 and "attempts_attemptevent" in errors[0].msg
        assert "attempts.E003" not in {e.id for e in run_checks()}  # only where it matters
    finally:
        history_guard.install(connection)


@pytest.mark.django_db
def test_the_unreleased_migrations_are_one_that_a_development_ledger_at_0017_counts_as_applied():
    """Release 0.2's schema is one migration after 0.1.0's 0009; it replaces the unreleased
    0010-0017, so a ledger that applied all eight has applied it (and one at 0009 applies it).
    Only migrations made after it follow it (0011: an index, for ledgers already at 0010; 0012:
    the kept live counts and an index; 0013: byte-order identifiers; 0014: who recorded each
    attempt; 0015: the inbox's index; 0016: Slack approvals)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection)
    key = ("attempts", "0010_release_0_2_schema")
    after = ("attempts", "0011_event_approval_idx")
    live_counts = ("attempts", "0012_live_counts")
    byte_order = ("attempts", "0013_byte_order_identifiers")
    recorded_by = ("attempts", "0014_recorded_by")
    held_order = ("attempts", "0015_held_order_idx")
    # Migrations after 0015 follow one another in one line, whatever their number.
    (leaf,) = loader.graph.leaf_nodes("attempts")
    node = leaf
    while node != held_order:
        parents = {p.key for p in loader.graph.node_map[node].parents if p.key[0] == "attempts"}
        (parent,) = parents
        assert parent[1] < node[1], (parent, node)
        node = parent
    assert {parent.key for parent in loader.graph.node_map[held_order].parents} == {recorded_by}
    assert {parent.key for parent in loader.graph.node_map[recorded_by].parents} == {byte_order}
    assert {parent.key for parent in loader.graph.node_map[byte_order].parents} == {live_counts}
    assert ("attempts", "0011_event_approval_idx") in {
        parent.key for parent in loader.graph.node_map[live_counts].parents
    }
    assert {parent.key for parent in loader.graph.node_map[after].parents} == {key}
    parents = {parent.key for parent in loader.graph.node_map[key].parents}
    assert ("attempts", "0009_drop_pattern_ops_copies") in parents
    replaced = [name for _, name in loader.disk_migrations[key].replaces]
    assert replaced == [
        "0010_notification_routes",
        "0011_traceparent",
        "0012_transparency_log",
        "0013_approval_policies",
        "0014_terminal_counts",
        "0015_archive_retention",
        "0016_erasure_salted_chain",
        "0017_approval_append_only",
    ]
    assert key in loader.applied_migrations  # the test database migrated through it


@pytest.mark.django_db
def test_the_leaves_keep_no_copy_of_their_unique_index_first_column():
    """Migration 0021: the unique (checkpoint, position) index serves every lookup by
    checkpoint, so no index on ``checkpoint_id`` alone is written with every leaf (on SQLite
    too, where the PostgreSQL test above does not look)."""
    import importlib

    migration = importlib.import_module("attempts.migrations.0021_leaf_without_checkpoint_copy")
    assert migration._copies(connection) == []
