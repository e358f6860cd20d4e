"""The published OpenAPI description (docs/openapi.json, served at /api/v1/openapi.json) matches
the implementation: every documented path, method and status is produced by a real request, and
every answer validates against the documented schema; every API route is documented."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import override_settings
from django.urls import URLPattern, get_resolver

from attempts import api_urls
from attempts.models import ApprovalPolicy, Grant
from tests.api.conftest import Answer, Api, Tokens, intent_body

DOC = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())
METHODS = {"get", "post", "put", "patch", "delete"}


def resolve_ref(ref: str) -> dict[str, Any]:
    node: Any = DOC
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def validate(value: Any, schema: dict[str, Any], where: str = "$") -> None:
    """A small JSON Schema checker for the keywords docs/openapi.json uses."""
    if "$ref" in schema:
        return validate(value, resolve_ref(schema["$ref"]), where)
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        checks = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "null": lambda v: v is None,
        }
        assert any(checks[k](value) for k in kinds), f"{where}: {value!r} is not {kinds}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in enum"
    if "const" in schema:
        assert value == schema["const"], f"{where}: {value!r} != {schema['const']!r}"
    if "pattern" in schema and isinstance(value, str):
        assert re.search(schema["pattern"], value), f"{where}: {value!r} !~ {schema['pattern']}"
    if isinstance(value, dict):
        for name in schema.get("required", []):
            assert name in value, f"{where}: missing {name}"
        properties = schema.get("properties", {})
        for name, item in value.items():
            if name in properties:
                validate(item, properties[name], f"{where}.{name}")
            else:
                assert schema.get("additionalProperties", True) is not False, f"{where}.{name}"
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            validate(item, schema["items"], f"{where}[{index}]")
    return None


def documented() -> set[tuple[str, str, str]]:
    found = set()
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                found |= {(path, method, status) for status in operation["responses"]}
    return found


def response_schema(path: str, method: str, status: str) -> dict[str, Any]:
    response = DOC["paths"][path][method]["responses"][status]
    if "$ref" in response:
        response = resolve_ref(response["$ref"])
    return response["content"]["application/json"]["schema"]


# ------------------------------------------------------------------------------ scenarios


def new_id(api: Api, key: str) -> str:
    return api.intent(key).body["attempt"]["attempt_id"]


def dispatched_id(api: Api, key: str) -> str:
    attempt_id = new_id(api, key)
    api.post(f"attempts/{attempt_id}/dispatch")
    return attempt_id


def _record_409(api: Api) -> Answer:
    api.intent("k:409")
    return api.intent("k:409", args={"other": 1})


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024)
def _too_large(api: Api, path: str) -> Answer:
    return api.post(path, {"blob": "x" * 4000})


def _action(action: str, body: Any, *, dispatched: bool = True) -> Callable[[Api], Answer]:
    def run(api: Api) -> Answer:
        attempt_id = (dispatched_id if dispatched else new_id)(api, f"k:{action}")
        return api.post(f"attempts/{attempt_id}/{action}", body)

    return run


def _action_errors(action: str, ok_body: Any) -> dict[str, Callable[[Api], Answer]]:
    path = "/attempts/{attempt_id}/" + action
    return {
        (path, "post", "400"): lambda api: api.post(
            f"attempts/{dispatched_id(api, 'k:400')}/{action}", raw=b"{oops"
        ),
        (path, "post", "404"): lambda api: api.post(f"attempts/att_NONE/{action}", ok_body),
        (path, "post", "413"): lambda api: _too_large(
            api, f"attempts/{dispatched_id(api, 'k:413')}/{action}"
        ),
        (path, "post", "422"): lambda api: api.post(
            f"attempts/{dispatched_id(api, 'k:422')}/{action}", {"bogus": 1}
        ),
        (path, "post", "401"): lambda api: api.post(
            f"attempts/att_X/{action}", ok_body, token="lwt_nope"
        ),
        (path, "post", "405"): lambda api: api.get(f"attempts/att_X/{action}"),
    }


def _confirm_twice_differently(api: Api) -> Answer:
    attempt_id = dispatched_id(api, "k:confirm409")
    api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "a"})
    return api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "b"})


def _provider_request_conflict(api: Api) -> Answer:
    attempt_id = dispatched_id(api, "k:prq")
    api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "a"})
    return api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "b"})


def _held(api: Api) -> Answer:
    ApprovalPolicy.objects.create(name="hold-tickets", tool_id="open_ticket")
    return api.intent("k:202")


def _scope_refused(api: Api) -> Answer:
    return api.intent("k:403", credential_scope=["root"])


def _receipt(api: Api) -> Answer:
    """A sealed attempt's receipt, with a signing key configured for the sealer."""
    import tempfile

    from django.conf import settings

    from attempts import chain, log

    attempt_id = new_id(api, "k:receipt")
    with tempfile.TemporaryDirectory() as folder:
        key = Path(folder) / "log.key"
        log.write_key_file(key, "example.test/ledger")
        with override_settings(TLOG={**settings.TLOG, "KEY_FILE": str(key)}):
            while chain.seal() is not None:
                pass
            return api.get(f"attempts/{attempt_id}/receipt")


