"""``ledgerweb-mcp-gateway init --upstream ...``: draft a gateway configuration and a
``ledger_config`` fragment from what an upstream MCP server says about its own tools.

The upstream's ``tools/list`` is read with each tool's annotations (MCP's ``ToolAnnotations``)
and every tool gets a choice, written with the reason beside it:

- ``readOnlyHint``: passes through the gateway unrecorded (not in ``[tools.*]``);
- otherwise a side effect, recorded in the ledger: a ``[tools.NAME]`` table with an idempotency
  key built from its required arguments, and a ledger tool in the fragment: ``idempotent`` when
  ``idempotentHint`` says so, else ``manual`` (a person settles an unknown outcome until a lookup
  tool is configured);
- ``destructiveHint`` (true unless the server says otherwise, as MCP's defaults have it): the
  ledger tool is ``critical`` and a suggested approval policy holds every call for two people.

Annotations are hints a server gives about itself, and a server can misdescribe its tools: the
files are drafts for a person to review. Nothing is applied; the command refuses to overwrite
files (``--force`` does) and prints what to do next.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Upstream

__all__ = ["Choice", "choose", "gateway_toml", "ledger_toml", "main", "read_tools"]

SLUG = re.compile(r"[^-a-zA-Z0-9_]+")


@dataclass
class Choice:
    """What ``init`` suggests for one upstream tool, and why (the comment a person reviews)."""

    name: str
    recorded: bool
    effect_class: str = ""
    critical: bool = False
    hold: bool = False
    key: str = ""
    why: list[str] = field(default_factory=list)


def _toml(value: Any) -> str:
    """A TOML value: JSON's strings, numbers, booleans and arrays are TOML's too."""
    return json.dumps(value, ensure_ascii=False)


def _hint(annotations: Any, name: str) -> bool | None:
    value = getattr(annotations, name, None) if annotations is not None else None
    return value if isinstance(value, bool) else None


def choose(tool: Any) -> Choice:
    """The suggestion for one tool of ``tools/list`` (an SDK ``Tool``)."""
    notes = getattr(tool, "annotations", None)
    read_only = _hint(notes, "read_only_hint")
    destructive = _hint(notes, "destructive_hint")
    idempotent = _hint(notes, "idempotent_hint")
    seen = {"readOnlyHint": read_only, "destructiveHint": destructive, "idempotentHint": idempotent}
    said = ", ".join(f"{k}={str(v).lower()}" for k, v in seen.items() if v is not None)
    why = [f"the server says: {said or 'nothing (no annotations)'}"]
    if read_only:
        why.append("read-only: passes through the gateway unrecorded")
        return Choice(tool.name, recorded=False, why=why)
    schema = getattr(tool, "input_schema", None) or {}
    required = [str(n) for n in schema.get("required", []) if isinstance(n, str)]
    key = ":".join([tool.name, "{tenant}", *(f"{{args.{n}}}" for n in required)])
    why.append(
        "a side effect: recorded in the ledger; the key is built from its required arguments "
        f"({', '.join(required) or 'none'}): check that it names one effect"
    )
    choice = Choice(tool.name, recorded=True, key=key, why=why)
    if idempotent:
        choice.effect_class = "idempotent"
        why.append("idempotentHint: the ledger's idempotent class (sending it again is harmless)")
    else:
        choice.effect_class = "manual"
        why.append(
            "not idempotent: manual (a person settles an unknown outcome); make it "
            "reconcilable once a lookup_tool is configured"
        )
    if destructive is not False:
        choice.critical = choice.hold = True
        why.append(
            "destructive"
            + (" (MCP's default when a server does not say)" if destructive is None else "")
            + ": critical, and a suggested approval policy holds every call for two people"
        )
    return choice


async def read_tools(upstream: Upstream, *, timeout: float) -> list[Any]:
    """Every tool of the upstream's ``tools/list`` (all pages), within ``timeout`` seconds."""
    import anyio

    from .upstream import client_for

    tools: list[Any] = []
    with anyio.fail_after(timeout):
        async with client_for(upstream, read_timeout=timeout) as client:
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools


def _upstream_lines(upstream: Upstream) -> list[str]:
    if upstream.url:
        return [f"url = {_toml(upstream.url)}"]
    return [f"command = {_toml(upstream.command)}", f"args = {_toml(list(upstream.args))}"]


def gateway_toml(
    upstream: Upstream, choices: list[Choice], *, tenant: str, task_id: str, source: str
) -> str:
    """The gateway's configuration, each choice commented."""
    lines = [
        f"# Drafted by `ledgerweb-mcp-gateway init` from {source}'s tools/list.",
        "# Tool annotations are hints a server gives about itself: review every choice below",
        "# before you use this file.",
        "",
        "[ledger]",
        f"tenant = {_toml(tenant)}",
        f"task_id = {_toml(task_id)}",
        "",
        f"[upstreams.{_toml(upstream.name)}]",
        *_upstream_lines(upstream),
    ]
    for choice in choices:
        lines.append("")
        lines += [f"# {choice.name}: {line}" for line in choice.why]
        if not choice.recorded:
            continue
        lines += [
            f"[tools.{_toml(choice.name)}]",
            f"ledger_tool = {_toml(choice.name)}",
            f"key = {_toml(choice.key)}",
            "receipt = false  # true when the tool's result is the provider's durable receipt",
        ]
    return "\n".join(lines) + "\n"


