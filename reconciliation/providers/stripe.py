"""Stripe payment intents, through the official ``stripe`` library (optional extra ``stripe``).

The tool's arguments are the payment: ``amount`` (a positive integer in the currency's minor
unit), ``currency`` (three letters), ``payment_method`` (an id), and optionally ``customer`` and
``description``. Configuration: ``LEDGERWEB_STRIPE_API_KEY``; the tool's ``dispatch_url`` is the
API base (empty: Stripe's own).

- **send** creates and confirms a payment intent with the attempt's idempotency key and the
  ledger's metadata (``ledger_attempt_id``, ``ledger_args_hash``, ``ledger_idempotency_key``).
  Stripe's own retries are off: whether to send again is the ledger's decision.
- **look up** reads the payment intents created since the intent (``created[gte]``, with
  slack) of the arguments' ``customer`` when there is one, at most ``max_pages`` pages, and
  keeps those whose metadata carries the attempt's idempotency key. It never trusts the idempotency key to have prevented a duplicate: every
  payment under the key is counted, and amount, currency and customer are compared with the
  recorded arguments. Whatever cannot be read as exactly one settled payment or none at all is
  an ambiguous answer, and the attempt stays UNKNOWN.

The lookup lists rather than searches: Stripe's Search API is eventually consistent, and a
"not found" that may only mean "not indexed yet" would be read as "never happened". See
docs/providers.md for the mapping onto the decision table.
"""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any, ClassVar
from urllib.parse import urlsplit

import stripe
from django.conf import settings

from attempts.canonical import canonical_bytes, hash_bytes
from reconciliation.faults import crash_point
from reconciliation.providers import base, transport
from reconciliation.providers.answers import evidence_of, id_problem

DEFAULT_API_BASE = "https://api.stripe.com"
METADATA_ATTEMPT = "ledger_attempt_id"
METADATA_ARGS_HASH = "ledger_args_hash"
METADATA_KEY = "ledger_idempotency_key"
# Stripe accepts idempotency keys and metadata values up to these lengths.
MAX_KEY_LENGTH = 255
MAX_METADATA_VALUE = 500

REQUIRED_ARGS = {"amount", "currency", "payment_method"}
OPTIONAL_ARGS = {"customer", "description"}

# A payment intent in these states moved (or holds) the money: the effect happened.
EFFECT_STATUSES = frozenset({"succeeded", "requires_capture"})
# In these its outcome is not settled yet: it may still happen.
PENDING_STATUSES = frozenset({"processing", "requires_action", "requires_confirmation"})
# In these no money moved: declined (waiting for another payment method) or canceled.
NO_EFFECT_STATUSES = frozenset({"requires_payment_method", "canceled"})

# Declines after which the same payment may succeed later (Stripe's decline codes).
RETRYABLE_DECLINES = frozenset(
    {
        "approve_with_id",
        "insufficient_funds",
        "issuer_not_available",
        "processing_error",
        "reenter_transaction",
        "try_again_later",
    }
)


class _NothingSent(Exception):
    """The connection could not be opened: no byte of the request left this machine."""


class _HttpClient(stripe.HTTPClient):
    """A plain ``http.client`` transport for the stripe library: one connection per request
    (so it is thread-safe), a timeout, and a way to tell "never sent" from "sent, answer lost"."""

    name = "ledgerweb"

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout

    def request(
        self,
        method: str,
        url: str,
        headers: Any,
        post_data: Any = None,
        *,
        _usage: Any = None,
    ) -> tuple[bytes, int, dict[str, str]]:
        body = post_data.encode() if isinstance(post_data, str) else post_data
        host = urlsplit(url).hostname
        sent = (lambda: crash_point("request_sent")) if method.lower() == "post" else None
        try:
            # One deadline for the whole exchange and a size limit (transport.exchange).
            answer = transport.exchange(
                method.upper(),
                url,
                body=body,
                headers=dict(headers or {}),
                deadline=self.timeout,
                after_response=sent,
            )
        except transport.NotSent as exc:
            raise stripe.APIConnectionError(
                f"could not connect to {host}: {exc}", should_retry=False
            ) from _NothingSent(str(exc))
        except (OSError, http.client.HTTPException, transport.AnswerTooLarge) as exc:
            what = "timeout" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}"
            raise stripe.APIConnectionError(
                f"{what} after the request to {host} was sent: {exc}", should_retry=False
            ) from exc
        return answer.body, answer.status, answer.headers

    def close(self) -> None:
        pass


