"""System checks: configuration that would break the ledger's promises is reported at start-up."""

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError


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
            hint="Add an [[ownership_rules]] entry with `manage.py ledger_config apply`, or set "
            "LEDGERWEB_DEFAULT_OWNER to a username.",
            id="attempts.W001",
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
                hint="Make one with `manage.py ledger_log genkey --out FILE` and set "
                "LEDGERWEB_TLOG_KEY_FILE, or set LEDGERWEB_TLOG_SIGN_COMMAND and "
                "LEDGERWEB_TLOG_VERIFIER_KEY (docs/audit-chain.md).",
                id="attempts.W010",
            )
        ]
    try:
        log.signer()
        log.witnesses()
    except (log.LogKeyError, ValueError) as exc:
        return [Error(f"The transparency log's keys: {exc}", id="attempts.E010")]
    return []