def ledger_toml(choices: list[Choice], *, tenant: str, source: str) -> str:
    """The ``ledger_config`` fragment: the recorded tools, their grants in ``tenant``, and the
    suggested approval policies, each commented."""
    lines = [
        f"# Drafted by `ledgerweb-mcp-gateway init` from {source}'s tools/list: the ledger's",
        "# side of the gateway's recorded tools. Review it, then `manage.py ledger_config plan` it.",
        "version = 1",
    ]
    recorded = [c for c in choices if c.recorded]
    for choice in recorded:
        lines += ["", f"# {choice.name}: {choice.why[0]}"]
        lines += [f"# {line}" for line in choice.why[2:]]
        lines += [
            "[[tools]]",
            f"name = {_toml(choice.name)}",
            f"effect_class = {_toml(choice.effect_class)}",
            f"critical = {_toml(choice.critical)}",
        ]
    for choice in recorded:
        lines += [
            "",
            "[[grants]]",
            f"tenant = {_toml(tenant)}",
            f"tool = {_toml(choice.name)}",
            'policy_version = "v1"',
        ]
    for choice in recorded:
        if not choice.hold:
            continue
        name = SLUG.sub("-", f"hold-{choice.name}")[:64].strip("-_") or "hold"
        lines += [
            "",
            f"# Suggested: every {choice.name} call waits for two people (it may be destructive).",
            "# Narrow the condition (CEL over args) to the calls that need it.",
            "[[approval_policies]]",
            f"name = {_toml(name)}",
            f"tool = {_toml(choice.name)}",
            'condition = ""',
            "approvals_needed = 2",
        ]
    return "\n".join(lines) + "\n"


def _upstream_from(value: str, name: str) -> Upstream:
    if value.startswith(("http://", "https://")):
        return Upstream(name=name, url=value)
    words = shlex.split(value)
    if not words:
        raise ValueError("--upstream is empty")
    return Upstream(name=name, command=words[0], args=tuple(words[1:]))


def main(argv: list[str] | None = None) -> int:
    """``ledgerweb-mcp-gateway init``: draft the two files (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="ledgerweb-mcp-gateway init",
        description=(
            "Read an upstream MCP server's tools/list with its tool annotations and draft a "
            "gateway configuration and a ledger_config fragment: read-only tools pass through "
            "unrecorded, idempotent ones are idempotent, destructive ones are critical and held "
            "by a suggested approval policy. Each choice is commented for a person to review; "
            "nothing is applied."
        ),
    )
    parser.add_argument(
        "--upstream",
        required=True,
        help="the upstream: an http(s):// URL (streamable HTTP) or a command line (stdio)",
    )
    parser.add_argument("--name", default="upstream", help="the upstream's name in the config")
    parser.add_argument("--tenant", default="acme", help="the tenant of the drafted grants")
    parser.add_argument("--task-id", default="agent", help="the gateway's default task id")
    parser.add_argument("--config", default="gateway.toml", help="where to write the gateway's")
    parser.add_argument(
        "--ledger-config", default="ledger_config.toml", help="where to write the ledger's"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for tools/list")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    options = parser.parse_args(argv)
    outputs = [Path(options.config), Path(options.ledger_config)]
    existing = [str(p) for p in outputs if p.exists()]
    if existing and not options.force:
        print(
            f"ledgerweb-mcp-gateway init: {', '.join(existing)} exists; --force overwrites",
            file=sys.stderr,
        )
        return 2
    try:
        import anyio

        upstream = _upstream_from(options.upstream, options.name)
        tools = anyio.run(lambda: read_tools(upstream, timeout=options.timeout))
    except ValueError as exc:
        print(f"ledgerweb-mcp-gateway init: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 (unreachable, refused, timed out: said plainly)
        print(
            f"ledgerweb-mcp-gateway init: cannot read the upstream's tools: {exc!r}",
            file=sys.stderr,
        )
        return 1
    choices = sorted((choose(tool) for tool in tools), key=lambda c: c.name)
    source = options.name
    outputs[0].write_text(
        gateway_toml(
            upstream, choices, tenant=options.tenant, task_id=options.task_id, source=source
        ),
        encoding="utf-8",
    )
    outputs[1].write_text(ledger_toml(choices, tenant=options.tenant, source=source), "utf-8")
    recorded = [c.name for c in choices if c.recorded]
    held = [c.name for c in choices if c.hold]
    print(
        f"{len(choices)} tools: {len(recorded)} recorded ({', '.join(recorded) or 'none'}), "
        f"{len(held)} held by a suggested policy ({', '.join(held) or 'none'}).\n"
        f"Drafts written: {outputs[0]} and {outputs[1]}. Review each commented choice (the "
        "annotations are the server's own hints), then `manage.py ledger_config plan "
        f"{outputs[1]}` on the ledger and `ledgerweb-mcp-gateway --config {outputs[0]}`."
    )
    return 0
