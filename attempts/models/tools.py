"""Tools agents call, their effect class and provider, and what a tenant may do with each
(grants); who owns a tool's attention work (ownership rules).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from attempts.models.roles import Tenant
from attempts.money import known_currency


class EffectClass(models.TextChoices):
    IDEMPOTENT = "idempotent", "Idempotent (provider honours the key, has a lookup)"
    RECONCILABLE = "reconcilable", "Reconcilable (lookup only)"
    MANUAL = "manual", "Manual (no key, no lookup)"


def adapter_names() -> list[str]:
    """The adapter names a tool may choose: ``settings.LEDGER["ADAPTERS"]``, never a path."""
    return sorted(settings.LEDGER["ADAPTERS"])


def validate_adapter_name(value: str) -> None:
    if value not in settings.LEDGER["ADAPTERS"]:
        raise ValidationError(
            f"unknown adapter {value!r}: choose one of {', '.join(adapter_names())}"
        )


# A top-level argument's name a display hint may point at (a JSON key path never: no "__").
ARGUMENT_NAME = RegexValidator(
    r"^(?!.*__)[A-Za-z][A-Za-z0-9_]*$", "a top-level argument's name (letters, digits, _)"
)


class Tool(models.Model):
    """A tool agents may call, its effect class, and how to reach its provider.

    ``adapter`` names one of the adapters settings list (``LEDGER["ADAPTERS"]``): ``http`` is
    the generic HTTP provider protocol, ``stripe`` Stripe payment intents (see
    ``reconciliation/providers``).
    """

    name = models.CharField(primary_key=True, max_length=100)
    description = models.CharField(max_length=300, blank=True)
    effect_class = models.CharField(max_length=16, choices=EffectClass.choices)
    critical = models.BooleanField(
        default=False,
        help_text="Payments, deletions, messages, deployments: never retried without a person, "
        "and a linked retry needs two distinct reviewers.",
    )
    adapter = models.CharField(
        max_length=200,
        default="http",
        validators=[validate_adapter_name],
        help_text="One of the adapters this deployment lists (LEDGER['ADAPTERS']).",
    )
    dispatch_url = models.URLField(max_length=500, blank=True)
    lookup_url = models.URLField(max_length=500, blank=True)
    timeout_seconds = models.FloatField(default=10.0)
    max_sends = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Overrides LEDGER['MAX_SENDS'] for this tool."
    )
    active = models.BooleanField(default=True)
    # Display hints (attempts/money.py): which argument is an amount in the currency's minor
    # units, and its currency, given as a code or named by another argument. Display only.
    amount_arg = models.CharField(
        max_length=100,
        blank=True,
        validators=[ARGUMENT_NAME],
        help_text="The argument holding an amount in minor units.",
    )
    currency = models.CharField(
        max_length=3,
        blank=True,
        validators=[RegexValidator(r"^[A-Z]{3}$", "an ISO 4217 code such as EUR")],
        help_text="The amount's currency (ISO 4217), when every call uses the same one.",
    )
    currency_arg = models.CharField(
        max_length=100,
        blank=True,
        validators=[ARGUMENT_NAME],
        help_text="The argument holding the currency's code.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Display hints that can be read: an amount names its currency one way."""
        if self.currency and self.currency_arg:
            raise ValidationError({"currency_arg": "give the currency or its argument, not both"})
        if self.amount_arg and not (self.currency or self.currency_arg):
            raise ValidationError(
                {"amount_arg": "an amount needs its currency: set currency or currency_arg"}
            )
        if self.currency and not known_currency(self.currency):
            raise ValidationError({"currency": f"{self.currency} is not an ISO 4217 currency"})

    @property
    def approvals_needed(self) -> int:
        """The one home of "a critical tool needs two approvals": distinct reviewers who must
        approve a linked attempt or retry of this tool."""
        return 2 if self.critical else 1

    @classmethod
    def approvals_needed_for(cls, tool_name: str) -> int:
        """``approvals_needed`` by name (an unconfigured tool needs one)."""
        critical = cls.objects.filter(name=tool_name).values_list("critical", flat=True).first()
        return cls(critical=bool(critical)).approvals_needed


class Grant(models.Model):
    """What a tenant may do with a tool now: the authority intents are recorded and sent under."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="grants")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="grants")
    policy_version = models.CharField(max_length=64)
    allowed_scopes = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool"], name="grant_unique_tenant_tool")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.tool_id}@{self.policy_version}"


class OwnershipRule(models.Model):
    """Who owns attention work: tenant and tool glob patterns to a person. Lowest priority wins."""

    tenant_pattern = models.CharField(max_length=100, default="*")
    tool_pattern = models.CharField(max_length=100, default="*")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    priority = models.PositiveIntegerField(default=100)

    class Meta:
        ordering = ["priority", "id"]

    def __str__(self) -> str:
        return f"{self.tenant_pattern}/{self.tool_pattern} -> {self.owner}"
