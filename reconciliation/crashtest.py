"""Failure injection as a deployment gate: the machinery behind ``manage.py crashtest``.

Every case runs against its own scratch database (a SQLite file, or a ``crashtest_*`` database
created on the PostgreSQL server) and its own demo provider process with a durable record of every
effect it performed. Agents and reconcilers are real child processes; the agent is killed with
SIGKILL at a named crash point (``attempts.faults``), recovery is run twice in a row and twice at
once, and then every invariant of protocol section 7 is checked against the ledger and against
the provider's own record. Nothing here writes to the operator's ledger database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import http.client
import json
import os
import random
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from attempts import audit
from attempts.canonical import canonical_bytes
from attempts.models import (
    ATTENTION_STATES,
    Attempt,
    AttemptEvent,
    EffectClass,
    Grant,
    Membership,
    OwnershipRule,
    Role,
    State,
    Tenant,
    Tool,
)
from reconciliation import faults

REPO = Path(settings.BASE_DIR)
MANAGE = REPO / "manage.py"
PYTHON = sys.executable

INVARIANTS: tuple[tuple[str, str], ...] = (
    ("once", "no non-idempotent effect twice; every effect has its ledger row"),
    ("settled", "every attempt ends settled or in MANUAL_REVIEW"),
    ("visible", "args hash, key, request id and intact history for each attempt"),
    ("authority", "no widened scope, no crossed tenant, no send under old authority"),
    ("owned", "UNKNOWN and MANUAL_REVIEW work is queued with an owner"),
    ("recovery", "recovery is safe to run twice in a row and twice at once"),
)
SETTLED = {State.OUTCOME_CONFIRMED, State.FAILED, State.MANUAL_REVIEW}
IN_FLIGHT = {State.INTENT_RECORDED, State.DISPATCHED, State.UNKNOWN, State.FAILED_RETRYABLE}

# The tools of the scratch world: one per effect class for the cases, all five for fuzzing.
TOOLS: dict[str, tuple[str, bool]] = {
    "update_crm": (EffectClass.IDEMPOTENT, False),
    "send_invoice_email": (EffectClass.IDEMPOTENT, True),
    "open_ticket": (EffectClass.RECONCILABLE, False),
    "charge_card": (EffectClass.RECONCILABLE, True),
    "deploy_service": (EffectClass.MANUAL, True),
}
CASE_TOOLS = ("update_crm", "open_ticket", "deploy_service")
TENANTS = ("acme", "globex")
OWNER = "crashtest-owner"
TOOL_TIMEOUT = 1.0  # seconds the agent and reconciler wait for the provider
CHILD_TIMEOUT = 120.0  # a child process still running after this is a harness failure

# Knobs of the child processes: stale after one second, UNKNOWN due again at once.
CHILD_SETTINGS = {
    "LEDGERWEB_STALE_AFTER": "1",
    "LEDGERWEB_BACKOFF_BASE": "0",
    "LEDGERWEB_BACKOFF_CAP": "1",
    "LEDGERWEB_LOG_LEVEL": "WARNING",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class HarnessError(Exception):
    """crashtest itself could not run (no provider, no reconciler, a child hung)."""


def args_hash(args: Any) -> str:
    return hashlib.sha256(canonical_bytes(args)).hexdigest()


# ---------------------------------------------------------------------------------------------
# Scratch databases


@dataclass
class ScratchDatabase:
    """One scratch ledger database: reachable in-process through ``alias`` and by children
    through ``env``."""

    alias: str
    label: str
    child_env: dict[str, str]
    config: dict[str, Any]
    drop: Callable[[], None]

    def attach(self) -> None:
        merged = connections.configure_settings(
            {"default": dict(settings.DATABASES["default"]), self.alias: dict(self.config)}
        )
        connections.settings[self.alias] = merged[self.alias]

    def detach(self) -> None:
        with contextlib.suppress(Exception):
            connections[self.alias].close()
        with contextlib.suppress(Exception):
            del connections[self.alias]
        connections.settings.pop(self.alias, None)


def _sqlite_config(path: Path) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=FULL;"
            "PRAGMA busy_timeout=30000;PRAGMA foreign_keys=ON",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        },
    }


class DatabaseFactory:
    """Creates the scratch databases of one crashtest run: a migrated, seeded template first,
    then a copy of it per case. SQLite: files under the run folder. PostgreSQL: databases named
    ``crashtest_<run>_<case>`` on the server of ``server_url``, dropped at the end."""

    def __init__(self, run_dir: Path, server_url: str | None, run_id: str) -> None:
        self.run_dir = run_dir
        self.server_url = server_url
        self.run_id = run_id
        self.created: list[str] = []
        if server_url:
            import dj_database_url

            parsed = dj_database_url.parse(server_url)
            if parsed["ENGINE"] != "django.db.backends.postgresql":
                raise HarnessError("--database-url must be a postgres:// URL")
            self.pg = parsed
        else:
            self.pg = None

    @property
    def vendor(self) -> str:
        return "postgresql" if self.pg else "sqlite"

    # PostgreSQL helpers -----------------------------------------------------------------
    def _admin(self):
        import psycopg

        assert self.pg is not None
        try:
            return psycopg.connect(
                host=self.pg["HOST"] or "127.0.0.1",
                port=self.pg["PORT"] or 5432,
                user=self.pg["USER"] or "postgres",
                password=self.pg["PASSWORD"] or None,
                dbname=self.pg["NAME"] or "postgres",
                autocommit=True,
                connect_timeout=10,
            )
        except psycopg.Error as exc:
            raise HarnessError(f"cannot reach the PostgreSQL server: {exc}".strip()) from None

    def _pg_url(self, name: str) -> str:
        assert self.pg is not None
        user = quote(self.pg["USER"] or "postgres", safe="")
        password = f":{quote(self.pg['PASSWORD'], safe='')}" if self.pg["PASSWORD"] else ""
        host = self.pg["HOST"] or "127.0.0.1"
        return f"postgres://{user}{password}@{host}:{self.pg['PORT'] or 5432}/{name}"

    def _pg_config(self, name: str) -> dict[str, Any]:
        assert self.pg is not None
        config = dict(self.pg)
        config["NAME"] = name
        config["CONN_MAX_AGE"] = 0
        config["OPTIONS"] = {"options": "-c synchronous_commit=on"}
        return config

    def _pg_drop(self, name: str) -> Callable[[], None]:
        def drop() -> None:
            with self._admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        return drop

    # Both --------------------------------------------------------------------------------
    def database(self, label: str, *, template: str | None = None) -> ScratchDatabase:
        alias = f"crashtest_{label}"
        if self.pg is None:
            path = self.run_dir / f"{label}.sqlite3"
            if template is not None:
                source = sqlite3.connect(self.run_dir / f"{template}.sqlite3")
                target = sqlite3.connect(path)
                with target:
                    source.backup(target)
                source.close()
                target.close()
            env = {"LEDGERWEB_SQLITE_PATH": str(path)}
            return ScratchDatabase(alias, label, env, _sqlite_config(path), lambda: None)
        import psycopg

        name = f"crashtest_{self.run_id}_{label}".lower()
        with self._admin() as admin:
            clause = f' TEMPLATE "crashtest_{self.run_id}_{template}"'.lower() if template else ""
            try:
                admin.execute(f'CREATE DATABASE "{name}"{clause}')
            except psycopg.Error as exc:
                raise HarnessError(f"cannot create the scratch database {name}: {exc}") from None
        self.created.append(name)
        env = {"DATABASE_URL": self._pg_url(name)}
        return ScratchDatabase(alias, label, env, self._pg_config(name), self._pg_drop(name))


# ---------------------------------------------------------------------------------------------
# The provider process


class ProviderProcess:
    """The demo provider (``reconciliation.demo_provider``) as a separate process."""

    def __init__(self, folder: Path, name: str) -> None:
        self.db = folder / f"{name}-provider.sqlite3"
        self.port_file = folder / f"{name}-provider.port"
        self.log = folder / f"{name}-provider.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        command = [PYTHON, "-m", "reconciliation.demo_provider", "--db", str(self.db)]
        command += ["--port", "0", "--port-file", str(self.port_file)]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=_base_env()
            )
        deadline = time.monotonic() + 20
        while not self.port_file.exists() or not self.port_file.read_text().strip():
            if self.process.poll() is not None:
                raise HarnessError(f"the demo provider did not start: {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise HarnessError("the demo provider did not report its port in time")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text().strip())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def url(self, tool: str, what: str) -> str:
        return f"http://127.0.0.1:{self.port}/tools/{tool}/{what}"

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data else {}
            connection.request(method, path, body=data, headers=headers)
            answer = connection.getresponse()
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else None
        finally:
            connection.close()

    def control(self, **patch: Any) -> None:
        status, body = self.request("POST", "/_control", patch)
        if status != 200:
            raise HarnessError(f"provider refused control {patch}: {status} {body}")

    def reset(self) -> None:
        self.request("POST", "/_control/reset")

    def effects(self, **filters: str) -> list[dict[str, Any]]:
        query = f"?{urlencode(filters)}" if filters else ""
        status, body = self.request("GET", f"/effects{query}")
        if status != 200 or not isinstance(body, list):
            raise HarnessError(f"provider /effects answered {status}")
        return body

    def summary(self) -> dict[str, Any]:
        status, body = self.request("GET", "/effects/summary")
        if status != 200:
            raise HarnessError(f"provider /effects/summary answered {status}")
        return body


def effect_key(effect: dict[str, Any]) -> str:
    return str(effect.get("idempotency_key") or effect.get("key") or "")


def effect_hash(effect: dict[str, Any]) -> str:
    if effect.get("args_hash"):
        return str(effect["args_hash"])
    return args_hash(effect.get("args"))


def effect_time(effect: dict[str, Any]) -> dt.datetime | None:
    raw = effect.get("created_at")
    if not raw:
        return None
    try:
        value = dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def root_key(key: str) -> str:
    """The logical effect a key belongs to: linked attempts append ``~rN`` to the root key."""
    return key.split("~r", 1)[0]


# ---------------------------------------------------------------------------------------------
# Child processes


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in faults_env_names()}
    env.pop("DATABASE_URL", None)
    env.pop("LEDGERWEB_SQLITE_PATH", None)
    env["PYTHONPATH"] = str(REPO)
    env["DJANGO_SETTINGS_MODULE"] = "ledgerweb.settings"
    env["LEDGERWEB_DATA_DIR"] = str(settings.DATA_DIR)
    env.update(CHILD_SETTINGS)
    return env


def faults_env_names() -> tuple[str, ...]:
    return (
        faults.ENV_CRASH_AT,
        faults.ENV_CRASH_AFTER,
        faults.ENV_CRASH_TIMER_MS,
        faults.ENV_MUTATION,
    )


@dataclass
class ChildResult:
    """What one agent or reconciler process did and how it ended."""

    role: str
    returncode: int
    stdout: str
    stderr: str
    log: Path

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def fault(self) -> str:
        """Where the process died: ``role:point``, ``role:timer`` or ``role:SIGKILL``."""
        for line in self.stderr.splitlines():
            if line.startswith("ledgerweb-fault: crash point "):
                return f"{self.role}:{line.split()[3]}"
            if line.startswith("ledgerweb-fault: kill timer"):
                return f"{self.role}:timer"
        return f"{self.role}:SIGKILL"

    def started(self) -> list[int]:
        return [
            int(line.split()[1]) for line in self.stdout.splitlines() if line.startswith("started ")
        ]

    def done(self) -> list[int]:
        return [
            int(line.split()[1]) for line in self.stdout.splitlines() if line.startswith("done ")
        ]

    def tail(self) -> str:
        lines = (self.stderr or self.stdout).strip().splitlines()
        return " | ".join(lines[-3:])[-400:]


@dataclass
class Child:
    role: str
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def wait(self) -> ChildResult:
        try:
            code = self.process.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise HarnessError(f"{self.role} did not finish within {CHILD_TIMEOUT:.0f}s") from None
        return ChildResult(
            self.role,
            code,
            self.out.read_text(errors="replace"),
            self.err.read_text(errors="replace"),
            self.err,
        )


# ---------------------------------------------------------------------------------------------
# One case's world


@dataclass
class Check:
    passed: bool = True
    evidence: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.passed = False
        if len(self.evidence) < 20:
            self.evidence.append(message)
        elif len(self.evidence) == 20:
            self.evidence.append("... (more evidence left out)")


@dataclass
class Snapshot:
    attempts: dict[str, tuple[str, int, int, str, str]]
    effects_by_key: dict[str, int]


class Scene:
    """One case (or a fuzz run): its scratch database, its provider, its child processes, and the
    evidence gathered while it runs (policy changes, snapshots, checkpoints, recovery results)."""

    def __init__(self, harness: Harness, label: str, db: ScratchDatabase) -> None:
        self.harness = harness
        self.label = label
        self.db = db
        self.folder = harness.run_dir / label
        self.folder.mkdir(parents=True, exist_ok=True)
        self.provider = ProviderProcess(self.folder, label)
        self.children: list[Child] = []
        self.counter = 0
        self.kills: Counter[str] = Counter()
        self.recovery_results: list[ChildResult] = []
        # (time, tenant, tool, policy_version, scopes): the grants in force from that moment.
        self.grant_history: list[tuple[dt.datetime, str, str, str, list[str]]] = []
        self.checks: dict[str, Check] = {name: Check() for name, _ in INVARIANTS}
        # Faults the case was to inject but did not: the case then proves less, and fails.
        self.unmet: list[str] = []

    @property
    def alias(self) -> str:
        return self.db.alias

    # --- set up and tear down ---------------------------------------------------------------
    def open(self) -> None:
        self.db.attach()
        self.provider.start()
        for tool, (effect_class, _critical) in TOOLS.items():
            Tool.objects.using(self.alias).filter(name=tool).update(
                dispatch_url=self.provider.url(tool, "send"),
                lookup_url=""
                if effect_class == EffectClass.MANUAL
                else self.provider.url(tool, "lookup"),
            )
            # Only idempotent tools honour the key at the provider: a second send of anything
            # else is a second effect, counted by the provider.
            self.provider.control(
                tools={tool: {"honour_keys": effect_class == EffectClass.IDEMPOTENT}}
            )
        for grant in Grant.objects.using(self.alias).all():
            self.grant_history.append(
                (
                    dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
                    grant.tenant_id,
                    grant.tool_id,
                    grant.policy_version,
                    list(grant.allowed_scopes),
                )
            )

    def close(self) -> None:
        for child in self.children:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
        self.provider.stop()
        self.db.detach()

    # --- children ---------------------------------------------------------------------------
    def _spawn(self, role: str, command: list[str], fault_env: dict[str, str]) -> Child:
        self.counter += 1
        stem = self.folder / f"{self.counter:04d}-{role}"
        env = _base_env()
        env.update(self.db.child_env)
        env.update(fault_env)
        if self.harness.mutation:
            env[faults.ENV_MUTATION] = self.harness.mutation
        out, err = stem.with_suffix(".out"), stem.with_suffix(".err")
        with open(out, "wb") as out_file, open(err, "wb") as err_file:
            process = subprocess.Popen(
                [PYTHON, str(MANAGE), *command],
                cwd=REPO,
                env=env,
                stdout=out_file,
                stderr=err_file,
            )
        child = Child(role, process, out, err)
        self.children.append(child)
        return child

    def start_agent(
        self,
        calls: list[dict[str, Any]],
        *,
        start: int = 0,
        count: int | None = None,
        crash_at: str | None = None,
        crash_after: int = 1,
        timer_ms: int | None = None,
        not_before: float | None = None,
        name: str = "agent",
    ) -> Child:
        self.counter += 1
        plan = self.folder / f"{self.counter:04d}-plan.json"
        plan.write_text(json.dumps(calls))
        command = ["crashtest_agent", str(plan), "--start", str(start), "--name", name]
        if count is not None:
            command += ["--count", str(count)]
        if not_before is not None:
            command += ["--not-before", f"{not_before:.3f}"]
        fault_env: dict[str, str] = {}
        if crash_at:
            fault_env[faults.ENV_CRASH_AT] = crash_at
            fault_env[faults.ENV_CRASH_AFTER] = str(crash_after)
        if timer_ms is not None:
            fault_env[faults.ENV_CRASH_TIMER_MS] = str(timer_ms)
        return self._spawn("agent", command, fault_env)

    def start_recovery(self, *, crash_at: str | None = None, timer_ms: int | None = None) -> Child:
        fault_env: dict[str, str] = {}
        if crash_at:
            fault_env[faults.ENV_CRASH_AT] = crash_at
        if timer_ms is not None:
            fault_env[faults.ENV_CRASH_TIMER_MS] = str(timer_ms)
        return self._spawn("reconcile", list(self.harness.recovery_command), fault_env)

    def agents(self, *specs: dict[str, Any]) -> list[ChildResult]:
        """Run agents at once (each spec: the keyword arguments of ``start_agent``)."""
        started = [self.start_agent(**spec) for spec in specs]
        results = [child.wait() for child in started]
        for result in results:
            if result.killed:
                self.kills[result.fault] += 1
            elif result.returncode != 0:
                raise HarnessError(f"an agent failed ({result.returncode}): {result.tail()}")
        return results

    def recover(self, *, at_once: int = 1, **fault: Any) -> list[ChildResult]:
        """Run ``at_once`` reconcilers at the same time and wait for them."""
        started = [self.start_recovery(**fault) for _ in range(at_once)]
        results = [child.wait() for child in started]
        for result in results:
            if result.killed:
                self.kills[result.fault] += 1
            else:
                self.recovery_results.append(result)
                if result.returncode != 0:
                    self.checks["recovery"].fail(
                        f"a recovery run exited {result.returncode}: {result.tail()}"
                    )
        return results

    def wait_until_due(self) -> None:
        """Sleep until every in-flight attempt is due for recovery (stale after one second)."""
        moments = [
            max(m for m in pair if m is not None)
            for pair in Attempt.objects.using(self.alias)
            .filter(state__in=IN_FLIGHT)
            .values_list("next_check_at", "lease_until")
            if any(m is not None for m in pair)
        ]
        latest = max(moments, default=None)
        if latest is not None:
            delay = (latest - timezone.now()).total_seconds() + 0.05
            if delay > 0:
                time.sleep(min(delay, 30))

    def recovery_round(self) -> None:
        """Recovery as section 7 wants it: once, again (nothing the first settled may change),
        then twice at once (the same)."""
        self.wait_until_due()
        self.recover()
        first = self.snapshot()
        self.wait_until_due()
        self.recover()
        self.compare(first, self.snapshot(), "a second run")
        self.wait_until_due()
        self.recover(at_once=2)
        self.compare(first, self.snapshot(), "two runs at once")

    # --- provider and grants ---------------------------------------------------------------
    def change_grant(
        self, tenant: str, tool: str, *, policy_version: str, scopes: list[str]
    ) -> None:
        now = timezone.now()
        Grant.objects.using(self.alias).filter(tenant_id=tenant, tool_id=tool).update(
            policy_version=policy_version, allowed_scopes=scopes, updated_at=now
        )
        self.grant_history.append((now, tenant, tool, policy_version, scopes))

    def grant_at(self, tenant: str, tool: str, when: dt.datetime) -> tuple[str, list[str]] | None:
        found = None
        for moment, g_tenant, g_tool, version, scopes in self.grant_history:
            if (g_tenant, g_tool) == (tenant, tool) and moment <= when:
                found = (version, scopes)
        return found

    # --- snapshots and checks ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        counts = Counter(
            AttemptEvent.objects.using(self.alias).values_list("attempt__attempt_id", flat=True)
        )
        attempts = {
            a.attempt_id: (
                a.state,
                a.version,
                counts[a.attempt_id],
                a.provider_request_id,
                a.result_ref,
            )
            for a in Attempt.objects.using(self.alias).all()
        }
        by_key = Counter(effect_key(e) for e in self.provider.effects())
        return Snapshot(attempts, dict(by_key))

    def compare(self, before: Snapshot, after: Snapshot, what: str) -> None:
        check = self.checks["recovery"]
        keys_of = {
            a.attempt_id: a.idempotency_key
            for a in Attempt.objects.using(self.alias).only("attempt_id", "idempotency_key")
        }
        for attempt_id, then in before.attempts.items():
            if then[0] not in SETTLED and then[0] != State.RECONCILED:
                continue
            now = after.attempts.get(attempt_id)
            if now != then:
                check.fail(
                    f"{what} changed settled attempt {attempt_id}: "
                    f"(state, version, events, request id, result) {then} -> {now}"
                )
            key = keys_of.get(attempt_id, "")
            if after.effects_by_key.get(key, 0) != before.effects_by_key.get(key, 0):
                check.fail(
                    f"{what} performed the settled effect {key!r} again: "
                    f"{before.effects_by_key.get(key, 0)} -> {after.effects_by_key.get(key, 0)}"
                )

    def checkpoint_owned(self, moment: str) -> None:
        """Invariant 5 at a moment in the middle of a case (checked again at the end)."""
        check_owned(self, self.checks["owned"], moment)

    def verify(self) -> dict[str, Check]:
        effects = self.provider.effects()
        check_once(self, self.checks["once"], effects)
        check_settled(self, self.checks["settled"], effects)
        check_visible(self, self.checks["visible"], effects)
        check_authority(self, self.checks["authority"], effects)
        check_owned(self, self.checks["owned"], "the end")
        if not self.recovery_results:
            self.checks["recovery"].fail("recovery never ran to completion")
        return self.checks

    def stats(self) -> dict[str, Any]:
        states = Counter(Attempt.objects.using(self.alias).values_list("state", flat=True))
        summary = self.provider.summary()
        return {
            "attempts": dict(sorted(states.items())),
            "effects": summary.get("total"),
            "kills": dict(sorted(self.kills.items())),
            "recovery_runs": len(self.recovery_results),
        }


# ---------------------------------------------------------------------------------------------
# The invariants of protocol section 7, each returning its evidence


def _attempts(scene: Scene) -> list[Attempt]:
    return list(Attempt.objects.using(scene.alias).select_related("parent").order_by("id"))


def check_once(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """1. No logical effect performed twice at the provider (a non-idempotent tool counts every
    send; linked attempts share their root's logical effect), and no effect without its row."""
    by_key = {a.idempotency_key: a for a in _attempts(scene)}
    per_logical: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for effect in effects:
        key = effect_key(effect)
        per_logical[(str(effect.get("tool", "")), root_key(key))].append(effect)
        attempt = by_key.get(key)
        if attempt is None:
            check.fail(f"effect {effect.get('id')} under key {key!r} has no ledger attempt")
            continue
        if effect_hash(effect) != attempt.args_hash:
            check.fail(
                f"effect {effect.get('id')} under {key!r} has payload hash {effect_hash(effect)[:12]}"
                f" but the ledger recorded {attempt.args_hash[:12]}"
            )
        sender = effect.get("ledger_attempt_id")
        if sender and sender != attempt.attempt_id:
            check.fail(
                f"effect {effect.get('id')} under {key!r} was sent by {sender}, "
                f"not by its attempt {attempt.attempt_id}"
            )
    for (tool, logical), performed in sorted(per_logical.items()):
        if len(performed) > 1:
            ids = ", ".join(str(e.get("id")) for e in performed)
            check.fail(f"{tool} effect {logical!r} performed {len(performed)} times ({ids})")


def _final_of(attempt: Attempt, children: dict[int, list[Attempt]]) -> Attempt | None:
    seen = set()
    current = attempt
    while current.state == State.RECONCILED:
        if current.pk in seen or not children.get(current.pk):
            return None
        seen.add(current.pk)
        current = children[current.pk][-1]
    return current


def check_settled(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """2. Every attempt is OUTCOME_CONFIRMED, FAILED or MANUAL_REVIEW (RECONCILED only with a
    link to one that is), and the ledger agrees with the provider: confirmed means performed
    with that payload, failed means not performed."""
    attempts = _attempts(scene)
    children: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.parent_id:
            children[attempt.parent_id].append(attempt)
    performed = defaultdict(list)
    for effect in effects:
        performed[effect_key(effect)].append(effect)
    for attempt in attempts:
        if attempt.state == State.RECONCILED:
            final = _final_of(attempt, children)
            if final is None or final.state not in SETTLED:
                check.fail(
                    f"{attempt.attempt_id} is RECONCILED but its lineage ends "
                    f"{'nowhere' if final is None else f'in {final.state}'}"
                )
        elif attempt.state not in SETTLED:
            check.fail(f"{attempt.attempt_id} ({attempt.tool_name}) was left {attempt.state}")
        done = performed.get(attempt.idempotency_key, [])
        if attempt.state == State.OUTCOME_CONFIRMED and not any(
            effect_hash(e) == attempt.args_hash for e in done
        ):
            check.fail(
                f"{attempt.attempt_id} is OUTCOME_CONFIRMED but the provider has no effect "
                f"under {attempt.idempotency_key!r} with its payload"
            )
        if attempt.state == State.FAILED and done:
            check.fail(
                f"{attempt.attempt_id} is FAILED but the provider performed it "
                f"({', '.join(str(e.get('id')) for e in done)})"
            )


def check_visible(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """3. Each attempt shows its key, args, a correct args hash, the provider request id once
    the effect is confirmed, and a full history whose hash chain is intact."""
    ids_by_key = {effect_key(e): str(e.get("id")) for e in effects}
    for attempt in _attempts(scene):
        if not attempt.idempotency_key:
            check.fail(f"{attempt.attempt_id} has no idempotency key")
        if args_hash(attempt.args) != attempt.args_hash:
            check.fail(f"{attempt.attempt_id}: args hash does not match its normalized args")
        provider_id = ids_by_key.get(attempt.idempotency_key)
        if (
            attempt.state == State.OUTCOME_CONFIRMED
            and provider_id
            and attempt.provider_request_id != provider_id
        ):
            check.fail(
                f"{attempt.attempt_id} is confirmed but shows provider request id "
                f"{attempt.provider_request_id!r}, the provider's is {provider_id!r}"
            )
    moves: dict[str, list[str]] = defaultdict(list)
    previous = audit.GENESIS
    for event in AttemptEvent.objects.using(scene.alias).select_related("attempt").order_by("id"):
        payload = audit.event_payload(
            attempt_id=event.attempt.attempt_id,
            action=event.action,
            actor_kind=event.actor_kind,
            actor=event.actor,
            from_state=event.from_state,
            to_state=event.to_state,
            reason=event.reason,
            details=event.details,
            created_at=event.created_at,
            prev_hash=event.prev_hash,
        )
        if event.prev_hash != previous or audit.payload_hash(payload) != event.hash:
            check.fail(f"history chain broken at event {event.pk} ({event.action})")
        previous = event.hash
        moves[event.attempt.attempt_id].append(event.to_state)
    for attempt in _attempts(scene):
        history = moves.get(attempt.attempt_id, [])
        if not history or history[-1] != attempt.state:
            check.fail(
                f"{attempt.attempt_id} is {attempt.state} but its history ends in "
                f"{history[-1] if history else 'nothing'}"
            )


def check_authority(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """4. A linked attempt keeps its tenant and tool and never widens scope (within both its
    parent's and the grant of its day); every send happened under the authority in force then."""
    attempts = _attempts(scene)
    for attempt in attempts:
        parent = attempt.parent
        if parent is not None:
            if attempt.tenant_id != parent.tenant_id or attempt.tool_name != parent.tool_name:
                check.fail(
                    f"linked {attempt.attempt_id} moved from {parent.tenant_id}/{parent.tool_name}"
                    f" to {attempt.tenant_id}/{attempt.tool_name}"
                )
            extra = set(attempt.credential_scope) - set(parent.credential_scope)
            if extra:
                check.fail(
                    f"linked {attempt.attempt_id} widened scope beyond its parent: {sorted(extra)}"
                )
        grant = scene.grant_at(attempt.tenant_id, attempt.tool_name, attempt.created_at)
        if grant is not None:
            extra = set(attempt.credential_scope) - set(grant[1])
            if extra:
                check.fail(
                    f"{attempt.attempt_id} holds scopes its grant never gave: {sorted(extra)}"
                )
    by_id = {a.attempt_id: a for a in attempts}
    sends = (
        AttemptEvent.objects.using(scene.alias)
        .filter(to_state=State.DISPATCHED)
        .exclude(from_state=State.DISPATCHED)
    )
    for event in sends.select_related("attempt"):
        attempt = by_id[event.attempt.attempt_id]
        grant = scene.grant_at(attempt.tenant_id, attempt.tool_name, event.created_at)
        if grant is None:
            check.fail(f"{attempt.attempt_id} was dispatched with no grant in force")
        elif grant[0] != attempt.policy_version or set(attempt.credential_scope) - set(grant[1]):
            check.fail(
                f"{attempt.attempt_id} was dispatched at {event.created_at:%H:%M:%S.%f} under "
                f"policy {attempt.policy_version} {attempt.credential_scope}, but the grant then "
                f"was {grant[0]} {grant[1]}"
            )
    by_key = {a.idempotency_key: a for a in attempts}
    for effect in effects:
        attempt = by_key.get(effect_key(effect))
        moment = effect_time(effect)
        if attempt is None or moment is None:
            continue
        grant = scene.grant_at(attempt.tenant_id, attempt.tool_name, moment)
        if grant is not None and grant[0] != attempt.policy_version:
            check.fail(
                f"effect {effect.get('id')} of {attempt.attempt_id} was performed at "
                f"{moment:%H:%M:%S.%f} under old policy {attempt.policy_version} "
                f"(in force: {grant[0]})"
            )


def check_owned(scene: Scene, check: Check, moment: str) -> None:
    """5. UNKNOWN and MANUAL_REVIEW attempts have an active owner who belongs to their tenant,
    and UNKNOWN ones are queued for another look (a next check time)."""
    members = set(Membership.objects.using(scene.alias).values_list("tenant_id", "user_id"))
    active = set(
        get_user_model()
        .objects.db_manager(scene.alias)
        .filter(is_active=True)
        .values_list("id", flat=True)
    )
    for attempt in Attempt.objects.using(scene.alias).filter(state__in=ATTENTION_STATES):
        if attempt.owner_id is None:
            check.fail(f"at {moment}: {attempt.attempt_id} is {attempt.state} with no owner")
        elif attempt.owner_id not in active or (attempt.tenant_id, attempt.owner_id) not in members:
            check.fail(
                f"at {moment}: {attempt.attempt_id} is owned by user {attempt.owner_id}, "
                f"who is not an active member of {attempt.tenant_id}"
            )
        if attempt.state == State.UNKNOWN and attempt.next_check_at is None:
            check.fail(f"at {moment}: {attempt.attempt_id} is UNKNOWN but not queued for a check")


# ---------------------------------------------------------------------------------------------
# The harness and the cases


def _call(tool: str, key: str, n: int, tenant: str = "acme") -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task_id": f"task-{key}",
        "tool_name": tool,
        "idempotency_key": key,
        "args": {"ref": key, "n": n, "note": "crashtest ✓"},
    }


@dataclass
class CaseReport:
    case: str
    title: str
    checks: dict[str, Check]
    stats: dict[str, Any]
    seconds: float
    error: str = ""
    unmet: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.error and not self.unmet and all(c.passed for c in self.checks.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "title": self.title,
            "passed": self.passed,
            "error": self.error,
            "faults_not_reached": self.unmet,
            "seconds": round(self.seconds, 2),
            "invariants": {
                name: {"passed": check.passed, "evidence": check.evidence}
                for name, check in self.checks.items()
            },
            "stats": self.stats,
        }


class Harness:
    """One crashtest run: the run folder, the template database, and the cases."""

    def __init__(
        self,
        *,
        server_url: str | None,
        progress: Callable[[str], None],
        mutation: str = "",
        keep: bool = False,
        recovery_command: tuple[str, ...] = ("reconcile", "--once", "--lease-seconds", "5"),
    ) -> None:
        self.run_id = f"{time.strftime('%Y%m%d%H%M%S')}_{secrets.token_hex(3)}"
        self.run_dir = Path(settings.DATA_DIR) / "crashtest" / self.run_id
        self.factory = DatabaseFactory(self.run_dir, server_url, self.run_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.mutation = mutation
        self.keep = keep
        self.recovery_command = recovery_command
        self.databases: list[ScratchDatabase] = []
        self.started = time.monotonic()
        self.failed = False

    @property
    def vendor(self) -> str:
        return self.factory.vendor

    def say(self, message: str) -> None:
        self.progress(f"[{time.monotonic() - self.started:6.1f}s] {message}")

    def prepare(self) -> None:
        """Create, migrate and seed the template database every case copies."""
        self.say(f"preparing a scratch {self.vendor} ledger (migrate + seed)")
        template = self.factory.database("template")
        self.databases.append(template)
        env = _base_env()
        env.update(template.child_env)
        done = subprocess.run(
            [PYTHON, str(MANAGE), "migrate", "--no-input", "-v", "0"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise HarnessError(f"migrating the scratch database failed: {done.stderr[-2000:]}")
        template.attach()
        try:
            seed_world(template.alias)
        finally:
            template.detach()

    def scene(self, label: str) -> Scene:
        db = self.factory.database(label, template="template")
        self.databases.append(db)
        return Scene(self, label, db)

    def cleanup(self, *, failed: bool) -> None:
        if self.keep:
            self.say(f"kept everything under {self.run_dir}")
            return
        for db in self.databases:
            with contextlib.suppress(Exception):
                db.drop()
        if failed:
            self.say(f"logs of this failed run are kept under {self.run_dir}")
        else:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def run_case(self, case: str) -> CaseReport:
        title, body = CASES[case]
        self.say(f"case {case}: {title}")
        started = time.monotonic()
        scene = self.scene(f"case_{case.lower()}")
        error = ""
        stats: dict[str, Any] = {}
        try:
            scene.open()
            body(scene)
            scene.verify()
            stats = scene.stats()
        except HarnessError as exc:
            error = str(exc)
        finally:
            scene.close()
        report = CaseReport(
            case, title, scene.checks, stats, time.monotonic() - started, error, scene.unmet
        )
        failed = [name for name, c in report.checks.items() if not c.passed]
        self.say(
            f"case {case}: {'PASS' if report.passed else 'FAIL'} in {report.seconds:.1f}s"
            + (f" (failed: {', '.join(failed)})" if failed else "")
            + (f" (error: {error})" if error else "")
            + (f" (fault not reached: {'; '.join(scene.unmet)})" if scene.unmet else "")
        )
        return report


def seed_world(alias: str) -> None:
    """Tenants, the five tools (URLs are filled in per case), grants v1 and the owner of all
    attention work."""
    for slug in TENANTS:
        Tenant.objects.using(alias).create(slug=slug, name=slug.title())
    for name, (effect_class, critical) in TOOLS.items():
        Tool.objects.using(alias).create(
            name=name, effect_class=effect_class, critical=critical, timeout_seconds=TOOL_TIMEOUT
        )
    for slug in TENANTS:
        for name in TOOLS:
            Grant.objects.using(alias).create(
                tenant_id=slug,
                tool_id=name,
                policy_version="v1",
                allowed_scopes=[f"{name}:read", f"{name}:write"],
            )
    owner = (
        get_user_model().objects.db_manager(alias).create_user(OWNER, f"{OWNER}@example.invalid")
    )
    for slug in TENANTS:
        Membership.objects.using(alias).create(user=owner, tenant_id=slug, role=Role.REVIEWER)
    OwnershipRule.objects.using(alias).create(owner=owner, tenant_pattern="*", tool_pattern="*")


def _expect_killed(scene: Scene, results: list[ChildResult], point: str) -> None:
    """A case proves little unless its agents really died where the case says."""
    wrong = [r.fault if r.killed else f"exit {r.returncode}" for r in results]
    wrong = [w for w in wrong if w != f"agent:{point}"]
    if wrong:
        scene.unmet.append(f"agents were to be killed at {point}, but: {', '.join(wrong)}")


def _kill_a_reconciler(scene: Scene, point: str) -> None:
    """One recovery worker dies at ``point`` before recovery proper begins; its leases lapse."""
    scene.wait_until_due()
    [result] = scene.recover(crash_at=point)
    if result.fault != f"reconcile:{point}":
        scene.unmet.append(
            f"the reconciler was to be killed at {point}, but: "
            f"{result.fault if result.killed else f'exit {result.returncode}'}"
        )


def case_a(scene: Scene) -> None:
    """Killed after the intent commit: nothing was sent; recovery finds a stale intent (and the
    first worker to resend it dies after the provider answered, before committing)."""
    results = scene.agents(
        *(
            {"calls": [_call(tool, f"a:{tool}", 1)], "crash_at": "intent_committed"}
            for tool in CASE_TOOLS
        )
    )
    _expect_killed(scene, results, "intent_committed")
    scene.checkpoint_owned("after the kills")
    _kill_a_reconciler(scene, "reconcile_resent")
    scene.recovery_round()


def case_b(scene: Scene) -> None:
    """Killed after the dispatch claim (before the send, and after the request was sent); the
    first recovery worker dies after its lookups answered, before deciding."""
    specs = []
    for point in ("dispatch_claimed", "request_sent"):
        for tool in CASE_TOOLS:
            specs.append({"calls": [_call(tool, f"b:{point}:{tool}", 2)], "crash_at": point})
    results = scene.agents(*specs)
    for point in ("dispatch_claimed", "request_sent"):
        _expect_killed(
            scene,
            [r for r, spec in zip(results, specs, strict=True) if spec["crash_at"] == point],
            point,
        )
    scene.checkpoint_owned("after the kills")
    _kill_a_reconciler(scene, "reconcile_looked_up")
    scene.recovery_round()


def case_c(scene: Scene) -> None:
    """Killed after the provider's response, before the outcome (and the request id) commit; the
    first recovery worker dies right after claiming its batch."""
    specs = []
    for point in ("response_received", "request_id_attached"):
        for tool in CASE_TOOLS:
            specs.append({"calls": [_call(tool, f"c:{point}:{tool}", 3)], "crash_at": point})
    results = scene.agents(*specs)
    for point in ("response_received", "request_id_attached"):
        _expect_killed(
            scene,
            [r for r, spec in zip(results, specs, strict=True) if spec["crash_at"] == point],
            point,
        )
    scene.checkpoint_owned("after the kills")
    _kill_a_reconciler(scene, "reconcile_claimed")
    scene.recovery_round()


def case_d(scene: Scene) -> None:
    """The same task delivered to two workers at once; one of each pair dies after the response
    if it is the one that sent."""
    not_before = time.time() + 3.0
    specs = []
    for tool in CASE_TOOLS:
        call = [_call(tool, f"d:{tool}", 4)]
        specs.append(
            {
                "calls": call,
                "not_before": not_before,
                "crash_at": "response_received",
                "name": "worker-1",
            }
        )
        specs.append({"calls": call, "not_before": not_before, "name": "worker-2"})
    scene.agents(*specs)
    scene.checkpoint_owned("after the race")
    scene.recovery_round()


def case_e(scene: Scene) -> None:
    """Authority changes while attempts are UNKNOWN: the provider swallows the answer (with and
    without performing the effect), then the grant moves to a new policy with fewer scopes."""
    for mode in ("hang_before_effect", "drop_after_effect"):
        scene.provider.control(
            tools={
                tool: {
                    "send_mode": mode,
                    "hang_seconds": TOOL_TIMEOUT + 1,
                    "honour_keys": TOOLS[tool][0] == EffectClass.IDEMPOTENT,
                }
                for tool in CASE_TOOLS
            }
        )
        scene.agents(*({"calls": [_call(tool, f"e:{mode}:{tool}", 5)]} for tool in CASE_TOOLS))
    scene.provider.control(
        tools={
            tool: {"send_mode": "ok", "honour_keys": TOOLS[tool][0] == EffectClass.IDEMPOTENT}
            for tool in CASE_TOOLS
        }
    )
    unknown = Attempt.objects.using(scene.alias).filter(state=State.UNKNOWN).count()
    if unknown != 2 * len(CASE_TOOLS):
        scene.unmet.append(f"{2 * len(CASE_TOOLS)} attempts were to be UNKNOWN, {unknown} are")
    scene.checkpoint_owned("while UNKNOWN")
    for tool in CASE_TOOLS:
        scene.change_grant("acme", tool, policy_version="v2", scopes=[f"{tool}:write"])
    scene.recovery_round()


def case_f(scene: Scene) -> None:
    """The provider's lookup times out: nothing may be resent or decided on a timeout; once the
    lookup answers again, recovery settles everything."""
    specs = []
    for point in ("dispatch_claimed", "request_sent"):
        for tool in CASE_TOOLS:
            specs.append({"calls": [_call(tool, f"f:{point}:{tool}", 6)], "crash_at": point})
    results = scene.agents(*specs)
    for point in ("dispatch_claimed", "request_sent"):
        _expect_killed(
            scene,
            [r for r, spec in zip(results, specs, strict=True) if spec["crash_at"] == point],
            point,
        )
    before = scene.provider.summary().get("total")
    scene.provider.control(lookup_mode="hang", hang_seconds=TOOL_TIMEOUT + 2)
    scene.recovery_round()
    scene.checkpoint_owned("while lookups time out")
    looked = Attempt.objects.using(scene.alias).filter(state=State.UNKNOWN, lookup_count__gt=0)
    if looked.count() != 2 * (len(CASE_TOOLS) - 1):
        scene.unmet.append(
            f"{2 * (len(CASE_TOOLS) - 1)} attempts were to stay UNKNOWN after timed-out lookups, "
            f"{looked.count()} did"
        )
    after = scene.provider.summary().get("total")
    if after != before:
        scene.checks["once"].fail(
            f"the provider performed {after - before} effect(s) while every lookup timed out: "
            "something was resent without a lookup answer"
        )
    for attempt in Attempt.objects.using(scene.alias).filter(
        state__in=SETTLED | {State.RECONCILED}
    ):
        if attempt.state != State.MANUAL_REVIEW:
            scene.checks["settled"].fail(
                f"{attempt.attempt_id} was settled as {attempt.state} while every lookup timed out"
            )
    scene.provider.control(lookup_mode="ok")
    scene.recovery_round()


CASES: dict[str, tuple[str, Callable[[Scene], None]]] = {
    "A": ("kill after the intent commit, before dispatch", case_a),
    "B": ("kill after the dispatch claim and send, before local acknowledgment", case_b),
    "C": ("kill after the provider's response, before the outcome commit", case_c),
    "D": ("the same task delivered to two workers at once", case_d),
    "E": ("authorization changed while the attempt is UNKNOWN", case_e),
    "F": ("the provider's lookup times out", case_f),
}


@contextlib.contextmanager
def harness_run(**kwargs: Any) -> Iterator[Harness]:
    harness = Harness(**kwargs)
    failed = True
    try:
        yield harness
        failed = harness.failed
    finally:
        harness.cleanup(failed=failed)


# ---------------------------------------------------------------------------------------------
# Random kill fuzzing

AGENT_POINTS = (
    "intent_committed",
    "dispatch_claimed",
    "request_sent",
    "response_received",
    "request_id_attached",
)
RECONCILER_POINTS = ("reconcile_claimed", "reconcile_looked_up", "reconcile_resent")
PROVIDER_FAULTS = (
    "drop_after_effect",
    "hang_after_effect",
    "hang_before_effect",
    "error_5xx",
    "refuse_retryable",
    "refuse",
)
FUZZ_LANES = 2


def _agent_fault(rng: random.Random) -> dict[str, Any]:
    """A random way for the next agent process to die (or not)."""
    roll = rng.random()
    if roll < 0.15:
        return {}
    if roll < 0.6:
        return {"crash_at": rng.choice(AGENT_POINTS), "crash_after": rng.randint(1, 4)}
    return {"timer_ms": rng.randint(0, 150)}


def _resume_at(
    result: ChildResult,
    position: int,
    end: int,
    rng: random.Random,
    recorded: Callable[[int], bool],
) -> int:
    """Where a restarted agent carries on: after the last finished call, repeating the one it
    was killed in (same key, as a restarted agent would) half of the time, and always when its
    intent never reached the ledger (so every planned call gets its attempt)."""
    if not result.killed:
        return end
    started, done = result.started(), result.done()
    if not started:
        return position
    interrupted = started[-1]
    if done and done[-1] == interrupted:
        return interrupted + 1
    if not recorded(interrupted) or rng.random() < 0.5:
        return interrupted
    return interrupted + 1


def run_fuzz(harness: Harness, *, calls: int, seed: int) -> dict[str, Any]:
    """Random kills over ``calls`` tool calls across effect classes and both tenants, with random
    provider faults and random reconciler kills on the way; then recovery and every invariant."""
    rng = random.Random(seed)
    started = time.monotonic()
    harness.say(f"fuzz: {calls} tool calls, seed {seed} (replay with --fuzz {calls} --seed {seed})")
    scene = harness.scene("fuzz")
    tools = list(TOOLS)
    plan = [
        _call(rng.choice(tools), f"fz{seed}:{i}", i, tenant=rng.choice(TENANTS))
        for i in range(calls)
    ]
    lanes = [plan[i::FUZZ_LANES] for i in range(FUZZ_LANES)]
    positions = [0] * FUZZ_LANES
    agent_runs = provider_faults = reconciler_runs = rounds = 0
    error = ""
    figures: dict[str, Any] = {}
    try:
        scene.open()
        while any(pos < len(lane) for pos, lane in zip(positions, lanes, strict=True)):
            rounds += 1
            if rng.random() < 0.2:
                tool = rng.choice(tools)
                mode = rng.choice(PROVIDER_FAULTS)
                scene.provider.control(
                    tools={
                        tool: {
                            "send_mode": mode,
                            "remaining_faults": 1,
                            "hang_seconds": TOOL_TIMEOUT + 0.5,
                        }
                    }
                )
                provider_faults += 1
            specs = []
            active = [i for i in range(FUZZ_LANES) if positions[i] < len(lanes[i])]
            chunks = {i: rng.randint(1, 6) for i in active}
            for i in active:
                specs.append(
                    {
                        "calls": lanes[i],
                        "start": positions[i],
                        "count": chunks[i],
                        "name": f"fuzz-agent-{i}",
                        **_agent_fault(rng),
                    }
                )
            results = scene.agents(*specs)
            agent_runs += len(results)
            for i, result in zip(active, results, strict=True):
                lane = lanes[i]

                def recorded(index: int, lane: list[dict[str, Any]] = lane) -> bool:
                    key = lane[index]["idempotency_key"]
                    return Attempt.objects.using(scene.alias).filter(idempotency_key=key).exists()

                end = min(len(lane), positions[i] + chunks[i])
                positions[i] = _resume_at(result, positions[i], end, rng, recorded)
            if rounds % 4 == 0:
                # A reconciler on the way, killed at a random point or by timer (or not at all).
                roll = rng.random()
                fault = (
                    {"crash_at": rng.choice(RECONCILER_POINTS)}
                    if roll < 0.4
                    else {"timer_ms": rng.randint(0, 600)}
                    if roll < 0.8
                    else {}
                )
                scene.recover(**fault)
                reconciler_runs += 1
            if rounds % 10 == 0:
                done = sum(positions)
                harness.say(
                    f"fuzz: {done}/{calls} calls, {agent_runs} agent runs, "
                    f"{sum(scene.kills.values())} kills"
                )
        harness.say("fuzz: all calls made; recovering")
        scene.provider.reset()
        for tool, (effect_class, _critical) in TOOLS.items():
            scene.provider.control(
                tools={tool: {"honour_keys": effect_class == EffectClass.IDEMPOTENT}}
            )
        scene.recovery_round()
        for _ in range(5):
            if not Attempt.objects.using(scene.alias).filter(state__in=IN_FLIGHT).exists():
                break
            scene.wait_until_due()
            scene.recover()
        scene.verify()
        figures = _fuzz_figures(scene)
        figures["stats"] = scene.stats()
    except HarnessError as exc:
        error = str(exc)
    finally:
        scene.close()
    passed = not error and all(c.passed for c in scene.checks.values())
    seconds = time.monotonic() - started
    harness.say(f"fuzz: {'PASS' if passed else 'FAIL'} in {seconds:.1f}s")
    return {
        "passed": passed,
        "error": error,
        "seed": seed,
        "calls": calls,
        "agent_runs": agent_runs,
        "reconciler_runs_with_faults": reconciler_runs,
        "provider_faults": provider_faults,
        "kills": dict(sorted(scene.kills.items())),
        "seconds": round(seconds, 1),
        **figures,
        "invariants": {
            name: {"passed": check.passed, "evidence": check.evidence}
            for name, check in scene.checks.items()
        },
    }


def _fuzz_figures(scene: Scene) -> dict[str, int]:
    """The headline numbers: duplicate non-idempotent effects, effects without a ledger row,
    attempts left unsettled outside MANUAL_REVIEW."""
    effects = scene.provider.effects()
    attempts = _attempts(scene)
    by_key = {a.idempotency_key: a for a in attempts}
    per_logical: Counter[tuple[str, str]] = Counter(
        (str(e.get("tool")), root_key(effect_key(e))) for e in effects
    )
    non_idempotent = {n for n, (c, _) in TOOLS.items() if c != EffectClass.IDEMPOTENT}
    children: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.parent_id:
            children[attempt.parent_id].append(attempt)
    unsettled = 0
    for attempt in attempts:
        final = _final_of(attempt, children) if attempt.state == State.RECONCILED else attempt
        if final is None or final.state not in SETTLED:
            unsettled += 1
    return {
        "attempts": len(attempts),
        "effects": len(effects),
        "duplicate_non_idempotent_effects": sum(
            n - 1 for (tool, _), n in per_logical.items() if n > 1 and tool in non_idempotent
        ),
        "duplicate_effects_any_class": sum(n - 1 for n in per_logical.values() if n > 1),
        "effects_without_ledger_row": sum(1 for e in effects if effect_key(e) not in by_key),
        "unsettled_outside_manual_review": unsettled,
        "manual_review": sum(1 for a in attempts if a.state == State.MANUAL_REVIEW),
    }


# ---------------------------------------------------------------------------------------------
# The report

SHORT = {
    "once": "once",
    "settled": "settled",
    "visible": "visible",
    "authority": "authority",
    "owned": "owned",
    "recovery": "recovery",
}


def render_table(
    reports: list[CaseReport], fuzz: dict[str, Any] | None, *, vendor: str, seconds: float
) -> str:
    """Cases by invariants, PASS/FAIL, then the evidence behind every failure."""
    names = [name for name, _ in INVARIANTS]
    lines = [
        f"crashtest on {vendor}: {len(reports)} case(s) x {len(names)} invariants"
        + (f" + fuzz {fuzz['calls']}" if fuzz else "")
        + f", {seconds:.1f}s",
        "",
    ]
    header = f"{'case':<5}" + "".join(f"{SHORT[n]:<11}" for n in names) + "time"
    lines.append(header)
    failures: list[str] = []
    rows: list[tuple[str, dict[str, Any], float, str, bool]] = [
        (r.case, {n: c.passed for n, c in r.checks.items()}, r.seconds, r.error, bool(r.unmet))
        for r in reports
    ]
    if fuzz:
        rows.append(
            (
                "fuzz",
                {n: v["passed"] for n, v in fuzz["invariants"].items()},
                fuzz["seconds"],
                fuzz["error"],
                False,
            )
        )
    for case, passed, took, error, unmet in rows:
        cells = "".join(f"{('PASS' if passed[n] and not error else 'FAIL'):<11}" for n in names)
        lines.append(
            f"{case:<5}{cells}{took:.1f}s" + ("  FAIL: fault not reached" if unmet else "")
        )
        if error:
            failures.append(f"case {case}: could not run: {error}")
    for report in reports:
        failures += [f"case {report.case}: fault not reached: {u}" for u in report.unmet]
        for name, check in report.checks.items():
            failures += [f"case {report.case} / {name}: {e}" for e in check.evidence]
    if fuzz:
        for name, value in fuzz["invariants"].items():
            failures += [f"fuzz / {name}: {e}" for e in value["evidence"]]
    lines.append("")
    for number, (name, text) in enumerate(INVARIANTS, 1):
        lines.append(f"  {SHORT[name]:<10} {number}. {text}")
    if fuzz and "effects" in fuzz:
        lines += [
            "",
            f"fuzz: seed {fuzz['seed']}, {fuzz['calls']} calls, {fuzz['attempts']} attempts, "
            f"{fuzz['effects']} effects, {fuzz['agent_runs']} agent runs, "
            f"kills {sum(fuzz['kills'].values())} {fuzz['kills']}",
            f"  duplicate non-idempotent effects: {fuzz['duplicate_non_idempotent_effects']}, "
            f"effects without a ledger row: {fuzz['effects_without_ledger_row']}, "
            f"unsettled outside MANUAL_REVIEW: {fuzz['unsettled_outside_manual_review']} "
            f"(MANUAL_REVIEW: {fuzz['manual_review']})",
        ]
    all_passed = all(r.passed for r in reports) and (fuzz is None or fuzz["passed"])
    if failures:
        lines += ["", "Evidence:"] + [f"  - {f}" for f in failures]
    lines += ["", "RESULT: " + ("PASS" if all_passed else "FAIL")]
    return "\n".join(lines)
