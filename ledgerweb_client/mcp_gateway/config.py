"""The MCP gateway's configuration file (TOML), read by the gateway and by the ledger's MCP
provider adapter alike, so both ends agree on upstreams, keys and lookups.

::

    [ledger]
    url = "http://127.0.0.1:8000"     # or the LEDGERWEB_URL environment variable
    token_env = "LEDGERWEB_TOKEN"     # the agent token is read from this variable, never the file
    tenant = "acme"                   # defaults for calls whose _meta does not name them
    task_id = "support-agent"

    [upstreams.tickets]               # stdio: the gateway starts the command
    command = "python"
    args = ["-m", "tickets_server"]
    env = { TICKETS_DB = "/srv/tickets.db" }

    [upstreams.mail]                  # streamable HTTP
    url = "http://127.0.0.1:9000/mcp"

    [tools.create_ticket]             # an upstream tool with a side effect
    upstream = "tickets"              # needed when there is more than one upstream
    ledger_tool = "open_ticket"       # the ledger's tool name (default: the same name)
    key = "ticket:{tenant}:{args.customer}:{args.title}"
    receipt = true                    # the upstream's result is a durable receipt: confirm with it
    request_id = "id"                 # field of the structured result with the provider's id
    lookup_tool = "find_ticket"       # read-only upstream tool reconciliation asks
    lookup_args = { idempotency_key = "{key}" }

Standard library only (``tomllib``; ``tomli``, its backport, on Python 3.10): the server reads it
without the MCP SDK's help.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the mcp extra installs the backport there
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]  # 3.10 only

from ..guard import KeyTemplate

__all__ = [
    "ConfigError",
    "GatewayConfig",
    "LedgerSettings",
    "ToolConfig",
    "Upstream",
    "load_config",
    "parse_config",
]

ERROR_RESULTS = ("unknown", "refused", "retryable")
# The longest a held call keeps its MCP request open before the pending answer.
MAX_APPROVAL_WAIT = 60
KEY_NAMES = ("tenant", "task_id", "tool")
LOOKUP_NAMES = ("tenant", "tool", "key", "attempt_id", "args_hash")


class ConfigError(ValueError):
    """The configuration file is unusable; the message names the file and the setting."""


@dataclass(frozen=True)
class LedgerSettings:
    url: str = ""
    token_env: str = "LEDGERWEB_TOKEN"  # noqa: S105 (the variable that holds it)
    tenant: str | None = None
    task_id: str | None = None
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class Upstream:
    """One upstream MCP server: a command to start (stdio) or a streamable HTTP URL."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable-http"


@dataclass(frozen=True)
class ToolConfig:
    """How one upstream tool with a side effect is recorded (see the module docstring)."""

    name: str
    upstream: str
    ledger_tool: str
    key: KeyTemplate
    receipt: bool = False
    request_id: str | None = None
    receipt_fields: tuple[str, ...] | None = None
    timeout_seconds: float = 30.0
    error_result: str = "unknown"
    #: Seconds a call an approval policy holds waits (a long poll) before the gateway answers
    #: it as pending approval; 0 answers at once.
    approval_wait_seconds: float = 0.0
    lookup_tool: str | None = None
    lookup_args: Mapping[str, Any] = field(default_factory=dict)

    def lookup_arguments(self, values: Mapping[str, str], args: Mapping[str, Any]) -> Any:
        """The lookup tool's arguments: ``lookup_args`` with every string rendered as a
        template over the recorded call (``{key}``, ``{attempt_id}``, ``{args.<name>}``...)."""

        def render(value: Any) -> Any:
            if isinstance(value, str):
                return KeyTemplate(value, names=LOOKUP_NAMES).render(args, **values)
            if isinstance(value, list):
                return [render(item) for item in value]
            if isinstance(value, dict):
                return {name: render(item) for name, item in value.items()}
            return value

        return render(dict(self.lookup_args))


@dataclass(frozen=True)
class GatewayConfig:
    path: str
    ledger: LedgerSettings
    upstreams: Mapping[str, Upstream]
    tools: Mapping[str, ToolConfig]

    def tool_for_ledger_tool(self, ledger_tool: str) -> ToolConfig | None:
        """The gateway tool recorded under the ledger's ``ledger_tool`` name."""
        for tool in self.tools.values():
            if tool.ledger_tool == ledger_tool:
                return tool
        return None


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table")
    return value


def _string(where: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be a non-empty string")
    return value


def _number(where: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{where} must be a positive number")
    return float(value)


def _no_unknown(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}")


def _upstream(name: str, table: dict[str, Any]) -> Upstream:
    where = f"[upstreams.{name}]"
    _no_unknown(where, table, {"command", "args", "env", "cwd", "url"})
    command = _string(f"{where} command", table.get("command"), optional=True)
    url = _string(f"{where} url", table.get("url"), optional=True)
    if bool(command) == bool(url):
        raise ConfigError(f"{where} needs exactly one of command (stdio) or url (HTTP)")
    if url and not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where} url must start with http:// or https://")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise ConfigError(f"{where} args must be a list of strings")
    env = table.get("env")
    if env is not None and (
        not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())
    ):
        raise ConfigError(f"{where} env must be a table of strings")
    return Upstream(
        name=name,
        command=command,
        args=tuple(args),
        env=env,
        cwd=_string(f"{where} cwd", table.get("cwd"), optional=True),
        url=url,
    )


