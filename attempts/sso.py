"""Single sign-on for operators through OpenID Connect (mozilla-django-oidc).

A person's roles come from the identity provider's groups claim, mapped to tenant roles by the
configuration file's ``[[sso_groups]]`` (``SsoGroupRole``). At every sign-in their memberships are
set to exactly what their groups give, and each change is recorded in the configuration history.
Someone whose groups map to no role is refused. Accounts are matched by the provider's ``sub``,
so a name chosen at the provider can never take over an existing local account.

The provider's endpoints come from ``LEDGERWEB_OIDC_DISCOVERY_URL`` (its
``/.well-known/openid-configuration``, read once per process at first use within
``LEDGERWEB_OIDC_TIMEOUT`` and kept) unless each is set by hand. Logging out of a session that
came through single sign-on also ends it at the provider (RP-initiated logout) when the provider
has an ``end_session_endpoint``.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from attempts import memberships
from attempts.config_history import acting
from attempts.locking import write_transaction
from attempts.models import ActorKind, Role, SsoGroupRole, SsoIdentity
from attempts.states import Actor

log = logging.getLogger("ledgerweb.sso")
# Why the last sign-in of this browser was refused, and what to do, for the login page to say.
REFUSAL_KEY = "ledgerweb_sso_refused"
ASK_FOR_A_GROUP = "Ask an administrator to map one of your groups to a role."

# mozilla-django-oidc's setting -> the discovery document's field.
DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
_WELL_KNOWN = "/.well-known/openid-configuration"
_MAX_DOCUMENT = 1024 * 1024
_discovery_lock = threading.Lock()
_discovery: dict[str, Any] | None = None


class DiscoveryError(ImproperlyConfigured):
    """The provider's discovery document could not be read or is not usable."""


def discovery() -> dict[str, Any]:
    """The provider's discovery document, fetched once per process (within the OIDC timeout)
    and kept; an error names the URL and what was wrong, and the next use tries again."""
    global _discovery
    url = settings.SSO["DISCOVERY_URL"]
    if not url:
        return {}
    with _discovery_lock:
        if _discovery is None or _discovery.get("_from") != url:
            _discovery = {**fetch_discovery(url, settings.OIDC_TIMEOUT), "_from": url}
        return _discovery


def fetch_discovery(url: str, timeout: float) -> dict[str, Any]:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise DiscoveryError(f"LEDGERWEB_OIDC_DISCOVERY_URL must be an http(s) URL; got {url!r}")
    request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (http(s))
            body = answer.read(_MAX_DOCUMENT + 1)
    except urllib.error.HTTPError as exc:
        raise DiscoveryError(f"the discovery document at {url} answered HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DiscoveryError(
            f"the discovery document at {url} could not be read within {timeout} s: {reason}"
        ) from None
    if len(body) > _MAX_DOCUMENT:
        raise DiscoveryError(f"the discovery document at {url} is larger than 1 MiB")
    try:
        document = json.loads(body)
    except ValueError:
        raise DiscoveryError(f"the discovery document at {url} is not JSON") from None
    if not isinstance(document, dict):
        raise DiscoveryError(f"the discovery document at {url} is not a JSON object")
    missing = [field for field in DISCOVERED.values() if not isinstance(document.get(field), str)]
    if missing:
        raise DiscoveryError(f"the discovery document at {url} has no {', '.join(missing)}")
    if url.endswith(_WELL_KNOWN):
        issuer = url[: -len(_WELL_KNOWN)]
        if str(document.get("issuer", "")).rstrip("/") != issuer.rstrip("/"):
            raise DiscoveryError(
                f"the discovery document at {url} names the issuer "
                f"{document.get('issuer')!r}, not {issuer!r}"
            )
    return document


def oidc_setting(attr: str, *args: Any) -> Any:
    """mozilla-django-oidc's settings, with the endpoints not set by hand taken from the
    provider's discovery document."""
    value = import_from_settings(attr, *args)
    if attr in DISCOVERED and not value:
        value = discovery().get(DISCOVERED[attr], "")
    return value


def end_session_endpoint() -> str:
    explicit = settings.SSO["END_SESSION_ENDPOINT"]
    if explicit or not settings.SSO["DISCOVERY_URL"]:
        return explicit
    value = discovery().get("end_session_endpoint")
    return value if isinstance(value, str) else ""