def payment_problems(args: dict[str, Any]) -> list[str]:
    """What makes ``args`` unusable as a payment intent (empty when they are fine)."""
    problems = []
    missing = REQUIRED_ARGS - args.keys()
    if missing:
        problems.append(f"missing {', '.join(sorted(missing))}")
    unknown = args.keys() - REQUIRED_ARGS - OPTIONAL_ARGS
    if unknown:
        problems.append(f"unsupported {', '.join(sorted(unknown))}")
    amount = args.get("amount")
    if "amount" in args and (type(amount) is not int or amount <= 0):
        problems.append("amount must be a positive integer (minor units)")
    currency = args.get("currency")
    if "currency" in args and not (
        isinstance(currency, str) and len(currency) == 3 and currency.isalpha()
    ):
        problems.append("currency must be a three-letter code")
    for name in ("payment_method", "customer", "description"):
        if name in args and not (isinstance(args[name], str) and args[name]):
            problems.append(f"{name} must be a non-empty string")
    return problems


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def differences(call: base.Call, payment: Any) -> list[str]:
    """How the payment Stripe holds differs from what the ledger recorded (empty: it matches)."""
    args = call.args
    found = []
    if payment.get("amount") != args.get("amount"):
        found.append(f"amount: recorded {args.get('amount')}, Stripe {payment.get('amount')}")
    if _text(payment.get("currency")).lower() != _text(args.get("currency")).lower():
        found.append(f"currency: recorded {args.get('currency')}, Stripe {payment.get('currency')}")
    customer = payment.get("customer")
    if isinstance(customer, dict):  # expanded
        customer = customer.get("id")
    if _text(customer) != _text(args.get("customer")):
        found.append(f"customer: recorded {args.get('customer')}, Stripe {customer}")
    metadata = payment.get("metadata") or {}
    if metadata.get(METADATA_ARGS_HASH) != call.args_hash:
        found.append("ledger_args_hash in metadata differs")
    if metadata.get(METADATA_ATTEMPT) != call.attempt_id:
        found.append(f"ledger_attempt_id in metadata is {metadata.get(METADATA_ATTEMPT)!r}")
    return found


def _held_args_hash(call: base.Call, payment: Any) -> str:
    """The args hash of the recorded arguments with Stripe's values in the compared fields:
    equal to the attempt's hash exactly when nothing differs."""
    held = dict(call.args)
    held["amount"] = payment.get("amount")
    customer = payment.get("customer")
    held["customer"] = customer.get("id") if isinstance(customer, dict) else customer
    if held["customer"] is None and "customer" not in call.args:
        del held["customer"]
    currency = payment.get("currency")
    if isinstance(currency, str) and currency.lower() == _text(call.args.get("currency")).lower():
        currency = call.args.get("currency")  # Stripe answers in lower case
    held["currency"] = currency
    held[METADATA_ARGS_HASH] = (payment.get("metadata") or {}).get(METADATA_ARGS_HASH)
    held[METADATA_ATTEMPT] = (payment.get("metadata") or {}).get(METADATA_ATTEMPT)
    recorded = {**call.args, METADATA_ARGS_HASH: call.args_hash, METADATA_ATTEMPT: call.attempt_id}
    if held == recorded:
        return call.args_hash
    return hash_bytes(canonical_bytes(held))


