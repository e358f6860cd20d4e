"""gunicorn configuration: ``gunicorn -c ledgerweb/gunicorn.conf.py ledgerweb.wsgi``."""

from ledgerweb.settings_reference import read

bind = read("LEDGERWEB_BIND")
workers = read("LEDGERWEB_WORKERS")
threads = read("LEDGERWEB_THREADS")
worker_class = "gthread"
timeout = 30
graceful_timeout = 10
keepalive = 5
accesslog = read("LEDGERWEB_ACCESS_LOG") or None
errorlog = "-"
# Bodies are bounded by Django (LEDGERWEB_MAX_BODY_BYTES); headers are bounded here.
limit_request_line = 8190
limit_request_fields = 100
