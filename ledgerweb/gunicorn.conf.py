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