class StripePaymentIntentAdapter(base.Adapter):
    """Payment intents at Stripe (or a Stripe-compatible test server at ``dispatch_url``)."""

    # Payment intents read per lookup page, and pages read at most before the answer is
    # "ambiguous" rather than "not found" (a lookup that has not seen everything proves nothing).
    page_size: ClassVar[int] = 100
    max_pages: ClassVar[int] = 10
    # The lookup reads payment intents created since the attempt's intent, less this much for
    # clocks that disagree (the payment is always made after the intent was recorded).
    created_slack_seconds: ClassVar[int] = 600

    def __init__(self, tool: Any) -> None:
        super().__init__(tool)
        self._client: stripe.StripeClient | None = None
        self._lock = threading.Lock()

    @property
    def provider_key(self) -> str:
        parts = urlsplit(self.api_base)
        return f"stripe:{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"

    @property
    def api_base(self) -> str:
        return (self.tool.dispatch_url or DEFAULT_API_BASE).rstrip("/")

    def client(self) -> stripe.StripeClient:
        with self._lock:
            if self._client is None:
                self._client = stripe.StripeClient(
                    settings.LEDGER["STRIPE_API_KEY"],
                    base_addresses={"api": self.api_base},
                    # The ledger decides about every resend; the library must never make one.
                    max_network_retries=0,
                    http_client=_HttpClient(self.timeout),
                )
            return self._client

    def check(self) -> list[str]:
        problems = []
        if not settings.LEDGER["STRIPE_API_KEY"]:
            problems.append("LEDGERWEB_STRIPE_API_KEY is not set")
        parts = urlsplit(self.api_base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"dispatch_url is not an http(s) URL: {self.tool.dispatch_url!r}")
        if self.timeout <= 0:
            problems.append("timeout_seconds must be positive")
        return problems

    # -----------------------------------------------------------------------------------------
    # send

    def send(self, call: base.Call) -> base.SendAnswer:
        problems = payment_problems(call.args)
        if len(call.idempotency_key) > MAX_KEY_LENGTH:
            problems.append(f"Stripe takes idempotency keys up to {MAX_KEY_LENGTH} characters")
        if len(call.idempotency_key) > MAX_METADATA_VALUE:
            problems.append("the idempotency key is too long for Stripe metadata")
        if problems:
            # Nothing left this machine; the same arguments will never be sendable.
            return base.SendAnswer(
                base.SendStatus.REFUSED, detail="not sent: " + "; ".join(problems)
            )
        params: dict[str, Any] = {
            "amount": call.args["amount"],
            "currency": call.args["currency"].lower(),
            "payment_method": call.args["payment_method"],
            "confirm": True,
            "metadata": {
                METADATA_ATTEMPT: call.attempt_id,
                METADATA_ARGS_HASH: call.args_hash,
                METADATA_KEY: call.idempotency_key,
            },
        }
        for name in OPTIONAL_ARGS & call.args.keys():
            params[name] = call.args[name]
        started = time.monotonic()
        try:
            payment = (
                self.client()
                .v1.payment_intents.create(
                    params=params, options={"idempotency_key": call.idempotency_key}
                )
                .to_dict()
            )
        except stripe.StripeError as exc:
            return _send_error(exc, int((time.monotonic() - started) * 1000))
        latency = int((time.monotonic() - started) * 1000)
        status = payment.get("status")
        if status in NO_EFFECT_STATUSES:
            error = payment.get("last_payment_error") or {}
            return base.SendAnswer(
                base.SendStatus.REFUSED,
                provider_request_id=payment["id"],
                retryable=_decline_retryable(error.get("decline_code"), error.get("code")),
                http_status=200,
                latency_ms=latency,
                detail=f"payment intent {status}: {error.get('code') or 'no payment'}",
            )
        return base.SendAnswer(
            base.SendStatus.ACCEPTED,
            provider_request_id=payment["id"],
            http_status=200,
            latency_ms=latency,
            detail="" if status in EFFECT_STATUSES else f"payment intent is {status}",
        )

    # -----------------------------------------------------------------------------------------
    # look up

    def lookup(self, call: base.Call) -> base.LookupAnswer:
        started = time.monotonic()
        try:
            matches, complete = self._payments_under(call)
        except stripe.StripeError as exc:
            return base.LookupAnswer(
                base.LookupStatus.UNAVAILABLE,
                http_status=exc.http_status,
                detail=_error_text(exc),
                latency_ms=int((time.monotonic() - started) * 1000),
                retry_after=_retry_after(exc),
            )
        bad = next((p for p in matches if id_problem("provider_request_id", p.get("id"))), None)
        if bad is not None:
            return base.LookupAnswer(
                base.LookupStatus.AMBIGUOUS,
                latency_ms=int((time.monotonic() - started) * 1000),
                detail="Stripe's answer failed validation",
                invalid=id_problem("provider_request_id", bad.get("id")),
                evidence=evidence_of(bad.get("id")),
            )
        latency = int((time.monotonic() - started) * 1000)
        effects = [p for p in matches if p.get("status") in EFFECT_STATUSES]
        pending = [p for p in matches if p.get("status") in PENDING_STATUSES]
        strange = [
            p
            for p in matches
            if p.get("status") not in EFFECT_STATUSES | PENDING_STATUSES | NO_EFFECT_STATUSES
        ]
        if strange:
            return base.LookupAnswer(
                base.LookupStatus.AMBIGUOUS,
                latency_ms=latency,
                detail=f"payment intent {strange[0]['id']} has unexpected status "
                f"{strange[0].get('status')!r}",
            )
        if effects:
            payment = effects[0]
            found = differences(call, payment)
            return base.LookupAnswer(
                base.LookupStatus.FOUND,
                provider_request_id=payment["id"],
                args_hash=_held_args_hash(call, payment),
                # Payments still pending under the same key are duplicates too.
                count=len(effects) + len(pending),
                result_ref=f"stripe:{payment['id']}",
                http_status=200,
                latency_ms=latency,
                detail="; ".join(found),
                extra={"payment_intents": [p["id"] for p in matches]},
            )
        if pending:
            return base.LookupAnswer(
                base.LookupStatus.AMBIGUOUS,
                latency_ms=latency,
                detail=f"payment intent {pending[0]['id']} is {pending[0].get('status')}: "
                "not settled yet",
            )
        if not complete:
            return base.LookupAnswer(
                base.LookupStatus.AMBIGUOUS,
                latency_ms=latency,
                detail=f"no payment in the newest {self.max_pages * self.page_size} payment "
                "intents since the intent; older ones were not read",
            )
        declined = [p["id"] for p in matches]
        return base.LookupAnswer(
            base.LookupStatus.NOT_FOUND,
            http_status=200,
            latency_ms=latency,
            detail=f"declined or canceled without payment: {', '.join(declined)}"
            if declined
            else "",
        )

    def list_filters(self, call: base.Call) -> dict[str, Any]:
        """What the lookup asks Stripe for: payment intents created since the intent (less
        the slack), of the payment's customer when the arguments name one."""
        params: dict[str, Any] = {"limit": self.page_size}
        if call.created_at is not None:
            since = int(call.created_at.timestamp()) - self.created_slack_seconds
            params["created"] = {"gte": max(0, since)}
        customer = call.args.get("customer")
        if isinstance(customer, str) and customer:
            params["customer"] = customer
        return params

    def _payments_under(self, call: base.Call) -> tuple[list[Any], bool]:
        """The payment intents whose metadata names this attempt's key, and whether every
        payment intent the filters select was read (at most ``max_pages`` requests)."""
        client = self.client()
        matches: list[Any] = []
        params = self.list_filters(call)
        for _ in range(self.max_pages):
            page = client.v1.payment_intents.list(params=params)
            for item in page.data:
                payment = item.to_dict()
                if (payment.get("metadata") or {}).get(METADATA_KEY) == call.idempotency_key:
                    matches.append(payment)
            if not page.has_more or not page.data:
                return matches, True
            params = {**params, "starting_after": page.data[-1].id}
        return matches, False


