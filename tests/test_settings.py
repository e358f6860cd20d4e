"""Settings come from the environment, fail with a sentence when wrong, and the embedded
database really runs durable (WAL, synchronous=FULL, immediate transactions, busy timeout)."""

import subprocess
import sys
from typing import Any

import pytest
from django.db import connection

from tests.conftest import REPO, child_env, manage

# The checks of settings run manage.py on a SQLite file of their own (or none): one pass runs
# them. The two tests of the database's own settings run on each.
ONE_DATABASE = pytest.mark.one_database("postgres")


def database_says(query: str) -> Any:
    """The one value a PRAGMA or SHOW answers."""
    with connection.cursor() as cursor:
        cursor.execute(query)
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_sqlite_pragmas_really_apply():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    assert database_says("PRAGMA journal_mode") == "wal"
    assert database_says("PRAGMA synchronous") == 2  # FULL
    assert database_says("PRAGMA busy_timeout") >= 5000
    assert database_says("PRAGMA foreign_keys") == 1
    # SQLite's own: the WAL is copied back as it grows
    assert database_says("PRAGMA wal_autocheckpoint") == 1000
    assert connection.transaction_mode == "IMMEDIATE"
    assert connection.settings_dict["CONN_MAX_AGE"] > 0  # connections outlive a request


@pytest.mark.django_db
def test_postgresql_commits_synchronously():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    assert database_says("SHOW synchronous_commit") == "on"


def run_manage(tmp_path, *args, **env):
    """manage.py in a child process with its own data folder and SQLite file."""
    base = child_env(LEDGERWEB_DATA_DIR=str(tmp_path), LEDGERWEB_SQLITE_PATH=str(tmp_path / "l.db"))
    base.pop("DATABASE_URL", None)
    base.update(env)
    return manage(*args, env=base)


@ONE_DATABASE
@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LEDGERWEB_DEBUG", "maybe", "LEDGERWEB_DEBUG must be one of"),
        ("LEDGERWEB_STALE_AFTER", "soon", "LEDGERWEB_STALE_AFTER must be a whole number"),
        ("LEDGERWEB_SECRET_KEY", "short", "at least 50 characters"),
        ("DATABASE_URL", "mysql://x@y/z", "must be a postgres:// URL"),
    ],
)
def test_bad_settings_fail_with_a_clear_message(tmp_path, variable, value, message):
    result = run_manage(tmp_path, "check", **{variable: value})
    assert result.returncode != 0
    assert message in result.stderr
    # One sentence, not a traceback.
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr


@ONE_DATABASE
def test_a_bad_postgresql_prepare_threshold_fails_with_a_clear_message(tmp_path):
    result = run_manage(
        tmp_path,
        "check",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres",
        LEDGERWEB_PG_PREPARE_THRESHOLD="often",
    )
    assert result.returncode != 0
    assert "LEDGERWEB_PG_PREPARE_THRESHOLD must be a whole number" in result.stderr


