"""One login throttle for /login/ and /admin/login/, over HTTP: the client address comes from
X-Forwarded-For only through a trusted proxy, lock-outs are per account and per address (so
nobody behind a proxy can lock out every password login), and ``staff`` means admin-site access
with what the person's roles allow."""

from __future__ import annotations

import ipaddress

import pytest
from django.conf import settings
from django.test import Client

from attempts.models import LoginThrottle
from reconciliation import config
from tests.conftest import PASSWORD, child_env, manage
from tests.dashboard.conftest import make_unknown

PROXY = "10.1.2.3"


@pytest.fixture
def behind_proxy(settings):
    settings.LEDGER = {
        **settings.LEDGER,
        "TRUSTED_PROXIES": (ipaddress.ip_network("10.1.2.0/24"),),
    }


def via_proxy(client_ip: str) -> Client:
    return Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=client_ip)


def admin_login(client: Client, username: str, password: str):
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password})


@pytest.fixture
def staff_admin(world):
    world.admin.is_staff = world.admin.is_superuser = True
    world.admin.save()
    return world.admin


def test_the_admin_login_is_throttled_and_refuses_the_right_password_while_locked(
    world, staff_admin
):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    client = Client(REMOTE_ADDR="192.0.2.40")
    for _ in range(limit - 1):
        assert admin_login(client, "admin", "wrong").status_code == 200
    assert admin_login(client, "admin", "wrong").status_code == 429
    response = admin_login(client, "admin", PASSWORD)
    assert response.status_code == 429
    assert "Too many failed log-ins" in response.content.decode()
    assert "_auth_user_id" not in client.session
    # Another address still signs in.
    assert admin_login(Client(REMOTE_ADDR="192.0.2.41"), "admin", PASSWORD).status_code == 302


def test_admin_and_dashboard_logins_share_one_count(world, staff_admin):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    client = Client(REMOTE_ADDR="192.0.2.50")
    for i in range(limit):
        if i % 2:
            admin_login(client, "admin", "wrong")
        else:
            client.post("/login/", {"username": "admin", "password": "wrong"})
    assert client.post("/login/", {"username": "admin", "password": PASSWORD}).status_code == 429
    assert admin_login(client, "admin", PASSWORD).status_code == 429


def test_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(world):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    # No proxy configured: a client choosing a fresh X-Forwarded-For per guess gains nothing.
    for i in range(limit):
        Client(REMOTE_ADDR="192.0.2.60", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").post(
            "/login/", {"username": "operator", "password": "wrong"}
        )
    fresh = Client(REMOTE_ADDR="192.0.2.60", HTTP_X_FORWARDED_FOR="198.51.100.99")
    assert fresh.post("/login/", {"username": "operator", "password": PASSWORD}).status_code == 429
    assert set(LoginThrottle.objects.values_list("address", flat=True)) == {"192.0.2.60", "(any)"}


def test_behind_a_trusted_proxy_one_client_cannot_lock_out_everyone(world, behind_proxy):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    attacker = via_proxy("203.0.113.5")
    for i in range(limit * 4):
        attacker.post("/login/", {"username": f"guess{i}", "password": "wrong"})
    response = attacker.post("/login/", {"username": "viewer", "password": PASSWORD})
    assert response.status_code == 429 and "any account from your address" in response.text
    # Everyone else behind the same proxy still signs in.
    for n, name in enumerate(("viewer", "operator", "reviewer")):
        other = via_proxy(f"203.0.113.{20 + n}")
        assert other.post("/login/", {"username": name, "password": PASSWORD}).status_code == 302
    # Writing a fake address in front of the header does not give the attacker a fresh one:
    # the proxy appends the address it saw, and that is the one counted.
    spoofed = via_proxy("198.51.100.77, 203.0.113.5")
    assert spoofed.post("/login/", {"username": "viewer", "password": PASSWORD}).status_code == 429


def test_a_chain_of_trusted_proxies_is_walked_from_the_right(world, behind_proxy):
    client = via_proxy("203.0.113.9, 10.1.2.7")  # client -> inner proxy -> proxy
    client.post("/login/", {"username": "operator", "password": "wrong"})
    assert LoginThrottle.objects.filter(address="203.0.113.9", username="operator").exists()


def test_one_account_guessed_from_many_addresses_is_locked(world, behind_proxy):
    limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
    for i in range(limit * 4):
        via_proxy(f"198.51.100.{i + 1}").post(
            "/login/", {"username": "reviewer", "password": "wrong"}
        )
    response = via_proxy("198.51.100.200").post(
        "/login/", {"username": "reviewer", "password": PASSWORD}
    )
    assert response.status_code == 429 and "this account." in response.text
    # Other accounts are untouched.
    other = via_proxy("198.51.100.200")
    assert other.post("/login/", {"username": "viewer", "password": PASSWORD}).status_code == 302


def test_a_bad_trusted_proxy_setting_stops_start_up_with_a_sentence(tmp_path):
    env = child_env(LEDGERWEB_DATA_DIR=str(tmp_path), LEDGERWEB_TRUSTED_PROXIES="10.0.0.0/33")
    env.pop("DATABASE_URL", None)
    done = manage("check", env=env)
    assert done.returncode != 0
    assert "LEDGERWEB_TRUSTED_PROXIES" in done.stderr


def test_staff_get_the_admin_permissions_of_their_roles(world):
    mine = make_unknown(world)
    theirs = make_unknown(world, tenant="globex")
    world.viewer.is_staff = True
    world.viewer.save()
    client = Client()
    assert admin_login(client, "viewer", PASSWORD).status_code == 302  # no hand-given permissions
    index = client.get("/admin/").content.decode()
    assert "/admin/attempts/attempt/" in index
    listing = client.get("/admin/attempts/attempt/")
    assert listing.status_code == 200
    assert mine.attempt_id in listing.text and theirs.attempt_id not in listing.text
    assert client.get("/admin/attempts/attemptevent/").status_code == 200
    # Configuration spans tenants: it stays with superusers.
    assert client.get("/admin/attempts/tool/").status_code == 403
    assert client.get("/admin/auth/user/").status_code == 403
    # Without staff, the same person gets no admin site at all.
    world.viewer.is_staff = False
    world.viewer.save()
    assert client.get("/admin/attempts/attempt/").status_code == 302


def test_staff_without_a_role_is_refused_by_the_configuration_file(world):
    text = 'version = 1\n\n[[users]]\nusername = "sam"\nstaff = true\n'
    with pytest.raises(config.ConfigError) as caught:
        config.plan(config.read("f.toml", text))
    assert any(
        line == 5 and "staff = true opens the admin site" in message
        for line, message in caught.value.problems
    ), caught.value.problems
    ok = 'version = 1\n\n[[users]]\nusername = "sam"\nstaff = true\nroles = { acme = "viewer" }\n'
    config.plan(config.read("f.toml", ok))
