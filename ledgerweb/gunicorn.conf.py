"""gunicorn configuration: ``gunicorn -c ledgerweb/gunicorn.conf.py ledgerweb.wsgi``."""

from pathlib import Path

from ledgerweb.logs import gunicorn_logger_class
from ledgerweb.paths import default_data_dir
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

# One JSON object per line for the error and access logs too (LEDGERWEB_LOG_FORMAT=json).
if read("LEDGERWEB_LOG_FORMAT") == "json":
    logger_class = gunicorn_logger_class()

# gunicorn's control socket (gunicornc) in this instance's data folder, not the one
# ~/.gunicorn/gunicorn.ctl every instance of the user would share; "off" turns it off.
_control = read("LEDGERWEB_CONTROL_SOCKET")
if _control == "off":
    control_socket_disable = True
else:
    _data = Path(read("LEDGERWEB_DATA_DIR", str(default_data_dir()))).resolve()
    control_socket = _control or str(_data / "gunicorn.ctl")
