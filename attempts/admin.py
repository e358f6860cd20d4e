"""Admin for configuration: tools (and their provider), grants, ownership rules, agent tokens,
tenants and memberships (users are Django's own admin, with their memberships inline). Attempts and their
history are read-only here: attempts change only through the state machine, and history is
append-only."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from attempts import config_history
from attempts.models import (
    AgentToken,
    Approval,
    ApprovalPolicy,
    Archive,
    ArchivedAttempt,
    Attempt,
    AttemptEvent,
    Grant,
    LoginThrottle,
    Membership,
    Notification,
    NotificationRoute,
    OwnershipRule,
    PersonSettings,
    RetentionRule,
    SlackIdentity,
    SlaPolicy,
    Tenant,
    Tool,
    adapter_names,
    tenants_where,
)
from attempts.views.auth import ThrottledAdminAuthenticationForm


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


class UserMembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["tenant"]
    verbose_name = "tenant membership"


class PersonSettingsInline(admin.StackedInline):
    model = PersonSettings
    extra = 0
    max_num = 1
    verbose_name = "dashboard and notification settings"


class LedgerUserAdmin(UserAdmin):
    """Django's user admin, plus the person's tenant memberships and roles on the same page."""

    inlines = [*UserAdmin.inlines, UserMembershipInline, PersonSettingsInline]

    def get_readonly_fields(self, request, obj=None):
        # A username names the person's memberships and rules in the history: not renamed here.
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "username") if obj is not None else fields


# One login throttle for /login/ and /admin/login/ (attempts/views/auth.py).
admin.site.login_form = ThrottledAdminAuthenticationForm

User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, LedgerUserAdmin)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable by staff with the view permission; never added, changed or deleted here."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class EventInline(admin.TabularInline):
    model = AttemptEvent
    fields = ["created_at", "action", "actor_kind", "actor", "from_state", "to_state", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ["id"]

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = [
        "attempt_id",
        "tenant",
        "tool_name",
        "state",
        "owner",
        "created_at",
        "provider_request_id",
    ]
    list_filter = ["state", "tenant", "tool_name"]
    search_fields = ["=attempt_id", "=idempotency_key", "=provider_request_id", "=task_id"]
    ordering = ["created_at", "id"]
    list_select_related = ["owner", "tenant"]
    inlines = [EventInline]

    def get_queryset(self, request: HttpRequest):
        # Staff see the tenants they belong to (superusers see all), like the dashboard.
        return super().get_queryset(request).visible_to(request.user)


@admin.register(AttemptEvent)
class AttemptEventAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "attempt",
        "action",
        "actor_kind",
        "actor",
        "from_state",
        "to_state",
        "created_at",
    ]
    list_filter = ["action", "actor_kind"]
    search_fields = ["=attempt__attempt_id", "actor"]
    list_select_related = ["attempt"]

    def get_queryset(self, request: HttpRequest):
        qs = super().get_queryset(request)
        return qs.filter(attempt__tenant_id__in=tenants_where(request.user))


@admin.register(LoginThrottle)
class LoginThrottleAdmin(admin.ModelAdmin):
    """Lets an admin lift a lock-out early (delete the row)."""

    list_display = ["username_shown", "address", "failures", "first_failure_at", "locked_until"]
    readonly_fields = ["username", "address", "key", "failures", "first_failure_at", "locked_until"]
    search_fields = ["username", "address"]

    @admin.display(description="username", ordering="username")
    def username_shown(self, obj: LoginThrottle) -> str:
        return obj.username or "(every username from this address)"

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class ConfigHistoryAdmin(admin.ModelAdmin):
    """Admin for configuration that decides authority or review. Every save and delete of a
    declared model, here or anywhere, is recorded in the tamper-evident history with the
    person who made it (``attempts.config_history``; the person comes from its middleware)."""


DISPLAY_FIELDS = ("amount_arg", "currency", "currency_arg")


class ToolForm(forms.ModelForm):
    # A choice among the adapters settings list, never a free-text import path.
    adapter = forms.ChoiceField(choices=lambda: [(name, name) for name in adapter_names()])

    class Meta:
        model = Tool
        # The display hints decide nothing, so the history does not record them.
        fields = ("name", "description", *config_history.TOOL_FIELDS, *DISPLAY_FIELDS)


@admin.register(Tool)
class ToolAdmin(ConfigHistoryAdmin):
    form = ToolForm
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
                "description": "adapter: a name from the deployment's list (LEDGER['ADAPTERS']): "
                "'http' is the generic HTTP provider (docs/providers.md), 'mcp' a tool behind the "
                "MCP gateway (docs/integrations.md), 'stripe' Stripe payment intents; custom "
                "adapters are added by the deployment (LEDGERWEB_ADAPTERS).",
            },
        ),
        (
            "Display",
            {
                "fields": DISPLAY_FIELDS,
                "description": "Shown as money on the dashboard: the argument holding an amount "
                "in the currency's minor units, and its currency (a code, or the argument that "
                "holds one). Display only: it decides nothing.",
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
class GrantAdmin(ConfigHistoryAdmin):
    form = GrantForm
    list_display = ("tenant", "tool", "policy_version", "allowed_scopes", "active", "updated_at")
    list_filter = ("active", "tenant", "tool")
    search_fields = ("tenant__slug", "tool__name", "policy_version")


@admin.register(OwnershipRule)
class OwnershipRuleAdmin(ConfigHistoryAdmin):
    list_display = ("priority", "tenant_pattern", "tool_pattern", "owner")
    list_editable = ("tenant_pattern", "tool_pattern", "owner")
    list_display_links = ("priority",)
    ordering = ("priority", "id")
    autocomplete_fields = ("owner",)


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(ConfigHistoryAdmin):
    """Approval before dispatch; the model's clean() refuses a bad CEL condition or too few
    approvals on a critical tool, and every change is in the history with its new version."""

    list_display = (
        "name",
        "tool",
        "condition",
        "approvals_needed",
        "approver_role",
        "approval_ttl",
        "max_wait",
        "active",
        "version",
    )
    list_filter = ("active", "tool", "approver_role")
    search_fields = ("name", "tool__name", "condition")
    readonly_fields = ("version", "updated_at")


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("attempt", "approver", "policy", "policy_version", "created_at", "expires_at")
    list_filter = ("policy",)
    search_fields = ("attempt__attempt_id", "approver__username")
    list_select_related = ("attempt", "approver", "policy")

    def get_queryset(self, request: HttpRequest):
        return (
            super().get_queryset(request).filter(attempt__tenant_id__in=tenants_where(request.user))
        )


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
        count = sum(token.revoke() for token in queryset.filter(revoked_at__isnull=True))
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)


@admin.register(SlaPolicy)
class SlaPolicyAdmin(admin.ModelAdmin):
    """How old UNKNOWN and MANUAL_REVIEW work may grow per tool (optionally per tenant), and
    who hears of a breach."""

    list_display = [
        "tool",
        "tenant",
        "unknown_warn_after",
        "unknown_breach_after",
        "review_warn_after",
        "review_breach_after",
        "escalate_to",
    ]
    list_filter = ["tool", "tenant"]
    autocomplete_fields = ["escalate_to"]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    """The outbox, read-only: what was sent to whom, and what is still trying."""

    list_display = [
        "id",
        "kind",
        "channel",
        "recipient",
        "status",
        "tries",
        "created_at",
        "sent_at",
    ]
    list_filter = ["status", "kind", "channel"]
    search_fields = ["recipient__username", "subject"]
    list_select_related = ["recipient"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest):
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(recipient=request.user)


@admin.register(NotificationRoute)
class NotificationRouteAdmin(ReadOnlyAdmin):
    """Notification routes are configuration as code (``ledger_config``, [[notification_routes]]),
    each change in the history; the admin shows them."""

    list_display = ["name", "tenant_pattern", "tool_pattern", "kinds", "active"]
    list_filter = ["active"]
    search_fields = ["name", "tenant_pattern", "tool_pattern"]


@admin.register(SlackIdentity)
class SlackIdentityAdmin(ConfigHistoryAdmin):
    """A Slack user an administrator verified as a ledger user (docs/integrations.md, Slack
    approvals): that Slack user's clicks decide as the ledger user, by the dashboard's rules."""

    list_display = ["team_id", "slack_user_id", "user"]
    search_fields = ["slack_user_id", "user__username"]
    raw_id_fields = ["user"]


@admin.register(RetentionRule)
class RetentionRuleAdmin(ConfigHistoryAdmin):
    """How long settled attempts stay before ``ledgerweb archive run`` (docs/archive.md)."""

    list_display = ("tenant", "tool", "archive_after_days")
    list_filter = ("tenant", "tool")


@admin.register(Archive)
class ArchiveAdmin(ReadOnlyAdmin):
    """Archives span tenants: superusers only. Written by ``ledgerweb archive run``."""

    list_display = ("name", "created_at", "attempts", "events", "location", "manifest_sha256")

    def has_view_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.is_superuser

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser


@admin.register(ArchivedAttempt)
class ArchivedAttemptAdmin(ReadOnlyAdmin):
    """Where each removed attempt went, for its tenants' people."""

    list_display = ("attempt_id", "tenant_id", "tool_name", "idempotency_key", "archive")
    search_fields = ("attempt_id", "idempotency_key", "provider_request_id")
    list_select_related = ("archive",)

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).filter(tenant_id__in=tenants_where(request.user))
