"""Every setting ledgerweb reads from the environment, declared once: name, type, default and
meaning. ``ledgerweb/settings.py``, the gunicorn configuration and the commands read them through
``read()``; ``docs/settings.md`` (and the README's short table) are generated from this list by
``manage.py settings_reference``, and tests/test_settings_reference.py fails when they differ or
when code names a ``LEDGERWEB_`` variable that is not declared here.

Adding a setting is one ``declare(...)`` in the block of its feature, then ``read(name)`` where it
is used. The type decides how the value is parsed (the strict helpers of ``ledgerweb.env``).
"""

from __future__ import annotations

import difflib
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from ledgerweb.env import env_bool, env_int, env_int_map, env_list, env_names, env_str

KINDS = {
    "str": "text",
    "secret": "secret text",
    "bool": "boolean",
    "int": "whole number",
    "list": "comma-separated list",
    "names": "comma-separated `name=dotted.path` pairs",
    "intmap": "comma-separated `key=number` pairs",
    "choice": "one of a list",
}


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str
    default: object
    description: str
    group: str
    minimum: int | None = None  # int: smallest value; secret: shortest length check --deploy takes
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    shown_default: str | None = None  # the documented default when the code computes it
    essential: bool = False  # also in the README's short table
    from_file: bool = False  # <NAME>_FILE may name a file holding the value (secrets: always)

    def documented_default(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        value = self.default
        if self.kind == "bool":
            return "on" if value else "off"
        if self.kind in ("list",):
            return f"`{','.join(value)}`" if value else "(none)"
        if self.kind == "names":
            return ", ".join(f"`{k}`" for k in value) if value else "(none)"
        if self.kind == "intmap":
            return ", ".join(f"`{k}={v}`" for k, v in value.items()) if value else "(none)"
        if value in ("", None):
            return "(none)"
        return f"`{value}`"

    def documented_type(self) -> str:
        if self.kind == "int":
            bounds = []
            if self.minimum is not None:
                bounds.append(f">= {self.minimum}")
            if self.maximum is not None:
                bounds.append(f"<= {self.maximum}")
            return KINDS["int"] + (f" ({', '.join(bounds)})" if bounds else "")
        if self.kind == "choice":
            return "one of " + ", ".join(f"`{c}`" for c in self.choices)
        if self.kind == "secret" and self.minimum:
            kind = f"secret text (>= {self.minimum} characters in production)"
        else:
            kind = KINDS[self.kind]
        if self.from_file:
            kind += f"; or a file: `{self.name}_FILE`"
        return kind


REFERENCE: dict[str, Setting] = {}
GROUPS: list[str] = []


def declare(name: str, kind: str, default: object, description: str, **options) -> Setting:
    """Add one setting to the reference (at import time; a name declared twice is a bug)."""
    if name in REFERENCE:
        raise ImproperlyConfigured(f"setting {name} is declared twice")
    if kind not in KINDS:
        raise ImproperlyConfigured(f"setting {name}: unknown type {kind!r}")
    if kind == "secret":
        options.setdefault("from_file", True)
    setting = Setting(name, kind, default, description, **options)
    if setting.group not in GROUPS:
        GROUPS.append(setting.group)
    REFERENCE[name] = setting
    return setting


_DECLARED = object()


def read(name: str, default: object = _DECLARED):
    """The value of a declared setting, parsed by its type. ``default`` replaces the declared
    one where the code computes it (the declaration's ``shown_default`` documents it)."""
    try:
        setting = REFERENCE[name]
    except KeyError:
        raise ImproperlyConfigured(
            f"{name} is read but not declared in ledgerweb/settings_reference.py"
        ) from None
    value = setting.default if default is _DECLARED else default
    if setting.kind in ("str", "secret"):
        if setting.from_file:
            found = from_file(name)
            if found is not None:
                return found
        return env_str(name, value)
    if setting.kind == "bool":
        return env_bool(name, value)
    if setting.kind == "int":
        return env_int(
            name,
            value,
            minimum=setting.minimum if setting.minimum is not None else 0,
            maximum=setting.maximum,
        )
    if setting.kind == "list":
        return env_list(name, value)
    if setting.kind == "names":
        return env_names(name, value)
    if setting.kind == "intmap":
        found = env_int_map(name, minimum=setting.minimum if setting.minimum is not None else 1)
        return found if os.environ.get(name, "").strip() else value
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return value
    if raw not in setting.choices:
        raise ImproperlyConfigured(
            f"{name} must be one of {', '.join(setting.choices)}; got {os.environ[name]!r}"
        )
    return raw


def from_file(name: str) -> str | None:
    """The value in the file ``<NAME>_FILE`` names (as container secrets and systemd credentials
    provide them; a final newline is not part of it), or None when that variable is unset."""
    path = os.environ.get(f"{name}_FILE", "").strip()
    if not path:
        return None
    if os.environ.get(name, "").strip():
        raise ImproperlyConfigured(f"{name} and {name}_FILE are both set: set one of them")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ImproperlyConfigured(
            f"{name}_FILE names {path}, which cannot be read ({exc.strerror or exc})"
        ) from None
    except UnicodeDecodeError:
        raise ImproperlyConfigured(f"{name}_FILE names {path}, which is not UTF-8 text") from None
    value = text.rstrip("\r\n")
    if not value.strip():
        raise ImproperlyConfigured(f"{name}_FILE names {path}, which is empty")
    return value


# LEDGERWEB_ variables that are not the server's settings: what reads each. Anything else named
# LEDGERWEB_* in the server's environment is a typo or a setting that no longer exists
# (``unknown_variables``; ``check`` warns, attempts/checks.py). LEDGERWEB_TEST_* are the suite's.
NOT_SETTINGS = {
    "LEDGERWEB_URL": "the agents' clients: the server's address",
    "LEDGERWEB_TOKEN": "the agents' clients: their bearer token",
    "LEDGERWEB_RECEIPT_FILE": "the clients' receipt examples",
    "LEDGERWEB_PYTHON": "scripts/setup: the Python to make .venv with",
    "LEDGERWEB_VENV": "scripts/run: a virtualenv to use as is",
    "LEDGERWEB_CACHE_DIR": "the test suite: where built container images are kept",
    "LEDGERWEB_CRASH_GATE": "scripts/test: the crash gate runs after the suite",
    "LEDGERWEB_IMAGE": "compose.yaml: the image to run",
    "LEDGERWEB_BACKUP_DIR": "deploy/restore-drill.sh and the backup service",
    "LEDGERWEB_DRILL_DATABASE_URL": "deploy/restore-drill.sh",
    "LEDGERWEB_COMMAND": "deploy/restore-drill.sh",
    "LEDGERWEB_PG_BIN": "the test suite and benchmarks: PostgreSQL's programs",
    "LEDGERWEB_BENCH_DATA": "bench/: where benchmarks keep their ledgers",
    "LEDGERWEB_SCALE_TEST": "bench/scale.py's test",
    "LEDGERWEB_SCHEMATHESIS_SECONDS": "the API fuzz test",
    "LEDGERWEB_SCHEMATHESIS_SEED": "the API fuzz test",
}


def unknown_variables(environ=None) -> list[tuple[str, str | None]]:
    """Each ``LEDGERWEB_*`` variable set in ``environ`` that nothing reads, with the setting it
    most likely meant (or None)."""
    environ = os.environ if environ is None else environ
    settings_names = list(REFERENCE) + [f"{n}_FILE" for n, s in REFERENCE.items() if s.from_file]
    known = set(settings_names) | set(NOT_SETTINGS)
    found = []
    for name in sorted(environ):
        if not name.startswith("LEDGERWEB_") or name in known or name.startswith("LEDGERWEB_TEST_"):
            continue
        tails = {n.removeprefix("LEDGERWEB_"): n for n in settings_names}
        close = difflib.get_close_matches(name.removeprefix("LEDGERWEB_"), tails, n=1, cutoff=0.6)
        found.append((name, tails[close[0]] if close else None))
    return found


# Placeholder secrets as example files and guides write them: check --deploy refuses them.
_PLACEHOLDER_MARKS = (
    "change-me",
    "changeme",
    "change_me",
    "replace-me",
    "replaceme",
    "placeholder",
    "example",
    "your-",
    "xxxxxx",
    "...",
    "<",
)
MIN_DISTINCT_CHARACTERS = 12


def weak_secret(value: str, minimum_length: int | None) -> str | None:
    """Why ``value`` is not fit to guard a production deployment, or None. Length and variety
    are judged only for secrets the operator generates (``minimum_length``); a password another
    system chose (SMTP, the identity provider's client secret) is only checked for placeholders.
    """
    lowered = value.lower()
    if lowered.startswith("django-insecure-"):
        return "it is a development key (django-insecure-...), which Django marks as unsafe"
    for mark in _PLACEHOLDER_MARKS:
        if mark in lowered:
            return f"it looks like a placeholder (contains {mark!r})"
    if not minimum_length:
        return None
    if len(value) < minimum_length:
        return f"it is {len(value)} characters long; at least {minimum_length} are needed"
    if len(set(value)) < MIN_DISTINCT_CHARACTERS:
        return f"it has only {len(set(value))} distinct characters; a random value has many more"
    if looks_chosen(value):
        return (
            "it reads like words a person chose, not a generated key (its letters follow "
            "English's frequencies and its characters vary too little)"
        )
    return None


# How often each letter appears in English text, in percent (the usual table).
_ENGLISH = dict(
    zip(
        "etaoinshrdlcumwfgypbvkjxqz",
        (12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0)
        + (2.0, 1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07),
        strict=True,
    )
)
_ENGLISH_TOTAL = sum(_ENGLISH.values())


def looks_chosen(value: str) -> bool:
    """Whether ``value`` reads like a phrase rather than a generated key: its letters are
    likelier under English's letter frequencies than under chance (by more than 6 bits), and its
    characters carry less than 4.6 bits each (Shannon's entropy of their frequencies). Keys made
    by Django or by Python's ``secrets`` pass about 9,998 times in 10,000 (a key that does not
    is refused with a sentence: generate another); hexadecimal keys are judged by length only.
    """
    if set(value.lower()) <= set("0123456789abcdef"):
        return False
    letters = [c for c in value.lower() if c in _ENGLISH]
    english = sum(math.log2(_ENGLISH[c] / _ENGLISH_TOTAL * 26) for c in letters)
    return english > 6 and bits_per_character(value) < 4.6


def bits_per_character(value: str) -> float:
    """Shannon's entropy of the character frequencies of ``value``, in bits per character."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


# --- Core: where the data lives, the database, Django's basics -------------------------------
_CORE = "Core"
declare(
    "LEDGERWEB_DATA_DIR",
    "str",
    "",
    "Data folder: the SQLite ledger, the generated secret key, collected static files. "
    "Installed from the wheel: `var` under the working directory.",
    group=_CORE,
    shown_default="`./var` in a checkout",
    essential=True,
)
declare(
    "DATABASE_URL",
    "str",
    "",
    "`postgres://user@host:port/db` selects PostgreSQL (`synchronous_commit=on`); several hosts "
    "(`postgres://user@h1:5432,h2:5432/db`) are tried in turn for the one that takes writes "
    "(`target_session_attrs=read-write` unless the URL says otherwise): see docs/scaling.md, "
    "failover.",
    group=_CORE,
    shown_default="(unset: SQLite)",
    essential=True,
    from_file=True,
)
declare(
    "LEDGERWEB_SQLITE_PATH",
    "str",
    "",
    "The SQLite ledger file.",
    group=_CORE,
    shown_default="`$LEDGERWEB_DATA_DIR/ledger.sqlite3`",
)
declare(
    "LEDGERWEB_SECRET_KEY",
    "secret",
    "",
    "Django's secret key, the same on every web machine "
    "(`python3 -c 'import secrets; print(secrets.token_urlsafe(64))'`).",
    group=_CORE,
    minimum=50,
    shown_default="generated once into `$LEDGERWEB_DATA_DIR/secret_key` (mode 0600)",
    essential=True,
)
declare("LEDGERWEB_DEBUG", "bool", False, "Django's debug mode; never in production.", group=_CORE)
declare(
    "LEDGERWEB_ALLOWED_HOSTS",
    "list",
    ["127.0.0.1", "localhost", "[::1]"],
    "Host names the server answers to.",
    group=_CORE,
    essential=True,
)
declare(
    "LEDGERWEB_CSRF_TRUSTED_ORIGINS",
    "list",
    [],
    "Origins trusted for form posts behind a proxy: `https://` + the host name.",
    group=_CORE,
)
declare(
    "LEDGERWEB_STATIC_ROOT",
    "str",
    "",
    "Where `collectstatic` (and `ledgerweb serve`) put the static files whitenoise serves.",
    group=_CORE,
    shown_default="`$LEDGERWEB_DATA_DIR/staticfiles`",
)
declare(
    "LEDGERWEB_MAX_BODY_BYTES",
    "int",
    1024 * 1024,
    "Largest request body Django accepts.",
    group=_CORE,
    minimum=1024,
)

# --- Database tuning ------------------------------------------------------------------------
_DB = "Database"
declare(
    "LEDGERWEB_DB_CONN_MAX_AGE",
    "int",
    60,
    "Seconds a database connection is kept between requests.",
    group=_DB,
    minimum=0,
)
declare(
    "LEDGERWEB_LOCK_TIMEOUT_MS",
    "int",
    10000,
    "PostgreSQL: longest wait for a lock before the call fails cleanly (`ledger_busy`).",
    group=_DB,
    minimum=1,
)
declare(
    "LEDGERWEB_PG_CONNECT_TIMEOUT",
    "int",
    5,
    "PostgreSQL: seconds a connection attempt may take per host before the next host in "
    "`DATABASE_URL` is tried or the call fails with `ledger_unavailable` (libpq's "
    "`connect_timeout`; a `connect_timeout` in the URL wins).",
    group=_DB,
    minimum=2,
)
declare(
    "LEDGERWEB_PG_SYNCHRONOUS_COMMIT",
    "choice",
    "on",
    "PostgreSQL: the ledger's sessions' `synchronous_commit` (never `off` or `local`). With a "
    "synchronous standby named in `synchronous_standby_names`, a commit is acknowledged once the "
    "standby has it in memory (`remote_write`), on disk (`on`) or applied (`remote_apply`); "
    "docs/scaling.md, failover, says what each risks and costs.",
    group=_DB,
    choices=("on", "remote_write", "remote_apply"),
)
declare(
    "LEDGERWEB_PG_PREPARE_THRESHOLD",
    "int",
    5,
    "PostgreSQL: a statement a connection runs this many times is prepared on the server; "
    "0 turns preparing off (for a pooler that cannot keep prepared statements).",
    group=_DB,
    minimum=0,
)
declare(
    "LEDGERWEB_PG_STATEMENT_TIMEOUT_MS",
    "int",
    60000,
    "PostgreSQL: longest a single statement may run before the server cancels it "
    "(`statement_timeout`; the call fails cleanly with `statement_timeout`); 0 for no limit, "
    "e.g. for a migration the changelog says rewrites a large table.",
    group=_DB,
    minimum=0,
)
declare(
    "LEDGERWEB_PG_IDLE_IN_TRANSACTION_TIMEOUT_MS",
    "int",
    60000,
    "PostgreSQL: longest a connection may sit idle inside an open transaction before the server "
    "ends its session (`idle_in_transaction_session_timeout`), so a stuck process cannot hold "
    "locks for ever; 0 for no limit.",
    group=_DB,
    minimum=0,
)
declare(
    "LEDGERWEB_SQLITE_BUSY_TIMEOUT_MS",
    "int",
    30000,
    "SQLite: longest wait for the write lock before the call fails cleanly (`ledger_busy`).",
    group=_DB,
    minimum=0,
)

# --- HTTPS and security ----------------------------------------------------------------------
_SECURITY = "HTTPS and security"
declare(
    "LEDGERWEB_HTTPS",
    "bool",
    False,
    "Behind HTTPS: secure cookies, HSTS, redirect to HTTPS, the proxy's `X-Forwarded-Proto` "
    "trusted; fault injection refused.",
    group=_SECURITY,
    essential=True,
)
declare(
    "LEDGERWEB_SSL_REDIRECT",
    "bool",
    True,
    "With `LEDGERWEB_HTTPS=1`: redirect plain HTTP to HTTPS (turn off when the proxy does).",
    group=_SECURITY,
)
declare(
    "LEDGERWEB_HSTS_SECONDS",
    "int",
    0,
    "`Strict-Transport-Security` max-age.",
    group=_SECURITY,
    minimum=0,
    shown_default="31536000 with `LEDGERWEB_HTTPS=1`, else 0",
)
declare(
    "LEDGERWEB_LOGIN_MAX_FAILURES",
    "int",
    5,
    "Failed password logins (`/login/` and `/admin/login/` alike) for one username from one "
    "address before that pair is locked; four times as many from one address (any username), "
    "or for one username (any address), lock the address or the account.",
    group=_SECURITY,
    minimum=1,
)
declare(
    "LEDGERWEB_LOGIN_LOCK_SECONDS",
    "int",
    15 * 60,
    "How long a login lock lasts (also the window failures are counted in).",
    group=_SECURITY,
    minimum=1,
)
declare(
    "LEDGERWEB_TRUSTED_PROXIES",
    "list",
    [],
    "Addresses or networks (`10.0.0.0/8`, `::1`) of reverse proxies whose `X-Forwarded-For` "
    "names the client: the login throttle then counts the nearest address in it that is not a "
    "listed proxy. Unset, the peer's own address counts (behind a proxy, every client would "
    "share the proxy's).",
    group=_SECURITY,
)
declare(
    "LEDGERWEB_FAULTS_ALLOWED",
    "bool",
    False,
    "Allows fault injection (crash points, mutations) in a test process; refused with "
    "`LEDGERWEB_HTTPS=1`.",
    group=_SECURITY,
)

# --- The ledger and its worker ---------------------------------------------------------------
_LEDGER = "Ledger and reconciliation"
declare(
    "LEDGERWEB_DEFAULT_OWNER",
    "str",
    "",
    "Username that owns UNKNOWN and MANUAL_REVIEW work when no ownership rule matches.",
    group=_LEDGER,
    essential=True,
)
declare(
    "LEDGERWEB_MAX_ARGS_BYTES",
    "int",
    64 * 1024,
    "Largest normalized argument document, in bytes of canonical JSON.",
    group=_LEDGER,
    minimum=64,
)
declare(
    "LEDGERWEB_STALE_AFTER",
    "int",
    120,
    "Seconds before an INTENT_RECORDED or DISPATCHED attempt counts as stale and recovery "
    "looks at it; longer than any provider timeout. Read by the worker when it looks, so a "
    "change applies to attempts already recorded; set it the same on web and worker machines.",
    group=_LEDGER,
    minimum=1,
    essential=True,
)
declare(
    "LEDGERWEB_UNKNOWN_MAX_AGE",
    "int",
    24 * 3600,
    "Seconds an attempt may stay UNKNOWN (looked up with backoff) before a person must decide.",
    group=_LEDGER,
    minimum=1,
)
declare(
    "LEDGERWEB_BACKOFF_BASE",
    "int",
    5,
    "Seconds: lookups of an UNKNOWN attempt wait base * 2**n, capped, with full jitter.",
    group=_LEDGER,
    minimum=0,
)
declare(
    "LEDGERWEB_BACKOFF_CAP",
    "int",
    3600,
    "Longest wait between two lookups of an UNKNOWN attempt, in seconds.",
    group=_LEDGER,
    minimum=1,
)
declare(
    "LEDGERWEB_MAX_SENDS",
    "int",
    5,
    "Sends of one attempt (the first included) before it is FAILED.",
    group=_LEDGER,
    minimum=1,
)
declare(
    "LEDGERWEB_REDACT_FIELDS",
    "list",
    ["password", "secret", "token", "api_key", "card_number", "cvc", "authorization"],
    "Argument field names (case-insensitive substrings of the key, at any depth) the dashboard "
    "shows redacted.",
    group=_LEDGER,
)
declare(
    "LEDGERWEB_ADAPTERS",
    "names",
    {
        "http": "reconciliation.providers.http.GenericHttpAdapter",
        "mcp": "reconciliation.providers.mcp.McpAdapter",
        "stripe": "reconciliation.providers.stripe.StripePaymentIntentAdapter",
    },
    "Extra provider adapters tools may name, `name=package.module.Class,...`; a tool names "
    "one, never an import path. A listed name replaces the built-in one.",
    group=_LEDGER,
    shown_default="`http`, `mcp`, `stripe` built in",
)
declare(
    "LEDGERWEB_SEAL_EVERY",
    "int",
    5,
    "Seconds between the worker's seals of new history into audit checkpoints; verify_audit "
    "reports anything left unsealed longer.",
    group=_LEDGER,
    minimum=1,
)
declare(
    "LEDGERWEB_STRIPE_API_KEY",
    "secret",
    "",
    "Secret key (`sk_...`) of the Stripe adapter; `manage.py check` reports a Stripe tool "
    "unusable without it.",
    group=_LEDGER,
)
declare(
    "LEDGERWEB_MCP_GATEWAY_CONFIG",
    "str",
    "",
    "The MCP gateway's configuration file, where the `mcp` adapter finds each tool's upstream "
    "server and lookup tool (docs/integrations.md).",
    group=_LEDGER,
)

# --- Approval before dispatch (docs/approvals.md) ----------------------------------------------
_APPROVALS = "Approval before dispatch"
declare(
    "LEDGERWEB_APPROVAL_GRACE",
    "int",
    30,
    "Seconds an approved intent waits for its agent's claim before the reconcile worker sends "
    "it itself (tools whose adapter the worker knows).",
    group=_APPROVALS,
)
declare(
    "LEDGERWEB_APPROVAL_WAIT_MAX",
    "int",
    20,
    "The longest `GET /api/v1/attempts/{id}?wait=N` long-poll, in seconds (below gunicorn's "
    "worker timeout).",
    group=_APPROVALS,
    maximum=25,
)

# --- Provider bulkheads (reconciliation/bulkhead.py) ------------------------------------------
_PROVIDERS = "Provider bulkheads"
declare(
    "LEDGERWEB_PROVIDER_CONCURRENCY",
    "int",
    64,
    "The most calls in flight recovery allows one bulkhead (an operation, send or lookup, of one "
    "endpoint: a URL's `host:port/path`, an MCP upstream, a Stripe API base) in one worker, at "
    "most the worker's `--concurrency`: within it the limit adapts, from 4, growing while the "
    "provider answers soundly and quickly, shrinking on rising latency, 429, 5xx or timeouts.",
    group=_PROVIDERS,
    minimum=1,
)
declare(
    "LEDGERWEB_PROVIDER_CONCURRENCY_BY_KEY",
    "intmap",
    {},
    "Per-bulkhead ceilings that replace the one above, by endpoint, provider or tool: "
    "`host:port/path=1,host:port=2,tool-name=8,...`.",
    group=_PROVIDERS,
    minimum=1,
)
declare(
    "LEDGERWEB_PROVIDER_BREAKER_FAILURES",
    "int",
    3,
    "Failures in a row (deadline, refused connection, 5xx, 429) that open a provider's circuit "
    "breaker.",
    group=_PROVIDERS,
    minimum=1,
)
declare(
    "LEDGERWEB_PROVIDER_BREAKER_OPEN_SECONDS",
    "int",
    30,
    "How long an open breaker waits before its probe (doubling while probes fail, at most "
    "`LEDGERWEB_BACKOFF_CAP`).",
    group=_PROVIDERS,
    minimum=1,
)

# --- The transparency log (attempts/log.py, docs/audit-chain.md) ------------------------------
_TLOG = "Transparency log"
declare(
    "LEDGERWEB_TLOG_ORIGIN",
    "str",
    "localhost/ledgerweb",
    "The log's name, the first line of every signed checkpoint; set it once (witnesses and "
    "clients pin it).",
    group=_TLOG,
)
declare(
    "LEDGERWEB_TLOG_KEY_FILE",
    "str",
    "",
    "The Ed25519 signing key file (mode 0600, made by `manage.py ledger_log genkey`), outside "
    "the database.",
    group=_TLOG,
)
declare(
    "LEDGERWEB_TLOG_SIGN_COMMAND",
    "str",
    "",
    "Instead of a key file: a command that reads a checkpoint body on stdin and prints its "
    "signature (a KMS or HSM); needs `LEDGERWEB_TLOG_VERIFIER_KEY`.",
    group=_TLOG,
)
declare(
    "LEDGERWEB_TLOG_VERIFIER_KEY",
    "str",
    "",
    "The signing key's verifier key in signed-note form (`NAME+KEYID+BASE64`).",
    group=_TLOG,
)
declare(
    "LEDGERWEB_TLOG_SIGNER_STATE",
    "str",
    "",
    "Where the signer keeps the newest tree it signed (it signs only consistent extensions of it).",
    group=_TLOG,
    shown_default="`$LEDGERWEB_DATA_DIR/log_signer.state`",
)
declare(
    "LEDGERWEB_TLOG_OLD_VERIFIER_KEYS",
    "list",
    [],
    "Verifier keys of earlier signing keys, so the checkpoints they signed still verify after "
    "a rotation.",
    group=_TLOG,
)
declare(
    "LEDGERWEB_TLOG_WITNESSES",
    "list",
    [],
    "Witnesses, `VERIFIER_KEY SUBMISSION_URL` items: each new checkpoint is submitted to them "
    "(C2SP tlog-witness).",
    group=_TLOG,
)
declare(
    "LEDGERWEB_TLOG_WITNESS_QUORUM",
    "int",
    1,
    "How many witness cosignatures make a checkpoint witnessed.",
    group=_TLOG,
)
declare(
    "LEDGERWEB_TLOG_WITNESS_TIMEOUT",
    "int",
    10,
    "Whole-request deadline of one submission to a witness, seconds.",
    group=_TLOG,
    minimum=1,
)
declare(
    "LEDGERWEB_TLOG_READ_TOKEN",
    "secret",
    "",
    "`/log/` is public unless this bearer token is set; then it is required.",
    group=_TLOG,
)

# --- Notifications ---------------------------------------------------------------------------
_NOTIFY = "Notifications"
declare(
    "LEDGERWEB_EMAIL_HOST",
    "str",
    "",
    "SMTP server; email is sent only when it (or `LEDGERWEB_EMAIL_BACKEND`) is set.",
    group=_NOTIFY,
)
declare("LEDGERWEB_EMAIL_PORT", "int", 25, "SMTP port.", group=_NOTIFY, minimum=1, maximum=65535)
declare("LEDGERWEB_EMAIL_USER", "str", "", "SMTP user name.", group=_NOTIFY)
declare("LEDGERWEB_EMAIL_PASSWORD", "secret", "", "SMTP password.", group=_NOTIFY)
declare(
    "LEDGERWEB_EMAIL_USE_TLS", "bool", False, "SMTP with STARTTLS (not with SSL).", group=_NOTIFY
)
declare(
    "LEDGERWEB_EMAIL_USE_SSL", "bool", False, "SMTP over TLS (not with STARTTLS).", group=_NOTIFY
)
declare("LEDGERWEB_EMAIL_TIMEOUT", "int", 10, "SMTP timeout in seconds.", group=_NOTIFY, minimum=1)
declare("LEDGERWEB_EMAIL_FROM", "str", "ledgerweb@localhost", "Sender address.", group=_NOTIFY)
declare(
    "LEDGERWEB_EMAIL_BACKEND",
    "str",
    "",
    "Another Django email backend (dotted path); turns email on without a host.",
    group=_NOTIFY,
    shown_default="Django's SMTP backend",
)
declare(
    "LEDGERWEB_CHAT_WEBHOOK_URL",
    "str",
    "",
    'Slack-compatible incoming webhook (JSON `{"text": ...}`); chat is off without it.',
    group=_NOTIFY,
)
declare(
    "LEDGERWEB_CHAT_TIMEOUT",
    "int",
    10,
    "Chat webhook timeout in seconds.",
    group=_NOTIFY,
    minimum=1,
)
declare(
    "LEDGERWEB_SLACK_BOT_TOKEN",
    "secret",
    "",
    "Slack bot token (`xoxb-...`, scopes `chat:write`, `users:read`, `users:read.email`): held "
    "calls are posted to routes' `slack_channel` with Approve / Reject buttons.",
    group=_NOTIFY,
)
declare(
    "LEDGERWEB_SLACK_SIGNING_SECRET",
    "secret",
    "",
    "The Slack app's signing secret: clicks on the buttons are verified with it "
    "(`/slack/interactions`). Slack approvals are off unless it and the bot token are set.",
    group=_NOTIFY,
)
declare(
    "LEDGERWEB_SLACK_API_URL",
    "str",
    "https://slack.com/api/",
    "Slack's Web API address (a test server's, in tests).",
    group=_NOTIFY,
)
declare(
    "LEDGERWEB_SLACK_TIMEOUT",
    "int",
    5,
    "Deadline in seconds of each call to Slack's Web API.",
    group=_NOTIFY,
    minimum=1,
)
declare(
    "LEDGERWEB_BASE_URL",
    "str",
    "",
    "The dashboard's public address (e.g. `https://ledger.example.com`), for links in notices.",
    group=_NOTIFY,
)
declare(
    "LEDGERWEB_NOTIFY_LEASE_SECONDS",
    "int",
    60,
    "A claimed notice not recorded as sent by then is delivered again.",
    group=_NOTIFY,
    minimum=1,
)
declare(
    "LEDGERWEB_NOTIFY_MAX_TRIES",
    "int",
    8,
    "Failed deliveries (with backoff) before a notice is given up.",
    group=_NOTIFY,
    minimum=1,
)
declare(
    "LEDGERWEB_SLA_EVERY",
    "int",
    30,
    "Seconds between a worker's SLA (and digest) checks.",
    group=_NOTIFY,
    minimum=1,
)

# --- Operations: serving, logs, monitoring ---------------------------------------------------
_OPS = "Serving, logs and monitoring"
declare(
    "LEDGERWEB_BIND",
    "str",
    "127.0.0.1:8000",
    "Address gunicorn (`ledgerweb serve`) listens on.",
    group=_OPS,
    essential=True,
)
declare("LEDGERWEB_WORKERS", "int", 3, "gunicorn worker processes.", group=_OPS, minimum=1)
declare("LEDGERWEB_THREADS", "int", 4, "Threads per gunicorn worker.", group=_OPS, minimum=1)
declare(
    "LEDGERWEB_ACCESS_LOG",
    "str",
    "-",
    "gunicorn's access log: a file, `-` for standard output; empty turns it off.",
    group=_OPS,
)
declare(
    "LEDGERWEB_CONTROL_SOCKET",
    "str",
    "",
    "gunicorn's control socket (`gunicornc -s PATH`), mode 0600; `off` turns it off.",
    group=_OPS,
    shown_default="`$LEDGERWEB_DATA_DIR/gunicorn.ctl`",
)
declare(
    "LEDGERWEB_LOG_FORMAT",
    "choice",
    "text",
    "`json`: one JSON object per log line, ledger fields (attempt ids) at the top level, in "
    "every process: the web's and gunicorn's error and access lines (method, path, status, "
    "duration_ms...), the worker's pass lines.",
    group=_OPS,
    choices=("text", "json"),
    essential=True,
)
declare(
    "LEDGERWEB_LOG_LEVEL",
    "choice",
    "INFO",
    "Level of the root logger.",
    group=_OPS,
    choices=("debug", "info", "warning", "error", "critical"),
    shown_default="`INFO`",
)
declare(
    "LEDGERWEB_METRICS_TOKEN",
    "secret",
    "",
    "Bearer token `/metrics` requires (Prometheus sends `Authorization: Bearer <token>`).",
    group=_OPS,
    minimum=32,
    essential=True,
)
declare(
    "LEDGERWEB_METRICS_ALLOW_LOOPBACK",
    "bool",
    False,
    "Opens `/metrics` to loopback clients without the token (`scripts/run` does for a local "
    "run); behind a proxy on the same host everyone looks like loopback.",
    group=_OPS,
)
declare(
    "LEDGERWEB_HEARTBEAT_MAX_AGE",
    "int",
    60,
    "Seconds without a worker heartbeat before `/healthz` reports the worker missing.",
    group=_OPS,
    minimum=1,
)
declare(
    "LEDGERWEB_HEALTHZ_REQUIRE_WORKER",
    "bool",
    True,
    "`/healthz` fails when no reconcile worker has reported within the heartbeat age.",
    group=_OPS,
)

# --- Tracing (OpenTelemetry) ------------------------------------------------------------------
_TRACING = "Tracing (OpenTelemetry)"
declare(
    "LEDGERWEB_TRACE_URL",
    "str",
    "",
    "Your tracing UI's address for one trace, with `{trace_id}` where the id goes (e.g. "
    "`https://tempo.example/trace/{trace_id}`): the attempt page links the agent's trace.",
    group=_TRACING,
)
declare(
    "LEDGERWEB_OTLP_ENDPOINT",
    "str",
    "",
    "OTLP/HTTP collector base address (e.g. `http://127.0.0.1:4318`): spans of intent, claim, "
    "confirm, lookup and settle are exported to `<it>/v1/traces`, in the agent's trace when it "
    "sent a `traceparent`. Unset: nothing of OpenTelemetry is imported or started. Needs the "
    "`tracing` extra.",
    group=_TRACING,
)
declare(
    "LEDGERWEB_OTLP_HEADERS",
    "secret",
    "",
    "Headers sent with each export, `name=value,...` (a collector's API key).",
    group=_TRACING,
)
declare(
    "LEDGERWEB_OTEL_SERVICE_NAME",
    "str",
    "ledgerweb",
    "The `service.name` of the exported spans.",
    group=_TRACING,
)

# --- Single sign-on (OpenID Connect) ---------------------------------------------------------
_SSO = "Single sign-on (OpenID Connect)"
declare(
    "LEDGERWEB_OIDC_CLIENT_ID",
    "str",
    "",
    "The client id registered at the identity provider; setting it turns single sign-on on.",
    group=_SSO,
    shown_default="(unset: passwords only)",
)
declare("LEDGERWEB_OIDC_CLIENT_SECRET", "secret", "", "The client's secret.", group=_SSO)
declare(
    "LEDGERWEB_OIDC_DISCOVERY_URL",
    "str",
    "",
    "The provider's discovery document (`https://id.example.com/.well-known/"
    "openid-configuration`): fills the four endpoints below that are not set, and the "
    "end-session endpoint. Read once per process at first use within `LEDGERWEB_OIDC_TIMEOUT`; "
    "`check --deploy` reads it too and reports what is wrong.",
    group=_SSO,
)
declare(
    "LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT",
    "str",
    "",
    "The provider's authorization endpoint (without a discovery URL: from its "
    "`/.well-known/openid-configuration`).",
    group=_SSO,
)
declare("LEDGERWEB_OIDC_TOKEN_ENDPOINT", "str", "", "The provider's token endpoint.", group=_SSO)
declare(
    "LEDGERWEB_OIDC_USERINFO_ENDPOINT", "str", "", "The provider's userinfo endpoint.", group=_SSO
)
declare(
    "LEDGERWEB_OIDC_JWKS_ENDPOINT",
    "str",
    "",
    "The provider's JSON Web Key Set endpoint.",
    group=_SSO,
)
declare(
    "LEDGERWEB_OIDC_END_SESSION_ENDPOINT",
    "str",
    "",
    "The provider's end-session endpoint: logging out of a single sign-on session ends it at "
    "the provider too (RP-initiated logout, with `id_token_hint` and "
    "`post_logout_redirect_uri` = the login page; register that address at the provider).",
    group=_SSO,
    shown_default="from the discovery document; none: logout ends only ledgerweb's session",
)
declare(
    "LEDGERWEB_OIDC_SIGN_ALGO",
    "str",
    "RS256",
    "ID token signing algorithm (`check --deploy` refuses `none`).",
    group=_SSO,
)
declare(
    "LEDGERWEB_OIDC_SCOPES",
    "str",
    "openid email profile",
    "Scopes asked for; add the one your provider needs for groups.",
    group=_SSO,
)
declare(
    "LEDGERWEB_OIDC_GROUPS_CLAIM",
    "str",
    "groups",
    "Claim holding the person's groups (mapped to roles by `[[sso_groups]]`).",
    group=_SSO,
)
declare(
    "LEDGERWEB_OIDC_USERNAME_CLAIM",
    "str",
    "preferred_username",
    "Claim used as the username (then `email`, then `sub`).",
    group=_SSO,
)
declare("LEDGERWEB_OIDC_LABEL", "str", "single sign-on", "The login button's text.", group=_SSO)
declare(
    "LEDGERWEB_OIDC_TIMEOUT",
    "int",
    10,
    "Seconds the server waits for the identity provider.",
    group=_SSO,
    minimum=1,
)

# --- The demo (`ledgerweb demo`, scripts/run) ------------------------------------------------
_DEMO = "Demo"
declare(
    "LEDGERWEB_DEMO_PROVIDER_PORT",
    "int",
    8765,
    "Port of the demo provider (`0` for any free port).",
    group=_DEMO,
    minimum=0,
    maximum=65535,
)
declare(
    "LEDGERWEB_DEMO_PROVIDER_URL",
    "str",
    "http://127.0.0.1:8765",
    "Address `seed_demo` gives the demo tools.",
    group=_DEMO,
)
declare(
    "LEDGERWEB_DEMO_TASKS", "int", 60, "Demo agent tasks on the first run.", group=_DEMO, minimum=0
)
declare(
    "LEDGERWEB_DEMO_PASSWORD",
    "secret",
    "",
    "Password for new demo users.",
    group=_DEMO,
    shown_default="(none: generated and printed)",
)

# --- Tests and failure injection (never in production) ---------------------------------------
_TESTS = "Tests and failure injection"
declare(
    "LEDGERWEB_TEST_DB_NAME",
    "str",
    "test_ledgerweb",
    "PostgreSQL: name of the test database.",
    group=_TESTS,
)
declare(
    "LEDGERWEB_TEST_SQLITE_PATH",
    "str",
    "",
    "SQLite: the test database file.",
    group=_TESTS,
    shown_default="`$LEDGERWEB_DATA_DIR/test_ledger.sqlite3`",
)
declare(
    "LEDGERWEB_CRASH_AT",
    "list",
    [],
    "Crash points (comma-separated) where this process kills itself (needs "
    "`LEDGERWEB_FAULTS_ALLOWED=1`; docs/crashtest.md).",
    group=_TESTS,
)
declare(
    "LEDGERWEB_CRASH_AFTER",
    "int",
    1,
    "Kill at the N-th hit of a listed crash point.",
    group=_TESTS,
    minimum=1,
)
declare(
    "LEDGERWEB_CRASH_TIMER_MS",
    "int",
    0,
    "Kill the process this many milliseconds after the kill timer is armed.",
    group=_TESTS,
    minimum=0,
)
declare(
    "LEDGERWEB_MUTATION",
    "str",
    "",
    "A deliberately broken behaviour, so crashtest shows it can fail.",
    group=_TESTS,
)


def essential() -> list[Setting]:
    return [s for s in REFERENCE.values() if s.essential]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """docs/settings.md, from the declarations above."""
    lines = [
        "# Settings reference",
        "",
        "<!-- Generated by `manage.py settings_reference` from ledgerweb/settings_reference.py;"
        " edit the declarations there, then run the command. -->",
        "",
        "Every setting ledgerweb reads, all from environment variables. A wrong value stops",
        "start-up with a sentence naming the variable; a boolean is one of 1/0, true/false,",
        "yes/no, on/off. `manage.py check --deploy` refuses placeholder and short secrets",
        "(the example file's `change-me-...` values), Django's `django-insecure-` keys and keys",
        "that read like chosen words; with single sign-on, plain-http provider addresses and",
        "`LEDGERWEB_OIDC_SIGN_ALGO=none`.",
        "",
        "Every secret, and `DATABASE_URL`, can come from a file instead: `<NAME>_FILE` names it",
        "(a container's `secrets:`, a systemd credential); a final newline is not part of the",
        "value, and setting both `<NAME>` and `<NAME>_FILE` is an error. `manage.py check` warns",
        "about a `LEDGERWEB_*` variable that is not a setting (a typo: `LEDGERWEB_HTTSP` is not",
        "`LEDGERWEB_HTTPS`), naming the setting it most likely meant.",
        "",
    ]
    for group in GROUPS:
        lines += [f"## {group}", "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for s in REFERENCE.values():
            if s.group == group:
                lines.append(
                    f"| `{s.name}` | {_cell(s.documented_type())} | "
                    f"{_cell(s.documented_default())} | {_cell(s.description)} |"
                )
        lines.append("")
    return "\n".join(lines)


README_START = "<!-- settings:start (generated by `manage.py settings_reference`) -->"
README_END = "<!-- settings:end -->"


def render_readme_block() -> str:
    """The README's short table of the settings a deployment sets first."""
    lines = [README_START, "| variable | default | meaning |", "|---|---|---|"]
    for s in essential():
        lines.append(f"| `{s.name}` | {_cell(s.documented_default())} | {_cell(s.description)} |")
    lines.append(README_END)
    return "\n".join(lines)


def with_readme_block(readme: str) -> str:
    """``readme`` with its generated block replaced by today's."""
    start = readme.find(README_START)
    end = readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError("the README has no settings block (its start and end markers)")
    return readme[:start] + render_readme_block() + readme[end + len(README_END) :]
