"""Django's Content-Security-Policy middleware, with the policy of a response that used no nonce
built once per configuration.

Django builds the header anew for every response (``build_policy``: each directive's values
joined, the nonce placeholder taken out when no nonce was used). A response whose nonce was
never used (every agent API answer, a page without inline scripts) gets the same header from
the same configuration each time, so that header is kept; a page that used its nonce gets its
own policy, built as Django builds it.
"""

from __future__ import annotations

import copy

from django.conf import settings
from django.middleware import csp
from django.utils.csp import CSP, build_policy

# Configurations kept at most (override_settings in tests makes new ones).
_KEPT = 8


class ContentSecurityPolicyMiddleware(csp.ContentSecurityPolicyMiddleware):
    """Django's, with the policy of a response without a nonce built once per configuration
    (compared by value, so a configuration changed in place is built again)."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        self._policies: list[tuple[dict, str]] = []

    def process_response(self, request, response):
        nonce = csp.get_nonce(request)
        sentinel = object()
        if (csp_config := getattr(response, "_csp_config", sentinel)) is sentinel:
            csp_config = settings.SECURE_CSP
        if (csp_ro_config := getattr(response, "_csp_ro_config", sentinel)) is sentinel:
            csp_ro_config = settings.SECURE_CSP_REPORT_ONLY
        for header, config in (
            (CSP.HEADER_ENFORCE, csp_config),
            (CSP.HEADER_REPORT_ONLY, csp_ro_config),
        ):
            # As Django's: a header the view set stays; an empty configuration adds none.
            if config and header not in response:
                response.headers[str(header)] = (
                    build_policy(config, nonce) if nonce else self._policy(config)
                )
        return response

    def _policy(self, config: dict) -> str:
        """``build_policy(config)`` without a nonce, built once for each configuration."""
        for kept, policy in self._policies:
            if kept == config:
                return policy
        policy = build_policy(config, None)
        self._policies = [(copy.deepcopy(config), policy), *self._policies[: _KEPT - 1]]
        return policy
