from django.urls import path, re_path

from stopdesk.api.errors import unknown_path
from stopdesk.api.openapi import openapi_json
from stopdesk.api.views import OPERATIONS

app_name = "api"


def _route(template: str) -> str:
    # /items/{item_id}/start -> items/<str:item_id>/start; ids are checked by the view, so that a
    # malformed or out-of-range id is a JSON 404 like any unknown one.
    return template.lstrip("/").replace("{", "<str:").replace("}", ">")


urlpatterns = [
    path("openapi.json", openapi_json, name="openapi"),
    *(path(_route(op.path), op.view, name=op.name) for op in OPERATIONS),
    re_path(r"^(?P<path>.*)$", unknown_path),
]
