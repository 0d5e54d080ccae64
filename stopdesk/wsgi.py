import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")
application = get_wsgi_application()

from stopdesk.warm import load_views  # noqa: E402 - needs the apps loaded above

load_views()
