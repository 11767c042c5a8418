"""WSGI entry point (gunicorn ``knowledgefs.wsgi``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
application = get_wsgi_application()
