"""The agent API skips the middleware only pages need (ledgerweb/browser.py): no session, no
signed-in person. What must hold for that to be safe: every view under /api/ is exempt from
login and CSRF by its own decorator (a view without the exemptions would have no
``request.user`` to check), a signed-in person's session opens nothing under /api/, and the
pages keep their login."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, get_resolver

from attempts import api as api_module
from tests.api.conftest import Api
from tests.conftest import PASSWORD


def api_views():
    """(route, view) of every URL pattern the project mounts under /api/."""
    found = []

    def walk(patterns, prefix: str) -> None:
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, route)
            elif isinstance(entry, URLPattern) and ("/" + route).startswith(api_module.API_PREFIX):
                found.append((route, entry.callback))

    walk(get_resolver().url_patterns, "")
    return found


def test_every_api_view_is_exempt_from_login_and_csrf_by_its_own_decorator() -> None:
    views = api_views()
    assert len(views) >= 9, views  # the agent API's endpoints, openapi.json included
    for route, view in views:
        assert getattr(view, "login_required", True) is False, route
        assert getattr(view, "csrf_exempt", False) is True, route


def test_the_api_sets_no_cookie_and_a_session_opens_nothing(world, client, tokens) -> None:
    answer = Api(client, tokens.acme).intent()
    assert answer.status == 201, answer.body
    assert "Set-Cookie" not in answer.headers
    # A person signed in to the dashboard, calling the API with the session alone.
    assert client.login(username="admin", password=PASSWORD)
    refused = Api(client, None).get("attempts")
    assert refused.status == 401, refused.body
    assert refused.body["error"]["code"]


def test_pages_still_need_a_login(world, client) -> None:
    page = client.get("/")
    assert page.status_code == 302 and "/login" in page.headers["Location"]
    assert client.login(username="admin", password=PASSWORD)
    assert client.get("/").status_code == 200
