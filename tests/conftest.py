"""Shared fixtures: a small world of tenants, tools, grants and named people, so that every test
checks authorization by default (an operator, reviewers, an admin, and an outsider who belongs
to another tenant)."""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models.signals import post_migrate

from attempts import ledger
from attempts.models import EffectClass, Grant, Membership, OwnershipRule, Role, Tenant, Tool
from attempts.states import Actor

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "correct-horse-battery-staple"


@contextlib.contextmanager
def clock_ahead(seconds: float):
    """Django's clock (``django.utils.timezone.now``, in every thread: a live server's too)
    runs ``seconds`` ahead (or behind, when negative) inside the block: approvals expire and
    deadlines pass without editing a row (approvals, like events, are append-only)."""
    from django.utils import timezone

    real = timezone.now
    with mock.patch.object(timezone, "now", lambda: real() + dt.timedelta(seconds=seconds)):
        yield


@dataclass
class World:
    acme: Tenant
    globex: Tenant
    viewer: User
    operator: User
    reviewer: User
    reviewer2: User
    admin: User
    outsider: User
    triage: User
    agent: Actor


def _user(name: str, **extra) -> User:
    return User.objects.create_user(name, f"{name}@example.test", PASSWORD, **extra)


def _guards_back_after_flush(sender, using, plan=None, **kwargs):
    if sender.label != "attempts" or plan is not None:
        return  # a migrate (it carries a plan) installs its own guards
    from django.db import connections

    from attempts import history_guard

    flushed = connections[using]
    # PostgreSQL's flush leaves them (``_flush_by_delete``): back only if a test dropped them.
    if flushed.vendor == "sqlite" or not history_guard.installed(flushed):
        history_guard.install(flushed)


post_migrate.connect(_guards_back_after_flush, dispatch_uid="tests-history-guards-after-flush")


@pytest.fixture(autouse=True)
def _no_signer_state_from_another_test():
    """The log signer keeps the newest tree it signed in the data folder, which the suite's
    tests share, while each test's database starts empty: one test's state would make the next
    one's signer refuse a smaller tree as a rollback."""
    from django.conf import settings

    state = Path(settings.DATA_DIR) / "log_signer.state"
    state.unlink(missing_ok=True)
    yield
    state.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _no_grant_guess_from_another_test():
    """New intents are built from the process's guess of their grant's terms
    (``authority.intent_terms``), checked by their INSERT: a guess left by another test's
    database is never trusted, but its first intent would pay a second statement, which the
    tests that count statements would see."""
    from attempts import authority

    authority.forget_terms()
    yield


@pytest.fixture(autouse=True)
def _history_guards_allow_flush(request):
    """Tests that commit (transactional_db, live_server) end with a flush, which the append-only
    triggers would refuse: on SQLite, drop them just before the flush; post_migrate (sent by
    flush) installs them again for the next test (the receiver above: the product itself never
    re-installs them behind a migration's back)."""
    marker = request.node.get_closest_marker("django_db")
    transactional = (
        "transactional_db" in request.fixturenames
        or "live_server" in request.fixturenames
        or (marker is not None and marker.kwargs.get("transaction"))
    )
    if not transactional:
        yield
        return
    request.getfixturevalue("transactional_db")
    yield
    if connection.vendor != "sqlite":
        return  # PostgreSQL's flush turns them off for its transaction (_flush_by_delete)
    from attempts import history_guard

    history_guard.remove(connection)


@pytest.fixture
def world(db) -> World:
    return make_world()


@dataclass
class _WorldRows:
    """The rows the first world of a test database wrote, table by table (its columns, its
    rows), and the World it returned: later tests write the same rows again with a few INSERTs
    instead of building it through the models and their configuration history, a statement or
    more for each row."""

    rows: dict[str, tuple[list[str], list[tuple]]]
    world: World


_first_worlds: dict[tuple[str, str], _WorldRows] = {}


