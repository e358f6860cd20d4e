"""Log-in with throttling, one throttle for the dashboard's ``/login/`` and the admin's
``/admin/login/``: too many failed passwords for one username from one address lock that pair
out for a while; many failures from one address (any username) lock the address, and many for
one username (from any address) lock the account. The person is told so, and even a correct
password is refused until the lock ends, or guessing would simply continue.

The client address is ``REMOTE_ADDR``, or, when that is a trusted proxy
(``LEDGERWEB_TRUSTED_PROXIES``), the nearest address in ``X-Forwarded-For`` that is not one."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import math

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import AuthenticationForm
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, resolve_url
from django.utils import timezone

from attempts.models import LoginThrottle


def throttle_key(username: str, address: str) -> str:
    return hashlib.sha256(f"{username.strip().lower()}|{address}".encode()).hexdigest()


def _is_trusted_proxy(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in settings.LEDGER["TRUSTED_PROXIES"])


def client_address(request: HttpRequest) -> str:
    """The address the request came from. ``X-Forwarded-For`` is chosen by the client, so it is
    read only when the peer is a trusted proxy, and only from the right: each trusted proxy
    appends the address it saw, and the first hop that is not a trusted proxy is the client
    (anything left of it is whatever the client wrote)."""
    address = request.META.get("REMOTE_ADDR", "") or "unknown"
    if not _is_trusted_proxy(address):
        return address
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    for hop in reversed([h.strip() for h in forwarded.split(",") if h.strip()]):
        if not _is_trusted_proxy(hop):
            return hop[:64]
        address = hop
    return address


def locked_for(key: str, now: dt.datetime) -> dt.timedelta | None:
    """How long the pair stays locked, or None when it may try."""
    until = LoginThrottle.objects.filter(key=key).values_list("locked_until", flat=True).first()
    if until is not None and until > now:
        return until - now
    return None


# An address guessing across many usernames, and a username guessed from many addresses, are
# locked too, at this multiple of the limit.
ADDRESS_LIMIT_FACTOR = 4
ANY_USER = "\x00any-user"
ANY_ADDRESS = "\x00any-address"


def record_failure(
    key: str, now: dt.datetime, limit: int, *, username: str = "", address: str = ""
) -> None:
    """Count one failure; the window is as long as the lock, counted from the first failure.
    ``username`` and ``address`` are kept so an admin can see who is locked out."""
    lock = dt.timedelta(seconds=settings.LEDGER["LOGIN_LOCK_SECONDS"])
    try:
        with transaction.atomic():
            LoginThrottle.objects.get_or_create(
                key=key,
                defaults={
                    "first_failure_at": now,
                    "username": username.strip()[:150],
                    "address": address[:64],
                },
            )
    except IntegrityError:
        pass  # another request created the row first: count on it below
    with transaction.atomic():
        row = LoginThrottle.objects.select_for_update().get(key=key)
        if now - row.first_failure_at > lock:
            row.failures, row.first_failure_at, row.locked_until = 0, now, None
        row.failures += 1
        if row.failures >= limit:
            row.locked_until = now + lock
        row.save()


def clear_failures(key: str) -> None:
    LoginThrottle.objects.filter(key=key).delete()


class ThrottleMixin:
    """Refuses a locked account, address or (account, address) pair before the password is
    checked, and counts a failure on all three; used by both login forms."""

    locked = False

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        pair_key = throttle_key(username, address)
        address_key = throttle_key(ANY_USER, address)
        account_key = throttle_key(username, ANY_ADDRESS)
        limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
        now = timezone.now()
        for key, whom in (
            (pair_key, "this account from your address"),
            (address_key, "any account from your address"),
            (account_key, "this account"),
        ):
            remaining = locked_for(key, now)
            if remaining is not None:
                self.locked = True
                minutes = max(1, math.ceil(remaining.total_seconds() / 60))
                raise forms.ValidationError(
                    f"Too many failed log-ins for {whom}. Try again in "
                    f"{minutes} minute{'s' if minutes != 1 else ''}.",
                    code="locked",
                )
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            wider = limit * ADDRESS_LIMIT_FACTOR
            record_failure(pair_key, now, limit, username=username, address=address)
            record_failure(address_key, now, wider, address=address)
            record_failure(account_key, now, wider, username=username, address="(any)")
            if locked_for(pair_key, now) is not None:
                self.locked = True
            raise
        clear_failures(pair_key)
        return cleaned


class ThrottledAuthenticationForm(ThrottleMixin, AuthenticationForm):
    """The dashboard's login form."""


class ThrottledAdminAuthenticationForm(ThrottleMixin, AdminAuthenticationForm):
    """The admin site's login form (attempts/admin.py installs it): the same throttle."""


@login_not_required
def admin_login(request: HttpRequest) -> HttpResponse:
    """The admin site's own login view, answering 429 while locked, as ``/login/`` does."""
    response = admin.site.login(request)
    form = (getattr(response, "context_data", None) or {}).get("form")
    if getattr(form, "locked", False):
        response.status_code = 429
    return response


class LoginView(auth_views.LoginView):
    """The login page; a locked-out attempt is answered 429 with the reason."""

    form_class = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        from attempts.sso import refusal

        context = super().get_context_data(**kwargs)
        context["sso"] = settings.SSO
        context["sso_refused"] = refusal(self.request)
        return context

    def form_invalid(self, form: ThrottledAuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        if form.locked:
            response.status_code = 429
        return response


class LogoutView(auth_views.LogoutView):
    """Django's logout; a session that came through single sign-on is then sent to the
    provider's end-session endpoint, which returns the browser to the login page."""

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        from attempts.sso import provider_logout_url

        after = resolve_url(settings.LOGOUT_REDIRECT_URL)
        base = settings.NOTIFY["BASE_URL"]
        after = f"{base}{after}" if base else request.build_absolute_uri(after)
        at_provider = provider_logout_url(request, after)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(at_provider) if at_provider else response


@login_not_required
def sso_start(request: HttpRequest) -> HttpResponse:
    """Send the browser to the identity provider; when its discovery document cannot be read,
    back to the login page with the reason, never an error page."""
    from mozilla_django_oidc.views import OIDCAuthenticationRequestView

    from attempts.sso import DiscoveryError, discovery, oidc_setting, refuse_unavailable

    try:
        discovery()
    except DiscoveryError as exc:
        refuse_unavailable(request, exc)
        return redirect("login")

    class RequestView(OIDCAuthenticationRequestView):
        get_settings = staticmethod(oidc_setting)

    return RequestView.as_view()(request)
