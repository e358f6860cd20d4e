"""WSGI entry point for gunicorn (see ``ledgerweb/gunicorn.conf.py``)."""

import os

from django.core.wsgi import get_wsgi_application

from ledgerweb import logs

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")

# A server process owns its logging: only here, not in the settings every import of Django
# loads, are the record fields no configured format prints switched off.
logs.skip_unused_record_fields()
logs.warnings_as_log_lines()
application = get_wsgi_application()
