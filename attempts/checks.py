"""System checks: configuration that would break the ledger's promises is reported at start-up."""

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError

from ledgerweb.cli import command_line


@register(Tags.database)
def check_owner_configured(app_configs=None, **kwargs):
    """UNKNOWN and MANUAL_REVIEW work must always land on a person. It reads the database, so
    it runs where it matters (``migrate``, the reconcile worker's start, ``check --database
    default``), not before every management command."""
    from attempts.models import OwnershipRule

    if settings.LEDGER["DEFAULT_OWNER"]:
        return []
    try:
        has_rule = OwnershipRule.objects.filter(owner__is_active=True).exists()
    except DatabaseError:
        return []  # not migrated yet: nothing to judge
    if has_rule:
        return []
    return [
        Warning(
            "No owner is configured for UNKNOWN and MANUAL_REVIEW work.",
            hint=f"Add an [[ownership_rules]] entry with `{command_line('ledger_config apply')}`, "
            "or set LEDGERWEB_DEFAULT_OWNER to a username.",
            id="attempts.W001",
        )
    ]


@register(Tags.database)
def check_history_guards(app_configs=None, **kwargs):
    """The history tables must refuse UPDATE and DELETE in the database itself (the triggers
    their migrations install, ``attempts.history_guard``)."""
    from django.db import connection

    from attempts import history_guard

    try:
        missing = history_guard.unguarded(connection)
    except DatabaseError:
        return []  # not migrated yet: nothing to judge
    if not missing:
        return []
    return [
        Error(
            f"History tables without their append-only triggers: {', '.join(missing)}.",
            hint=f'Something dropped them. Put them back with `{command_line("shell")} -c "from '
            "django.db import connection; from attempts import history_guard; "
            'history_guard.install(connection)"`, then find out who dropped them and why '
            "(docs/audit-chain.md).",
            id="attempts.E003",
        )
    ]


@register()
def check_default_owner(app_configs=None, **kwargs):
    """``LEDGERWEB_DEFAULT_OWNER`` must name an active person who may own work somewhere
    (``owners``): otherwise attention work would be routed to nobody, or to someone who cannot
    act on it. One query, only when the setting is set."""
    if not settings.LEDGER["DEFAULT_OWNER"]:
        return []
    from attempts import owners

    try:
        problem = owners.default_owner_problem()
    except DatabaseError:
        return []  # not migrated yet: nothing to judge
    if problem is None:
        return []
    return [
        Error(
            problem + ".",
            hint="Set LEDGERWEB_DEFAULT_OWNER to the username of an operator, reviewer or admin "
            f"({command_line('ledger_config dump')} lists the users and their roles), or leave it "
            "unset.",
            id="attempts.E002",
        )
    ]


@register()
def check_sqlite_durability(app_configs=None, **kwargs):
    """The embedded database must run with durable commits."""
    from django.db import connection

    if connection.vendor != "sqlite":
        return []
    options = settings.DATABASES["default"].get("OPTIONS", {})
    init = options.get("init_command", "").replace(" ", "").lower()
    errors = []
    if "synchronous=full" not in init or "journal_mode=wal" not in init:
        errors.append(
            Error(
                "SQLite must run in WAL mode with synchronous=FULL.",
                id="attempts.E001",
            )
        )
    return errors


@register(Tags.security, deploy=True)
def check_secrets_are_real(app_configs=None, **kwargs):
    """The gate before production (``check --deploy``): no secret may be a placeholder copied
    from an example file, too short, or too uniform to be random."""
    from ledgerweb import settings_reference as reference

    errors = []
    for setting in reference.REFERENCE.values():
        if setting.kind != "secret":
            continue
        value = settings.SECRET_KEY if setting.name == "LEDGERWEB_SECRET_KEY" else None
        if value is None:
            value = reference.read(setting.name)
        if not value:
            continue  # unset: the feature is off (the secret key is then generated)
        why = reference.weak_secret(value, setting.minimum)
        if why:
            errors.append(
                Error(
                    f"{setting.name} is not a production secret: {why}.",
                    hint="Generate one: python3 -c 'import secrets; "
                    "print(secrets.token_urlsafe(64))' (docs/settings.md).",
                    id="attempts.E010",
                )
            )
    return errors


@register(Tags.security, deploy=True)
def check_sso_discovery(app_configs=None, **kwargs):
    """With a discovery URL, the provider's document must be readable and complete before a
    person depends on it (the gate fetches it, within the OIDC timeout)."""
    if not settings.SSO["ENABLED"] or not settings.SSO["DISCOVERY_URL"]:
        return []
    from attempts.sso import DiscoveryError, fetch_discovery

    try:
        fetch_discovery(settings.SSO["DISCOVERY_URL"], settings.OIDC_TIMEOUT)
    except DiscoveryError as exc:
        return [
            Error(
                f"Single sign-on cannot start: {exc}.",
                hint="Check LEDGERWEB_OIDC_DISCOVERY_URL (the provider's "
                "/.well-known/openid-configuration) and that this machine can reach it.",
                id="attempts.E011",
            )
        ]
    return []


