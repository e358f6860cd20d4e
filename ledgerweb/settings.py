"""Settings for ledgerweb, read from the environment (see README, "Configuration").

The embedded default is a SQLite file under ``LEDGERWEB_DATA_DIR`` in WAL mode with
``synchronous=FULL`` and immediate transactions; ``DATABASE_URL`` selects PostgreSQL.
"""

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from ledgerweb.env import env_bool, env_int, env_list, env_names, env_str
from ledgerweb.paths import CHECKOUT_DIR, default_data_dir, shipped

BASE_DIR = CHECKOUT_DIR
DATA_DIR = Path(env_str("LEDGERWEB_DATA_DIR", str(default_data_dir()))).resolve()

DEBUG = env_bool("LEDGERWEB_DEBUG", False)
HTTPS = env_bool("LEDGERWEB_HTTPS", False)


def _secret_key() -> str:
    """The configured key, or one generated once and kept (mode 0600) in the data folder."""
    configured = env_str("LEDGERWEB_SECRET_KEY")
    if configured:
        if len(configured) < 50:
            raise ImproperlyConfigured("LEDGERWEB_SECRET_KEY must be at least 50 characters long")
        return configured
    key_file = DATA_DIR / "secret_key"
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(64)
        key_file.touch(mode=0o600)
        key_file.write_text(key)
        return key


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("LEDGERWEB_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("LEDGERWEB_CSRF_TRUSTED_ORIGINS", [])

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
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "attempts.timezones.TimeZoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
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
            ],
        },
    },
]


def _databases() -> dict:
    url = env_str("DATABASE_URL")
    if url:
        try:
            config = dj_database_url.parse(
                url, conn_max_age=env_int("LEDGERWEB_DB_CONN_MAX_AGE", 60)
            )
        except Exception as exc:  # dj_database_url raises several types for a bad URL
            raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
        if config["ENGINE"] != "django.db.backends.postgresql":
            raise ImproperlyConfigured(
                "DATABASE_URL must be a postgres:// URL (SQLite is configured with "
                "LEDGERWEB_DATA_DIR instead)"
            )
        # Durability is the product: never run the ledger with synchronous_commit off. Every lock
        # wait is bounded (attempts/locking.py turns a timeout into LedgerBusy).
        lock_ms = env_int("LEDGERWEB_LOCK_TIMEOUT_MS", 10000, minimum=1)
        config.setdefault("OPTIONS", {})["options"] = (
            f"-c synchronous_commit=on -c lock_timeout={lock_ms}"
        )
        # Parameters travel apart from the SQL, and a statement a connection has run a few times
        # is prepared once and then only executed: the server stops re-planning the same few
        # writes on every tool call. 0 turns preparing off (for a pooler that cannot keep
        # prepared statements).
        config["OPTIONS"]["server_side_binding"] = True
        prepare = env_int("LEDGERWEB_PG_PREPARE_THRESHOLD", 5, minimum=0)
        config["OPTIONS"]["prepare_threshold"] = prepare or None
        config["TEST"] = {"NAME": env_str("LEDGERWEB_TEST_DB_NAME", "test_ledgerweb")}
        return {"default": config}
    busy_ms = env_int("LEDGERWEB_SQLITE_BUSY_TIMEOUT_MS", 30000, minimum=0)
    return {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("LEDGERWEB_SQLITE_PATH", str(DATA_DIR / "ledger.sqlite3")),
            # Keep each thread's connection between requests: closing the last connection to a
            # WAL database checkpoints it, and opening one re-runs the pragmas (together more
            # than a whole intent's work).
            "CONN_MAX_AGE": env_int("LEDGERWEB_DB_CONN_MAX_AGE", 60, minimum=0),
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
                "NAME": env_str("LEDGERWEB_TEST_SQLITE_PATH", str(DATA_DIR / "test_ledger.sqlite3"))
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
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]

