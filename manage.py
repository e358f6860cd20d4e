#!/usr/bin/env python
"""Django's command-line utility for ledgerweb."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A setting's bad value: its sentence (docs/settings.md), not a traceback.
        sys.exit(f"manage.py: configuration error: {exc}")


if __name__ == "__main__":
    main()
