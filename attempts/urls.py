from django.contrib.auth import views as auth_views
from django.urls import path

from attempts.views import exports, overview

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("audit/", exports.audit_exports, name="audit_exports"),
    path("audit/export.<str:fmt>", exports.audit_download, name="audit_download"),
    path("audit/report/", exports.report_lookup, name="audit_report_lookup"),
    path("audit/report/<str:attempt_id>/", exports.attempt_report, name="audit_report"),
]
