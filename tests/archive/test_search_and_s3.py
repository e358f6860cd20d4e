"""Searching the dashboard for an archived key or request id says where it went; archives in an
S3-compatible bucket (moto's server, a real local HTTP server process) run, verify and restore."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from attempts.actors import Actor
from attempts.models import Attempt
from reconciliation.archive import archive
from reconciliation.archive.store import FolderStore, open_store
from tests.conftest import free_port
from tests.dashboard.conftest import login

pytestmark = pytest.mark.django_db


def test_search_for_an_archived_key_or_request_id_says_where_it_went(
    ledger_with_rules, tmp_path, world
):
    result = archive.run(store=FolderStore(tmp_path / "a"), actor=Actor.system("t"))
    client = login(world.viewer)
    for term in ("old:1", "req-old:1"):
        page = client.get("/queues/all/", {"q": term}).content.decode()
        assert 'data-testid="archived-match"' in page, term
        assert result.name in page and "was archived on" in page
    # Another tenant's archived attempts are not shown to someone outside it.
    page = login(world.outsider).get("/queues/all/", {"q": "old:1"}).content.decode()
    assert "archived-match" not in page
    # A key still in the ledger is not reported as archived.
    page = client.get("/queues/all/", {"q": "young:0"}).content.decode()
    assert "archived-match" not in page


@pytest.fixture
def s3(monkeypatch):
    """moto's S3 server on a free port, and boto3 pointed at it through its own settings."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1)  # noqa: S310 - our own local server
                break
            except OSError:
                time.sleep(0.1)
        for name, value in {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        import boto3

        boto3.client("s3").create_bucket(Bucket="ledger-archives")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_calls_to_the_bucket_have_deadlines(monkeypatch):
    from reconciliation.archive.store import S3_CONNECT_TIMEOUT, S3_READ_TIMEOUT, S3Store

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = S3Store("ledger-archives").client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (S3_CONNECT_TIMEOUT, S3_READ_TIMEOUT)


def test_archives_in_an_s3_bucket_run_verify_and_restore(ledger_with_rules, tmp_path, s3):
    due = {a.attempt_id for a in ledger_with_rules.due}
    call_command("archive", "run", "--to", "s3://ledger-archives/prod", "--batch-size", "2")
    assert not Attempt.objects.filter(attempt_id__in=due).exists()
    store = open_store("s3://ledger-archives/prod")
    [name] = store.archives()
    call_command("archive", "verify", "--from", "s3://ledger-archives/prod")
    scratch = tmp_path / "scratch.sqlite3"
    call_command(
        "archive", "restore", "--from", "s3://ledger-archives/prod", "--into-sqlite", str(scratch)
    )
    from attempts import audit_verify

    report = audit_verify.verify_sqlite_file(str(scratch))
    assert report.ok and f"{len(due) * 4} events verify" in report.render(), report.render()
    # An archive is never overwritten, and a changed object in the bucket is caught.
    import boto3

    client = boto3.client("s3")
    key = f"prod/{name}/attempts-00001.jsonl.gz"
    client.put_object(Bucket="ledger-archives", Key=key, Body=b"not the archive")
    with pytest.raises(CommandError, match="some archives do not verify"):
        call_command("archive", "verify", "--from", "s3://ledger-archives/prod")
    from reconciliation.archive.store import StoreError

    with pytest.raises(StoreError, match="cannot write"):
        store.put(name, "manifest.json", b"{}")