def _retry_after(exc: stripe.StripeError) -> float | None:
    """Stripe's ``Retry-After`` on a 429 (or 503), as seconds."""
    if exc.http_status not in (429, 503):
        return None
    headers = exc.headers or {}
    value = headers.get("retry-after") or headers.get("Retry-After")
    return transport.retry_after_seconds(value) if value else None


def _decline_retryable(decline_code: Any, code: Any) -> bool:
    return decline_code in RETRYABLE_DECLINES or code in RETRYABLE_DECLINES


def _error_text(exc: stripe.StripeError) -> str:
    message = exc.user_message or str(exc) or type(exc).__name__
    code = f" {exc.code}" if exc.code else ""
    return f"{type(exc).__name__}{code}: {message}"[:300]


def _send_error(exc: stripe.StripeError, latency: int) -> base.SendAnswer:
    """Stripe's refusals mapped onto the send answers (see docs/providers.md)."""
    status = exc.http_status
    detail = _error_text(exc)
    if isinstance(exc, stripe.APIConnectionError):
        if isinstance(exc.__cause__, _NothingSent):
            return base.SendAnswer(
                base.SendStatus.REFUSED,
                retryable=True,
                latency_ms=latency,
                detail=f"not sent: {detail}",
            )
        return base.SendAnswer(base.SendStatus.UNCERTAIN, latency_ms=latency, detail=detail)
    if isinstance(exc, stripe.CardError):
        error = exc.error
        intent = getattr(error, "payment_intent", None) if error is not None else None
        return base.SendAnswer(
            base.SendStatus.REFUSED,
            provider_request_id=_text(getattr(intent, "id", None)),
            retryable=_decline_retryable(
                getattr(error, "decline_code", None) if error is not None else None, exc.code
            ),
            http_status=status,
            latency_ms=latency,
            detail=detail,
        )
    if isinstance(exc, stripe.IdempotencyError) or status == 409:
        # The key is in use by a request that may be making this very payment.
        return base.SendAnswer(
            base.SendStatus.UNCERTAIN, http_status=status, latency_ms=latency, detail=detail
        )
    if isinstance(exc, stripe.RateLimitError | stripe.AuthenticationError | stripe.PermissionError):
        # Refused before anything was done; may work later (or once the key is fixed). A 429
        # holds this provider for its Retry-After (reconciliation/bulkhead.py).
        return base.SendAnswer(
            base.SendStatus.REFUSED,
            retryable=True,
            http_status=status,
            latency_ms=latency,
            detail=detail,
            retry_after=_retry_after(exc),
        )
    if isinstance(exc, stripe.InvalidRequestError) and status is not None and status < 500:
        return base.SendAnswer(
            base.SendStatus.REFUSED, http_status=status, latency_ms=latency, detail=detail
        )
    # 5xx or anything else: Stripe may have made the payment before failing.
    return base.SendAnswer(
        base.SendStatus.UNCERTAIN, http_status=status, latency_ms=latency, detail=detail
    )
