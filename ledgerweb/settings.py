"""Settings for ledgerweb, read from the environment through the declared reference
(ledgerweb/settings_reference.py, documented in docs/settings.md).

The embedded default is a SQLite file under ``LEDGERWEB_DATA_DIR`` in WAL mode with
``synchronous=FULL`` and immediate transactions; ``DATABASE_URL`` selects PostgreSQL.
"""

import ipaddress
import os
import secrets
import tempfile
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from ledgerweb.paths import CHECKOUT_DIR, default_data_dir, shipped
from ledgerweb.settings_reference import read

BASE_DIR = CHECKOUT_DIR
DATA_DIR = Path(read("LEDGERWEB_DATA_DIR", str(default_data_dir()))).resolve()

DEBUG = read("LEDGERWEB_DEBUG")
HTTPS = read("LEDGERWEB_HTTPS")


def _secret_key() -> str:
    """The configured key, or one generated once and kept (mode 0600) in the data folder."""
    configured = read("LEDGERWEB_SECRET_KEY")
    if configured:
        if len(configured) < 50:
            raise ImproperlyConfigured("LEDGERWEB_SECRET_KEY must be at least 50 characters long")
        return configured
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        # Written whole under another name (mkstemp: mode 0600), then linked into place: the
        # workers of a first start read no file or the whole key, and the first link wins for
        # all of them.
        fd, written = tempfile.mkstemp(dir=DATA_DIR, prefix=".secret_key.")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(64))
            try:
                os.link(written, key_file)
            except FileExistsError:
                pass
        finally:
            os.unlink(written)
    key = key_file.read_text().strip()
    if not key:
        raise ImproperlyConfigured(f"{key_file} is empty: remove it and a new key is made")
    return key


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = read("LEDGERWEB_ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = read("LEDGERWEB_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "attempts",
    "reconciliation",
]

MIDDLEWARE = [
    # First: every later line of a request, and its response, carry its X-Request-ID.
    "ledgerweb.request_context.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Sessions, the signed-in person, their time zone and messages: for pages, not for the
    # agent API's token-authenticated JSON (ledgerweb/browser.py).
    "ledgerweb.browser.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "ledgerweb.browser.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    # Who changed an authority row (tenant, role, token, tool...): the signed-in person.
    "attempts.config_history.ActingMiddleware",
    "ledgerweb.browser.TimeZoneMiddleware",
    "ledgerweb.browser.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Django's, with a policy that uses no nonce built once (ledgerweb/csp.py).
    "ledgerweb.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "ledgerweb.urls"
WSGI_APPLICATION = "ledgerweb.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [shipped("templates")],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
                "attempts.context_processors.navigation",
                "ledgerweb.health.health_band",
            ],
        },
    },
]