def _database_away(method: str, path: str, body: Any = None) -> Callable[[Api], Answer]:
    """The call while every statement fails as on a lost connection (the real PostgreSQL
    restart is tests/test_database_away.py)."""

    def lost(*args: Any) -> None:
        raise OperationalError("terminating connection due to administrator command")

    def run(api: Api) -> Answer:
        api.client.raise_request_exception = False
        try:
            with connection.execute_wrapper(lost):
                return api.call(method, path, body)
        finally:
            api.client.raise_request_exception = True

    return run


SCENARIOS: dict[tuple[str, str, str], Callable[[Api], Answer]] = {
    ("/attempts/{attempt_id}/receipt", "get", "200"): _receipt,
    ("/attempts/{attempt_id}/receipt", "get", "404"): lambda api: api.get(
        "attempts/att_NONE/receipt"
    ),
    ("/attempts/{attempt_id}/receipt", "get", "409"): lambda api: api.get(
        f"attempts/{new_id(api, 'k:unsealed')}/receipt"
    ),
    ("/attempts/{attempt_id}/receipt", "get", "401"): lambda api: api.get(
        "attempts/att_X/receipt", token=None
    ),
    ("/attempts/{attempt_id}/receipt", "get", "405"): lambda api: api.post(
        "attempts/att_X/receipt"
    ),
    ("/attempts", "post", "201"): lambda api: api.intent("k:201"),
    ("/attempts", "post", "202"): _held,
    ("/attempts", "post", "200"): lambda api: (api.intent("k:200"), api.intent("k:200"))[1],
    ("/attempts", "post", "400"): lambda api: api.post("attempts", raw=b"{"),
    ("/attempts", "post", "403"): _scope_refused,
    ("/attempts", "post", "409"): _record_409,
    ("/attempts", "post", "413"): lambda api: _too_large(api, "attempts"),
    ("/attempts", "post", "422"): lambda api: api.intent("k:422", task_id="line\nbreak"),
    ("/attempts", "post", "401"): lambda api: api.post("attempts", intent_body(), token=None),
    ("/attempts", "post", "405"): lambda api: api.call("DELETE", "attempts"),
    ("/attempts", "get", "200"): lambda api: (api.intent("k:list"), api.get("attempts"))[1],
    ("/attempts", "get", "422"): lambda api: api.get("attempts?limit=0"),
    ("/attempts", "get", "401"): lambda api: api.get("attempts", token="lwt_nope"),
    ("/attempts", "get", "405"): lambda api: api.call("PUT", "attempts"),
    ("/attempts/{attempt_id}", "get", "200"): lambda api: api.get(
        f"attempts/{new_id(api, 'k:get')}"
    ),
    ("/attempts/{attempt_id}", "get", "404"): lambda api: api.get("attempts/att_NONE"),
    ("/attempts/{attempt_id}", "get", "422"): lambda api: api.get(
        f"attempts/{new_id(api, 'k:wait')}?wait=600"
    ),
    ("/attempts/{attempt_id}", "get", "401"): lambda api: api.get("attempts/att_X", token=None),
    ("/attempts/{attempt_id}", "get", "405"): lambda api: api.post("attempts/att_X"),
    ("/attempts/{attempt_id}/dispatch", "post", "200"): _action("dispatch", None, dispatched=False),
    ("/attempts/{attempt_id}/dispatch", "post", "409"): _action("dispatch", None),
    **_action_errors("dispatch", None),
    ("/attempts/{attempt_id}/provider-request", "post", "200"): _action(
        "provider-request", {"provider_request_id": "prv_1"}
    ),
    ("/attempts/{attempt_id}/provider-request", "post", "409"): _provider_request_conflict,
    **_action_errors("provider-request", {"provider_request_id": "p"}),
    ("/attempts/{attempt_id}/confirm", "post", "200"): _action("confirm", {"result_ref": "r"}),
    ("/attempts/{attempt_id}/confirm", "post", "409"): _confirm_twice_differently,
    **_action_errors("confirm", {"result_ref": "r"}),
    ("/attempts/{attempt_id}/fail", "post", "200"): _action(
        "fail", {"reason": "declined", "retryable": False}
    ),
    ("/attempts/{attempt_id}/fail", "post", "409"): _action(
        "fail", {"reason": "x", "retryable": True}, dispatched=False
    ),
    **_action_errors("fail", {"reason": "r", "retryable": False}),
    ("/attempts/{attempt_id}/unknown", "post", "200"): _action("unknown", {"reason": "timeout"}),
    ("/attempts/{attempt_id}/unknown", "post", "409"): _action(
        "unknown", {"reason": "timeout"}, dispatched=False
    ),
    **_action_errors("unknown", {"reason": "r"}),
    ("/attempts", "post", "503"): _database_away("POST", "attempts", intent_body("k:503")),
    ("/attempts", "get", "503"): _database_away("GET", "attempts"),
    ("/attempts/{attempt_id}", "get", "503"): _database_away("GET", "attempts/att_X"),
    ("/attempts/{attempt_id}/receipt", "get", "503"): _database_away(
        "GET", "attempts/att_X/receipt"
    ),
    **{
        ("/attempts/{attempt_id}/" + action, "post", "503"): _database_away(
            "POST", f"attempts/att_X/{action}", body
        )
        for action, body in (
            ("dispatch", None),
            ("provider-request", {"provider_request_id": "p"}),
            ("confirm", {"result_ref": "r"}),
            ("fail", {"reason": "r", "retryable": False}),
            ("unknown", {"reason": "r"}),
        )
    },
}


