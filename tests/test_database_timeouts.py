"""PostgreSQL bounds every statement and every idle open transaction (LEDGERWEB_PG_STATEMENT_
TIMEOUT_MS, LEDGERWEB_PG_IDLE_IN_TRANSACTION_TIMEOUT_MS): a runaway query is cut with an error
that names the setting, and a process that stalls inside a transaction cannot hold its locks for
ever. Each case runs in a process of its own with the setting in its environment."""

from __future__ import annotations

import json
import subprocess

import pytest
from django.db import connection

from tests.conftest import PYTHON, REPO, child_env

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def child(code: str, **env: str) -> dict:
    done = subprocess.run(
        [PYTHON, "-c", "import django; django.setup()\n" + code],
        cwd=REPO,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_defaults_bound_statements_and_idle_transactions():
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "1min"
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        assert cursor.fetchone()[0] == "1min"
        cursor.execute("SHOW jit")  # short index reads: compiling would cost more than running
        assert cursor.fetchone()[0] == "off"


LONG_STATEMENT = """
import json
from django.db import connection
from django.test import RequestFactory
from attempts import api
from attempts.locking import StatementTimeout, write_transaction

out = {}
with connection.cursor() as cursor:
    cursor.execute("SHOW statement_timeout")
    out["setting"] = cursor.fetchone()[0]
# A ledger write transaction: the clear error, and the connection stays usable.
try:
    with write_transaction(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(5)")
except StatementTimeout as exc:
    out["write"] = [exc.code, str(exc)]
# Anything else (a page's query): the server's error handler answers 503 with the same words.
try:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(5)")
except Exception:
    request = RequestFactory().get("/api/v1/attempts", HTTP_ACCEPT="application/json")
    answer = api.server_error(request)
    out["page"] = [answer.status_code, json.loads(answer.content)]
with connection.cursor() as cursor:
    cursor.execute("SELECT 1")
    out["after"] = cursor.fetchone()[0]
print(json.dumps(out))
"""


def test_a_long_statement_is_cut_with_an_error_that_names_the_setting():
    out = child(LONG_STATEMENT, LEDGERWEB_PG_STATEMENT_TIMEOUT_MS="200")
    assert out["setting"] == "200ms"
    code, message = out["write"]
    assert code == "statement_timeout"
    assert "ran longer than 200 ms (LEDGERWEB_PG_STATEMENT_TIMEOUT_MS)" in message
    assert "was not written" in message
    status, body = out["page"]
    assert status == 503
    assert body["error"]["code"] == "statement_timeout", body
    assert "LEDGERWEB_PG_STATEMENT_TIMEOUT_MS" in body["error"]["message"]
    assert out["after"] == 1


IDLE_TRANSACTION = """
import json, time
from django.db import DatabaseError, connection, transaction

out = {}
try:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        time.sleep(1.5)  # a process stalled with its transaction open
        cursor.execute("SELECT 1")
    out["error"] = None
except DatabaseError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def test_a_transaction_left_idle_is_ended_by_the_server():
    out = child(IDLE_TRANSACTION, LEDGERWEB_PG_IDLE_IN_TRANSACTION_TIMEOUT_MS="300")
    assert out["error"] is not None and "idle-in-transaction timeout" in out["error"]
