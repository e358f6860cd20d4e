"""The middleware only a browser's requests need, passed over for the agent API.

The agent API (``attempts/api.py``, under ``/api/``) authenticates every call by its bearer
token and answers JSON: no session cookie, no signed-in person, no flash messages, no time zone
to show times in. So sessions, authentication, messages and the person's time zone are set up
for pages only (``attempts.api.wants_json`` says which requests are the API's). Everything that
guards a request stays on for every request, in ``settings.MIDDLEWARE`` as it is: security
headers, CSRF (the API's views are exempt by their decorator, as before), login required (the
API's views are exempt by theirs; a view under ``/api/`` without the exemption fails closed,
since the API has no ``request.user``), clickjacking and the CSP.
"""

from __future__ import annotations

from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions

from attempts import timezones
from attempts.api import wants_json


class BrowserOnly:
    """Mixed into a middleware class: requests to the agent API go straight on to the next."""

    def __call__(self, request):
        if wants_json(request):
            return self.get_response(request)
        return super().__call__(request)


class SessionMiddleware(BrowserOnly, sessions.SessionMiddleware):
    """Django's, for pages only."""


class AuthenticationMiddleware(BrowserOnly, auth.AuthenticationMiddleware):
    """Django's, for pages only."""


class TimeZoneMiddleware(BrowserOnly, timezones.TimeZoneMiddleware):
    """The person's time zone (``attempts.timezones``), for pages only."""


class MessageMiddleware(BrowserOnly, messages.MessageMiddleware):
    """Django's, for pages only."""
