"""Fixtures for the dashboard: attempts in the states people work on, made through the ledger
itself (no hand-written rows), and logged-in clients for each named person."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
from pathlib import Path

import pytest
from django.test import Client

from attempts import ledger, linked, states
from attempts.locking import write_transaction
from attempts.models import Attempt, SlaPolicy, State
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


AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
PHONE = {"width": 390, "height": 844}


@functools.cache
def _axe_source() -> str:
    return AXE.read_text(encoding="utf-8")


class Tab:
    """One person's browser tab, under the pages' own Content-Security-Policy, collecting
    console errors (CSP violations show up there)."""

    def __init__(self, browser, base: str, *, viewport=None, dark=False) -> None:
        self.context = browser.new_context(
            viewport=viewport or {"width": 1400, "height": 900},
            color_scheme="dark" if dark else "light",
        )
        self.page = self.context.new_page()
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def goto(self, path: str) -> None:
        self.page.goto(self.base + path)

    def login(self, username: str) -> None:
        """Sign in on the sign-in page the tab was sent to (it keeps where to go next), or on
        /login/."""
        if "/login/" not in self.page.url:
            self.goto("/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", PASSWORD)
        self.page.click("button[type=submit]")
        self.page.wait_for_load_state("networkidle")

    def shot(self, label: str) -> None:
        self.page.screenshot(path=str(SHOTS / f"{label}.png"), full_page=True)

    def axe(self) -> list[dict]:
        """Critical and serious axe-core violations on the current page, as the browser shows it
        under the page's Content-Security-Policy: axe-core is evaluated by the driver, which the
        policy does not govern, not added as a script tag, which it refuses."""
        self.page.evaluate(_axe_source())
        result = self.page.evaluate(
            "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
            ".filter(v => v.impact === 'critical' || v.impact === 'serious')"
            ".map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"
        )
        return result

    def no_sideways_scroll(self) -> bool:
        return self.page.evaluate(
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )


def csp_errors(*tabs: Tab) -> list[str]:
    return [e for t in tabs for e in t.errors if "Content Security Policy" in e or "Refused" in e]


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


def escalating_sla(world) -> SlaPolicy:
    """open_ticket's SLA: a warning after 5 minutes UNKNOWN, a breach after 30 that escalates
    to the admin."""
    return SlaPolicy.objects.create(
        tool_id="open_ticket",
        unknown_warn_after=dt.timedelta(minutes=5),
        unknown_breach_after=dt.timedelta(minutes=30),
        escalate_to=world.admin,
    )


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


@pytest.fixture(scope="module")
def _chromium():
    """Debian's Chromium, headless, through Playwright: started once per test module."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
        # still plain synchronous code.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as p:
            launched = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            yield launched
            launched.close()


@pytest.fixture
def browser(_chromium):
    """The module's Chromium (browser tests only); what a test opened in it (each tab is a
    context of its own: cookies, storage) is closed when the test ends."""
    yield _chromium
    for context in _chromium.contexts:
        context.close()
