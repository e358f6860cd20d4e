"""Access: every URL needs login (anonymous visitors get the login page, never data), login
throttling, logout, and the Content-Security-Policy with a nonce and self-served htmx."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.conf import settings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from attempts.models import LoginThrottle
from tests.conftest import PASSWORD
from tests.dashboard.conftest import make_review, make_unknown

SAMPLE = {
    "attempt_id": "att_X",
    "slug": "unknown",
    "object_id": "1",
    "app_label": "attempts",
    "content_type_id": "1",
    "model_name": "attempt",
    "url": "x",
    "path": "x",
}


def all_url_paths() -> list[str]:
    """One concrete path for every URL pattern in the project (admin included)."""
    paths: list[str] = []

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            route = str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + route)
            elif isinstance(pattern, URLPattern):
                paths.append(prefix + route)

    walk(get_resolver().url_patterns, "")
    concrete = []
    for route in paths:
        route = route.lstrip("^").rstrip("$").replace("\\Z", "")
        route = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: SAMPLE.get(m.group(1), "1"), route)
        route = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: SAMPLE.get(m.group(1), "attempts"), route)
        route = route.replace("^", "").replace("$", "")
        concrete.append("/" + route)
    return sorted(set(concrete))


def test_url_list_covers_the_dashboard():
    paths = all_url_paths()
    for expected in (
        "/",
        "/queues/unknown/",
        "/attempts/att_X/",
        "/attempts/att_X/approve/",
        "/queues/bulk/",
        "/admin/",
    ):
        assert expected in paths


@pytest.mark.parametrize("method", ["get", "post"])
def test_every_url_anonymously_gives_the_login_page_never_data(world, method):
    attempt = make_unknown(world, provider_request_id="req-secret-777")
    client = Client(REMOTE_ADDR="203.0.113.9")  # not loopback: /metrics needs its token
    for path in all_url_paths():
        path = path.replace("att_X", attempt.attempt_id)
        response = getattr(client, method)(path, follow=True)
        body = response.content.decode()
        # (The attempt id may appear in the login form's "next" address, never as data.)
        for secret in ("req-secret-777", attempt.idempotency_key, attempt.args_hash, "customer-"):
            assert secret not in body, (path, secret)
        if path.startswith("/api/"):
            # The agent API answers bearer-token clients: anonymous is a JSON refusal.
            if path.endswith("openapi.json"):
                assert response.status_code in (200, 405), path  # the published contract
            else:
                assert response.status_code in (401, 405), (path, response.status_code)
            continue
        if path.startswith("/log/"):
            # The transparency log is public by design (C2SP tlog-tiles): hashes and signed
            # checkpoints only, never an entry's content; 404 until something is published.
            assert response.status_code in (200, 400, 404, 405), (path, response.status_code)
            assert "tenant" not in body and "acme" not in body, path
            continue
        if path == "/slack/interactions":
            # Slack's button clicks: Slack's signature is the proof, not a login. Unsigned, it
            # is refused (404 where Slack approvals are not configured) and shows nothing.
            assert response.status_code in (401, 404, 405), (path, response.status_code)
            continue
        if path in ("/healthz", "/metrics"):
            assert response.status_code in (200, 403, 405, 503), (path, response.status_code)
            assert "tenant=" not in body, path
            continue
        if path in ("/livez", "/readyz"):
            # A load balancer's probes: a status and nothing of the ledger.
            assert response.status_code in (200, 405, 503), (path, response.status_code)
            if response.status_code == 200:
                assert set(response.json()) <= {"status", "database"}, path
            continue
        if path.startswith("/set-password/"):
            # The one-time set-password link (manage.py password_link): a bad token shows only
            # that the link is not valid, and the page after it only says "log in".
            assert response.status_code in (200, 405), (path, response.status_code)
            if response.status_code == 200:
                assert "already used or has expired" in body or "Password set" in body, path
            continue
        assert response.status_code in (200, 405), (path, response.status_code)
        if response.status_code == 200:
            assert 'name="password"' in body, f"{method.upper()} {path} did not end on a login page"
            final = response.redirect_chain[-1][0] if response.redirect_chain else path
            assert "login" in final, (path, final)


def test_login_and_logout(world):
    client = Client()
    response = client.post("/login/", {"username": "operator", "password": PASSWORD})
    assert response.status_code == 302 and response.url == "/"
    assert client.get("/").status_code == 200
    response = client.post("/logout/")
    assert response.status_code == 302
    assert client.get("/").status_code == 302


def test_wrong_password_is_refused_with_a_message(world):
    response = Client().post("/login/", {"username": "operator", "password": "nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()


def test_login_throttling_locks_the_username_from_that_address(world):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    client = Client(REMOTE_ADDR="10.0.0.9")
    for _ in range(limit - 1):
        assert (
            client.post("/login/", {"username": "operator", "password": "bad"}).status_code == 200
        )
    response = client.post("/login/", {"username": "operator", "password": "bad"})
    assert response.status_code == 429
    # Locked: even the right password is refused, with a clear message.
    response = client.post("/login/", {"username": "Operator", "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed log-ins" in response.content.decode()
    assert "_auth_user_id" not in client.session
    # Another address, or another account, is not locked.
    other = Client(REMOTE_ADDR="10.0.0.10")
    assert other.post("/login/", {"username": "operator", "password": PASSWORD}).status_code == 302
    assert client.post("/login/", {"username": "viewer", "password": PASSWORD}).status_code == 302


def test_one_address_guessing_many_usernames_is_locked_too(world):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    client = Client(REMOTE_ADDR="10.0.0.12")
    for i in range(limit * 4):
        client.post("/login/", {"username": f"user{i}", "password": "bad"})
    response = client.post("/login/", {"username": "viewer", "password": PASSWORD})
    assert response.status_code == 429
    assert "any account" in response.content.decode()
    assert (
        Client(REMOTE_ADDR="10.0.0.13")
        .post("/login/", {"username": "viewer", "password": PASSWORD})
        .status_code
        == 302
    )


def test_lock_ends_and_success_resets_the_count(world):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    client = Client(REMOTE_ADDR="10.0.0.11")
    for _ in range(limit):
        client.post("/login/", {"username": "reviewer", "password": "bad"})
    assert LoginThrottle.objects.exclude(locked_until=None).count() == 1
    past = timezone.now() - dt.timedelta(seconds=1)
    LoginThrottle.objects.update(locked_until=past, first_failure_at=past - dt.timedelta(hours=1))
    assert client.post("/login/", {"username": "reviewer", "password": PASSWORD}).status_code == 302
    # The (username, address) count is cleared; the address-wide and account-wide ones just
    # age out.
    assert LoginThrottle.objects.count() == 2


def test_pages_carry_a_csp_with_a_nonce_and_htmx_from_our_static_files(world, clients):
    make_review(world)
    response = clients.operator.get("/")
    csp = response.headers["Content-Security-Policy"]
    nonce = re.search(r"'nonce-([^']+)'", csp).group(1)
    assert "script-src 'self' 'nonce-" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    body = response.content.decode()
    scripts = re.findall(r"<script[^>]*>", body)
    assert scripts, "no scripts at all?"
    for tag in scripts:
        assert f'nonce="{nonce}"' in tag, tag
        assert re.search(r'src="/static/', tag), tag
    assert any("django_htmx/htmx-2" in tag for tag in scripts)
    assert "<style" not in body and " style=" not in body
    assert "hx-on" not in body