@ONE_DATABASE
def test_production_settings_pass_the_deploy_check(tmp_path):
    assert (
        run_manage(tmp_path, "ledger_log", "genkey", "--out", str(tmp_path / "k")).returncode == 0
    )
    result = run_manage(
        tmp_path,
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        LEDGERWEB_HTTPS="1",
        LEDGERWEB_SECRET_KEY="Vt3o_q9ZkP0r7LxW2mYc8HfN5aJdE1sGbU4iKlR6nTzQwX-yAvBgMhOe",
        LEDGERWEB_DEFAULT_OWNER="oncall",
        LEDGERWEB_ALLOWED_HOSTS="ledger.example.com",
        LEDGERWEB_TRUSTED_PROXIES="127.0.0.1",
        LEDGERWEB_TLOG_KEY_FILE=str(tmp_path / "k"),
        **SSO,  # single sign-on over https, ID tokens signed (RS256)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@ONE_DATABASE
def test_missing_owner_configuration_is_reported_where_it_matters(tmp_path):
    assert run_manage(tmp_path, "migrate", "-v0").returncode == 0
    # An ordinary command does not query the database for it...
    result = run_manage(tmp_path, "check", LEDGERWEB_DEFAULT_OWNER="")
    assert "attempts.W001" not in result.stdout + result.stderr
    result = run_manage(tmp_path, "showmigrations", "attempts", LEDGERWEB_DEFAULT_OWNER="")
    assert "attempts.W001" not in result.stdout + result.stderr
    # ...the database checks do, and so does the worker, which hands work to people.
    result = run_manage(tmp_path, "check", "--database", "default", LEDGERWEB_DEFAULT_OWNER="")
    assert "attempts.W001" in result.stdout + result.stderr
    result = run_manage(tmp_path, "reconcile", "--once", LEDGERWEB_DEFAULT_OWNER="")
    assert result.returncode == 0, result.stderr
    assert "attempts.W001" in result.stdout + result.stderr
    result = run_manage(
        tmp_path, "check", "--database", "default", LEDGERWEB_DEFAULT_OWNER="oncall"
    )
    assert "attempts.W001" not in result.stdout + result.stderr


@ONE_DATABASE
def test_a_default_owner_who_cannot_own_work_fails_the_check(tmp_path):
    assert run_manage(tmp_path, "migrate", "-v0").returncode == 0
    made = run_manage(
        tmp_path,
        "shell",
        "-c",
        "from django.contrib.auth.models import User\n"
        "from attempts.models import Membership, Tenant\n"
        "acme = Tenant.objects.create(slug='acme', name='Acme')\n"
        "for name, role in (('vic', 'viewer'), ('opal', 'operator')):\n"
        "    Membership.objects.create(user=User.objects.create(username=name), tenant=acme,"
        " role=role)\n"
        "User.objects.create(username='gone', is_active=False)\n",
    )
    assert made.returncode == 0, made.stderr
    for name, why in (
        ("nosuchuser", "'nosuchuser', and no such user exists"),
        ("vic", "'vic', who cannot act on attempts in any tenant"),
        ("gone", "'gone', who is not active"),
    ):
        result = run_manage(tmp_path, "check", LEDGERWEB_DEFAULT_OWNER=name)
        assert result.returncode != 0, name
        assert "attempts.E002" in result.stderr and why in result.stderr, result.stderr
    result = run_manage(tmp_path, "check", LEDGERWEB_DEFAULT_OWNER="opal")
    assert result.returncode == 0, result.stderr


@ONE_DATABASE
def test_log_records_skip_only_fields_no_format_prints_in_server_processes():
    from django.conf import settings

    used = " ".join(str(f.get("format", "")) for f in settings.LOGGING["formatters"].values())
    for skipped in ("pathname", "filename", "lineno", "funcName", "thread", "processName"):
        assert skipped not in used

    def probe(code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.stdout.strip() or done.stderr

    # A program that only loads the settings keeps the standard library's logging as it was...
    assert (
        probe(
            "import django, logging\n"
            "django.setup()\n"
            "print(logging._srcfile is not None and logging.logThreads)"
        )
        == "True"
    )
    # ...the server's own process (gunicorn imports ledgerweb.wsgi) switches the fields off,
    # keeping the process id that gunicorn's error log prints.
    assert (
        probe(
            "import logging, ledgerweb.wsgi\n"
            "print(logging._srcfile is None and not logging.logThreads and logging.logProcesses)"
        )
        == "True"
    )


@ONE_DATABASE
def test_the_deploy_check_warns_without_a_log_signing_key(tmp_path):
    result = run_manage(tmp_path, "check", "--deploy")
    assert "attempts.W012" in result.stdout + result.stderr
    key = tmp_path / "loose.key"
    assert run_manage(tmp_path, "ledger_log", "genkey", "--out", str(key)).returncode == 0
    key.chmod(0o644)
    result = run_manage(tmp_path, "check", "--deploy", LEDGERWEB_TLOG_KEY_FILE=str(key))
    assert result.returncode != 0
    assert "attempts.E012" in result.stderr and "chmod 600" in result.stderr


@ONE_DATABASE
def test_workers_starting_together_share_one_generated_secret_key(tmp_path, monkeypatch):
    """On a first start every gunicorn worker makes the data folder's key at once: each must
    get the same whole key (an empty one answered 500, two keys broke each other's sessions)."""
    import threading

    from ledgerweb import settings

    monkeypatch.delenv("LEDGERWEB_SECRET_KEY", raising=False)
    for attempt in range(20):
        monkeypatch.setattr(settings, "DATA_DIR", tmp_path / str(attempt))
        start, keys = threading.Barrier(8), []

        def make_key(start: threading.Barrier, keys: list[str]) -> None:
            start.wait()
            keys.append(settings._secret_key())

        threads = [threading.Thread(target=make_key, args=(start, keys)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        key_file = tmp_path / str(attempt) / "secret_key"
        assert len(set(keys)) == 1 and len(keys[0]) >= 50, keys
        assert keys[0] == key_file.read_text() and key_file.stat().st_mode & 0o777 == 0o600
        assert [p.name for p in key_file.parent.iterdir()] == ["secret_key"]


@ONE_DATABASE
def test_an_empty_secret_key_file_fails_with_a_clear_message(tmp_path):
    (tmp_path / "secret_key").write_text("")
    done = manage("check", env=child_env(LEDGERWEB_DATA_DIR=str(tmp_path)))
    assert done.returncode != 0
    assert "secret_key is empty: remove it and a new key is made" in done.stderr


@ONE_DATABASE
def test_a_mistyped_setting_is_reported_with_the_setting_it_meant(tmp_path):
    result = run_manage(
        tmp_path,
        "check",
        LEDGERWEB_WORKRES="4",
        LEDGERWEB_HTTSP="1",
        LEDGERWEB_METRICS_TOKN="x" * 40,
        LEDGERWEB_QQQ_NOTHING_LIKE_IT="1",
    )
    out = result.stderr
    assert "LEDGERWEB_WORKRES is set, but it is not a ledgerweb setting" in out
    assert "did you mean LEDGERWEB_WORKERS?" in out
    assert "did you mean LEDGERWEB_HTTPS?" in out
    assert "did you mean LEDGERWEB_METRICS_TOKEN?" in out
    assert (
        "LEDGERWEB_QQQ_NOTHING_LIKE_IT is set, but it is not a ledgerweb setting, so nothing" in out
    )
    # A variable the agents' clients read is not a typo, nor is a secret's _FILE form.
    quiet = run_manage(
        tmp_path,
        "check",
        LEDGERWEB_URL="http://x",
        LEDGERWEB_METRICS_TOKEN_FILE=str(REPO / "README.md"),
    )
    assert "ledgerweb.W001" not in quiet.stderr, quiet.stderr


def deploy_env(tmp_path, **extra):
    key = tmp_path / "k"
    if not key.exists():
        assert run_manage(tmp_path, "ledger_log", "genkey", "--out", str(key)).returncode == 0
    return {
        "LEDGERWEB_HTTPS": "1",
        "LEDGERWEB_SECRET_KEY": "Vt3o_q9ZkP0r7LxW2mYc8HfN5aJdE1sGbU4iKlR6nTzQwX-yAvBgMhOe",
        "LEDGERWEB_ALLOWED_HOSTS": "ledger.example.com",
        "LEDGERWEB_TRUSTED_PROXIES": "127.0.0.1",
        "LEDGERWEB_TLOG_KEY_FILE": str(key),
        **extra,
    }


SSO = {
    "LEDGERWEB_OIDC_CLIENT_ID": "ledgerweb",
    "LEDGERWEB_OIDC_CLIENT_SECRET": "a-secret-the-provider-chose-8d1f0c2b",
    "LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT": "https://id.example.com/authorize",
    "LEDGERWEB_OIDC_TOKEN_ENDPOINT": "https://id.example.com/token",
    "LEDGERWEB_OIDC_USERINFO_ENDPOINT": "https://id.example.com/userinfo",
    "LEDGERWEB_OIDC_JWKS_ENDPOINT": "https://id.example.com/jwks",
}


@ONE_DATABASE
@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        (
            {"LEDGERWEB_SECRET_KEY": "django-insecure-Vt3o_q9ZkP0r7LxW2mYc8HfN5aJdE1sGbU4iKl"},
            "LEDGERWEB_SECRET_KEY is not a production secret: it is a development key",
        ),
        (
            # 51 characters, many distinct, chosen by a person.
            {"LEDGERWEB_SECRET_KEY": "ThisIsOurVerySecretLedgerwebKeyForProductionUse2026"},
            "LEDGERWEB_SECRET_KEY is not a production secret: it reads like words",
        ),
        (
            {**SSO, "LEDGERWEB_OIDC_TOKEN_ENDPOINT": "http://id.example.com/token"},
            "LEDGERWEB_OIDC_TOKEN_ENDPOINT is http://id.example.com/token: single sign-on must "
            "reach its provider over https",
        ),
        (
            {**SSO, "LEDGERWEB_OIDC_SIGN_ALGO": "none"},
            "LEDGERWEB_OIDC_SIGN_ALGO is none: ID tokens would be taken unsigned",
        ),
    ],
    ids=["django-insecure", "chosen-words", "plain-http-oidc", "unsigned-id-tokens"],
)
def test_the_deploy_check_refuses_what_production_must_not_run_with(tmp_path, extra, refusal):
    refused = run_manage(tmp_path, "check", "--deploy", **deploy_env(tmp_path, **extra))
    assert refused.returncode != 0
    assert refusal in refused.stderr, refused.stderr


@ONE_DATABASE
def test_every_secret_can_come_from_a_file(tmp_path):
    key = "Vt3o_q9ZkP0r7LxW2mYc8HfN5aJdE1sGbU4iKlR6nTzQwX-yAvBgMhOe"
    (tmp_path / "secret_key").write_text(key + "\n")
    read = "from django.conf import settings; print(settings.SECRET_KEY)"
    done = run_manage(
        tmp_path, "shell", "-c", read, LEDGERWEB_SECRET_KEY_FILE=str(tmp_path / "secret_key")
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == key
    both = run_manage(
        tmp_path,
        "check",
        LEDGERWEB_SECRET_KEY=key,
        LEDGERWEB_SECRET_KEY_FILE=str(tmp_path / "secret_key"),
    )
    assert both.returncode != 0
    assert "LEDGERWEB_SECRET_KEY and LEDGERWEB_SECRET_KEY_FILE are both set" in both.stderr
    missing = run_manage(tmp_path, "check", LEDGERWEB_METRICS_TOKEN_FILE=str(tmp_path / "nope"))
    assert missing.returncode != 0
    assert f"LEDGERWEB_METRICS_TOKEN_FILE names {tmp_path / 'nope'}, which cannot be read" in (
        missing.stderr
    )
    assert "Traceback" not in missing.stderr


@ONE_DATABASE
def test_every_secret_and_the_database_url_are_readable_from_a_file():
    from ledgerweb import settings_reference as reference

    secrets_ = [s.name for s in reference.REFERENCE.values() if s.kind == "secret"]
    assert secrets_ and all(reference.REFERENCE[n].from_file for n in secrets_)
    assert reference.REFERENCE["DATABASE_URL"].from_file
