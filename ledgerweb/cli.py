"""The ``ledgerweb`` command that ``pip install`` gives: the server outside a checkout.

    ledgerweb serve [GUNICORN OPTIONS]     collect static files, then the dashboard and the API
    ledgerweb worker [RECONCILE OPTIONS]   the reconciliation worker (manage.py reconcile)
    ledgerweb migrate                      create or upgrade the database
    ledgerweb config plan|apply|dump ...   configuration as code (manage.py ledger_config)
    ledgerweb archive run|restore|verify   retention: archive settled attempts (docs/archive.md)
    ledgerweb demo [--no-demo]             the demo world, as scripts/run starts it
    ledgerweb COMMAND ...                  any management command (ledgerweb help lists them)

Data (the SQLite ledger, the generated secret key, collected static files) goes to
``LEDGERWEB_DATA_DIR``; every other setting comes from the environment as in the README.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ledgerweb.paths import IN_CHECKOUT, PACKAGE_DIR

# Short names for the commands a deployment runs; everything else is Django's own name.
ALIASES = {"worker": "reconcile", "config": "ledger_config"}
USAGE = __doc__.split("\n\n")[1]


def invoked_as() -> str:
    """The command people run management commands with here: ``ledgerweb`` in a process the
    installed command started (``ledgerweb serve``'s web workers too), ``manage.py`` in one
    the checkout's started; any other process (gunicorn or a test runner started directly)
    says ``manage.py`` in a checkout and ``ledgerweb`` installed from the wheel."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if program.startswith("ledgerweb"):  # "ledgerweb", "ledgerweb serve"
        return "ledgerweb"
    if program == "manage.py":
        return "manage.py"
    return "manage.py" if IN_CHECKOUT else "ledgerweb"


def command_line(command: str) -> str:
    """``command`` (a management command and its arguments, ``"ledger_config apply FILE"``) as
    the person who ran this process types it: ``manage.py ledger_config apply FILE``, or
    ``ledgerweb config apply FILE`` with the installed command's short names. Every message
    and hint that names a command says it through this."""
    if invoked_as() == "manage.py":
        return f"manage.py {command}"
    name, _, rest = command.partition(" ")
    short = {django: alias for alias, django in ALIASES.items()}.get(name, name)
    return " ".join(part for part in ("ledgerweb", short, rest) if part)


def main(argv: list[str] | None = None) -> int:
    """Run one ledgerweb command; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
    if not args or args[0] in ("-h", "--help"):
        print("usage: ledgerweb COMMAND [OPTIONS]\n")
        print(USAGE)
        print("\n`ledgerweb COMMAND --help` explains each command.")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        return serve(rest)
    if command == "demo":
        from reconciliation.demo_run import run_demo

        return run_demo(rest)
    return manage([ALIASES.get(command, command), *rest])


def manage(args: list[str]) -> int:
    """A Django management command, as ``manage.py`` runs it."""
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(["ledgerweb", *args])
    except ImproperlyConfigured as exc:  # a setting's bad value: its sentence, no traceback
        print(f"ledgerweb: configuration error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse and CommandError exit through here
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def serve(args: list[str]) -> int:
    """Collect static files, then run gunicorn with ledgerweb's configuration."""
    if "-h" in args or "--help" in args:
        print(
            "usage: ledgerweb serve [--skip-collectstatic] [GUNICORN OPTIONS]\n\n"
            "Serve the dashboard and the agent API with gunicorn (ledgerweb/gunicorn.conf.py;\n"
            "LEDGERWEB_BIND, LEDGERWEB_WORKERS, LEDGERWEB_THREADS). Static files are collected\n"
            "into LEDGERWEB_STATIC_ROOT first unless --skip-collectstatic is given."
        )
        return 0
    if "--skip-collectstatic" in args:
        args = [arg for arg in args if arg != "--skip-collectstatic"]
    else:
        status = manage(["collectstatic", "--no-input", "-v", "0"])
        if status:
            return status
    from gunicorn.app.wsgiapp import run

    config = str(PACKAGE_DIR / "gunicorn.conf.py")
    sys.argv = ["ledgerweb serve", "-c", config, *args, "ledgerweb.wsgi"]
    run()
    return 0
