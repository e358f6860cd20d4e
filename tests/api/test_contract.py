"""Contract tests for the agent API, protocol section 9: every call, every status, and every
class of bad input answered with a clear JSON 4xx that stores nothing."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from attempts import api as api_module
from attempts import states
from attempts.canonical import normalize_args
from attempts.locking import write_transaction
from attempts.models import AgentToken, Attempt, AttemptEvent, Grant, State
from attempts.states import Actor
from tests.api.conftest import Api, Tokens, intent_body, ledger_snapshot

ATTEMPT_FIELDS = {
    "attempt_id",
    "tenant",
    "task_id",
    "tool_name",
    "idempotency_key",
    "args_hash",
    "state",
    "provider_request_id",
    "result_ref",
    "policy_version",
    "credential_scope",
    "parent_attempt_id",
    "owner",
    "created_at",
    "updated_at",
    "args",
}


def assert_error(answer, status: int, code: str) -> None:
    assert answer.status == status, answer.body
    assert answer.headers["Content-Type"] == "application/json"
    assert set(answer.body["error"]) == {"code", "message"}
    assert answer.body["error"]["code"] == code, answer.body
    assert answer.body["error"]["message"]


def dispatched(api: Api, key: str = "k:dispatched") -> str:
    attempt_id = api.intent(key).body["attempt"]["attempt_id"]
    assert api.post(f"attempts/{attempt_id}/dispatch").body["dispatch"] is True
    return attempt_id


# ------------------------------------------------------------------------------ POST /attempts


def test_record_intent_201_then_200_for_the_same_key_and_args(api: Api) -> None:
    first = api.intent()
    assert first.status == 201
    attempt = first.body["attempt"]
    assert ATTEMPT_FIELDS <= set(attempt)
    assert attempt["state"] == "INTENT_RECORDED"
    assert attempt["args_hash"] == normalize_args(intent_body()["args"]).args_hash
    assert attempt["policy_version"] == "v1"
    assert attempt["credential_scope"] == ["open_ticket:read", "open_ticket:write"]
    assert attempt["provider_request_id"] is None
    assert first.body["created"] is True
    assert first.headers["Location"] == f"/api/v1/attempts/{attempt['attempt_id']}"

    # Same logical arguments in another key order and number spelling: the same attempt.
    again = api.intent(args={"priority": 2.0, "title": "Printer on fire"})
    assert again.status == 200
    assert again.body["created"] is False
    assert again.body["attempt"]["attempt_id"] == attempt["attempt_id"]
    assert Attempt.objects.count() == 1
    event = AttemptEvent.objects.get()
    assert (event.actor_kind, event.actor) == ("agent", "agent-acme")


def test_same_key_is_returned_whatever_the_state(api: Api) -> None:
    attempt_id = dispatched(api, "k:any-state")
    again = api.intent("k:any-state")
    assert (again.status, again.body["attempt"]["state"]) == (200, "DISPATCHED")
    assert again.body["attempt"]["attempt_id"] == attempt_id


@pytest.mark.parametrize(
    "change",
    [{"args": {"title": "Other"}}, {"tool_name": "charge_card"}],
    ids=["different-args", "different-tool"],
)
def test_key_reuse_with_different_intent_is_409_and_overwrites_nothing(api: Api, change) -> None:
    original = api.intent("k:reuse").body["attempt"]
    before = ledger_snapshot()
    answer = api.intent("k:reuse", **change)
    assert_error(answer, 409, "idempotency_conflict")
    assert answer.body["attempt_id"] == original["attempt_id"]
    assert ledger_snapshot() == before
    assert Attempt.objects.get().args == intent_body()["args"]


def test_key_taken_in_another_tenant_is_409_without_revealing_the_attempt(
    api: Api, tokens: Tokens
) -> None:
    api.intent("k:shared")
    before = ledger_snapshot()
    answer = api.intent("k:shared", tenant="globex", token=tokens.globex)
    assert_error(answer, 409, "idempotency_conflict")
    assert "attempt_id" not in answer.body
    assert ledger_snapshot() == before


BAD_JSON = [
    b"{",
    b'{"tenant": "acme",}',
    b'{"a": 1, "a": 2}',
    b'{"tenant": "acme", "args": {"x": 1, "y": 2, "x": 1}}',
    b'{"args": {"x": NaN}}',
    b'{"args": {"x": Infinity}}',
    b"\xff\xfe{}",
    "\ufeff{}".encode(),
    b"",
    b"   ",
    b"[" * 100000,
]


@pytest.mark.parametrize("raw", BAD_JSON, ids=range(len(BAD_JSON)))
def test_malformed_json_is_400_and_stores_nothing(api: Api, raw: bytes) -> None:
    before = ledger_snapshot()
    assert_error(api.post("attempts", raw=raw), 400, "malformed_json")
    assert ledger_snapshot() == before


@pytest.mark.parametrize(
    "text", ['{"a": [1, {"b": null}]}', '\ufeff{"a": 1}', *(raw.decode() for raw in BAD_JSON[:6])]
)
def test_a_body_is_decoded_as_json_loads_decodes_it(text: str) -> None:
    # The API's decoder is built once (api._decode_body); the answers and refusals, with their
    # messages, are json.loads' with the same hooks.
    def outcome(decode):
        try:
            return ("value", decode(text))
        except ValueError as exc:
            return ("refused", type(exc), str(exc))

    def reference(body: str):
        return json.loads(
            body,
            object_pairs_hook=api_module._no_duplicate_keys,
            parse_constant=api_module._refuse_constant,
        )

    assert outcome(api_module._decode_body) == outcome(reference)


WRONG_TYPES = [
    ("body-is-a-list", [intent_body()]),
    ("body-is-a-string", "hello"),
    ("tenant-int", intent_body(tenant=7)),
    ("task-id-bool", intent_body(task_id=True)),
    ("tool-name-null", intent_body(tool_name=None)),
    ("key-list", intent_body(idempotency_key=["k"])),
    ("key-empty", intent_body(idempotency_key="  ")),
    ("key-too-long", intent_body(idempotency_key="k" * 256)),
    ("args-list", intent_body(args=[1, 2])),
    ("args-string", intent_body(args='{"a": 1}')),
    ("args-null", intent_body(args=None)),
    ("args-huge-int", intent_body(args={"n": 2**60})),
    ("policy-version-int", intent_body(policy_version=1)),
    ("scope-string", intent_body(credential_scope="open_ticket:write")),
    ("scope-int-items", intent_body(credential_scope=[1])),
    ("scope-empty-item", intent_body(credential_scope=[""])),
    ("unknown-field", {**intent_body(), "idempotencyKey": "x"}),
    ("missing-args", {k: v for k, v in intent_body().items() if k != "args"}),
    ("missing-tenant", {k: v for k, v in intent_body().items() if k != "tenant"}),
]


@pytest.mark.parametrize(("name", "body"), WRONG_TYPES, ids=[n for n, _ in WRONG_TYPES])
def test_wrong_types_are_422_and_store_nothing(api: Api, name: str, body) -> None:
    before = ledger_snapshot()
    answer = api.post("attempts", body)
    assert answer.status == 422, answer.body
    assert answer.body["error"]["code"] in {"invalid_field", "args_not_object", "invalid_args"}
    assert ledger_snapshot() == before


def test_unknown_tool_is_403_unknown_tool(api: Api) -> None:
    before = ledger_snapshot()
    assert_error(api.intent(tool_name="launch_rocket"), 403, "unknown_tool")
    assert ledger_snapshot() == before


def test_tenant_not_allowed_to_the_token_is_403(api: Api) -> None:
    before = ledger_snapshot()
    assert_error(api.intent(tenant="globex"), 403, "tenant_not_granted")
    assert_error(api.intent(tenant="no-such-tenant"), 403, "tenant_not_granted")
    assert ledger_snapshot() == before


def test_scope_not_granted_is_403(api: Api) -> None:
    before = ledger_snapshot()
    answer = api.intent(credential_scope=["open_ticket:write", "open_ticket:admin"])
    assert_error(answer, 403, "scope_not_granted")
    assert_error(api.intent(policy_version="v0"), 403, "policy_version_mismatch")
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(active=False)
    assert_error(api.intent(), 403, "tool_not_granted")
    assert ledger_snapshot() == before


def test_narrower_scope_is_recorded(api: Api) -> None:
    answer = api.intent(credential_scope=["open_ticket:write"], policy_version="v1")
    assert answer.status == 201
    assert answer.body["attempt"]["credential_scope"] == ["open_ticket:write"]


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=2048)
def test_oversized_body_is_413_and_stores_nothing(api: Api) -> None:
    before = ledger_snapshot()
    body = intent_body(args={"blob": "x" * 5000})
    assert_error(api.post("attempts", body), 413, "too_large")
    assert ledger_snapshot() == before


def test_args_over_the_canonical_limit_are_413(api: Api, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "MAX_ARGS_BYTES": 100}
    before = ledger_snapshot()
    assert_error(api.intent(args={"blob": "x" * 200}), 413, "too_large")
    assert ledger_snapshot() == before


# ------------------------------------------------------------------------------ authentication


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer lwt_not-a-real-token", "Token x"],
)
def test_missing_or_bad_token_is_401_with_www_authenticate(api: Api, header) -> None:
    before = ledger_snapshot()
    answer = api.call(
        "POST",
        "attempts",
        intent_body(),
        token=None,
        headers={"Authorization": header} if header is not None else None,
    )
    assert_error(answer, 401, "unauthorized")
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert ledger_snapshot() == before


def test_revoked_token_is_401_for_every_call(api: Api, tokens: Tokens) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    assert tokens.acme_token.revoke() is True
    assert tokens.acme_token.revoke() is False
    before = ledger_snapshot()
    for method, path, body in [
        ("POST", "attempts", intent_body("k:after-revoke")),
        ("GET", "attempts?idempotency_key=invoice:acme:1:send", None),
        ("GET", f"attempts/{attempt_id}", None),
        ("POST", f"attempts/{attempt_id}/dispatch", None),
        ("POST", f"attempts/{attempt_id}/unknown", {"reason": "x"}),
    ]:
        answer = api.call(method, path, body)
        assert_error(answer, 401, "unauthorized")
        assert 'error="invalid_token"' in answer.headers["WWW-Authenticate"]
    assert ledger_snapshot() == before


def test_tokens_are_stored_hashed(tokens: Tokens) -> None:
    stored = AgentToken.objects.get(name="agent-acme")
    assert tokens.acme not in (stored.token_hash, stored.prefix)
    assert stored.token_hash == AgentToken.hash_token(tokens.acme)
    assert tokens.acme.startswith(stored.prefix)


def test_last_used_is_written_at_most_once_a_minute(api: Api) -> None:
    api.get("attempts")
    first = AgentToken.objects.get(name="agent-acme").last_used_at
    assert first is not None
    api.get("attempts")
    assert AgentToken.objects.get(name="agent-acme").last_used_at == first
    AgentToken.objects.filter(name="agent-acme").update(
        last_used_at=timezone.now() - dt.timedelta(minutes=2)
    )
    api.get("attempts")
    assert AgentToken.objects.get(name="agent-acme").last_used_at > first


# ------------------------------------------------------------------------------ dispatch


def test_dispatch_claims_once_then_409_not_dispatchable(api: Api) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    claimed = api.post(f"attempts/{attempt_id}/dispatch")
    assert claimed.status == 200
    assert claimed.body["dispatch"] is True
    assert claimed.body["attempt"]["state"] == "DISPATCHED"
    before = ledger_snapshot()
    again = api.post(f"attempts/{attempt_id}/dispatch")
    assert_error_with_attempt(again, "not_dispatchable", "DISPATCHED")
    assert ledger_snapshot() == before


def assert_error_with_attempt(answer, code: str, state: str) -> None:
    assert answer.status == 409
    assert answer.body["error"]["code"] == code
    assert answer.body["attempt"]["state"] == state


def test_unknown_attempt_is_not_dispatchable(api: Api) -> None:
    attempt_id = dispatched(api)
    assert api.post(f"attempts/{attempt_id}/unknown", {"reason": "timeout"}).status == 200
    assert_error_with_attempt(
        api.post(f"attempts/{attempt_id}/dispatch"), "not_dispatchable", "UNKNOWN"
    )


def test_failed_retryable_may_be_dispatched_again(api: Api) -> None:
    attempt_id = dispatched(api)
    api.post(f"attempts/{attempt_id}/fail", {"reason": "429", "retryable": True})
    again = api.post(f"attempts/{attempt_id}/dispatch", {})
    assert (again.status, again.body["dispatch"]) == (200, True)
    assert again.body["attempt"]["send_count"] == 2


def test_dispatch_refused_when_authority_changed(api: Api) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(policy_version="v2")
    before = ledger_snapshot()
    answer = api.post(f"attempts/{attempt_id}/dispatch")
    assert_error(answer, 409, "authority_changed")
    assert ledger_snapshot() == before


def test_dispatch_rejects_a_body_with_fields(api: Api) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    assert_error(api.post(f"attempts/{attempt_id}/dispatch", {"force": True}), 422, "invalid_field")
    assert Attempt.objects.get().state == State.INTENT_RECORDED


# ------------------------------------------------------------------------------ provider-request


def test_provider_request_200_same_again_200_different_409(api: Api) -> None:
    attempt_id = dispatched(api)
    path = f"attempts/{attempt_id}/provider-request"
    first = api.post(path, {"provider_request_id": "prv_1"})
    assert (first.status, first.body["attempt"]["provider_request_id"]) == (200, "prv_1")
    events = AttemptEvent.objects.count()
    assert api.post(path, {"provider_request_id": "prv_1"}).status == 200
    assert AttemptEvent.objects.count() == events
    assert_error(api.post(path, {"provider_request_id": "prv_2"}), 409, "provider_request_conflict")
    assert Attempt.objects.get().provider_request_id == "prv_1"


def test_provider_request_before_dispatch_is_409(api: Api) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    answer = api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "p"})
    assert_error(answer, 409, "not_dispatched")


def _never_sent(api: Api) -> str:
    attempt_id = api.intent("k:never-sent").body["attempt"]["attempt_id"]
    answer = api.post(f"attempts/{attempt_id}/fail", {"reason": "abandoned", "retryable": False})
    assert answer.body["attempt"]["state"] == "FAILED"
    return attempt_id


def _confirmed(api: Api) -> str:
    attempt_id = dispatched(api, "k:confirmed")
    api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "receipt-1"})
    return attempt_id


def _in_review(api: Api) -> str:
    attempt_id = dispatched(api, "k:review")
    api.post(f"attempts/{attempt_id}/unknown", {"reason": "timed out"})
    attempt = Attempt.objects.get(attempt_id=attempt_id)
    with write_transaction():
        states.move(attempt, State.MANUAL_REVIEW, actor=Actor.system(), reason="test")
    return attempt_id


@pytest.mark.parametrize("make", [_never_sent, _confirmed, _in_review])
def test_provider_request_on_an_attempt_not_in_flight_is_409(api: Api, make) -> None:
    """Never sent (INTENT_RECORDED -> FAILED), settled, or with a person: 409, nothing stored."""
    attempt_id = make(api)
    before = ledger_snapshot()
    answer = api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "p"})
    assert_error(answer, 409, "not_in_flight")
    assert ledger_snapshot() == before
    assert Attempt.objects.get(attempt_id=attempt_id).provider_request_id == ""


def test_provider_request_repeated_after_confirmation_is_200(api: Api) -> None:
    attempt_id = dispatched(api, "k:confirmed-with-id")
    api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "prv_9"})
    api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "receipt-9"})
    again = api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "prv_9"})
    assert again.status == 200


# ------------------------------------------------------------------------------ confirm


def test_confirm_200_and_repeat_200_then_different_409(api: Api) -> None:
    attempt_id = dispatched(api)
    path = f"attempts/{attempt_id}/confirm"
    done = api.post(path, {"result_ref": "ticket-77", "provider_request_id": "prv_9"})
    assert done.status == 200
    assert done.body["attempt"]["state"] == "OUTCOME_CONFIRMED"
    assert done.body["attempt"]["result_ref"] == "ticket-77"
    assert done.body["attempt"]["provider_request_id"] == "prv_9"
    events = AttemptEvent.objects.count()
    assert api.post(path, {"result_ref": "ticket-77"}).status == 200
    assert AttemptEvent.objects.count() == events
    assert_error(api.post(path, {"result_ref": "ticket-78"}), 409, "state_conflict")


def test_confirm_from_an_incompatible_state_is_409(api: Api) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    before = ledger_snapshot()
    assert_error(
        api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "r"}), 409, "state_conflict"
    )
    assert ledger_snapshot() == before


def test_confirm_unknown_with_a_late_receipt(api: Api) -> None:
    attempt_id = dispatched(api)
    api.post(f"attempts/{attempt_id}/unknown", {"reason": "timeout"})
    late = api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "late-receipt"})
    assert (late.status, late.body["attempt"]["state"]) == (200, "OUTCOME_CONFIRMED")


# ------------------------------------------------------------------------------ fail and unknown


@pytest.mark.parametrize(("retryable", "state"), [(True, "FAILED_RETRYABLE"), (False, "FAILED")])
def test_fail_200(api: Api, retryable: bool, state: str) -> None:
    attempt_id = dispatched(api)
    answer = api.post(
        f"attempts/{attempt_id}/fail", {"reason": "card declined", "retryable": retryable}
    )
    assert (answer.status, answer.body["attempt"]["state"]) == (200, state)


def test_fail_from_an_incompatible_state_is_409(api: Api) -> None:
    attempt_id = dispatched(api)
    api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "ok"})
    before = ledger_snapshot()
    answer = api.post(f"attempts/{attempt_id}/fail", {"reason": "no", "retryable": False})
    assert_error(answer, 409, "state_conflict")
    assert ledger_snapshot() == before


@pytest.mark.parametrize(
    "body",
    [{"reason": "x"}, {"reason": "x", "retryable": "yes"}, {"reason": 1, "retryable": True}],
)
def test_fail_needs_reason_and_boolean_retryable(api: Api, body) -> None:
    attempt_id = dispatched(api)
    before = ledger_snapshot()
    assert_error(api.post(f"attempts/{attempt_id}/fail", body), 422, "invalid_field")
    assert ledger_snapshot() == before


def test_unknown_200_and_repeat_is_a_no_op(api: Api) -> None:
    attempt_id = dispatched(api)
    answer = api.post(f"attempts/{attempt_id}/unknown", {"reason": "read timeout"})
    assert (answer.status, answer.body["attempt"]["state"]) == (200, "UNKNOWN")
    assert answer.body["attempt"]["owner"] == "triage"  # attention work always lands on a person
    events = AttemptEvent.objects.count()
    assert api.post(f"attempts/{attempt_id}/unknown", {"reason": "again"}).status == 200
    assert AttemptEvent.objects.count() == events


def test_unknown_before_dispatch_is_409(api: Api) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    assert_error(api.post(f"attempts/{attempt_id}/unknown", {"reason": "x"}), 409, "state_conflict")


# ------------------------------------------------------------------------------ reads


def test_get_attempt_200_and_404_for_another_tenant_or_nonexistent(
    api: Api, tokens: Tokens
) -> None:
    attempt_id = api.intent().body["attempt"]["attempt_id"]
    got = api.get(f"attempts/{attempt_id}")
    assert (got.status, got.body["attempt"]["attempt_id"]) == (200, attempt_id)
    assert_error(api.get(f"attempts/{attempt_id}", token=tokens.globex), 404, "not_found")
    assert_error(api.get("attempts/att_NOPE"), 404, "not_found")


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("dispatch", None),
        ("provider-request", {"provider_request_id": "p"}),
        ("confirm", {"result_ref": "r"}),
        ("fail", {"reason": "r", "retryable": False}),
        ("unknown", {"reason": "r"}),
    ],
)
def test_actions_on_another_tenants_attempt_are_404_and_change_nothing(
    api: Api, tokens: Tokens, action: str, body
) -> None:
    attempt_id = dispatched(api)
    before = ledger_snapshot()
    answer = api.post(f"attempts/{attempt_id}/{action}", body, token=tokens.globex)
    assert_error(answer, 404, "not_found")
    assert ledger_snapshot() == before


def test_list_by_idempotency_key_is_scoped_to_the_token(api: Api, tokens: Tokens) -> None:
    attempt_id = api.intent("k:list").body["attempt"]["attempt_id"]
    mine = api.get("attempts?idempotency_key=k:list")
    assert mine.status == 200
    assert [a["attempt_id"] for a in mine.body["attempts"]] == [attempt_id]
    theirs = api.get("attempts?idempotency_key=k:list", token=tokens.globex)
    assert (theirs.status, theirs.body["attempts"]) == (200, [])
    assert api.get("attempts?idempotency_key=missing").body["attempts"] == []


@pytest.mark.parametrize(
    ("query", "index"),
    [
        ("task_id=t-plan", "attempt_task_idx"),
        ("trace_id=4bf92f3577b34da6a3ce929d0e0e4736", "attempt_trace_idx"),
        ("idempotency_key=k:plan", "sqlite_autoindex_attempts_attempt_2"),
    ],
)
def test_a_list_by_identifier_reads_that_identifiers_index(
    api: Api, tokens: Tokens, query: str, index: str
) -> None:
    """Without statistics SQLite chose the tenant's range of a queue index and read every
    attempt of the tenant (a trace's partial index could not be chosen at all): the tenants are
    checked on the identifier's few rows instead, and another tenant still sees none of them."""
    if connection.vendor != "sqlite":
        pytest.skip("query plans are checked on SQLite")
    traceparent = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    body = intent_body("k:plan", task_id="t-plan")
    made = api.call("POST", "attempts", body, headers=traceparent).body["attempt"]["attempt_id"]
    with CaptureQueriesContext(connection) as queries:
        mine = api.get(f"attempts?{query}")
    # Read now: the next request's start empties the log the captured queries are read from.
    (sql,) = [q["sql"] for q in queries.captured_queries if 'FROM "attempts_attempt" ' in q["sql"]]
    assert [a["attempt_id"] for a in mine.body["attempts"]] == [made]
    assert api.get(f"attempts?{query}", token=tokens.globex).body["attempts"] == []
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        plan = " | ".join(str(row[-1]) for row in cursor.fetchall())
    assert f"USING INDEX {index} " in plan or f"USING COVERING INDEX {index} " in plan, plan


def test_list_paginates_with_a_cursor(api: Api, tokens: Tokens) -> None:
    ids = [
        api.intent(f"k:page:{n}", task_id="t-page").body["attempt"]["attempt_id"] for n in range(5)
    ]
    api.post("attempts", intent_body("k:globex", tenant="globex"), token=tokens.globex)
    seen: list[str] = []
    after = ""
    while True:
        page = api.get(f"attempts?task_id=t-page&limit=2{'&after=' + after if after else ''}")
        assert page.status == 200
        seen += [a["attempt_id"] for a in page.body["attempts"]]
        after = page.body["next_after"]
        if after is None:
            break
    assert seen == sorted(ids)
    assert len(api.get("attempts?state=INTENT_RECORDED").body["attempts"]) == 5


@pytest.mark.parametrize("query", ["limit=0", "limit=201", "limit=x", "state=BOGUS", "colour=red"])
def test_list_refuses_bad_parameters(api: Api, query: str) -> None:
    assert_error(api.get(f"attempts?{query}"), 422, "invalid_field")


# ------------------------------------------------------------------------------ HTTP surface


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "attempts", "GET, POST"),
        ("PUT", "attempts/att_X", "GET"),
        ("GET", "attempts/att_X/dispatch", "POST"),
        ("PATCH", "attempts/att_X/confirm", "POST"),
    ],
)
def test_wrong_method_is_405_json_with_allow(api: Api, method: str, path: str, allow: str) -> None:
    answer = api.call(method, path)
    assert_error(answer, 405, "method_not_allowed")
    assert answer.headers["Allow"] == allow