def _tool(name: str, table: dict[str, Any], upstreams: Mapping[str, Upstream]) -> ToolConfig:
    where = f"[tools.{name}]"
    _no_unknown(
        where,
        table,
        {
            "upstream",
            "ledger_tool",
            "key",
            "receipt",
            "request_id",
            "receipt_fields",
            "timeout_seconds",
            "error_result",
            "approval_wait_seconds",
            "lookup_tool",
            "lookup_args",
        },
    )
    upstream = table.get("upstream")
    if upstream is None:
        if len(upstreams) != 1:
            raise ConfigError(f"{where} needs upstream = one of {', '.join(sorted(upstreams))}")
        upstream = next(iter(upstreams))
    if upstream not in upstreams:
        raise ConfigError(f"{where} upstream {upstream!r} is not configured under [upstreams]")
    try:
        key = KeyTemplate(str(_string(f"{where} key", table.get("key"))), names=KEY_NAMES)
    except ValueError as exc:
        raise ConfigError(f"{where} key: {exc}") from None
    receipt = table.get("receipt", False)
    if not isinstance(receipt, bool):
        raise ConfigError(f"{where} receipt must be true or false")
    fields = table.get("receipt_fields")
    if fields is not None and (
        not isinstance(fields, list) or not all(isinstance(f, str) for f in fields)
    ):
        raise ConfigError(f"{where} receipt_fields must be a list of field names")
    error_result = table.get("error_result", "unknown")
    if error_result not in ERROR_RESULTS:
        raise ConfigError(f"{where} error_result must be one of {', '.join(ERROR_RESULTS)}")
    approval_wait = table.get("approval_wait_seconds", 0)
    if (
        isinstance(approval_wait, bool)
        or not isinstance(approval_wait, int | float)
        or not 0 <= approval_wait <= MAX_APPROVAL_WAIT
    ):
        raise ConfigError(
            f"{where} approval_wait_seconds must be a number from 0 to {MAX_APPROVAL_WAIT}"
        )
    lookup_tool = _string(f"{where} lookup_tool", table.get("lookup_tool"), optional=True)
    lookup_args = table.get("lookup_args", {"idempotency_key": "{key}"})
    if not isinstance(lookup_args, dict):
        raise ConfigError(f"{where} lookup_args must be a table")
    tool = ToolConfig(
        name=name,
        upstream=upstream,
        ledger_tool=str(_string(f"{where} ledger_tool", table.get("ledger_tool", name))),
        key=key,
        receipt=receipt,
        request_id=_string(f"{where} request_id", table.get("request_id"), optional=True),
        receipt_fields=tuple(fields) if fields is not None else None,
        timeout_seconds=_number(f"{where} timeout_seconds", table.get("timeout_seconds"), 30.0),
        error_result=error_result,
        approval_wait_seconds=float(approval_wait),
        lookup_tool=lookup_tool,
        lookup_args=lookup_args,
    )
    try:  # every template in lookup_args must parse now, not at the first lookup
        _check_templates(lookup_args)
    except ValueError as exc:
        raise ConfigError(f"{where} lookup_args: {exc}") from None
    return tool


def _check_templates(value: Any) -> None:
    if isinstance(value, str):
        KeyTemplate(value, names=LOOKUP_NAMES)
    elif isinstance(value, list):
        for item in value:
            _check_templates(item)
    elif isinstance(value, dict):
        for item in value.values():
            _check_templates(item)


def parse_config(data: Mapping[str, Any], *, path: str = "<config>") -> GatewayConfig:
    """Check a decoded configuration and build the ``GatewayConfig``; ``ConfigError`` names
    the first problem."""
    try:
        _no_unknown("the file", data, {"ledger", "upstreams", "tools"})
        ledger_table = _table("[ledger]", data.get("ledger", {}))
        _no_unknown(
            "[ledger]", ledger_table, {"url", "token_env", "tenant", "task_id", "timeout_seconds"}
        )
        ledger = LedgerSettings(
            url=_string("[ledger] url", ledger_table.get("url"), optional=True) or "",
            token_env=str(
                _string("[ledger] token_env", ledger_table.get("token_env", "LEDGERWEB_TOKEN"))
            ),
            tenant=_string("[ledger] tenant", ledger_table.get("tenant"), optional=True),
            task_id=_string("[ledger] task_id", ledger_table.get("task_id"), optional=True),
            timeout_seconds=_number(
                "[ledger] timeout_seconds", ledger_table.get("timeout_seconds"), 10.0
            ),
        )
        upstream_tables = _table("[upstreams]", data.get("upstreams", {}))
        if not upstream_tables:
            raise ConfigError("[upstreams] must name at least one upstream MCP server")
        upstreams = {
            name: _upstream(name, _table(f"[upstreams.{name}]", table))
            for name, table in upstream_tables.items()
        }
        tool_tables = _table("[tools]", data.get("tools", {}))
        tools = {
            name: _tool(name, _table(f"[tools.{name}]", table), upstreams)
            for name, table in tool_tables.items()
        }
        ledger_tools = [tool.ledger_tool for tool in tools.values()]
        duplicates = sorted({name for name in ledger_tools if ledger_tools.count(name) > 1})
        if duplicates:
            raise ConfigError(
                f"ledger_tool {', '.join(duplicates)} is used by more than one tool; each "
                "needs its own, so that reconciliation knows which upstream tool to ask"
            )
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return GatewayConfig(path=path, ledger=ledger, upstreams=upstreams, tools=tools)


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    """Read and check the TOML file at ``path``."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, path=str(path))
