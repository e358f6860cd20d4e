"""The ledger's records, one module per concept (roles and tenancy, tools, approvals, the
attempt and its events, configuration history, checkpoints, tokens, notifications and SLAs,
counts, retention, key and effect indexes), re-exported here so ``from attempts.models import X``
and the migrations see one ``models`` module.

Only ``attempts.states`` changes ``Attempt.state``; everything else asks it.
"""

from attempts.models.approvals import (
    HELD_APPROVAL_KINDS as HELD_APPROVAL_KINDS,
)
from attempts.models.approvals import (
    Approval as Approval,
)
from attempts.models.approvals import (
    ApprovalCondition as ApprovalCondition,
)
from attempts.models.approvals import (
    ApprovalPolicy as ApprovalPolicy,
)
from attempts.models.approvals import (
    ApprovalPolicyQuerySet as ApprovalPolicyQuerySet,
)
from attempts.models.approvals import (
    ApprovalVerdict as ApprovalVerdict,
)
from attempts.models.approvals import (
    approval_terms as approval_terms,
)
from attempts.models.approvals import (
    approvers as approvers,
)
from attempts.models.approvals import (
    held_verdict as held_verdict,
)
from attempts.models.approvals import (
    review_verdict as review_verdict,
)
from attempts.models.attempts import (
    ATTEMPT_ID as ATTEMPT_ID,
)
from attempts.models.attempts import (
    ATTENTION_STATES as ATTENTION_STATES,
)
from attempts.models.attempts import (
    IN_FLIGHT_STATES as IN_FLIGHT_STATES,
)
from attempts.models.attempts import (
    MIN_PREFIX as MIN_PREFIX,
)
from attempts.models.attempts import (
    OWNED_STATES as OWNED_STATES,
)
from attempts.models.attempts import (
    PREFIX_FIELDS as PREFIX_FIELDS,
)
from attempts.models.attempts import (
    QUEUE_COUNT_CAP as QUEUE_COUNT_CAP,
)
from attempts.models.attempts import (
    RECOVERABLE_STATES as RECOVERABLE_STATES,
)
from attempts.models.attempts import (
    TERMINAL_STATES as TERMINAL_STATES,
)
from attempts.models.attempts import (
    Attempt as Attempt,
)
from attempts.models.attempts import (
    AttemptQuerySet as AttemptQuerySet,
)
from attempts.models.attempts import (
    ByteOrderCharField as ByteOrderCharField,
)
from attempts.models.attempts import (
    State as State,
)
from attempts.models.attempts import (
    attention_age as attention_age,
)
from attempts.models.attempts import (
    canonical_attempt_id as canonical_attempt_id,
)
from attempts.models.attempts import (
    new_attempt_id as new_attempt_id,
)
from attempts.models.attempts import (
    prefix_value as prefix_value,
)
from attempts.models.attempts import (
    search_key as search_key,
)
from attempts.models.checkpoints import (
    Checkpoint as Checkpoint,
)
from attempts.models.checkpoints import (
    CheckpointLeaf as CheckpointLeaf,
)
from attempts.models.checkpoints import (
    CheckpointSignature as CheckpointSignature,
)
from attempts.models.checkpoints import (
    LogEntry as LogEntry,
)
from attempts.models.checkpoints import (
    LogNode as LogNode,
)
from attempts.models.checkpoints import (
    WitnessState as WitnessState,
)
from attempts.models.configuration import (
    TENANT_SUBJECT_KINDS as TENANT_SUBJECT_KINDS,
)
from attempts.models.configuration import (
    ConfigEvent as ConfigEvent,
)
from attempts.models.configuration import (
    ConfigEventQuerySet as ConfigEventQuerySet,
)
from attempts.models.counts import (
    LiveDayCount as LiveDayCount,
)
from attempts.models.counts import (
    TerminalCount as TerminalCount,
)
from attempts.models.counts import (
    TerminalCountPass as TerminalCountPass,
)
from attempts.models.counts import (
    TerminalDayCount as TerminalDayCount,
)
from attempts.models.events import (
    APPROVAL_ACTION as APPROVAL_ACTION,
)
from attempts.models.events import (
    DECISIVE_ACTIONS as DECISIVE_ACTIONS,
)
from attempts.models.events import (
    MOVED as MOVED,
)
from attempts.models.events import (
    ActorKind as ActorKind,
)
from attempts.models.events import (
    AttemptEvent as AttemptEvent,
)
from attempts.models.keys import (
    ProviderEffect as ProviderEffect,
)
from attempts.models.keys import (
    RecordedKey as RecordedKey,
)
from attempts.models.keys import (
    key_digest as key_digest,
)
from attempts.models.notifications import (
    NoticeKind as NoticeKind,
)
from attempts.models.notifications import (
    NoticeStatus as NoticeStatus,
)
from attempts.models.notifications import (
    Notification as Notification,
)
from attempts.models.notifications import (
    NotificationRoute as NotificationRoute,
)
from attempts.models.notifications import (
    NotifyCursor as NotifyCursor,
)
from attempts.models.notifications import (
    PersonSettings as PersonSettings,
)
from attempts.models.notifications import (
    SlackIdentity as SlackIdentity,
)
from attempts.models.notifications import (
    SlackMessage as SlackMessage,
)
from attempts.models.notifications import (
    SlackRequest as SlackRequest,
)
from attempts.models.notifications import (
    SlaEscalation as SlaEscalation,
)
from attempts.models.notifications import (
    SlaPolicy as SlaPolicy,
)
from attempts.models.retention import (
    Archive as Archive,
)
from attempts.models.retention import (
    ArchivedAttempt as ArchivedAttempt,
)
from attempts.models.retention import (
    ArchivedAttemptQuerySet as ArchivedAttemptQuerySet,
)
from attempts.models.retention import (
    ErasureRequest as ErasureRequest,
)
from attempts.models.retention import (
    RetentionRule as RetentionRule,
)
from attempts.models.roles import (
    ROLE_RANK as ROLE_RANK,
)
from attempts.models.roles import (
    Membership as Membership,
)
from attempts.models.roles import (
    Role as Role,
)
from attempts.models.roles import (
    SsoGroupRole as SsoGroupRole,
)
from attempts.models.roles import (
    SsoIdentity as SsoIdentity,
)
from attempts.models.roles import (
    Tenant as Tenant,
)
from attempts.models.roles import (
    has_role as has_role,
)
from attempts.models.roles import (
    highest_role as highest_role,
)
from attempts.models.roles import (
    read_people as read_people,
)
from attempts.models.roles import (
    role_rank as role_rank,
)
from attempts.models.roles import (
    sso_groups as sso_groups,
)
from attempts.models.roles import (
    tenant_roles as tenant_roles,
)
from attempts.models.roles import (
    tenants_where as tenants_where,
)
from attempts.models.tokens import (
    AgentIdentity as AgentIdentity,
)
from attempts.models.tokens import (
    AgentToken as AgentToken,
)
from attempts.models.tokens import (
    LoginThrottle as LoginThrottle,
)
from attempts.models.tools import (
    ARGUMENT_NAME as ARGUMENT_NAME,
)
from attempts.models.tools import (
    EffectClass as EffectClass,
)
from attempts.models.tools import (
    Grant as Grant,
)
from attempts.models.tools import (
    OwnershipRule as OwnershipRule,
)
from attempts.models.tools import (
    Tool as Tool,
)
from attempts.models.tools import (
    adapter_names as adapter_names,
)
from attempts.models.tools import (
    validate_adapter_name as validate_adapter_name,
)