def test_every_documented_status_has_a_scenario_and_vice_versa() -> None:
    assert documented() == set(SCENARIOS)


@pytest.mark.parametrize("case", sorted(SCENARIOS), ids=lambda c: f"{c[1].upper()} {c[0]} {c[2]}")
def test_documented_status_is_what_the_server_answers(api: Api, case) -> None:
    path, method, status = case
    answer = SCENARIOS[case](api)
    assert answer.status == int(status), answer.body
    validate(answer.body, response_schema(path, method, status))
    if status == "401":
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    if status == "405":
        assert answer.headers["Allow"]
    if status == "503":
        assert answer.body["error"]["code"] == "ledger_unavailable"
        assert answer.headers["Retry-After"].isdigit()


def test_every_api_route_is_documented() -> None:
    routes = set()
    for pattern in get_resolver().url_patterns:
        if not str(pattern.pattern).startswith("api/"):
            continue
        assert isinstance(pattern, URLPattern)
        assert str(pattern.pattern).startswith(api_urls.PREFIX)
        route = str(pattern.pattern).removeprefix(api_urls.PREFIX)
        routes.add("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))
    assert routes - {"/openapi.json"} == set(DOC["paths"])


def test_the_document_is_served(client, tokens: Tokens) -> None:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.json() == DOC
    assert DOC["openapi"].startswith("3.1")
    assert Grant.objects.exists()  # the world is there; the document needs no token
