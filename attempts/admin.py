"""Admin for the ledger's configuration: tools (and their provider), grants, ownership rules,
agent tokens.

Attempts and their history are not edited here: they change only through the state machine.
"""

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from attempts.models import AgentToken, Grant, OwnershipRule, Tool


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "effect_class",
        "critical",
        "adapter",
        "timeout_seconds",
        "max_sends",
        "active",
    )
    list_filter = ("effect_class", "critical", "active")
    search_fields = ("name", "description")
    fieldsets = (
        (None, {"fields": ("name", "description", "effect_class", "critical", "active")}),
        (
            "Provider",
            {
                "fields": ("adapter", "dispatch_url", "lookup_url", "timeout_seconds", "max_sends"),
                "description": "adapter 'http' is the generic HTTP provider (docs/providers.md); "
                "or the dotted path of a custom adapter class.",
            },
        ),
    )

    def get_readonly_fields(self, request, obj=None):
        return ("name",) if obj is not None else ()


class GrantForm(forms.ModelForm):
    class Meta:
        model = Grant
        fields = ("tenant", "tool", "policy_version", "allowed_scopes", "active")

    def clean_allowed_scopes(self):
        scopes = self.cleaned_data["allowed_scopes"]
        if not isinstance(scopes, list) or not all(isinstance(s, str) and s for s in scopes):
            raise forms.ValidationError('a JSON list of non-empty strings, e.g. ["crm:write"]')
        return sorted(set(scopes))


@admin.register(Grant)
class GrantAdmin(admin.ModelAdmin):
    form = GrantForm
    list_display = ("tenant", "tool", "policy_version", "allowed_scopes", "active", "updated_at")
    list_filter = ("active", "tenant", "tool")
    search_fields = ("tenant__slug", "tool__name", "policy_version")


@admin.register(OwnershipRule)
class OwnershipRuleAdmin(admin.ModelAdmin):
    list_display = ("priority", "tenant_pattern", "tool_pattern", "owner")
    list_editable = ("tenant_pattern", "tool_pattern", "owner")
    list_display_links = ("priority",)
    ordering = ("priority", "id")


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    """Agent tokens: the secret is generated on add and shown once in a message; only its hash
    is kept. Revoke instead of deleting, so events keep naming a token that existed."""

    list_display = ["name", "prefix", "tenant_list", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix"]
    filter_horizontal = ["tenants"]
    actions = ["revoke_tokens"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["name", "tenants"]
        return [
            "name",
            "prefix",
            "tenants",
            "created_by",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return ["name", "prefix", "created_by", "created_at", "last_used_at", "revoked_at"]

    @admin.display(description="tenants")
    def tenant_list(self, obj: AgentToken) -> str:
        return ", ".join(obj.tenants.values_list("slug", flat=True))

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj: AgentToken, form, change: bool) -> None:
        if not change:
            obj.created_by = request.user
            raw = obj.rotate_secret()
            super().save_model(request, obj, form, change)
            messages.warning(
                request,
                f"The token for {obj.name} is {raw} - copy it now, it is not shown again.",
            )
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Revoke selected tokens")
    def revoke_tokens(self, request, queryset) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
