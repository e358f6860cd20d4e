"""The ledgerweb MCP gateway (extra ``mcp``): ``ledgerweb-mcp-gateway --config gateway.toml``.

An MCP server in front of upstream MCP servers that records every call to a tool configured as a
side effect in the ledger, through the agent HTTP API (``ledgerweb_client``). It runs beside the
agent, without Django or the ledger's database: see ``docs/integrations.md``.

``config`` and ``receipts`` need only the standard library (the ledger's MCP provider adapter
reads them); ``gateway`` and ``upstream`` need the ``mcp`` package.
"""

from .config import ConfigError, GatewayConfig, ToolConfig, Upstream, load_config

__all__ = ["ConfigError", "GatewayConfig", "ToolConfig", "Upstream", "load_config", "main"]


def main(argv: list[str] | None = None) -> int:
    """The ``ledgerweb-mcp-gateway`` command (``init ...``: draft a configuration from an
    upstream's tool annotations, ``ledgerweb_client.mcp_gateway.init``)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["init"]:
            from .init import main as init_main

            return init_main(argv[1:])
        from .gateway import main as gateway_main
    except ImportError as exc:
        print(
            f"ledgerweb-mcp-gateway needs the MCP SDK ({exc.name} is missing): "
            "pip install 'ledgerweb-client[mcp]'",
            file=sys.stderr,
        )
        return 2
    return gateway_main(argv)
