"""A private PostgreSQL server for a bench or a test: a cluster in a folder of its own, on a free
port, started and stopped by whoever made it, never the system's server. bench/soak.py runs its
database on one, bench/failover.py a primary and its standbys, tests/test_database_away.py one it
restarts under load.

As root, PostgreSQL's tools run as the ``postgres`` user (initdb refuses root), so the folder
above the cluster is given to that user.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PG_BIN = Path(os.environ.get("LEDGERWEB_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One PostgreSQL server in ``root/name``, on a port of its own; its socket and its log
    (``name.log``) are in ``root``. ``options`` are added to the server's command line."""

    def __init__(self, root: Path, name: str) -> None:
        self.dir = root / name
        self.port = free_port()
        self.database = "postgres"
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.run_as:
            shutil.chown(root, "postgres", "postgres")
        self.options: list[str] = []

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def pg(self, tool: str, *args: str, timeout: float = 120) -> str:
        """Run one of PostgreSQL's programs; its output, or RuntimeError with its errors."""
        done = subprocess.run(
            [*self.run_as, str(PG_BIN / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr[-2000:]}")
        return done.stdout

    def create(self, database: str) -> None:
        """A new cluster, started, with an empty ``database`` (the one ``url`` names). A server
        that fails part-way is stopped: nothing started here outlives a failed start."""
        try:
            self.pg("initdb", "-D", str(self.dir), "-U", "postgres", "-A", "trust", "--no-sync")
            self.start()
            self.pg("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", database)
        except BaseException:
            self.stop()
            raise
        self.database = database

    def _ctl(self, action: str, *extra: str) -> None:
        settings = [
            f"-p {self.port}",
            f"-k {self.dir.parent}",
            "-c listen_addresses=127.0.0.1",
            "-c fsync=on",
            *self.options,
        ]
        self.pg(
            "pg_ctl",
            action,
            "-D",
            str(self.dir),
            "-w",
            "-t",
            "60",
            "-o",
            " ".join(settings),
            *extra,
            "-l",
            str(self.dir.parent / f"{self.dir.name}.log"),
        )

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """A fast restart: every connection is ended, new ones are refused until it is back."""
        self._ctl("restart", "-m", "fast")

    def sql(self, statement: str) -> str:
        """One statement through psql, in ``database``; its rows, unaligned."""
        return self.pg(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            self.database,
            "-Atc",
            statement,
            timeout=30,
        ).strip()

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, at once: the machine is gone."""
        try:
            pid = int((self.dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        for victim in [pid, *map(int, children)]:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        """An immediate stop if it runs; killed if pg_ctl cannot stop it."""
        if (self.dir / "postmaster.pid").exists():
            try:
                self.pg("pg_ctl", "stop", "-D", str(self.dir), "-m", "immediate", "-w", timeout=30)
            except (RuntimeError, subprocess.SubprocessError, OSError):
                self.kill()
