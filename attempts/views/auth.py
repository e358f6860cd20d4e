"""Log-in with throttling: too many failed passwords for one username from one address lock
that pair out for a while, and the person is told so (even a correct password is refused until
the lock ends, or guessing would simply continue)."""

from __future__ import annotations

import datetime as dt
import hashlib
import math

from django import forms
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from attempts.models import LoginThrottle


def throttle_key(username: str, address: str) -> str:
    return hashlib.sha256(f"{username.strip().lower()}|{address}".encode()).hexdigest()


def client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: a forwarded-for header is chosen by the client and would let anyone
    # pick a fresh address per guess. Behind a proxy, the proxy must set REMOTE_ADDR.
    return request.META.get("REMOTE_ADDR", "") or "unknown"


def locked_for(key: str, now: dt.datetime) -> dt.timedelta | None:
    """How long the pair stays locked, or None when it may try."""
    until = LoginThrottle.objects.filter(key=key).values_list("locked_until", flat=True).first()
    if until is not None and until > now:
        return until - now
    return None


# An address guessing across many usernames is locked too, at this multiple of the limit.
ADDRESS_LIMIT_FACTOR = 4


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


class ThrottledAuthenticationForm(AuthenticationForm):
    """Django's form, refusing a locked (username, address) pair before checking the password."""

    locked = False

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        pair_key = throttle_key(username, address)
        address_key = throttle_key("\x00any-user", address)
        limit = settings.LEDGER["LOGIN_MAX_FAILURES"]
        now = timezone.now()
        for key, whom in ((pair_key, "this account"), (address_key, "any account")):
            remaining = locked_for(key, now)
            if remaining is not None:
                self.locked = True
                minutes = max(1, math.ceil(remaining.total_seconds() / 60))
                raise forms.ValidationError(
                    f"Too many failed log-ins for {whom} from your address. Try again in "
                    f"{minutes} minute{'s' if minutes != 1 else ''}.",
                    code="locked",
                )
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            record_failure(pair_key, now, limit, username=username, address=address)
            record_failure(address_key, now, limit * ADDRESS_LIMIT_FACTOR, address=address)
            if locked_for(pair_key, now) is not None:
                self.locked = True
            raise
        clear_failures(pair_key)
        return cleaned


class LoginView(auth_views.LoginView):
    """The login page; a locked-out attempt is answered 429 with the reason."""

    form_class = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        from attempts.sso import REFUSAL_KEY

        context = super().get_context_data(**kwargs)
        context["sso"] = settings.SSO
        context["sso_refused"] = self.request.session.pop(REFUSAL_KEY, "")
        return context

    def form_invalid(self, form: ThrottledAuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        if form.locked:
            response.status_code = 429
        return response
