"""gunicorn configuration: ``gunicorn -c ledgerweb/gunicorn.conf.py ledgerweb.wsgi``."""

import os

bind = os.environ.get("LEDGERWEB_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("LEDGERWEB_WORKERS", "3"))
threads = int(os.environ.get("LEDGERWEB_THREADS", "4"))
worker_class = "gthread"
timeout = 30
graceful_timeout = 10
keepalive = 5
accesslog = os.environ.get("LEDGERWEB_ACCESS_LOG", "-")
errorlog = "-"
# Bodies are bounded by Django (LEDGERWEB_MAX_BODY_BYTES); headers are bounded here.
limit_request_line = 8190
limit_request_fields = 100


# The intent writer (attempts/writer.py) runs beside the web tier on SQLite: started once the
# workers are up, stopped with the server. Workers record intents themselves whenever it is not
# there, so a writer that dies costs throughput, never an intent.
_intent_writer = None


def _writer_wanted() -> bool:
    if os.environ.get("DATABASE_URL"):
        return False  # PostgreSQL groups concurrent commits itself
    from ledgerweb.env import env_bool  # the settings' own parsing (and error for a bad value)

    return env_bool("LEDGERWEB_INTENT_WRITER", True)


def when_ready(server):
    global _intent_writer
    if not _writer_wanted():
        return
    import subprocess
    import sys
    from pathlib import Path

    manage = Path(__file__).resolve().parent.parent / "manage.py"
    _intent_writer = subprocess.Popen([sys.executable, str(manage), "ledger_writer"])
    server.log.info("intent writer started (pid %s)", _intent_writer.pid)


def on_exit(server):
    if _intent_writer is None or _intent_writer.poll() is not None:
        return
    import subprocess

    _intent_writer.terminate()
    try:
        _intent_writer.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _intent_writer.kill()
