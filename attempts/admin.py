"""Admin registrations."""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils import timezone

from attempts.models import AgentToken


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
