"""Fixtures for the dashboard: attempts in the states people work on, made through the ledger
itself (no hand-written rows), and logged-in clients for each named person."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from django.test import Client

from attempts import ledger, linked, states
from attempts.locking import write_transaction
from attempts.models import Attempt, State
from attempts.states import Actor
from tests.conftest import PASSWORD, REPO, agent_intent

_seq = itertools.count(1)

CHROMIUM = "/usr/bin/chromium"
SHOTS = REPO / "var" / "artifacts" / "screenshots"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WORKER = Actor.worker("recon-1")


def make_attempt(
    world,
    *,
    tenant: str = "acme",
    tool: str = "open_ticket",
    key: str | None = None,
    args: dict | None = None,
) -> Attempt:
    n = next(_seq)
    attempt, _ = agent_intent(
        world,
        key or f"{tenant}:{tool}:{n}",
        tool=tool,
        args=args if args is not None else {"to": f"customer-{n}@example.test", "amount": n},
        task=f"task-{n}",
        tenant=tenant,
    )
    return attempt


def make_unknown(world, *, provider_request_id: str = "", **kwargs) -> Attempt:
    attempt = make_attempt(world, **kwargs)
    attempt, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert claimed
    if provider_request_id:
        attempt = ledger.attach_provider_request(attempt, provider_request_id, actor=world.agent)
    return ledger.mark_unknown(attempt, reason="timeout after 10s", actor=world.agent)


def make_review(world, *, reason: str = "payload_mismatch", **kwargs) -> Attempt:
    attempt = make_unknown(world, **kwargs)
    with write_transaction():
        return states.move(
            attempt,
            State.MANUAL_REVIEW,
            actor=WORKER,
            reason="lookup found a different payload hash",
            fields={"review_reason": reason},
        )


def record_lookup(attempt: Attempt, *, answer: str = "not_found", latency_ms: int = 12) -> None:
    with write_transaction():
        states.move(
            attempt,
            None,
            action="attempt.lookup",
            actor=WORKER,
            details={"answer": answer, "latency_ms": latency_ms, "provider_id": "prov-77"},
        )


def make_awaiting(world, **kwargs) -> Attempt:
    """A linked attempt waiting for approval (the reconciler found authority changed)."""
    original = make_unknown(world, **kwargs)
    return linked.create_linked_attempt(original, actor=WORKER, reason="policy changed")


def login(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


@pytest.fixture(autouse=True)
def _plain_static_storage(settings):
    """Pages link static files by name; the manifest storage needs collectstatic, tests do not."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def clients(world):
    """A logged-in client per named person in the world."""

    class Clients:
        def __getattr__(self, name: str) -> Client:
            client = login(getattr(world, name))
            setattr(self, name, client)
            return client

    return Clients()


@pytest.fixture
def browser(monkeypatch):
    """Debian's Chromium, headless, through Playwright (browser tests only)."""
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()