@register(Tags.security, deploy=True)
def check_trusted_proxies(app_configs=None, **kwargs):
    """Behind the TLS proxy production runs behind (LEDGERWEB_HTTPS=1), every client arrives from
    the proxy's address unless the proxy is trusted to name them: one client's failed logins
    would then lock out every password login."""
    if not settings.HTTPS or settings.LEDGER["TRUSTED_PROXIES"]:
        return []
    return [
        Warning(
            "LEDGERWEB_TRUSTED_PROXIES is empty: behind a reverse proxy every client shares the "
            "proxy's address, and the login throttle locks them out together.",
            hint="Set it to the proxy's address or network (127.0.0.1 for nginx on this "
            "machine), or to the address gunicorn sees when clients connect directly.",
            id="attempts.W010",
        )
    ]


@register(Tags.security, deploy=True)
def check_log_signing_key(app_configs=None, **kwargs):
    """Production signs its checkpoints: without a key they are unsigned, and nobody outside
    can check the history (``check --deploy`` says so); a configured key must be usable."""
    from attempts import log

    config = settings.TLOG
    if not config["KEY_FILE"] and not config["SIGN_COMMAND"]:
        return [
            Warning(
                "No transparency-log signing key: checkpoints stay unsigned, /log/ serves "
                "nothing and agents get no receipts.",
                hint=f"Make one with `{command_line('ledger_log genkey --out FILE')}` and set "
                "LEDGERWEB_TLOG_KEY_FILE, or set LEDGERWEB_TLOG_SIGN_COMMAND and "
                "LEDGERWEB_TLOG_VERIFIER_KEY (docs/audit-chain.md).",
                id="attempts.W012",
            )
        ]
    try:
        log.signer()
        log.witnesses()
    except (log.LogKeyError, ValueError) as exc:
        return [Error(f"The transparency log's keys: {exc}", id="attempts.E012")]
    return []


# Not tagged "database" (Django runs those only with --database): the deploy gate must ask the
# server it will run on.
@register("failover", deploy=True)
def check_failover_durability(app_configs=None, **kwargs):
    """The gate before production (``check --deploy``): on PostgreSQL with standbys, an
    acknowledged write must survive a failover, so replication must be synchronous for the
    ledger's sessions (attempts/replication.py, docs/scaling.md)."""
    from attempts import replication

    try:
        found = replication.durability()
    except DatabaseError:
        return []  # the database cannot be reached: other checks and /healthz say so
    text = replication.warning_text(found) if found is not None else None
    if text is None:
        return []
    return [
        Warning(
            text,
            hint="Name the standby in synchronous_standby_names on the primary (e.g. "
            "'ANY 1 (standby1, standby2)') and keep LEDGERWEB_PG_SYNCHRONOUS_COMMIT at on or "
            "remote_apply; docs/scaling.md (failover) gives the cost on the write path.",
            id="attempts.W045",
        )
    ]


@register()
def check_unknown_settings(app_configs=None, **kwargs):
    """A ``LEDGERWEB_*`` variable that nothing reads is a typo or a setting that is gone: its
    value is silently not in force (a misspelt ``LEDGERWEB_HTTPS=1`` leaves HTTPS off), so say so, with the
    setting it most likely meant."""
    from ledgerweb import settings_reference as reference

    return [
        Warning(
            f"{name} is set, but it is not a ledgerweb setting, so nothing reads it"
            + (f"; did you mean {meant}?" if meant else "."),
            hint="docs/settings.md lists every setting.",
            id="ledgerweb.W001",
        )
        for name, meant in reference.unknown_variables()
    ]


@register(Tags.security, deploy=True)
def check_sso_is_safe(app_configs=None, **kwargs):
    """Single sign-on in production talks to its provider over TLS only, and takes only signed
    ID tokens: over plain http anyone on the path can read the client secret and forge the
    person; ``none`` accepts an ID token nobody signed."""
    from ledgerweb import settings_reference as reference

    if not settings.SSO["ENABLED"]:
        return []
    errors = []
    for setting in reference.REFERENCE.values():
        if not setting.name.startswith("LEDGERWEB_OIDC_"):
            continue
        if setting.name.endswith(("_ENDPOINT", "_URL")):
            value = reference.read(setting.name)
            if value and not value.lower().startswith("https://"):
                errors.append(
                    Error(
                        f"{setting.name} is {value}: single sign-on must reach its provider "
                        "over https.",
                        id="ledgerweb.E001",
                    )
                )
    if reference.read("LEDGERWEB_OIDC_SIGN_ALGO").strip().lower() == "none":
        errors.append(
            Error(
                "LEDGERWEB_OIDC_SIGN_ALGO is none: ID tokens would be taken unsigned.",
                hint="Use the provider's algorithm (RS256 for most).",
                id="ledgerweb.E002",
            )
        )
    return errors
