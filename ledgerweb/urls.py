"""URL map. Every page needs login (LoginRequiredMiddleware); the agent API authenticates with
bearer tokens and is exempt from the session login and CSRF."""

from django.contrib import admin
from django.urls import include, path, re_path

from attempts import api_urls
from attempts.views import transparency
from attempts.views.auth import admin_login
from ledgerweb import ops

urlpatterns = [
    # The agent API's routes, first and not by include(): each agent call resolved at once.
    *api_urls.urlpatterns,
    # Before the admin's own URLs: its login answers 429 while locked (one login throttle).
    path("admin/login/", admin_login),
    path("admin/", admin.site.urls),
    path("healthz", ops.healthz, name="healthz"),
    path("livez", ops.livez, name="livez"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    # The transparency log, read-only (C2SP tlog-tiles); public unless a token is configured.
    path("log/checkpoint", transparency.checkpoint, name="log-checkpoint"),
    re_path(r"^log/tile/(?P<path>.+)$", transparency.tile, name="log-tile"),
    path("log/consistency/<int:old>/<int:new>", transparency.consistency, name="log-consistency"),
    path("", include("attempts.urls")),
]

# Django's own error pages answer JSON under /api/ (attempts.api), HTML elsewhere.
handler400 = "attempts.api.bad_request"
handler403 = "attempts.api.permission_denied"
handler404 = "attempts.api.not_found"
handler500 = "attempts.api.server_error"
