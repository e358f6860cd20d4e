"""URL map of the agent API, mounted under ``/api/v1/`` by ``ledgerweb.urls``."""

from django.urls import path

from attempts import api

urlpatterns = [
    path("attempts", api.attempts_collection, name="api-attempts"),
    path("attempts/<str:attempt_id>", api.attempt_detail, name="api-attempt"),
    path("attempts/<str:attempt_id>/receipt", api.attempt_receipt, name="api-receipt"),
    path("attempts/<str:attempt_id>/dispatch", api.attempt_dispatch, name="api-dispatch"),
    path(
        "attempts/<str:attempt_id>/provider-request",
        api.attempt_provider_request,
        name="api-provider-request",
    ),
    path("attempts/<str:attempt_id>/confirm", api.attempt_confirm, name="api-confirm"),
    path("attempts/<str:attempt_id>/fail", api.attempt_fail, name="api-fail"),
    path("attempts/<str:attempt_id>/unknown", api.attempt_unknown, name="api-unknown"),
    path("openapi.json", api.openapi_document, name="api-openapi"),
]