def test_unknown_api_path_is_404_json(api: Api) -> None:
    assert_error(api.get("nothing-here"), 404, "not_found")
    assert_error(api.post("attempts/"), 404, "not_found")


def test_api_needs_no_session_or_csrf(client, tokens: Tokens) -> None:
    client.handler.enforce_csrf_checks = True
    answer = Api(client, tokens.acme).intent()
    assert answer.status == 201


def test_changes_are_logged_as_structured_lines_with_the_attempt_id(api: Api, caplog) -> None:
    import json
    import logging

    from ledgerweb.logs import JsonFormatter

    caplog.set_level(logging.INFO, logger="ledgerweb.api")
    attempt_id = dispatched(api, "k:logged")
    events = [r for r in caplog.records if getattr(r, "attempt_id", None) == attempt_id]
    assert [r.event for r in events] == ["attempt.intent_recorded", "attempt.dispatch_claimed"]
    assert f"attempt_id={attempt_id}" in events[0].getMessage()
    line = json.loads(JsonFormatter().format(events[1]))
    assert (line["attempt_id"], line["agent"], line["state"]) == (
        attempt_id,
        "agent-acme",
        "DISPATCHED",
    )


def test_a_server_failure_under_api_is_a_json_500(client, tokens: Tokens, monkeypatch) -> None:
    from attempts import ledger

    def explode(**kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(ledger, "record_intent", explode)
    client.raise_request_exception = False
    answer = Api(client, tokens.acme).intent()
    assert answer.status == 500
    assert answer.body["error"]["code"] == "server_error"
    assert "disk on fire" not in answer.body["error"]["message"]


@pytest.mark.parametrize(
    "args", [{"key\x00": 1}, {"a": "text\x00"}, {"a": [{"b": "\x00"}]}], ids=repr
)
def test_nul_in_args_is_422_on_every_database(api: Api, args) -> None:
    """PostgreSQL's jsonb cannot hold U+0000 (it answered 500); SQLite refuses it alike."""
    before = ledger_snapshot()
    assert_error(api.intent("k:nul", args=args), 422, "invalid_args")
    assert ledger_snapshot() == before