def _split_hosts(url: str) -> tuple[str, list[str], list[str]]:
    """A libpq multi-host URL (``postgres://user@h1:5432,h2:5433/db``) as a one-host URL that
    dj_database_url can read, and the lists of hosts and ports (libpq takes them comma-separated,
    port by port). A one-host URL comes back as it is, with empty lists."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if not sep or "," not in hostlist:
        return url, [], []
    hosts, ports = [], []
    for item in hostlist.split(","):
        if item.startswith("["):  # [::1]:5432
            host, _, port = item[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host or (port and not port.isdigit()):
            raise ImproperlyConfigured(
                f"DATABASE_URL lists a host that is not host[:port]: {item!r}"
            )
        hosts.append(host)
        ports.append(port or "5432")
    first = f"[{hosts[0]}]" if ":" in hosts[0] else hosts[0]
    return f"{scheme}://{userinfo}{at}{first}:{ports[0]}{slash}{tail}", hosts, ports


def _postgresql(url: str) -> dict:
    """The PostgreSQL database ``DATABASE_URL`` names, with its deadlines and durability."""
    one_host, hosts, ports = _split_hosts(url)
    try:
        config = dj_database_url.parse(one_host, conn_max_age=read("LEDGERWEB_DB_CONN_MAX_AGE"))
    except Exception as exc:  # dj_database_url raises several types for a bad URL
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            "DATABASE_URL must be a postgres:// URL (SQLite is configured with "
            "LEDGERWEB_DATA_DIR instead)"
        )
    options = config.setdefault("OPTIONS", {})
    if hosts:
        # Failover (docs/scaling.md): libpq tries the hosts in turn and keeps the first that
        # takes writes, so after a promotion a new connection finds the new primary. A kept
        # connection to a server that went away or turned read-only is closed on its first
        # error (a 503 with Retry-After, attempts/locking.py), and the next one looks again:
        # no health-check query on every request's write path.
        config["HOST"], config["PORT"] = ",".join(hosts), ",".join(ports)
        options.setdefault("target_session_attrs", "read-write")
    # A host that does not answer costs this long, not libpq's default of for ever; a
    # connection whose peer vanished without a word is found by keepalives, not never.
    options.setdefault("connect_timeout", read("LEDGERWEB_PG_CONNECT_TIMEOUT"))
    options.setdefault("keepalives", 1)
    options.setdefault("keepalives_idle", 10)
    options.setdefault("keepalives_interval", 5)
    options.setdefault("keepalives_count", 3)
    # Durability is the product: never run the ledger with synchronous_commit off or local
    # (with a synchronous standby, the setting chooses how far the standby has a commit
    # before it is acknowledged: attempts/replication.py). Every lock
    # wait, every statement and every idle open transaction is bounded (attempts/locking.py
    # turns a lock or statement timeout into LedgerBusy; the server ends an idle session).
    # No JIT: the ledger's reads are short index ranges, and on a big table the planner's
    # estimates cross jit_above_cost, so compiling would cost more than running.
    lock_ms = read("LEDGERWEB_LOCK_TIMEOUT_MS")
    statement_ms = read("LEDGERWEB_PG_STATEMENT_TIMEOUT_MS")
    idle_ms = read("LEDGERWEB_PG_IDLE_IN_TRANSACTION_TIMEOUT_MS")
    level = read("LEDGERWEB_PG_SYNCHRONOUS_COMMIT")
    options["options"] = (
        f"-c synchronous_commit={level} -c lock_timeout={lock_ms} -c statement_timeout="
        f"{statement_ms} -c idle_in_transaction_session_timeout={idle_ms} -c jit=off"
    )
    # Parameters travel apart from the SQL, and a statement a connection has run a few times
    # is prepared once and then only executed: the server stops re-planning the same few
    # writes on every tool call. 0 turns preparing off (for a pooler that cannot keep
    # prepared statements).
    config["OPTIONS"]["server_side_binding"] = True
    prepare = read("LEDGERWEB_PG_PREPARE_THRESHOLD")
    config["OPTIONS"]["prepare_threshold"] = prepare or None
    config["TEST"] = {"NAME": read("LEDGERWEB_TEST_DB_NAME")}
    return config


def _databases() -> dict:
    url = read("DATABASE_URL")
    if url:
        return {"default": _postgresql(url)}
    busy_ms = read("LEDGERWEB_SQLITE_BUSY_TIMEOUT_MS")
    return {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": read("LEDGERWEB_SQLITE_PATH", str(DATA_DIR / "ledger.sqlite3")),
            # Keep each thread's connection between requests: closing the last connection to a
            # WAL database checkpoints it, and opening one re-runs the pragmas (docs/scaling.md
            # says what that costs).
            "CONN_MAX_AGE": read("LEDGERWEB_DB_CONN_MAX_AGE"),
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": {
                # WAL for concurrent readers, FULL so a commit survives power loss before the next
                # step acts on it, IMMEDIATE so a write transaction takes the lock at BEGIN and a
                # read-then-write can never fail half-way with SQLITE_BUSY.
                "init_command": (
                    "PRAGMA journal_mode=WAL;"
                    "PRAGMA synchronous=FULL;"
                    f"PRAGMA busy_timeout={busy_ms};"
                    "PRAGMA foreign_keys=ON"
                ),
                "transaction_mode": "IMMEDIATE",
                "timeout": busy_ms / 1000,
            },
            "TEST": {
                "NAME": read("LEDGERWEB_TEST_SQLITE_PATH", str(DATA_DIR / "test_ledger.sqlite3"))
            },
        }
    }


DATABASES = _databases()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    # Staff get the admin-site permissions of their tenant roles (attempts/memberships.py).
    "attempts.memberships.RolePermissionBackend",
]

# Single sign-on through OpenID Connect (attempts/sso.py, docs/deploy.md): on when a client id is
# configured. Roles come from the provider's groups claim through the configuration file's
# [[sso_groups]]; someone in no mapped group is refused.
SSO = {
    "ENABLED": bool(read("LEDGERWEB_OIDC_CLIENT_ID")),
    "GROUPS_CLAIM": read("LEDGERWEB_OIDC_GROUPS_CLAIM"),
    "USERNAME_CLAIM": read("LEDGERWEB_OIDC_USERNAME_CLAIM"),
    "LABEL": read("LEDGERWEB_OIDC_LABEL"),
    # The provider's /.well-known/openid-configuration: fills every endpoint not set by hand
    # (attempts/sso.py reads it at first use, within OIDC_TIMEOUT, and keeps it).
    "DISCOVERY_URL": read("LEDGERWEB_OIDC_DISCOVERY_URL"),
    # RP-initiated logout; from the discovery document when not set.
    "END_SESSION_ENDPOINT": read("LEDGERWEB_OIDC_END_SESSION_ENDPOINT"),
}
if SSO["ENABLED"]:
    AUTHENTICATION_BACKENDS.append("attempts.sso.GroupRoleBackend")
    OIDC_RP_CLIENT_ID = read("LEDGERWEB_OIDC_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = read("LEDGERWEB_OIDC_CLIENT_SECRET")
    OIDC_OP_AUTHORIZATION_ENDPOINT = read("LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = read("LEDGERWEB_OIDC_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = read("LEDGERWEB_OIDC_USERINFO_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = read("LEDGERWEB_OIDC_JWKS_ENDPOINT")
    OIDC_RP_SIGN_ALGO = read("LEDGERWEB_OIDC_SIGN_ALGO")
    OIDC_RP_SCOPES = read("LEDGERWEB_OIDC_SCOPES")
    OIDC_USE_PKCE = True
    OIDC_CREATE_USER = True
    OIDC_TIMEOUT = read("LEDGERWEB_OIDC_TIMEOUT")
    OIDC_STORE_ID_TOKEN = True  # the id_token_hint of RP-initiated logout
    LOGIN_REDIRECT_URL_FAILURE = "/login/"  # a path: mozilla-django-oidc does not resolve names
    _endpoints = (
        ("LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT", OIDC_OP_AUTHORIZATION_ENDPOINT),
        ("LEDGERWEB_OIDC_TOKEN_ENDPOINT", OIDC_OP_TOKEN_ENDPOINT),
        ("LEDGERWEB_OIDC_USERINFO_ENDPOINT", OIDC_OP_USER_ENDPOINT),
        ("LEDGERWEB_OIDC_JWKS_ENDPOINT", OIDC_OP_JWKS_ENDPOINT),
    )
    _missing = [] if OIDC_RP_CLIENT_SECRET else ["LEDGERWEB_OIDC_CLIENT_SECRET"]
    if not SSO["DISCOVERY_URL"]:
        _missing += [name for name, value in _endpoints if not value]
    if _missing:
        raise ImproperlyConfigured(
            f"LEDGERWEB_OIDC_CLIENT_ID is set, so single sign-on also needs {', '.join(_missing)}"
            + (
                " (or LEDGERWEB_OIDC_DISCOVERY_URL for the endpoints)"
                if len(_missing) > 1 or _missing[0] != "LEDGERWEB_OIDC_CLIENT_SECRET"
                else ""
            )
        )

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [shipped("static")]
STATIC_ROOT = Path(read("LEDGERWEB_STATIC_ROOT", str(DATA_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = DEBUG

# Security. Cookies are Secure and HSTS is on when the deployment says it is behind HTTPS.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
    "base-uri": [CSP.NONE],
    "object-src": [CSP.NONE],
}
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = True  # htmx reads the token from the page, never from the cookie
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS and read("LEDGERWEB_SSL_REDIRECT")
SECURE_HSTS_SECONDS = read("LEDGERWEB_HSTS_SECONDS", 31536000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
DATA_UPLOAD_MAX_MEMORY_SIZE = read("LEDGERWEB_MAX_BODY_BYTES")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "ledgerweb.logs.JsonFormatter"},
    },
    # The running request's id, trace id and attempt id on each of its lines.
    "filters": {"request": {"()": "ledgerweb.request_context.RequestContextFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["request"],
            # LEDGERWEB_LOG_FORMAT=json: one JSON object per line, attempt ids as fields.
            "formatter": "json" if read("LEDGERWEB_LOG_FORMAT") == "json" else "structured",
        }
    },
    "root": {"handlers": ["console"], "level": read("LEDGERWEB_LOG_LEVEL").upper()},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The stripe library logs every request at INFO; the reconciler records what matters.
        "stripe": {"level": "WARNING"},
    },
}


def _networks(name: str) -> tuple:
    try:
        return tuple(ipaddress.ip_network(item, strict=False) for item in read(name))
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{name}: {exc} (addresses or networks, comma-separated)"
        ) from None


# The ledger's own knobs (seconds unless named otherwise).
LEDGER = {
    # Largest accepted normalized argument document, in bytes of canonical JSON.
    "MAX_ARGS_BYTES": read("LEDGERWEB_MAX_ARGS_BYTES"),
    # An INTENT_RECORDED or DISPATCHED attempt older than this is stale: recovery looks at it.
    # Must be longer than any provider timeout.
    "STALE_AFTER": read("LEDGERWEB_STALE_AFTER"),
    # How long an UNKNOWN attempt may keep being looked up before a person must decide.
    "UNKNOWN_MAX_AGE": read("LEDGERWEB_UNKNOWN_MAX_AGE"),
    # Backoff between lookups of an UNKNOWN attempt: base * 2**n, capped, with full jitter.
    "BACKOFF_BASE": read("LEDGERWEB_BACKOFF_BASE"),
    "BACKOFF_CAP": read("LEDGERWEB_BACKOFF_CAP"),
    # How many times one attempt may be sent (first send included) before it is FAILED.
    "MAX_SENDS": read("LEDGERWEB_MAX_SENDS"),
    # Field names whose values the dashboard shows redacted.
    "REDACT_FIELDS": read("LEDGERWEB_REDACT_FIELDS"),
    # Username that owns attention work when no ownership rule matches.
    "DEFAULT_OWNER": read("LEDGERWEB_DEFAULT_OWNER"),
    # Fault injection (crash points, mutations) only where a test process asks for it
    # explicitly; never with production settings (checked below).
    "FAULTS_ALLOWED": read("LEDGERWEB_FAULTS_ALLOWED"),
    # Dashboard login throttling: this many failures per username and address lock it out.
    "LOGIN_MAX_FAILURES": read("LEDGERWEB_LOGIN_MAX_FAILURES"),
    "LOGIN_LOCK_SECONDS": read("LEDGERWEB_LOGIN_LOCK_SECONDS"),
    # Reverse proxies whose X-Forwarded-For the login throttle believes (ip_network objects).
    "TRUSTED_PROXIES": _networks("LEDGERWEB_TRUSTED_PROXIES"),
    # Provider adapters a tool may name (Tool.adapter): short name -> adapter class. The list
    # is code and deployment configuration; the database only ever holds a name from it.
    # LEDGERWEB_ADAPTERS=name=package.module.Class,... adds custom adapters.
    "ADAPTERS": read("LEDGERWEB_ADAPTERS"),
    # The sealer (attempts/chain.py, run by the reconcile worker) seals new history into a
    # checkpoint this often; verify_audit reports anything left unsealed for longer.
    "SEAL_EVERY": read("LEDGERWEB_SEAL_EVERY"),
    # Secret API key of the Stripe adapter (reconciliation/providers/stripe.py).
    "STRIPE_API_KEY": read("LEDGERWEB_STRIPE_API_KEY"),
    # The MCP gateway's configuration file: the "mcp" provider adapter finds each tool's upstream
    # server and lookup tool there (docs/integrations.md).
    "MCP_GATEWAY_CONFIG": read("LEDGERWEB_MCP_GATEWAY_CONFIG"),
}

# Provider bulkheads (reconciliation/bulkhead.py, issue 23): calls in flight per provider (a
# lookup URL's host:port, an MCP upstream, or a tool name), overridable per provider, and the
# circuit breaker that stops calling a failing provider and probes it again.
LEDGER.update(
    {
        "PROVIDER_CONCURRENCY": read("LEDGERWEB_PROVIDER_CONCURRENCY"),
        "PROVIDER_CONCURRENCY_BY_KEY": read("LEDGERWEB_PROVIDER_CONCURRENCY_BY_KEY"),
        "PROVIDER_BREAKER_FAILURES": read("LEDGERWEB_PROVIDER_BREAKER_FAILURES"),
        "PROVIDER_BREAKER_OPEN_SECONDS": read("LEDGERWEB_PROVIDER_BREAKER_OPEN_SECONDS"),
    }
)

# The transparency log (attempts/log.py, docs/audit-chain.md): signed checkpoints, tiles under
# /log/, witnesses. The signing key lives outside the database: a key file (mode 0600, made by
# `manage.py ledger_log genkey`) or a command that signs (a KMS or HSM) with its verifier key.
TLOG = {
    # The log's name in every checkpoint note; set it once, witnesses and clients pin it.
    "ORIGIN": read("LEDGERWEB_TLOG_ORIGIN"),
    "KEY_FILE": read("LEDGERWEB_TLOG_KEY_FILE"),
    "SIGN_COMMAND": read("LEDGERWEB_TLOG_SIGN_COMMAND"),
    "VERIFIER_KEY": read("LEDGERWEB_TLOG_VERIFIER_KEY"),
    # Where the signer keeps the newest tree it signed (it signs only consistent extensions of
    # it); default: beside the key file, or in the data folder with a signing command.
    "SIGNER_STATE": read("LEDGERWEB_TLOG_SIGNER_STATE"),
    # Verifier keys of earlier signing keys, kept so checkpoints they signed still verify.
    "OLD_VERIFIER_KEYS": read("LEDGERWEB_TLOG_OLD_VERIFIER_KEYS"),
    # Witnesses: "VERIFIER_KEY SUBMISSION_URL" items, comma-separated.
    "WITNESSES": read("LEDGERWEB_TLOG_WITNESSES"),
    # How many witness cosignatures make a checkpoint witnessed (default: one if any is set).
    "WITNESS_QUORUM": read("LEDGERWEB_TLOG_WITNESS_QUORUM"),
    # Whole-request deadline of one submission to a witness, seconds.
    "WITNESS_TIMEOUT": read("LEDGERWEB_TLOG_WITNESS_TIMEOUT"),
    # /log/ is public unless this bearer token is set (then it is required).
    "READ_TOKEN": read("LEDGERWEB_TLOG_READ_TOKEN"),
}

# Approval before dispatch (issue 24, docs/approvals.md). After a held attempt is approved the
# agent has APPROVAL_GRACE seconds to claim it before the reconcile worker sends it itself;
# GET /api/v1/attempts/{id}?wait=N long-polls at most APPROVAL_WAIT_MAX seconds (below
# gunicorn's 30 s worker timeout: a waiting request holds one worker thread, no transaction).
LEDGER["APPROVAL_GRACE"] = read("LEDGERWEB_APPROVAL_GRACE")
LEDGER["APPROVAL_WAIT_MAX"] = read("LEDGERWEB_APPROVAL_WAIT_MAX")

# Notifications (attempts/notify.py): email through Django's SMTP backend, and a
# Slack-compatible chat webhook. Both off until configured; the reconcile worker delivers them.
_EMAIL_HOST = read("LEDGERWEB_EMAIL_HOST")
_EMAIL_TLS = read("LEDGERWEB_EMAIL_USE_TLS")
_EMAIL_SSL = read("LEDGERWEB_EMAIL_USE_SSL")
if _EMAIL_TLS and _EMAIL_SSL:
    raise ImproperlyConfigured("set LEDGERWEB_EMAIL_USE_TLS or LEDGERWEB_EMAIL_USE_SSL, not both")
MAILERS = {
    "default": {
        "BACKEND": read("LEDGERWEB_EMAIL_BACKEND") or "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": _EMAIL_HOST or "localhost",
            "port": read("LEDGERWEB_EMAIL_PORT"),
            "username": read("LEDGERWEB_EMAIL_USER"),
            "password": read("LEDGERWEB_EMAIL_PASSWORD"),
            "use_tls": _EMAIL_TLS,
            "use_ssl": _EMAIL_SSL,
            "timeout": read("LEDGERWEB_EMAIL_TIMEOUT"),
        },
    }
}
DEFAULT_FROM_EMAIL = read("LEDGERWEB_EMAIL_FROM")
NOTIFY = {
    # Email goes out only when an SMTP host is configured (or another backend chosen).
    "EMAIL": bool(_EMAIL_HOST) or bool(read("LEDGERWEB_EMAIL_BACKEND")),
    "CHAT_WEBHOOK_URL": read("LEDGERWEB_CHAT_WEBHOOK_URL"),
    "CHAT_TIMEOUT": read("LEDGERWEB_CHAT_TIMEOUT"),
    # Links in notices: the dashboard's public address (e.g. https://ledger.example.com).
    "BASE_URL": read("LEDGERWEB_BASE_URL").rstrip("/"),
    # A claimed notice not recorded as sent within this many seconds is delivered again.
    "LEASE_SECONDS": read("LEDGERWEB_NOTIFY_LEASE_SECONDS"),
    "MAX_TRIES": read("LEDGERWEB_NOTIFY_MAX_TRIES"),
    # How often the worker looks for SLA breaches (seconds).
    "SLA_EVERY": read("LEDGERWEB_SLA_EVERY"),
}

# Approve and reject held calls in Slack (attempts/slack.py): on when both secrets are set.
SLACK = {
    "BOT_TOKEN": read("LEDGERWEB_SLACK_BOT_TOKEN"),
    "SIGNING_SECRET": read("LEDGERWEB_SLACK_SIGNING_SECRET"),
    "API_URL": read("LEDGERWEB_SLACK_API_URL"),
    "TIMEOUT": read("LEDGERWEB_SLACK_TIMEOUT"),
}

# Tracing (attempts/tracing.py, docs/operations.md): the traceparent an agent sends is kept on
# its attempt and linked to the team's tracing UI; the ledger's own steps are exported as spans
# over OTLP/HTTP only when an endpoint is configured.
TRACING = {
    "TRACE_URL": read("LEDGERWEB_TRACE_URL"),
    "OTLP_ENDPOINT": read("LEDGERWEB_OTLP_ENDPOINT").rstrip("/"),
    "OTLP_HEADERS": read("LEDGERWEB_OTLP_HEADERS"),
    "SERVICE_NAME": read("LEDGERWEB_OTEL_SERVICE_NAME"),
}
if TRACING["TRACE_URL"] and (
    "{trace_id}" not in TRACING["TRACE_URL"]
    or not TRACING["TRACE_URL"].startswith(("https://", "http://"))
):
    raise ImproperlyConfigured(
        "LEDGERWEB_TRACE_URL must be an http(s) address with {trace_id} where the id goes, e.g. "
        "https://tempo.example/trace/{trace_id}"
    )

# Operations endpoints (docs/operations.md). /metrics answers "Authorization: Bearer
# <LEDGERWEB_METRICS_TOKEN>"; LEDGERWEB_METRICS_ALLOW_LOOPBACK=1 opens it to loopback clients too.
OPS = {
    "HEARTBEAT_MAX_AGE": read("LEDGERWEB_HEARTBEAT_MAX_AGE"),
    "HEALTHZ_REQUIRE_WORKER": read("LEDGERWEB_HEALTHZ_REQUIRE_WORKER"),
    "METRICS_TOKEN": read("LEDGERWEB_METRICS_TOKEN"),
    # Off unless explicitly opened: behind a reverse proxy on the same host every client looks
    # like loopback, so by default /metrics needs the token.
    "METRICS_ALLOW_LOOPBACK": read("LEDGERWEB_METRICS_ALLOW_LOOPBACK"),
}
if HTTPS and LEDGER["FAULTS_ALLOWED"]:
    raise ImproperlyConfigured(
        "LEDGERWEB_FAULTS_ALLOWED cannot be on in production (LEDGERWEB_HTTPS=1): crash points "
        "and mutations exist for crashtest only"
    )
