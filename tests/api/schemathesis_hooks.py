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


# The documented traceparent pattern (docs/openapi.json), which the server applies exactly.
_TRACEPARENT = re.compile(
    r"^(?!ff-)(?![0-9a-f]{2}-0{32}-)(?![0-9a-f]{2}-[0-9a-f]{32}-0{16}-)"
    r"(00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}|(?!00-)[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}"
    r"-[0-9a-f]{2}(-.*)?)$"
)


@schemathesis.hook
def before_call(context, case, kwargs):
    """Schemathesis's coverage phase can put a header value made to break the header's
    ``pattern`` ("0" for traceparent) into a case it checks as positive, then expects the
    request accepted. In a case generated as positive, such a value is replaced by a valid one;
    a case generated as negative keeps it (and must be refused, as it is)."""
    meta = getattr(case, "meta", None)
    value = (case.headers or {}).get("traceparent")
    if meta is None or value is None or str(meta.generation.mode) != "positive":
        return
    if not _TRACEPARENT.match(str(value).strip()):
        case.headers = {**case.headers, "traceparent": VALID_TRACEPARENT}


VALID_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