def make_world() -> World:
    """The world, in one transaction: a test that commits (transactional_db, live_server)
    would otherwise commit each of its rows and their history on its own, each commit a wait
    for the disk. Written again from the database's first world when nothing is in its way;
    built when something is (a test made its own rows first)."""
    from django.db import IntegrityError

    from attempts.config_history import acting

    database = (connection.vendor, str(connection.settings_dict["NAME"]))
    first = _first_worlds.get(database)
    with transaction.atomic():
        if first is not None:
            try:
                with transaction.atomic():
                    _write_rows(first.rows)
            except IntegrityError:
                pass
            else:
                return copy.deepcopy(first.world)
        before = _every_row() if first is None else None
        with acting(Actor.system("test-setup"), "the test world"):
            world = _make_world()
        if before is not None:
            _first_worlds[database] = _WorldRows(_rows_added(before), copy.deepcopy(world))
        return world


def _every_row() -> dict[str, tuple[list[str], list[tuple]]]:
    """Every table's columns and rows, as the database driver returns them (JSON as its text on
    both databases, which an INSERT takes back as it is)."""
    from attempts import dbadapter

    found = {}
    with connection.cursor() as cursor:
        for table in dbadapter.table_names(connection):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608
            found[table] = ([column[0] for column in cursor.description], cursor.fetchall())
    return found


def _rows_added(before: dict[str, tuple[list[str], list[tuple]]]):
    added = {}
    for table, (columns, rows) in _every_row().items():
        old = {repr(row) for row in before.get(table, ([], []))[1]}
        new = [row for row in rows if repr(row) not in old]
        if new:
            added[table] = (columns, new)
    return added


def _write_rows(rows: dict[str, tuple[list[str], list[tuple]]]) -> None:
    """The rows written as they were read (the foreign keys are checked at commit on both
    databases, so the tables' order does not matter)."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table, (columns, values) in rows.items():
            names = ", ".join(map(quote, columns))
            marks = ", ".join(["%s"] * len(columns))
            cursor.executemany(
                f"INSERT INTO {quote(table)} ({names}) VALUES ({marks})",  # noqa: S608
                values,
            )


def _make_world() -> World:
    acme = Tenant.objects.create(slug="acme", name="Acme Corp")
    globex = Tenant.objects.create(slug="globex", name="Globex")
    tools = [
        Tool(name="send_invoice_email", effect_class=EffectClass.IDEMPOTENT, critical=True),
        Tool(name="open_ticket", effect_class=EffectClass.RECONCILABLE),
        Tool(name="charge_card", effect_class=EffectClass.RECONCILABLE, critical=True),
        Tool(name="deploy_service", effect_class=EffectClass.MANUAL, critical=True),
        Tool(name="update_crm", effect_class=EffectClass.IDEMPOTENT),
    ]
    for tool in tools:  # one by one: bulk_create would bypass the configuration history
        tool.save(force_insert=True)
    for tenant in (acme, globex):
        for tool in tools:
            Grant.objects.create(
                tenant=tenant,
                tool=tool,
                policy_version="v1",
                allowed_scopes=[f"{tool.name}:write", f"{tool.name}:read"],
            )
    people = {
        "viewer": Role.VIEWER,
        "operator": Role.OPERATOR,
        "reviewer": Role.REVIEWER,
        "reviewer2": Role.REVIEWER,
        "admin": Role.ADMIN,
        "triage": Role.OPERATOR,
    }
    users = {}
    for name, role in people.items():
        users[name] = _user(name)
        Membership.objects.create(user=users[name], tenant=acme, role=role)
    users["outsider"] = _user("outsider")
    Membership.objects.create(user=users["outsider"], tenant=globex, role=Role.ADMIN)
    OwnershipRule.objects.create(owner=users["triage"], tenant_pattern="acme", priority=10)
    OwnershipRule.objects.create(owner=users["outsider"], tenant_pattern="globex", priority=10)
    return World(acme=acme, globex=globex, agent=Actor.agent("test-agent"), **users)


def agent_intent(
    world: World,
    key: str,
    *,
    tool: str,
    args: dict[str, Any],
    task: str = "t",
    tenant: str = "acme",
):
    """The world's agent records an intent (``ledger.record_intent``); returns what that returns,
    ``(attempt, created)``."""
    return ledger.record_intent(
        tenant=tenant,
        task_id=task,
        tool_name=tool,
        idempotency_key=key,
        args=args,
        actor=world.agent,
    )


def no_digests() -> None:
    """Turn the daily digest off for everyone. It goes out from the person's local hour (08:00
    UTC by default) on: a test that counts what a real worker delivers would otherwise pass or
    fail by the time of day it runs."""
    from attempts.models import PersonSettings

    for user in User.objects.all():
        PersonSettings.objects.update_or_create(user=user, defaults={"digest_hour": None})


# An attempt's events when it went through the safe order and was confirmed, oldest first.
CONFIRMED_IN_ORDER = [
    "attempt.created",
    "attempt.dispatched",
    "attempt.provider_request_attached",
    "attempt.outcome_confirmed",
]


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that must use the same (test) database as this test."""
    env = dict(os.environ)
    settings_dict = connection.settings_dict
    if connection.vendor == "sqlite":
        env.pop("DATABASE_URL", None)
        env["LEDGERWEB_SQLITE_PATH"] = str(settings_dict["NAME"])
    else:
        env["DATABASE_URL"] = (
            f"postgres://{settings_dict['USER'] or 'postgres'}@{settings_dict['HOST'] or '127.0.0.1'}"
            f":{settings_dict['PORT'] or 5432}/{settings_dict['NAME']}"
        )
    env["DJANGO_SETTINGS_MODULE"] = "ledgerweb.settings"
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


