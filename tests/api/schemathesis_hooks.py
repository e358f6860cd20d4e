"""Hooks for the schemathesis run of tests/api/test_schemathesis.py (SCHEMATHESIS_HOOKS).

Generated intents name random tenants and tools, which the server rightly refuses with 403 or
422 before anything else happens. Half the time, a *valid* tenant or tool name is replaced by one
the test world has, so the fuzzer also reaches recording, dispatching and confirming. Only values
that are already valid are replaced: a case meant to be invalid stays invalid."""

from __future__ import annotations

import os
import random
import re

import schemathesis

TENANTS = os.environ.get("LEDGERWEB_FUZZ_TENANTS", "acme").split(",")
TOOLS = os.environ.get("LEDGERWEB_FUZZ_TOOLS", "update_crm").split(",")
_TEXT = re.compile(
    "^[^\u0000-\u001f\u007f-\u009f]*"
    "[^\u0000-\u0020\u007f-\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
    "[^\u0000-\u001f\u007f-\u009f]*$"
)


def _valid(value: object, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and bool(_TEXT.match(value))


@schemathesis.hook
def map_body(context, body):
    operation = context.operation
    if operation is None or operation.path != "/attempts" or not isinstance(body, dict):
        return body
    body = dict(body)
    if _valid(body.get("tenant"), 64) and random.random() < 0.5:
        body["tenant"] = random.choice(TENANTS)
    if _valid(body.get("tool_name"), 100) and random.random() < 0.5:
        body["tool_name"] = random.choice(TOOLS)
    # Optional authority fields the world does not grant: dropped (when valid) half the time.
    policy = body.get("policy_version")
    scope = body.get("credential_scope")
    optional_valid = (policy is None or _valid(policy, 64)) and (
        scope is None or (isinstance(scope, list) and all(_valid(item, 500) for item in scope))
    )
    if optional_valid and random.random() < 0.5:
        body.pop("policy_version", None)
        body.pop("credential_scope", None)
    return body
