"""Admin for the ledger's configuration: tools (and their provider), grants, ownership rules.

Attempts and their history are not edited here: they change only through the state machine.
"""

from django import forms
from django.contrib import admin

from attempts.models import Grant, OwnershipRule, Tool


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
