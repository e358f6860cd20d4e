"""Where ledgerweb's shipped files are: the checkout's folders, or their installed copies.

In a checkout (``manage.py`` beside the packages) templates, static files and the published
documents (``docs/openapi.json``, ``docs/config.schema.json``) are read where they are edited.
Installed from a wheel, pyproject.toml puts the same folders inside the ``ledgerweb`` package.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT_DIR = PACKAGE_DIR.parent
IN_CHECKOUT = (CHECKOUT_DIR / "manage.py").is_file()


def shipped(folder: str) -> Path:
    """The folder ``templates``, ``static`` or ``docs``, wherever this installation keeps it."""
    return (CHECKOUT_DIR if IN_CHECKOUT else PACKAGE_DIR) / folder


def default_data_dir() -> Path:
    """``./var`` in the checkout; for an installed package, ``var`` under the working directory
    (a deployment sets ``LEDGERWEB_DATA_DIR``; docs/deploy.md)."""
    return (CHECKOUT_DIR if IN_CHECKOUT else Path.cwd()) / "var"
