"""A real upstream MCP server for the gateway's tests, built with the official SDK.

``python -m tests.integrations.mcp_upstream --db effects.db --noun ticket [--http --port-file F]``

Tools (for ``--noun ticket``): ``create_ticket`` (the side effect: every call, repeated or not,
is a new row in a SQLite file, so a duplicate effect is visible), ``find_ticket`` (the lookup
tool: by the idempotency key the gateway sends in ``_meta``) and ``list_tickets`` (read-only).
While the file named by ``--hold-file`` exists, ``create_ticket`` records its effect and then
holds its answer back: the window in which a test kills the gateway.
"""

from __future__ import annotations

import argparse
import json
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from mcp.server.mcpserver import Context, MCPServer

KEY_META = "io.ledgerweb/idempotency_key"


class Effect(TypedDict):
    id: str
    customer: str
    title: str


def _db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS effects (n INTEGER PRIMARY KEY, id TEXT, tool TEXT, "
        "idempotency_key TEXT, args TEXT)"
    )
    return db


def build(db_path: str, noun: str, hold_file: str | None) -> MCPServer:
    server = MCPServer(f"{noun}s")

    def create(customer: str, title: str, ctx: Context) -> Effect:
        meta = ctx.request_context.meta or {}
        db = _db(db_path)
        with db:
            count = db.execute("SELECT count(*) FROM effects").fetchone()[0]
            effect_id = f"{noun[0].upper()}-{count + 1}"
            db.execute(
                "INSERT INTO effects (id, tool, idempotency_key, args) VALUES (?, ?, ?, ?)",
                (
                    effect_id,
                    f"create_{noun}",
                    meta.get(KEY_META, ""),
                    json.dumps({"customer": customer, "title": title}),
                ),
            )
        db.close()
        deadline = time.monotonic() + 60
        while hold_file and Path(hold_file).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"id": effect_id, "customer": customer, "title": title}

    def find(idempotency_key: str) -> dict[str, Any]:
        db = _db(db_path)
        rows = db.execute(
            "SELECT id, args FROM effects WHERE idempotency_key = ? ORDER BY n",
            (idempotency_key,),
        ).fetchall()
        db.close()
        if not rows:
            return {"found": False}
        effect_id, args = rows[0]
        return {
            "found": True,
            "id": effect_id,
            "args": json.loads(args),
            "count": len(rows),
            "result": {"id": effect_id, **json.loads(args)},
        }

    def listing() -> int:
        db = _db(db_path)
        count = db.execute("SELECT count(*) FROM effects").fetchone()[0]
        db.close()
        return count

    server.add_tool(create, name=f"create_{noun}", description=f"Create a {noun} (side effect).")
    server.add_tool(find, name=f"find_{noun}", description=f"Look a {noun} up by key.")
    server.add_tool(listing, name=f"list_{noun}s", description=f"Count the {noun}s (read-only).")
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--noun", default="ticket")
    parser.add_argument("--hold-file")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port-file")
    options = parser.parse_args()
    _db(options.db).close()
    server = build(options.db, options.noun, options.hold_file)
    if not options.http:
        server.run("stdio")
        return
    import anyio
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    Path(options.port_file).write_text(str(sock.getsockname()[1]))
    print("listening", file=sys.stderr, flush=True)
    anyio.run(lambda: uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
