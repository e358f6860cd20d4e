"""Command-line options several management commands share, each with one meaning."""

from __future__ import annotations

from argparse import ArgumentParser

from django.core.management.base import CommandError

from attempts.actors import Actor
from attempts.config_history import operator


def add_actor_option(parser: ArgumentParser, doing: str) -> None:
    """``--actor NAME``: who the configuration history records for a command that changes who
    may do what (``doing``: "applies it", "revokes it"...). ``command_actor`` reads it."""
    parser.add_argument(
        "--actor",
        default=None,
        help=f"who {doing}, as recorded in the history (default: the operating-system user)",
    )


def command_actor(name: str | None) -> Actor:
    """The ``--actor`` given, else the operating-system user; a CommandError that says what
    is wrong when neither is usable."""
    try:
        return operator(name)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
