"""The crashtest harness: scratch databases, the provider process, child processes and the
scene a case runs in (its database, provider, kills, snapshots and evidence).

Every case runs against its own scratch database (a SQLite file, or a ``crashtest_*`` database
created on the PostgreSQL server) and its own demo provider process with a durable record of every
effect it performed. Nothing here writes to the operator's ledger database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import http.client
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from attempts.canonical import canonical_bytes
from attempts.models import (
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
from reconciliation.demo_provider import wait_for_port_file

REPO = Path(settings.BASE_DIR)
# Management commands in child processes, from a checkout or an installed package alike.
MANAGE = ["-m", "ledgerweb"]
PYTHON = sys.executable

INVARIANTS: tuple[tuple[str, str], ...] = (
    ("once", "no non-idempotent effect twice; every effect has its ledger row"),
    ("settled", "every attempt ends settled or in MANUAL_REVIEW"),
    ("visible", "args hash, key, request id and intact history for each attempt"),
    ("authority", "no widened scope, no crossed tenant, no send under old authority"),
    ("owned", "UNKNOWN and MANUAL_REVIEW work is queued with an owner"),
    ("recovery", "recovery is safe to run twice in a row and twice at once"),
    ("approved", "nothing a policy held is sent without enough valid approvals at its claim"),
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
# The people who approve held work in cases G-I (reviewers in every tenant).
APPROVERS = ("crashtest-approver-1", "crashtest-approver-2")
TOOL_TIMEOUT = 1.0  # seconds the agent and reconciler wait for the provider
CHILD_TIMEOUT = 120.0  # a child process still running after this is a harness failure

# Knobs of the child processes: stale after one second, UNKNOWN due again at once.
CHILD_SETTINGS = {
    # The children are crashtest's own test processes: fault injection is on for them only.
    "LEDGERWEB_FAULTS_ALLOWED": "1",
    "LEDGERWEB_STALE_AFTER": "1",
    "LEDGERWEB_BACKOFF_BASE": "0",
    "LEDGERWEB_BACKOFF_CAP": "1",
    # Approved work the agent does not claim is the worker's after one second (cases G-I).
    "LEDGERWEB_APPROVAL_GRACE": "1",
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
    """The demo provider (``reconciliation.demo_provider``) as a separate process (``extra``:
    more of its command-line options), and a small client for it."""

    def __init__(self, folder: Path, name: str, *extra: str) -> None:
        self.extra = extra
        self.db = folder / f"{name}-provider.sqlite3"
        self.port_file = folder / f"{name}-provider.port"
        self.log = folder / f"{name}-provider.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        command = [PYTHON, "-m", "reconciliation.demo_provider", "--db", str(self.db)]
        command += ["--port", "0", "--port-file", str(self.port_file), *self.extra]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=_base_env()
            )
        port = wait_for_port_file(self.port_file, self.process, seconds=20)
        if port is None:
            raise HarnessError(f"the demo provider did not start: {self.log.read_text()}")
        self.port = port
        self.base = f"http://127.0.0.1:{self.port}"

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
        status, body = self.request("POST", "/_control/reset")
        if status != 200:
            raise HarnessError(f"provider refused reset: {status} {body}")

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
                [PYTHON, *MANAGE, *command],
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

    def approve_held(self, approver: str, *, keys: list[str] | None = None) -> ChildResult:
        """``approver`` approves held attempts (all, or those under ``keys``) in a child process,
        through ``review.approve_held`` like a person in the inbox."""
        command = ["crashtest_review", "--as", approver, *(keys or [])]
        result = self._spawn("review", command, {}).wait()
        if result.returncode != 0:
            raise HarnessError(f"approving as {approver} failed: {result.tail()}")
        return result

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

    def stats(self) -> dict[str, Any]:
        states = Counter(Attempt.objects.using(self.alias).values_list("state", flat=True))
        summary = self.provider.summary()
        return {
            "attempts": dict(sorted(states.items())),
            "effects": summary.get("total"),
            "kills": dict(sorted(self.kills.items())),
            "recovery_runs": len(self.recovery_results),
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
            [PYTHON, *MANAGE, "migrate", "--no-input", "-v", "0"],
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
    for name in APPROVERS:
        person = get_user_model().objects.db_manager(alias).create_user(name, f"{name}@ex.invalid")
        for slug in TENANTS:
            Membership.objects.using(alias).create(user=person, tenant_id=slug, role=Role.REVIEWER)


@contextlib.contextmanager
def harness_run(**kwargs: Any) -> Iterator[Harness]:
    harness = Harness(**kwargs)
    failed = True
    try:
        yield harness
        failed = harness.failed
    finally:
        harness.cleanup(failed=failed)
