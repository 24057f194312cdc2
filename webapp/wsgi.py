"""WSGI entry point (runserver, and any WSGI server); gunicorn serves webapp/asgi.py."""

import os

from django.core.wsgi import get_wsgi_application

from webapp.provisioning import check_ready_to_serve

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

application = get_wsgi_application()
# No serving without the secrets: the error names the variable and `manage.py prepare_var`.
check_ready_to_serve()
