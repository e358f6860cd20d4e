"""URL map. Every page needs login (LoginRequiredMiddleware); the agent API authenticates with
bearer tokens and is exempt from the session login and CSRF."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("attempts.urls")),
]
