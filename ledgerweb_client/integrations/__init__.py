"""Framework adapters: agent tools whose every call goes through the ledger.

* ``ledgerweb_client.integrations.decorator``: ``@ledgered`` for plain Python tool functions
  (no extra needed; re-exported here);
* ``ledgerweb_client.integrations.langchain``: LangChain / LangGraph tools (extra ``langchain``);
* ``ledgerweb_client.integrations.openai_agents``: OpenAI Agents SDK function tools (extra
  ``openai-agents``);
* ``ledgerweb_client.integrations.pydantic_ai``: Pydantic AI tools, held calls as deferred tool
  calls (extra ``pydantic-ai``);
* ``ledgerweb_client.integrations.agent_framework``: Microsoft Agent Framework tools whose
  approval the ledger decides (extra ``agent-framework``).

Each records the intent, claims, sends and confirms through ``LedgerClient`` with the shared
``ledgerweb_client.guard``, and turns the ledger's refusals into the framework's tool errors.
See ``docs/integrations.md``.
"""

from ..guard import (
    LedgerContext,
    Recorded,
    ToolCallAwaitingApproval,
    ToolCallConflict,
    ToolCallError,
    ToolCallFailed,
    ToolCallInvalid,
    ToolCallLedgerUnavailable,
    ToolCallNotDispatchable,
    ToolCallNotGranted,
    ToolCallOutcomeUnknown,
    ToolCallRejected,
    ToolSpec,
    current_ledger,
    use_ledger,
)
from .decorator import ledgered

__all__ = [
    "LedgerContext",
    "Recorded",
    "ToolCallAwaitingApproval",
    "ToolCallConflict",
    "ToolCallError",
    "ToolCallFailed",
    "ToolCallInvalid",
    "ToolCallLedgerUnavailable",
    "ToolCallNotDispatchable",
    "ToolCallNotGranted",
    "ToolCallOutcomeUnknown",
    "ToolCallRejected",
    "ToolSpec",
    "current_ledger",
    "ledgered",
    "use_ledger",
]