# Single sign-on through OpenID Connect (attempts/sso.py, docs/deploy.md): on when a client id is
# configured. Roles come from the provider's groups claim through the configuration file's
# [[sso_groups]]; someone in no mapped group is refused.
SSO = {
    "ENABLED": bool(env_str("LEDGERWEB_OIDC_CLIENT_ID")),
    "GROUPS_CLAIM": env_str("LEDGERWEB_OIDC_GROUPS_CLAIM", "groups"),
    "USERNAME_CLAIM": env_str("LEDGERWEB_OIDC_USERNAME_CLAIM", "preferred_username"),
    "LABEL": env_str("LEDGERWEB_OIDC_LABEL", "single sign-on"),
}
if SSO["ENABLED"]:
    AUTHENTICATION_BACKENDS.append("attempts.sso.GroupRoleBackend")
    OIDC_RP_CLIENT_ID = env_str("LEDGERWEB_OIDC_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = env_str("LEDGERWEB_OIDC_CLIENT_SECRET")
    OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = env_str("LEDGERWEB_OIDC_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = env_str("LEDGERWEB_OIDC_USERINFO_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = env_str("LEDGERWEB_OIDC_JWKS_ENDPOINT")
    OIDC_RP_SIGN_ALGO = env_str("LEDGERWEB_OIDC_SIGN_ALGO", "RS256")
    OIDC_RP_SCOPES = env_str("LEDGERWEB_OIDC_SCOPES", "openid email profile")
    OIDC_USE_PKCE = True
    OIDC_CREATE_USER = True
    OIDC_TIMEOUT = env_int("LEDGERWEB_OIDC_TIMEOUT", 10, minimum=1)
    LOGIN_REDIRECT_URL_FAILURE = "/login/"  # a path: mozilla-django-oidc does not resolve names
    _missing = [
        name
        for name, value in (
            ("LEDGERWEB_OIDC_CLIENT_SECRET", OIDC_RP_CLIENT_SECRET),
            ("LEDGERWEB_OIDC_AUTHORIZATION_ENDPOINT", OIDC_OP_AUTHORIZATION_ENDPOINT),
            ("LEDGERWEB_OIDC_TOKEN_ENDPOINT", OIDC_OP_TOKEN_ENDPOINT),
            ("LEDGERWEB_OIDC_USERINFO_ENDPOINT", OIDC_OP_USER_ENDPOINT),
            ("LEDGERWEB_OIDC_JWKS_ENDPOINT", OIDC_OP_JWKS_ENDPOINT),
        )
        if not value
    ]
    if _missing:
        raise ImproperlyConfigured(
            f"LEDGERWEB_OIDC_CLIENT_ID is set, so single sign-on also needs {', '.join(_missing)}"
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
STATIC_ROOT = Path(env_str("LEDGERWEB_STATIC_ROOT", str(DATA_DIR / "staticfiles")))
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
SECURE_SSL_REDIRECT = HTTPS and env_bool("LEDGERWEB_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("LEDGERWEB_HSTS_SECONDS", 31536000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("LEDGERWEB_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "ledgerweb.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            # LEDGERWEB_LOG_FORMAT=json: one JSON object per line, attempt ids as fields.
            "formatter": "json" if env_str("LEDGERWEB_LOG_FORMAT") == "json" else "structured",
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LEDGERWEB_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The stripe library logs every request at INFO; the reconciler records what matters.
        "stripe": {"level": "WARNING"},
    },
}

# The ledger's own knobs (seconds unless named otherwise).
LEDGER = {
    # Largest accepted normalized argument document, in bytes of canonical JSON.
    "MAX_ARGS_BYTES": env_int("LEDGERWEB_MAX_ARGS_BYTES", 64 * 1024, minimum=64),
    # An INTENT_RECORDED or DISPATCHED attempt older than this is stale: recovery looks at it.
    # Must be longer than any provider timeout.
    "STALE_AFTER": env_int("LEDGERWEB_STALE_AFTER", 120, minimum=1),
    # How long an UNKNOWN attempt may keep being looked up before a person must decide.
    "UNKNOWN_MAX_AGE": env_int("LEDGERWEB_UNKNOWN_MAX_AGE", 24 * 3600, minimum=1),
    # Backoff between lookups of an UNKNOWN attempt: base * 2**n, capped, with full jitter.
    "BACKOFF_BASE": env_int("LEDGERWEB_BACKOFF_BASE", 5, minimum=0),
    "BACKOFF_CAP": env_int("LEDGERWEB_BACKOFF_CAP", 3600, minimum=1),
    # How many times one attempt may be sent (first send included) before it is FAILED.
    "MAX_SENDS": env_int("LEDGERWEB_MAX_SENDS", 5, minimum=1),
    # Field names whose values the dashboard shows redacted.
    "REDACT_FIELDS": env_list(
        "LEDGERWEB_REDACT_FIELDS",
        ["password", "secret", "token", "api_key", "card_number", "cvc", "authorization"],
    ),
    # Username that owns attention work when no ownership rule matches.
    "DEFAULT_OWNER": env_str("LEDGERWEB_DEFAULT_OWNER", ""),
    # Fault injection (crash points, mutations) only where a test process asks for it
    # explicitly; never with production settings (checked below).
    "FAULTS_ALLOWED": env_bool("LEDGERWEB_FAULTS_ALLOWED", False),
    # Dashboard login throttling: this many failures per username and address lock it out.
    "LOGIN_MAX_FAILURES": env_int("LEDGERWEB_LOGIN_MAX_FAILURES", 5, minimum=1),
    "LOGIN_LOCK_SECONDS": env_int("LEDGERWEB_LOGIN_LOCK_SECONDS", 15 * 60, minimum=1),
    # Provider adapters a tool may name (Tool.adapter): short name -> adapter class. The list
    # is code and deployment configuration; the database only ever holds a name from it.
    # LEDGERWEB_ADAPTERS=name=package.module.Class,... adds custom adapters.
    "ADAPTERS": env_names(
        "LEDGERWEB_ADAPTERS",
        {
            "http": "reconciliation.providers.http.GenericHttpAdapter",
            "mcp": "reconciliation.providers.mcp.McpAdapter",
            # Needs the stripe extra; a tool naming it without the extra is reported unusable.
            "stripe": "reconciliation.providers.stripe.StripePaymentIntentAdapter",
        },
    ),
    # The sealer (attempts/chain.py, run by the reconcile worker) seals new history into a
    # checkpoint this often; verify_audit reports anything left unsealed for longer.
    "SEAL_EVERY": env_int("LEDGERWEB_SEAL_EVERY", 5, minimum=1),
    # Secret API key of the Stripe adapter (reconciliation/providers/stripe.py).
    "STRIPE_API_KEY": env_str("LEDGERWEB_STRIPE_API_KEY", ""),
    # The MCP gateway's configuration file: the "mcp" provider adapter finds each tool's upstream
    # server and lookup tool there (docs/integrations.md).
    "MCP_GATEWAY_CONFIG": env_str("LEDGERWEB_MCP_GATEWAY_CONFIG", ""),
}

# Approval before dispatch (issue 24, docs/approvals.md). After a held attempt is approved the
# agent has APPROVAL_GRACE seconds to claim it before the reconcile worker sends it itself;
# GET /api/v1/attempts/{id}?wait=N long-polls at most APPROVAL_WAIT_MAX seconds (below
# gunicorn's 30 s worker timeout: a waiting request holds one worker thread, no transaction).
LEDGER["APPROVAL_GRACE"] = env_int("LEDGERWEB_APPROVAL_GRACE", 30, minimum=0)
LEDGER["APPROVAL_WAIT_MAX"] = env_int("LEDGERWEB_APPROVAL_WAIT_MAX", 20, minimum=0, maximum=25)

# Notifications (attempts/notify.py): email through Django's SMTP backend, and a
# Slack-compatible chat webhook. Both off until configured; the reconcile worker delivers them.
_EMAIL_HOST = env_str("LEDGERWEB_EMAIL_HOST", "")
_EMAIL_TLS = env_bool("LEDGERWEB_EMAIL_USE_TLS", False)
_EMAIL_SSL = env_bool("LEDGERWEB_EMAIL_USE_SSL", False)
if _EMAIL_TLS and _EMAIL_SSL:
    raise ImproperlyConfigured("set LEDGERWEB_EMAIL_USE_TLS or LEDGERWEB_EMAIL_USE_SSL, not both")
MAILERS = {
    "default": {
        "BACKEND": env_str(
            "LEDGERWEB_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend"
        ),
        "OPTIONS": {
            "host": _EMAIL_HOST or "localhost",
            "port": env_int("LEDGERWEB_EMAIL_PORT", 25, minimum=1, maximum=65535),
            "username": env_str("LEDGERWEB_EMAIL_USER", ""),
            "password": env_str("LEDGERWEB_EMAIL_PASSWORD", ""),
            "use_tls": _EMAIL_TLS,
            "use_ssl": _EMAIL_SSL,
            "timeout": env_int("LEDGERWEB_EMAIL_TIMEOUT", 10, minimum=1),
        },
    }
}
DEFAULT_FROM_EMAIL = env_str("LEDGERWEB_EMAIL_FROM", "ledgerweb@localhost")
NOTIFY = {
    # Email goes out only when an SMTP host is configured (or another backend chosen).
    "EMAIL": bool(_EMAIL_HOST) or bool(env_str("LEDGERWEB_EMAIL_BACKEND")),
    "CHAT_WEBHOOK_URL": env_str("LEDGERWEB_CHAT_WEBHOOK_URL", ""),
    "CHAT_TIMEOUT": env_int("LEDGERWEB_CHAT_TIMEOUT", 10, minimum=1),
    # Links in notices: the dashboard's public address (e.g. https://ledger.example.com).
    "BASE_URL": env_str("LEDGERWEB_BASE_URL", "").rstrip("/"),
    # A claimed notice not recorded as sent within this many seconds is delivered again.
    "LEASE_SECONDS": env_int("LEDGERWEB_NOTIFY_LEASE_SECONDS", 60, minimum=1),
    "MAX_TRIES": env_int("LEDGERWEB_NOTIFY_MAX_TRIES", 8, minimum=1),
    # How often the worker looks for SLA breaches (seconds).
    "SLA_EVERY": env_int("LEDGERWEB_SLA_EVERY", 30, minimum=1),
}

# Operations endpoints (docs/operations.md). /metrics answers "Authorization: Bearer
# <LEDGERWEB_METRICS_TOKEN>"; LEDGERWEB_METRICS_ALLOW_LOOPBACK=1 opens it to loopback clients too.
OPS = {
    "HEARTBEAT_MAX_AGE": env_int("LEDGERWEB_HEARTBEAT_MAX_AGE", 60, minimum=1),
    "HEALTHZ_REQUIRE_WORKER": env_bool("LEDGERWEB_HEALTHZ_REQUIRE_WORKER", True),
    "METRICS_TOKEN": env_str("LEDGERWEB_METRICS_TOKEN"),
    # Off unless explicitly opened: behind a reverse proxy on the same host every client looks
    # like loopback, so by default /metrics needs the token.
    "METRICS_ALLOW_LOOPBACK": env_bool("LEDGERWEB_METRICS_ALLOW_LOOPBACK", False),
}
if HTTPS and LEDGER["FAULTS_ALLOWED"]:
    raise ImproperlyConfigured(
        "LEDGERWEB_FAULTS_ALLOWED cannot be on in production (LEDGERWEB_HTTPS=1): crash points "
        "and mutations exist for crashtest only"
    )
