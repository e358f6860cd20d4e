from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.urls import path

from attempts.views import (
    actions,
    approvals,
    auth,
    config_changes,
    detail,
    erasure,
    exports,
    overview,
    preferences,
    queues,
    slack,
)

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("login/", auth.LoginView.as_view(), name="login"),
    path("logout/", auth.LogoutView.as_view(), name="logout"),
    path("settings/", preferences.preferences, name="preferences"),
    # The one-time link `manage.py password_link` prints: people set their own password.
    path(
        "set-password/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(post_reset_login=False),
        name="password_reset_confirm",
    ),
    path(
        "set-password/done/",
        auth_views.PasswordResetCompleteView.as_view(),
        name="password_reset_complete",
    ),
    path("approvals/", approvals.inbox, name="approvals"),
    path("slack/interactions", slack.interactions, name="slack-interactions"),
    path("approvals/bulk/", approvals.bulk, name="approval-bulk"),
    path("approvals/<str:attempt_id>/edit/", approvals.edit, name="approval-edit"),
    path("approvals/<str:attempt_id>/approve/", approvals.approve, name="approval-approve"),
    path("approvals/<str:attempt_id>/reject/", approvals.reject, name="approval-reject"),
    path("queues/bulk/", queues.bulk_action, name="queue-bulk"),
    path("queues/<slug:slug>/", queues.queue_view, name="queue"),
    path("attempts/<str:attempt_id>/", detail.attempt_detail, name="attempt-detail"),
    path("attempts/<str:attempt_id>/take/", actions.take, name="attempt-take"),
    path("attempts/<str:attempt_id>/assign/", actions.assign, name="attempt-assign"),
    path("attempts/<str:attempt_id>/unassign/", actions.unassign, name="attempt-unassign"),
    path("attempts/<str:attempt_id>/note/", actions.note, name="attempt-note"),
    *(
        path(
            f"attempts/<str:attempt_id>/erasure/{step}/",
            erasure.erasure_step,
            {"step": step},
            name=f"attempt-erasure-{step}",
        )
        for step in erasure.STEPS
    ),
    path("attempts/<str:attempt_id>/confirm/", actions.mark_confirmed, name="attempt-confirm"),
    path("attempts/<str:attempt_id>/fail/", actions.mark_failed, name="attempt-fail"),
    path("attempts/<str:attempt_id>/acknowledge/", actions.acknowledge, name="attempt-acknowledge"),
    path("attempts/<str:attempt_id>/approve/", actions.approve, name="attempt-approve"),
    path("attempts/<str:attempt_id>/reject/", actions.reject, name="attempt-reject"),
    path("audit/", exports.audit_exports, name="audit_exports"),
    path("audit/export.<str:fmt>", exports.audit_download, name="audit_download"),
    path("audit/config/", config_changes.config_history, name="config_history"),
    path("audit/log/", exports.log_page, name="audit_log"),
    path("audit/verify_export.py", exports.verifier_script, name="audit_verifier_script"),
    path("audit/report/", exports.report_lookup, name="audit_report_lookup"),
    path("audit/report/<str:attempt_id>/", exports.attempt_report, name="audit_report"),
]

if settings.SSO["ENABLED"]:
    from mozilla_django_oidc import views as oidc_views

    urlpatterns += [
        path(
            "oidc/authenticate/",
            auth.sso_start,
            name="oidc_authentication_init",
        ),
        path(
            "oidc/callback/",
            login_not_required(oidc_views.OIDCAuthenticationCallbackView.as_view()),
            name="oidc_authentication_callback",
        ),
    ]
