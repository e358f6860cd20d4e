"""Single sign-on through OpenID Connect against a real provider process (oidc-provider-mock, an
authlib-based OpenID provider for tests: discovery, authorization code flow with PKCE, signed ID
tokens, JWKS and userinfo over HTTP), with the ledger served by ``ledgerweb serve`` in its own
process. Roles come from the provider's groups claim through the configuration file's
``[[sso_groups]]``; someone in no mapped group is refused."""

from __future__ import annotations

import http.cookiejar
import io
import json
import re
import subprocess
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from attempts.models import ConfigEvent, Membership, SsoIdentity
from tests.conftest import PYTHON, REPO, child_env, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

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


@pytest.fixture
def ledger_server(provider: str, tmp_path: Path):
    path = tmp_path / "ledger.toml"
    path.write_text(MAPPINGS)
    call_command("ledger_config", "apply", str(path), "--actor", "ops", stdout=io.StringIO())
    with urllib.request.urlopen(f"{provider}/.well-known/openid-configuration") as answer:  # noqa: S310
        discovery = json.load(answer)
    port = free_port()
    env = child_env(
        LEDGERWEB_DATA_DIR=str(tmp_path / "data"),
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_WORKERS="1",
        LEDGERWEB_THREADS="2",
        LEDGERWEB_INTENT_WRITER="0",
        LEDGERWEB_OIDC_CLIENT_ID="ledgerweb",
        LEDGERWEB_OIDC_CLIENT_SECRET="a-client-secret",
        LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT=discovery["authorization_endpoint"],
        LEDGERWEB_OIDC_TOKEN_ENDPOINT=discovery["token_endpoint"],
        LEDGERWEB_OIDC_USERINFO_ENDPOINT=discovery["userinfo_endpoint"],
        LEDGERWEB_OIDC_JWKS_ENDPOINT=discovery["jwks_uri"],
    )
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [PYTHON, "-m", "ledgerweb", "serve"],
            cwd=REPO,
            env=env,
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
    assert "belongs to a local account" in page
    assert not SsoIdentity.objects.exists()
    assert roles_of("alice") == {}
