"""Write docs/settings.md and the README's short settings table from the declared reference
(ledgerweb/settings_reference.py), or check that they match it."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from ledgerweb import settings_reference as reference
from ledgerweb.paths import CHECKOUT_DIR, IN_CHECKOUT


def documents(root: Path) -> dict[Path, str]:
    """Each generated document and the text it should have today."""
    readme = root / "README.md"
    return {
        root / "docs" / "settings.md": reference.render_markdown(),
        readme: reference.with_readme_block(readme.read_text(encoding="utf-8")),
    }


class Command(BaseCommand):
    help = (
        "Generate docs/settings.md and the README's settings table from the settings "
        "declared in ledgerweb/settings_reference.py (--check: only report a difference; "
        "--print: print docs/settings.md)."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="exit with an error when a generated document differs from the declarations",
        )
        parser.add_argument(
            "--print",
            action="store_true",
            dest="print_only",
            help="print the reference instead of writing it",
        )

    def handle(self, *args, check: bool, print_only: bool, **options) -> None:
        if print_only:
            self.stdout.write(reference.render_markdown(), ending="")
            return
        if not IN_CHECKOUT:
            raise CommandError("the documents live in a checkout; use --print here")
        try:
            wanted = documents(CHECKOUT_DIR)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        stale = [
            path
            for path, text in wanted.items()
            if not path.exists() or path.read_text(encoding="utf-8") != text
        ]
        if check:
            if stale:
                names = ", ".join(str(p.relative_to(CHECKOUT_DIR)) for p in stale)
                raise CommandError(
                    f"{names} differ from ledgerweb/settings_reference.py: run "
                    "`manage.py settings_reference`"
                )
            self.stdout.write("settings documents match the declarations")
            return
        for path in stale:
            path.write_text(wanted[path], encoding="utf-8")
            self.stdout.write(f"wrote {path.relative_to(CHECKOUT_DIR)}")
        if not stale:
            self.stdout.write("settings documents already match the declarations")
