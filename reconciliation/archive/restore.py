"""``ledgerweb archive restore``: load archives into a scratch database for an investigation.

The scratch database is another SQLite file or PostgreSQL database, never the ledger: the
command runs its loading step in a child process whose settings point there (so nothing of the
ledger's own connection, history or signals can be written to by mistake), migrates it, and
refuses a database that holds checkpoints (a ledger's, not a scratch database). Every archive is
verified on the way (``verify_export.check_archive``: the manifest's SHA-256 as the ledger's
history recorded it when the ledger is at hand, each file's hash, each attempt's history and
receipt); an archive that does not verify loads nothing.

Restored attempts keep their ids, states, events and hashes (put back by the state machine's
``restore_archived``: only ``states.py`` writes ``state``); they are unsealed in the scratch
database (it has no checkpoints: their receipts are in the archive), so ``verify_audit`` there
checks each attempt's history and row. Owners become inactive people of the same name without a password;
approvals and erasure requests stay in the archive file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from attempts import states
from attempts.models import (
    Attempt,
    Checkpoint,
    ProviderEffect,
    RecordedKey,
    Tenant,
    key_digest,
)
from attempts.verify_export import LogTrust, VerifierKey, check_archive
from reconciliation.archive.record import ATTEMPT_COLUMNS, EVENT_COLUMNS, from_line
from reconciliation.archive.store import Store

REPO = Path(__file__).resolve().parents[2]


class RestoreError(Exception):
    """The restore cannot be done; the message says why. Nothing was loaded."""


def scratch_env(*, sqlite: str | None = None, database_url: str | None = None) -> dict[str, str]:
    """The environment of a process whose database is the scratch database."""
    env = dict(os.environ)
    if sqlite:
        env.pop("DATABASE_URL", None)
        env["LEDGERWEB_SQLITE_PATH"] = str(Path(sqlite).resolve())
    elif database_url:
        env["DATABASE_URL"] = database_url
    else:
        raise RestoreError(
            "say where the scratch database is: --into-sqlite or --into-database-url"
        )
    env.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def same_database(*, sqlite: str | None, database_url: str | None) -> bool:
    """Whether the target is the database this process (the ledger) uses."""
    settings = connection.settings_dict
    if sqlite:
        return (
            connection.vendor == "sqlite"
            and Path(str(settings["NAME"])).resolve() == Path(sqlite).resolve()
        )
    import dj_database_url

    other = dj_database_url.parse(database_url)
    return connection.vendor == "postgresql" and (
        other.get("NAME"),
        other.get("HOST") or "localhost",
        int(other.get("PORT") or 5432),
    ) == (
        settings.get("NAME"),
        settings.get("HOST") or "localhost",
        int(settings.get("PORT") or 5432),
    )


def restore(
    *,
    where: str,
    names: list[str],
    expect: dict[str, str],
    sqlite: str | None = None,
    database_url: str | None = None,
    log_keys: list[str] = (),
) -> subprocess.CompletedProcess:
    """Run the loading step (``archive load``) in a child process on the scratch database.
    ``expect`` maps archive names to the manifest SHA-256 the ledger's history recorded."""
    if same_database(sqlite=sqlite, database_url=database_url):
        raise RestoreError("the scratch database is the ledger's own database: choose another")
    # ``python -m django`` with the environment's settings module: the same command in a
    # checkout and in a wheel install (which has no manage.py).
    command = [sys.executable, "-m", "django", "archive", "load", "--from", where]
    for name in names:
        command += ["--name", name]
        if name in expect:
            command += ["--expect-sha256", f"{name}={expect[name]}"]
    for key in log_keys:
        command += ["--log-key", key]
    return subprocess.run(  # noqa: S603 - our own command, arguments as a list
        command,
        env=scratch_env(sqlite=sqlite, database_url=database_url),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )


