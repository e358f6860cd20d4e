"""Single sign-on through OpenID Connect against a real provider process (oidc-provider-mock, an
authlib-based OpenID provider for tests: discovery, authorization code flow with PKCE, signed ID
tokens, JWKS and userinfo over HTTP), with the ledger served by ``ledgerweb serve`` in its own
process. Roles come from the provider's groups claim through the configuration file's
``[[sso_groups]]``; someone in no mapped group is refused."""

from __future__ import annotations

import contextlib
import http.cookiejar
import http.server
import io
import json
import re
import subprocess
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from attempts.models import ConfigEvent, Membership, SsoIdentity
from tests.conftest import PYTHON, REPO, child_env, free_port, manage
from tests.http_handler import QuietHandler

# Sign-in is the web tier's: the SQLite pass covers it when both passes run.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.one_database]

ALICE = {
    "sub": "idp-alice-0001",
    "preferred_username": "alice",
    "email": "alice@example.test",
    "groups": ["ledger-reviewers", "everyone"],
}
BOB = {
    "sub": "idp-bob-0002",
    "preferred_username": "bob",
    "email": "bob@x.test",
    "groups": ["sales"],
}
MAPPINGS = textwrap.dedent(
    """\
    version = 1

    [[tenants]]
    slug = "acme"

    [[tenants]]
    slug = "globex"

    [[sso_groups]]
    group = "ledger-reviewers"
    roles = { acme = "reviewer" }

    [[sso_groups]]
    group = "globex-admins"
    roles = { globex = "admin" }

    [[sso_groups]]
    group = "everyone"
    roles = { acme = "viewer" }
    """
)