def provider_logout_url(request: HttpRequest, after: str) -> str:
    """Where to send a browser whose session came through single sign-on, so the provider
    ends its session too (OpenID Connect RP-Initiated Logout), then returns it to ``after``
    (absolute). Empty when the session was a password login or the provider has no endpoint."""
    id_token = request.session.get("oidc_id_token")
    if not settings.SSO["ENABLED"] or not id_token:
        return ""
    try:
        endpoint = end_session_endpoint()
    except DiscoveryError as exc:
        log.warning("sso.logout_without_provider %s", exc)
        return ""
    if not endpoint:
        return ""
    query = urllib.parse.urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": after,
            "client_id": settings.OIDC_RP_CLIENT_ID,
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def roles_for_groups(groups: list[str]) -> dict[str, str]:
    """tenant -> the highest role any of ``groups`` gives there."""
    roles: dict[str, str] = {}
    for tenant, role in SsoGroupRole.objects.filter(group__in=groups).values_list(
        "tenant_id", "role"
    ):
        held = roles.get(tenant)
        roles[tenant] = Role.highest([role, held] if held else [role])
    return dict(sorted(roles.items()))


def groups_claim(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.SSO["GROUPS_CLAIM"], [])
    if isinstance(value, str):
        value = [value]
    return sorted({str(group) for group in value}) if isinstance(value, list) else []


class GroupRoleBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with accounts keyed by ``sub`` and roles from groups."""

    get_settings = staticmethod(oidc_setting)

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not claims.get("sub"):
            return self._refuse("the identity provider sent no subject")
        groups = groups_claim(claims)
        if not roles_for_groups(groups):
            return self._refuse(
                f"none of your groups ({', '.join(groups) or 'none'}) has a role in ledgerweb",
                ASK_FOR_A_GROUP,
            )
        return True

    def _refuse(self, why: str, advice: str = "") -> bool:
        log.warning("sso.refused %s", why, extra={"reason": why})
        if getattr(self, "request", None) is not None:
            self.request.session[REFUSAL_KEY] = {"why": why, "advice": advice}
        return False

    def filter_users_by_claims(self, claims: dict[str, Any]):
        return get_user_model().objects.filter(sso_identity__subject=claims["sub"])

    def create_user(self, claims: dict[str, Any]):
        username = self._username(claims)
        users = get_user_model().objects
        if users.filter(username=username).exists():
            self._refuse(
                f"the account name {username!r} belongs to a local (password) account, and "
                "single sign-on never signs into a local account",
                "Ask an administrator to rename or remove the local account, or to set "
                "LEDGERWEB_OIDC_USERNAME_CLAIM to a claim that does not collide.",
            )
            raise SuspiciousOperation(f"sso username {username!r} is taken by a local account")
        with (
            acting(Actor(ActorKind.SYSTEM, "sso"), f"first sign-in of {username}"),
            write_transaction(),
        ):
            user = users.create_user(username, email=claims.get("email", ""))  # no password
            SsoIdentity.objects.create(user=user, subject=claims["sub"])
        return self.update_user(user, claims)

    def update_user(self, user: Any, claims: dict[str, Any]):
        groups = groups_claim(claims)
        email = claims.get("email", user.email)
        if email != user.email:
            user.email = email
            user.save(update_fields=["email"])
        with write_transaction():
            memberships.set_roles(
                user,
                roles_for_groups(groups),
                actor=Actor(ActorKind.SYSTEM, "sso"),
                reason=f"sign-in of {user.get_username()} with groups {groups}",
            )
            SsoIdentity.objects.filter(user=user).update(last_login_groups=groups)
        return user

    @staticmethod
    def _username(claims: dict[str, Any]) -> str:
        for claim in (settings.SSO["USERNAME_CLAIM"], "preferred_username", "email", "sub"):
            value = str(claims.get(claim) or "").strip()
            if value:
                return value[:150]
        raise SuspiciousOperation("no usable name in the identity provider's claims")


def refusal(request: HttpRequest) -> dict[str, str]:
    """Why the last sign-in of this browser was refused (once), for the login page."""
    value = request.session.pop(REFUSAL_KEY, None)
    if isinstance(value, str):  # a session from before refusals carried their advice
        value = {"why": value, "advice": ASK_FOR_A_GROUP}
    return value or {}


def refuse_unavailable(request: HttpRequest, exc: Exception) -> None:
    log.error("sso.discovery_failed %s", exc, extra={"reason": str(exc)})
    request.session[REFUSAL_KEY] = {
        "why": f"the identity provider could not be reached ({exc})",
        "advice": "Log in with a password, or try again later; an administrator can check "
        "LEDGERWEB_OIDC_DISCOVERY_URL with `ledgerweb check --deploy`.",
    }
