#!/usr/bin/env python3
"""Benchmark: whether the sealer and the transparency log keep up with the write path.

    .venv/bin/python bench/seal.py [--attempts 2000] [--postgres]

In one run, on a scratch ledger (var/bench/seal.sqlite3, or a scratch PostgreSQL database that is
dropped afterwards), with a signing key in a scratch folder:

  writes    the agent's write path: record_intent for ``--attempts`` attempts (one transaction
            and one event each); the baseline, in attempts per second;
  seal      the sealer over all of them: leaves appended to the log, stored subtree hashes,
            the checkpoint and its note, then the signature (attempts/log.py); leaves per second;
  proofs    inclusion proofs read from the stored hashes, per second, at that log size.

It prints each figure and the ratio seal/writes: above 1, sealing keeps up with writing; sealing
runs in the worker, never on the agent's path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"


def _setup_env(postgres: bool) -> str | None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "ledgerweb.settings"
    os.environ.setdefault("LEDGERWEB_DATA_DIR", str(REPO / "var"))
    sys.path.insert(0, str(REPO))
    if postgres:
        import psycopg

        name = f"lw_bench_seal_{os.getpid()}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        os.environ["DATABASE_URL"] = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
        return name
    os.environ.pop("DATABASE_URL", None)
    path = REPO / "var" / "bench" / "seal.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    os.environ["LEDGERWEB_SQLITE_PATH"] = str(path)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=2000)
    parser.add_argument("--postgres", action="store_true", help="run on a scratch PostgreSQL DB")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="lw-bench-seal-")
    key = Path(folder) / "log.key"
    os.environ["LEDGERWEB_TLOG_KEY_FILE"] = str(key)
    scratch = _setup_env(args.postgres)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, check=True
        )
        subprocess.run(
            [sys.executable, "manage.py", "ledger_log", "genkey", "--out", str(key)],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        run(args)
    finally:
        if scratch:
            from django.db import connections

            connections.close_all()
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.db import connection

    from attempts import chain, ledger, log
    from attempts.models import EffectClass, Grant, Tenant, Tool
    from attempts.states import Actor

    tenant = Tenant.objects.create(slug="acme", name="Acme")
    tool = Tool.objects.create(name="update_crm", effect_class=EffectClass.IDEMPOTENT)
    Grant.objects.create(tenant=tenant, tool=tool, policy_version="v1", allowed_scopes=[])
    agent = Actor.agent("bench")

    began = time.perf_counter()
    for n in range(args.attempts):
        ledger.record_intent(
            tenant="acme",
            task_id="bench",
            tool_name="update_crm",
            idempotency_key=f"seal:{n}",
            args={"n": n},
            actor=agent,
        )
    writes = args.attempts / (time.perf_counter() - began)

    began = time.perf_counter()
    checkpoints = 0
    while chain.seal() is not None:
        checkpoints += 1
    sealed = time.perf_counter() - began
    newest = log.newest_signed()
    assert newest is not None and newest.size == args.attempts, "the sealer left work"
    seal_rate = args.attempts / sealed

    count = min(500, args.attempts)
    began = time.perf_counter()
    for index in range(0, args.attempts, max(1, args.attempts // count)):
        log.inclusion_proof(index, newest.size)
    proofs = count / (time.perf_counter() - began)

    print(f"database: {connection.vendor}; {args.attempts} attempts, {checkpoints} checkpoints")
    print(f"writes (record_intent, baseline): {writes:,.0f} attempts/s")
    print(f"seal (log append + checkpoint + signature): {seal_rate:,.0f} leaves/s")
    print(f"proofs (inclusion, from stored hashes): {proofs:,.0f} /s at size {newest.size}")
    print(f"ratio seal/writes: {seal_rate / writes:.1f}")


if __name__ == "__main__":
    main()