PYTHON = sys.executable


def manage(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``manage.py`` with ``args`` in a child process (``env``: its environment, else this
    one's), its output captured as text."""
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_manage(
    args: Sequence[str], *, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen[str]:
    """``manage.py`` with ``args`` started in a child process and left running (``env``: its
    environment, else this one's); its output in text pipes unless ``popen`` says otherwise."""
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen([PYTHON, "manage.py", *args], cwd=REPO, env=env, **options)


def machine_cache(name: str) -> Path:
    """A folder for what the suite builds once per machine rather than once per clone (container
    images, mypy's cache): ``LEDGERWEB_CACHE_DIR``, else ``$XDG_CACHE_HOME/ledgerweb``, else
    /var/cache/ledgerweb as root, else ~/.cache/ledgerweb; ``name`` below it."""
    if configured := os.environ.get("LEDGERWEB_CACHE_DIR"):
        return Path(configured) / name
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "ledgerweb" / name
    if os.geteuid() == 0:
        return Path("/var/cache/ledgerweb") / name
    return Path.home() / ".cache" / "ledgerweb" / name


def free_port() -> int:
    """A port on 127.0.0.1 free right now, for a server a test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def built_checkout(tmp_path_factory) -> Path:
    """A copy of the checkout's files (tracked and untracked, not ignored) with the server's wheel
    built in it as docs/deploy.md says, ``pip wheel --no-deps -w dist .``: the copy keeps the
    checkout free of build folders, and the build runs once per test run
    (tests/test_packaging.py, tests/test_deploy_guide.py)."""
    source = tmp_path_factory.mktemp("checkout")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", "dist", "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return source


def pip_install(python: Path | str, what: str, *, timeout: float, **options: Any) -> None:
    """``pip install`` a wheel or a folder into the venv of ``python``; pip's output when it
    fails. ``options`` go to ``subprocess.run`` (cwd, env)."""
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", what],
        capture_output=True,
        text=True,
        timeout=timeout,
        **options,
    )
    assert install.returncode == 0, install.stdout + install.stderr


# Rows a flush leaves on PostgreSQL: made by post_migrate from the code, the same for every test
# (the flush's post_migrate finds them there instead of writing them again).
_KEPT_BY_FLUSH = {"django_content_type", "auth_permission"}


def _flush_by_delete(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    """PostgreSQL's flush for the suite: a DELETE per table instead of Django's one TRUNCATE of
    every table. A test that commits ends with a flush; TRUNCATE gives each of the schema's
    tables and indexes a new file, where DELETEs of the few rows such a test writes take a
    fraction of that. Triggers are off for the flush's transaction (``session_replication_
    role``, as the suite's superuser): the foreign keys' (every table is emptied) and the
    append-only guards', which stay installed (``_history_guards_allow_flush``). The suite
    never resets sequences."""
    if reset_sequences:
        raise NotImplementedError("the suite's flush does not reset sequences")
    return ["SET LOCAL session_replication_role = replica"] + [
        f"DELETE FROM {style.SQL_FIELD(self.quote_name(table))}"  # noqa: S608 -- quoted table names
        for table in tables
        if table not in _KEPT_BY_FLUSH
    ]


def pytest_configure(config):
    from django.conf import settings

    if os.environ.get("DATABASE_URL"):
        from django.db.backends.postgresql.operations import DatabaseOperations

        DatabaseOperations.sql_flush = _flush_by_delete

    config.addinivalue_line(
        "markers",
        "one_database(pass_='sqlite'): does not depend on the database; when scripts/test runs"
        " both databases' passes (LEDGERWEB_TEST_PASSES=both), only the pass named runs it"
        " ('sqlite' or 'postgres', for the passes to take about as long)",
    )

    if folder := os.environ.get("LEDGERWEB_TEST_TIMES"):
        from tests import shards

        config.pluginmanager.register(shards.Timer(folder), "ledgerweb-test-times")

    # Password hashing strength is not under test; PBKDF2 would dominate the suite's run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Pages render without a collectstatic run: plain static storage, and whitenoise's root made.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)


ONE_DATABASE_PASSES = ("sqlite", "postgres")


def one_database_pass(item) -> str | None:
    """The pass that runs ``item`` when both databases' passes run (its one_database marker's
    argument, the SQLite pass by default); None when every pass runs it."""
    marker = item.get_closest_marker("one_database")
    if marker is None:
        return None
    chosen = marker.args[0] if marker.args else marker.kwargs.get("pass_", "sqlite")
    if chosen not in ONE_DATABASE_PASSES:
        raise pytest.UsageError(
            f"{item.nodeid}: one_database takes 'sqlite' or 'postgres', not {chosen!r}"
        )
    return chosen


def pytest_ignore_collect(collection_path, config):
    """In a shard of the suite (tests/shards.py), another shard's test files are not collected:
    importing the whole suite costs every shard processor time it need not spend."""
    shard = os.environ.get("LEDGERWEB_TEST_SHARD")
    if not shard or not collection_path.name.startswith("test_") or collection_path.is_dir():
        return None
    from tests import shards

    try:
        return True if shards.elsewhere(collection_path, shard) else None
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.hookimpl(trylast=True)  # after -m and -k have left out theirs
def pytest_collection_modifyitems(session, config, items):
    """When both databases' passes run, the tests of the other pass (one_database) are left
    out; then this shard's test files only, when scripts/test runs the suite in shards
    (tests/shards.py; the other shards' files were not even collected). Then the container image, which takes
    minutes to build: when its tests are selected on the SQLite pass, the build starts now, in
    a thread, beside the other tests (tests/test_container.py)."""
    on_postgres = bool(os.environ.get("DATABASE_URL"))
    if os.environ.get("LEDGERWEB_TEST_PASSES") == "both":
        this_pass = "postgres" if on_postgres else "sqlite"
        others = [item for item in items if one_database_pass(item) not in (None, this_pass)]
        if others:
            config.hook.pytest_deselected(items=others)
            left_out = set(map(id, others))
            items[:] = [item for item in items if id(item) not in left_out]
    if shard := os.environ.get("LEDGERWEB_TEST_SHARD"):
        from tests import shards

        try:
            mine, others = shards.keep(items, shard)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = mine
    if on_postgres:
        return  # the image's tests run on the SQLite pass only
    if any(item.nodeid.startswith("tests/test_container.py::test_the_image") for item in items):
        from tests import test_container

        test_container.start_prebuild()


def pytest_sessionfinish(session, exitstatus):
    import sys as _sys

    container = _sys.modules.get("tests.test_container")
    if container is not None:
        container.finish_prebuild()
