"""ledgerweb/csp.py: every response carries the policy Django's middleware would give it; one
that used no nonce gets it from a policy built once per configuration."""

from __future__ import annotations

import re

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.middleware.csp import ContentSecurityPolicyMiddleware as DjangosMiddleware
from django.test import override_settings
from django.utils.csp import CSP

from ledgerweb.csp import ContentSecurityPolicyMiddleware


def _headers(middleware_class, *, use_nonce: bool = False, response=None) -> dict:
    request = HttpRequest()
    middleware = middleware_class(lambda request: response or HttpResponse())
    middleware.process_request(request)
    if use_nonce:
        str(request._csp_nonce)
    return dict(middleware.process_response(request, response or HttpResponse()).headers)


def _policies(response_headers: dict) -> dict:
    return {k: v for k, v in response_headers.items() if "Content-Security-Policy" in k}


def test_a_response_without_a_nonce_gets_djangos_policy_again_and_again():
    middleware = ContentSecurityPolicyMiddleware(lambda request: HttpResponse())
    expected = _policies(_headers(DjangosMiddleware))
    assert expected["Content-Security-Policy"]
    for _ in range(3):
        request = HttpRequest()
        middleware.process_request(request)
        got = _policies(dict(middleware.process_response(request, HttpResponse()).headers))
        assert got == expected
    assert "nonce" not in expected["Content-Security-Policy"]


def test_a_response_that_used_its_nonce_gets_its_own_policy():
    first = _policies(_headers(ContentSecurityPolicyMiddleware, use_nonce=True))
    second = _policies(_headers(ContentSecurityPolicyMiddleware, use_nonce=True))
    nonces = [
        re.search(r"'nonce-([^']+)'", p["Content-Security-Policy"])[1] for p in (first, second)
    ]
    assert nonces[0] != nonces[1]


def test_another_configuration_gets_its_own_policy():
    ours = ContentSecurityPolicyMiddleware(lambda request: HttpResponse())

    def policy() -> dict:
        request = HttpRequest()
        ours.process_request(request)
        return _policies(dict(ours.process_response(request, HttpResponse()).headers))

    before = policy()
    narrower = {**settings.SECURE_CSP, "img-src": [CSP.SELF]}
    with override_settings(SECURE_CSP=narrower, SECURE_CSP_REPORT_ONLY={"default-src": [CSP.NONE]}):
        assert policy() == _policies(_headers(DjangosMiddleware))
        assert policy()["Content-Security-Policy-Report-Only"] == "default-src 'none'"
        settings.SECURE_CSP["img-src"].append("data:")  # changed in place: built again
        assert policy() == _policies(_headers(DjangosMiddleware))
        assert "img-src 'self' data:" in policy()["Content-Security-Policy"]
    assert policy() == before


def test_a_views_own_header_stays():
    response = HttpResponse()
    response.headers["Content-Security-Policy"] = "default-src 'none'"
    got = _headers(ContentSecurityPolicyMiddleware, response=response)
    assert got["Content-Security-Policy"] == "default-src 'none'"