def _index(fresh: list[dict[str, Any]]) -> None:
    """The restored attempts' keys and provider effects in the scratch database's permanent
    indexes, as the ledger's write path would have put them, so a key replayed there is
    answered by its restored attempt and never recorded twice. What an index already holds
    (loaded before, from an earlier restore) is kept as it is."""
    RecordedKey.objects.bulk_create(
        [
            RecordedKey(
                key_digest=key_digest(a["idempotency_key"]),
                tenant_id=a["tenant"],
                tool_name=a["tool_name"],
                args_hash=a["args_hash"],
                attempt_id=a["attempt_id"],
            )
            for a in (r["attempt"] for r in fresh)
        ],
        ignore_conflicts=True,
    )
    ProviderEffect.objects.bulk_create(
        [
            ProviderEffect(
                tool_name=a["tool_name"],
                provider_request_id=a["provider_request_id"],
                attempt_id=a["attempt_id"],
            )
            for a in (r["attempt"] for r in fresh)
            if a.get("provider_request_id")
        ],
        ignore_conflicts=True,
    )


def load(
    *,
    store: Store,
    names: list[str],
    expect: dict[str, str],
    log_keys: list[str] = (),
    say: Callable[[str], None] = lambda line: None,
) -> int:
    """Verify and load archives into this process's database (the scratch database).
    Returns how many attempts were loaded; RestoreError (nothing loaded) on any problem."""
    if Checkpoint.objects.exists():
        raise RestoreError(
            "this database holds checkpoints: it is a ledger, not a scratch database"
        )
    trust = LogTrust(log_keys=[VerifierKey.parse(k) for k in log_keys])
    records: list[dict[str, Any]] = []
    for name in names:
        check = check_archive(
            store.reader(name),
            name=name,
            expect_sha256=expect.get(name),
            trust=trust,
            on_record=records.append,
        )
        if not check.ok:
            raise RestoreError("\n".join(str(p) for p in check.problems))
        say(f"verified archive {name}: {len(check.leaves)} attempts")
    loaded = 0
    with transaction.atomic():
        known = set(Attempt.objects.values_list("attempt_id", flat=True))
        fresh = [r for r in records if r["attempt"]["attempt_id"] not in known]
        tenants = {r["attempt"]["tenant"] for r in fresh}
        have = set(Tenant.objects.filter(slug__in=tenants).values_list("slug", flat=True))
        # bulk_create: a scratch database gets the archive's rows, not configuration history.
        Tenant.objects.bulk_create(Tenant(slug=t, name=t) for t in sorted(tenants - have))
        users = get_user_model()
        owners = {r["attempt"]["owner"] for r in fresh if r["attempt"]["owner"]}
        present = set(users.objects.filter(username__in=owners).values_list("username", flat=True))
        # "!..." is Django's unusable password: restored people cannot sign in.
        unusable = "!restored"
        users.objects.bulk_create(
            users(username=name, is_active=False, password=unusable)
            for name in sorted(owners - present)
        )
        owner_pk = dict(users.objects.filter(username__in=owners).values_list("username", "pk"))
        # Parents before children: a linked attempt is archived before (or with) its parent.
        fresh.sort(key=lambda r: r["attempt"]["created_at"])
        for record in fresh:
            a = record["attempt"]
            states.restore_archived(
                from_line(ATTEMPT_COLUMNS, a),
                (from_line(EVENT_COLUMNS, e) for e in record["events"]),
                owner_id=owner_pk.get(a["owner"]),
            )
            loaded += 1
        _index(fresh)
        by_id = dict(
            Attempt.objects.filter(
                attempt_id__in=[r["attempt"]["attempt_id"] for r in fresh]
            ).values_list("attempt_id", "pk")
        )
        for record in fresh:
            parent = record["attempt"]["parent_attempt_id"]
            if parent:
                parent_pk = (
                    by_id.get(parent)
                    or Attempt.objects.filter(attempt_id=parent)
                    .values_list("pk", flat=True)
                    .first()
                )
                if parent_pk:
                    Attempt.objects.filter(pk=by_id[record["attempt"]["attempt_id"]]).update(
                        parent_id=parent_pk
                    )
    say(f"loaded {loaded} attempts ({len(records) - loaded} were there already)")
    return loaded
