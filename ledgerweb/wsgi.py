"""WSGI entry point for gunicorn (see ``ledgerweb/gunicorn.conf.py``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")

application = get_wsgi_application()
