from django.contrib.auth import views as auth_views
from django.urls import path

from attempts.views import actions, auth, detail, exports, overview, preferences, queues

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("login/", auth.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("settings/", preferences.preferences, name="preferences"),
    path("queues/bulk/", queues.bulk_action, name="queue-bulk"),
    path("queues/<slug:slug>/", queues.queue_view, name="queue"),
    path("attempts/<str:attempt_id>/", detail.attempt_detail, name="attempt-detail"),
    path("attempts/<str:attempt_id>/take/", actions.take, name="attempt-take"),
    path("attempts/<str:attempt_id>/assign/", actions.assign, name="attempt-assign"),
    path("attempts/<str:attempt_id>/unassign/", actions.unassign, name="attempt-unassign"),
    path("attempts/<str:attempt_id>/note/", actions.note, name="attempt-note"),
    path("attempts/<str:attempt_id>/confirm/", actions.mark_confirmed, name="attempt-confirm"),
    path("attempts/<str:attempt_id>/fail/", actions.mark_failed, name="attempt-fail"),
    path("attempts/<str:attempt_id>/acknowledge/", actions.acknowledge, name="attempt-acknowledge"),
    path("attempts/<str:attempt_id>/approve/", actions.approve, name="attempt-approve"),
    path("attempts/<str:attempt_id>/reject/", actions.reject, name="attempt-reject"),
    path("audit/", exports.audit_exports, name="audit_exports"),
    path("audit/export.<str:fmt>", exports.audit_download, name="audit_download"),
    path("audit/report/", exports.report_lookup, name="audit_report_lookup"),
    path("audit/report/<str:attempt_id>/", exports.attempt_report, name="audit_report"),
]