def wait_for(url: str, process: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (127.0.0.1)
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"{url} did not answer:\n{log.read_text()}"
            time.sleep(0.2)


@pytest.fixture
def provider(tmp_path: Path):
    port = free_port()
    log = tmp_path / "provider.log"
    command = [PYTHON, "-m", "oidc_provider_mock", "--port", str(port)]
    for claims in (ALICE, BOB):
        command += ["--user-claims", json.dumps(claims)]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{base}/.well-known/openid-configuration", process, log)
        yield base
    finally:
        process.kill()
        process.wait(timeout=10)


def apply_mappings(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(MAPPINGS)
    call_command("ledger_config", "apply", str(path), "--actor", "ops", stdout=io.StringIO())


def sso_env(tmp_path: Path, port: int, **oidc: str) -> dict[str, str]:
    return child_env(
        LEDGERWEB_DATA_DIR=str(tmp_path / "data"),
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_WORKERS="1",
        LEDGERWEB_THREADS="2",
        LEDGERWEB_INTENT_WRITER="0",
        LEDGERWEB_OIDC_CLIENT_ID="ledgerweb",
        LEDGERWEB_OIDC_CLIENT_SECRET="a-client-secret",
        LEDGERWEB_OIDC_TIMEOUT="3",
        **oidc,
    )


@contextlib.contextmanager
def serve(tmp_path: Path, **oidc: str):
    """``ledgerweb serve`` in its own process with these single sign-on settings."""
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [PYTHON, "-m", "ledgerweb", "serve"],
            cwd=REPO,
            env=sso_env(tmp_path, port, **oidc),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{base}/login/", process, log)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def ledger_server(provider: str, tmp_path: Path):
    """The four endpoints copied by hand, as before discovery."""
    apply_mappings(tmp_path)
    with urllib.request.urlopen(f"{provider}/.well-known/openid-configuration") as answer:  # noqa: S310
        discovery = json.load(answer)
    with serve(
        tmp_path,
        LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT=discovery["authorization_endpoint"],
        LEDGERWEB_OIDC_TOKEN_ENDPOINT=discovery["token_endpoint"],
        LEDGERWEB_OIDC_USERINFO_ENDPOINT=discovery["userinfo_endpoint"],
        LEDGERWEB_OIDC_JWKS_ENDPOINT=discovery["jwks_uri"],
    ) as base:
        yield base


@pytest.fixture
def discovered_server(provider: str, tmp_path: Path):
    """Only the discovery URL: every endpoint comes from the provider's document."""
    apply_mappings(tmp_path)
    with serve(
        tmp_path, LEDGERWEB_OIDC_DISCOVERY_URL=f"{provider}/.well-known/openid-configuration"
    ) as base:
        yield base


class Browser:
    """Follows redirects and keeps cookies, as a person's browser does across both sites."""

    def __init__(self) -> None:
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def open(self, url: str, form: dict[str, str] | None = None) -> tuple[str, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        with self.opener.open(url, data=data, timeout=30) as answer:
            return answer.geturl(), answer.read().decode()

    def sign_in(self, server: str, subject: str) -> tuple[str, str]:
        """Start at the login page's SSO link; choose ``subject`` at the provider."""
        _, login = self.open(f"{server}/login/")
        link = re.search(r'href="(/oidc/authenticate/[^"]*)"', login)
        assert link, login
        at_provider, page = self.open(server + link.group(1))
        assert at_provider.startswith("http://127.0.0.1") and "Authorize" in page
        return self.open(at_provider, {"sub": subject})


def roles_of(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("tenant_id", "role"))


def test_a_person_signs_in_with_roles_from_their_groups(provider, ledger_server) -> None:
    final, page = Browser().sign_in(ledger_server, ALICE["sub"])
    assert final.rstrip("/") == ledger_server, final
    assert "Log out" in page and "alice" in page
    user = User.objects.get(username="alice")
    assert SsoIdentity.objects.get(user=user).subject == ALICE["sub"]
    assert not user.has_usable_password()
    # Highest role per tenant over her groups: reviewer (ledger-reviewers) beats viewer.
    assert roles_of("alice") == {"acme": "reviewer"}

    # Her groups change at the provider: the next sign-in follows them.
    changed = {**ALICE, "groups": ["globex-admins"]}
    request = urllib.request.Request(  # noqa: S310 (127.0.0.1)
        f"{provider}/users/{ALICE['sub']}",
        data=json.dumps({k: v for k, v in changed.items() if k != "sub"}).encode(),
        headers={"Content-Type": "application/json"},
        method="PUT",
    )
    urllib.request.urlopen(request).close()  # noqa: S310
    final, page = Browser().sign_in(ledger_server, ALICE["sub"])
    assert "Log out" in page
    assert roles_of("alice") == {"globex": "admin"}
    assert User.objects.filter(username="alice").count() == 1
    # Each membership the sign-ins made or removed is in the configuration history.
    changes = list(
        ConfigEvent.objects.filter(subject__startswith="membership:")
        .order_by("seq")
        .values_list("subject", "action", "actor_kind", "actor")
    )
    assert changes == [
        ("membership:acme/alice", "created", "system", "sso"),
        ("membership:acme/alice", "deleted", "system", "sso"),
        ("membership:globex/alice", "created", "system", "sso"),
    ]


def test_a_person_in_no_mapped_group_is_refused(provider, ledger_server) -> None:
    browser = Browser()
    final, page = browser.sign_in(ledger_server, BOB["sub"])
    assert final.startswith(f"{ledger_server}/login/"), final
    assert "Single sign-on refused you" in page and "sales" in page
    assert "Log out" not in page
    assert not User.objects.filter(username="bob").exists()
    # Refused means no session either: the dashboard still asks to log in.
    final, page = browser.open(f"{ledger_server}/")
    assert "/login/" in final and 'name="password"' in page


def test_a_provider_name_never_takes_over_a_local_account(provider, ledger_server) -> None:
    User.objects.create_user("alice", password="local-password-123", is_superuser=True)
    final, page = Browser().sign_in(ledger_server, ALICE["sub"])
    assert final.startswith(f"{ledger_server}/login/")
    # The refusal says why, and what to do about a name collision, not about groups.
    assert "belongs to a local (password) account" in page
    assert "rename or remove the local account" in page
    assert "map one of your groups" not in page
    assert not SsoIdentity.objects.exists()
    assert roles_of("alice") == {}


def test_the_discovery_url_alone_configures_sign_in_and_logout_ends_the_providers_session(
    provider, discovered_server
) -> None:
    browser = Browser()
    final, page = browser.sign_in(discovered_server, ALICE["sub"])
    assert final.rstrip("/") == discovered_server, final
    assert "Log out" in page and roles_of("alice") == {"acme": "reviewer"}
    # Logging out sends the browser to the provider's end_session_endpoint with the ID token
    # as the hint and the login page to come back to (RP-initiated logout)...
    _, page = browser.open(f"{discovered_server}/login/")
    _, overview = browser.open(f"{discovered_server}/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', overview).group(1)
    at_provider, page = browser.open(f"{discovered_server}/logout/", {"csrfmiddlewaretoken": token})
    assert at_provider.startswith(f"{provider}/oauth2/end_session?"), at_provider
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(at_provider).query)
    assert query["post_logout_redirect_uri"] == [f"{discovered_server}/login/"]
    assert query["client_id"] == ["ledgerweb"]
    assert query["id_token_hint"][0].count(".") == 2  # a signed JWT
    assert "id_token_hint" in page and "Recommended parameter" not in page
    # ...which ends its session and returns the browser to the login page, logged out here.
    final, page = browser.open(
        f"{provider}/oauth2/end_session/confirm",
        {"redirect_uri": query["post_logout_redirect_uri"][0]},
    )
    assert final == f"{discovered_server}/login/" and 'name="password"' in page
    final, _ = browser.open(f"{discovered_server}/")
    assert "/login/" in final


def test_a_password_login_logs_out_locally_only(provider, discovered_server) -> None:
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    # The server's own hasher (the test settings hash faster, with one the server lacks).
    hashed = PBKDF2PasswordHasher().encode("pat-password-123", "pat-salt-1234")
    User.objects.create(username="pat", password=hashed)
    browser = Browser()
    _, page = browser.open(f"{discovered_server}/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    final, page = browser.open(
        f"{discovered_server}/login/",
        {"csrfmiddlewaretoken": token, "username": "pat", "password": "pat-password-123"},
    )
    assert "Log out" in page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    final, _ = browser.open(f"{discovered_server}/logout/", {"csrfmiddlewaretoken": token})
    assert final == f"{discovered_server}/login/"


def test_an_unreachable_discovery_url_is_a_clear_message_not_an_error_page(tmp_path) -> None:
    apply_mappings(tmp_path)
    closed = f"http://127.0.0.1:{free_port()}/.well-known/openid-configuration"
    with serve(tmp_path, LEDGERWEB_OIDC_DISCOVERY_URL=closed) as base:
        final, page = Browser().open(f"{base}/oidc/authenticate/")
    assert final.startswith(f"{base}/login/")
    assert "the identity provider could not be reached" in page and closed in page
    assert "Log in with a password" in page
    # The deployment gate reads the document too, and says what is wrong.
    done = manage(
        "check", "--deploy", env=sso_env(tmp_path, 1, LEDGERWEB_OIDC_DISCOVERY_URL=closed)
    )
    assert done.returncode != 0
    assert "attempts.E011" in done.stderr and "could not be read within 3" in done.stderr


class _Document(QuietHandler):
    body = b"{}"

    def do_GET(self) -> None:
        self.reply(200, self.body)


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (b"not json", "is not JSON"),
        (b"[]", "is not a JSON object"),
        (b'{"issuer": "http://127.0.0.1"}', "has no authorization_endpoint"),
        (
            json.dumps(
                {
                    "issuer": "https://evil.example",
                    "authorization_endpoint": "a",
                    "token_endpoint": "t",
                    "userinfo_endpoint": "u",
                    "jwks_uri": "j",
                }
            ).encode(),
            "names the issuer 'https://evil.example'",
        ),
    ],
)
def test_a_bad_discovery_document_is_refused_with_what_is_wrong(document, error) -> None:
    from attempts.sso import DiscoveryError, fetch_discovery

    handler = type("Handler", (_Document,), {"body": document})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/.well-known/openid-configuration"
        with pytest.raises(DiscoveryError, match=re.escape(error)):
            fetch_discovery(url, 5)
    finally:
        server.shutdown()
        server.server_close()
