"""URL map of the agent API, every route under ``/api/v1/`` (``PREFIX``). ``ledgerweb.urls``
lists these at its top level, first: an ``include()`` would resolve every call through one more
resolver (and one more ``ResolverMatch``), the patterns before it tried first."""

from django.urls import path

from attempts import api

PREFIX = "api/v1/"

urlpatterns = [
    path(PREFIX + "attempts", api.attempts_collection, name="api-attempts"),
    path(PREFIX + "attempts/<str:attempt_id>", api.attempt_detail, name="api-attempt"),
    path(PREFIX + "attempts/<str:attempt_id>/receipt", api.attempt_receipt, name="api-receipt"),
    path(PREFIX + "attempts/<str:attempt_id>/dispatch", api.attempt_dispatch, name="api-dispatch"),
    path(
        PREFIX + "attempts/<str:attempt_id>/provider-request",
        api.attempt_provider_request,
        name="api-provider-request",
    ),
    path(PREFIX + "attempts/<str:attempt_id>/confirm", api.attempt_confirm, name="api-confirm"),
    path(PREFIX + "attempts/<str:attempt_id>/fail", api.attempt_fail, name="api-fail"),
    path(PREFIX + "attempts/<str:attempt_id>/unknown", api.attempt_unknown, name="api-unknown"),
    path(PREFIX + "openapi.json", api.openapi_document, name="api-openapi"),
]
