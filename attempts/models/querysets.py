"""What the ledger's querysets share beyond Django's own."""

from __future__ import annotations

from typing import Any, Self

from django.db import models


class LedgerQuerySet(models.QuerySet):
    def where_given(self, **lookups: Any) -> Self:
        """Narrowed by each lookup that has a value: a filter a person left empty ("" or None)
        is no filter. The screens' and exports' filter forms use it."""
        return self.filter(**{lookup: value for lookup, value in lookups.items() if value})
