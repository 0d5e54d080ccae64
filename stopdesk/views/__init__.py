"""Server-rendered pages: one view and one template per page; htmx requests get the named
partial of the element they target."""

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """The request as django-htmx's middleware leaves it (for type checking)."""

    htmx: HtmxDetails
