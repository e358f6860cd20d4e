"""Whether a write the ledger acknowledged can be lost when its PostgreSQL fails over.

A commit is acknowledged to the agent once PostgreSQL says it is durable. On one server that
means flushed to its disk. With a standby, it means what ``synchronous_commit`` and
``synchronous_standby_names`` say, as the ledger's own sessions see them: unless a synchronous
standby has the commit too, promoting a standby after the primary is lost forgets the writes it
had not received, and the ledger would hand a key out again or forget that an effect was
dispatched (docs/scaling.md, failover). This module reads those settings, and
``pg_stat_replication`` where the ledger's role may read it, and says so: the deploy check
(attempts/checks.py) and ``/healthz`` report it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.db import connection

from attempts import dbadapter

# Levels of synchronous_commit at which a commit waits for a synchronous standby (when one is
# named): remote_write (in the standby's memory), on (on its disk), remote_apply (visible there).
WAITS_FOR_STANDBY = ("remote_write", "on", "remote_apply")


@dataclass(frozen=True)
class Durability:
    """What the ledger's sessions commit with, and what a failover can lose."""

    synchronous_commit: str
    synchronous_standby_names: str
    # Standbys streaming from this server and how many of them are synchronous; None where the
    # ledger's role may not read pg_stat_replication's details (grant it pg_monitor).
    standbys: int | None
    synchronous_standbys: int | None
    # "none": every acknowledged commit is on a synchronous standby too; "possible": standbys are
    # asynchronous, a failover can lose acknowledged writes; "no_standby": no standby streams
    # (nothing to fail over to that this server knows of); "waiting": synchronous standbys are
    # named but none is connected, so commits wait (nothing is lost, nothing is written either).
    failover_loss: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def durability() -> Durability | None:
    """The ledger connection's durability on failover (three short reads), or None on SQLite.
    Raises the database's error when it cannot be read."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('synchronous_commit'), "
            "current_setting('synchronous_standby_names')"
        )
        level, names = cursor.fetchone()
        # Rows are visible to every role; state and sync_state only to those allowed to see
        # other sessions' details (superuser, pg_monitor, pg_read_all_stats).
        cursor.execute("SELECT state, sync_state FROM pg_stat_replication")
        rows = cursor.fetchall()
    detailed = all(state is not None for state, _ in rows)
    streaming = [sync for state, sync in rows if state == "streaming"]
    standbys = len(streaming) if detailed else None
    synchronous = sum(1 for sync in streaming if sync in ("sync", "quorum")) if detailed else None
    waits = level in WAITS_FOR_STANDBY and names.strip() != ""
    if waits:
        loss = "waiting" if synchronous == 0 else "none"
    elif detailed and not rows:
        loss = "no_standby"
    else:
        loss = "possible"
    return Durability(level, names, standbys, synchronous, loss)


def warning_text(found: Durability) -> str | None:
    """What an operator is told when acknowledged writes can be lost on failover; None when
    they cannot (or there is no standby to fail over to)."""
    if found.failover_loss != "possible":
        return None
    who = (
        f"{found.standbys} standby(s) stream from this server"
        if found.standbys
        else "this server's standbys cannot be seen by the ledger's role"
    )
    if found.synchronous_standby_names.strip():
        why = f"the ledger's sessions commit with synchronous_commit={found.synchronous_commit}"
    else:
        why = "synchronous_standby_names is empty"
    return (
        f"Replication is asynchronous ({why}) and {who}: a failover can lose writes the ledger "
        "already acknowledged, and the ledger would then send a key again or forget a dispatch."
    )


def make_durable() -> None:
    """Return once everything this session has read is as durable as an acknowledged commit.

    PostgreSQL shows a transaction's writes to other sessions as soon as the primary has them,
    before a synchronous standby does (the committing session is still waiting). Something read
    and then sent outside without a write of ours before it (a checkpoint to a witness) could
    therefore be lost in a failover after the outside world saw it. A transaction that writes
    (a logical-decoding message, no table) waits at its commit, like every ledger commit, for
    the standby to have the WAL up to it, and so everything visible before it. A transaction
    that wrote no WAL would not wait. Nothing to do on SQLite."""
    if connection.vendor != "postgresql" or dbadapter.in_atomic_block(connection):
        return  # inside a transaction the caller's own commit is the wait
    from django.db import transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_logical_emit_message(true, 'ledgerweb', 'durable')")
