"""A scratch ledger for the benches that write through the product's own path: a fresh SQLite
file under var/bench, or a PostgreSQL database of its own that is dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"


def _point_at(name: str, postgres: bool) -> str | None:
    """Point this process's settings at a new scratch ledger; the PostgreSQL database's name."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "ledgerweb.settings"
    os.environ.setdefault("LEDGERWEB_DATA_DIR", str(REPO / "var"))
    if postgres:
        import psycopg

        database = f"lw_bench_{name}_{os.getpid()}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        os.environ["DATABASE_URL"] = PG_ADMIN.rsplit("/", 1)[0] + "/" + database
        return database
    os.environ.pop("DATABASE_URL", None)
    path = REPO / "var" / "bench" / f"{name}.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    os.environ["LEDGERWEB_SQLITE_PATH"] = str(path)
    return None


@contextlib.contextmanager
def scratch_ledger(name: str, *, postgres: bool) -> Iterator[None]:
    """A migrated scratch ledger called ``name`` for the body of the ``with``: var/bench/
    <name>.sqlite3 (made fresh), or with ``postgres`` a scratch database, dropped on the way out."""
    database = _point_at(name, postgres)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, check=True
        )
        yield
    finally:
        if database:
            from django.db import connections

            connections.close_all()
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def one_tool_agent() -> Any:
    """Set Django up, give tenant acme a grant for one idempotent tool (update_crm), and return
    the agent the bench writes as."""
    import django

    django.setup()
    from attempts.actors import Actor
    from attempts.models import EffectClass, Grant, Tenant, Tool

    tenant = Tenant.objects.create(slug="acme", name="Acme")
    tool = Tool.objects.create(name="update_crm", effect_class=EffectClass.IDEMPOTENT)
    Grant.objects.create(tenant=tenant, tool=tool, policy_version="v1", allowed_scopes=[])
    return Actor.agent("bench")


def record(agent: Any, key: str, n: int) -> Any:
    """The bench's tool call recorded: an update_crm intent of tenant acme, arguments ``{"n": n}``;
    returns ``(attempt, created)`` as ``ledger.record_intent`` does."""
    from attempts import ledger

    return ledger.record_intent(
        tenant="acme",
        task_id="bench",
        tool_name="update_crm",
        idempotency_key=key,
        args={"n": n},
        actor=agent,
    )
