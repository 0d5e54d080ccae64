from django.urls import path, re_path

from stopdesk.api.errors import unknown_path
from stopdesk.api.openapi import openapi_json
from stopdesk.api.views import OPERATIONS
from stopdesk.push.watch import MANY_PATH as WATCH_MANY_PATH
from stopdesk.push.watch import PATH as WATCH_PATH
from stopdesk.push.watch import watch_many, watch_stop

app_name = "api"


def _route(template: str) -> str:
    # /items/{item_id}/start -> items/<str:item_id>/start; ids are checked by the view, so that a
    # malformed or out-of-range id is a JSON 404 like any unknown one.
    return template.lstrip("/").replace("{", "<str:").replace("}", ">")


urlpatterns = [
    path("openapi.json", openapi_json, name="openapi"),
    *(path(_route(op.path), op.view, name=op.name) for op in OPERATIONS),
    path(_route(WATCH_PATH), watch_stop, name="watch_stop"),
    path(_route(WATCH_MANY_PATH), watch_many, name="watch_many"),
    re_path(r"^(?P<path>.*)$", unknown_path),
]
