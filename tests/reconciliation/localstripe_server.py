"""Run localstripe (the fake, stateful Stripe server from PyPI) for the tests, on 127.0.0.1.

localstripe's own command binds every interface (``::``) on a fixed port and keeps its state in
one fixed file for the whole machine. This starts the same aiohttp application on a free
loopback port, writes the port to ``--port-file`` once it listens, and keeps the store in
``--store`` (reloaded at start, so a restarted server remembers its payments).

localstripe refuses the payment intent list's ``created`` and ``customer`` filters, which Stripe
has and the adapter sends; they are added here as Stripe documents them (``created[gte]`` etc.,
``customer``), so the crash tests run the adapter's real lookup.

    python -m tests.reconciliation.localstripe_server --port-file P --store S
"""

from __future__ import annotations

import argparse
import pickle
import socket
from pathlib import Path

from aiohttp import web
from localstripe import resources, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", type=Path, required=True, help="where to write the port")
    parser.add_argument("--store", type=Path, required=True, help="localstripe's state file")
    args = parser.parse_args()
    store_path: Path = args.store

    def dump_to_disk(self) -> None:
        temporary = store_path.with_suffix(".tmp")
        with open(temporary, "wb") as out:
            pickle.dump(dict(self), out, protocol=pickle.HIGHEST_PROTOCOL)
        temporary.replace(store_path)

    resources.Store.dump_to_disk = dump_to_disk
    _filtered_payment_intent_list()
    if store_path.exists():
        with open(store_path, "rb") as saved:
            resources.store.update(pickle.load(saved))  # noqa: S301 (our own file)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)

    async def announce(_app: web.Application) -> None:
        args.port_file.write_text(str(sock.getsockname()[1]))

    server.app.on_startup.append(announce)
    web.run_app(server.app, sock=sock, print=None, access_log=None)


def _filtered_payment_intent_list() -> None:
    listed = resources.PaymentIntent._api_list_all.__func__

    def list_all(cls, url, customer=None, created=None, limit=None, starting_after=None):
        page = listed(cls, url, limit=limit, starting_after=starting_after)
        if customer is not None:
            page._list = [p for p in page._list if p.customer == customer]
        bounds = created if isinstance(created, dict) else {}
        for op, keep in (
            ("gte", lambda a, b: a >= b),
            ("gt", lambda a, b: a > b),
            ("lte", lambda a, b: a <= b),
            ("lt", lambda a, b: a < b),
        ):
            if op in bounds:
                page._list = [p for p in page._list if keep(p.created, int(bounds[op]))]
        return page

    resources.PaymentIntent._api_list_all = classmethod(list_all)


if __name__ == "__main__":
    main()
