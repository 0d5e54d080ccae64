"""A runtime names configured entries; it never chooses where the server connects. Both doors
(the HTTP API and the in-process runtime) refuse a declaration that tries, naming the field, and
write nothing."""

from __future__ import annotations

import pytest

from stopdesk.agent.runtime import LocalRuntime
from stopdesk.protocol.errors import InvalidRequest
from stopdesk.services.items import task_create
from stopdesk.states import ItemState as S
from tests.api.conftest import ledger_counts
from tests.factories import make_item

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

CRM = "http://127.0.0.1:8765"
STEERING = [
    # The reproductions: a hard-coded reversal, and the server's OpenAI key sent to a listener.
    (
        "http",
        {"http": {"system": "crm", "record_url": CRM + "/records/{record_id}", "reverse": {"action": "archive"}}},
        "detail.http.record_url",
    ),
    ("http", {"http": {"system": "crm", "reverse": {"url": CRM + "/records/acc-9/archive"}}}, "detail.http.reverse"),
    ("openai", {"openai": {"base_url": "http://127.0.0.1:9/v1"}}, "detail.openai.base_url"),
    ("http", {"http": {"system": "crm", "lookup_url": "gopher://127.0.0.1:6379/_FLUSHALL"}}, "detail.http.lookup_url"),
    (
        "openai",
        {"openai": {"client": {"default_headers": {"Authorization": "x"}}}},
        "detail.openai.client.default_headers",
    ),
    ("mcp", {"mcp": {"server": "git", "headers": {"Authorization": "Bearer stolen"}}}, "detail.mcp.headers"),
    (
        "mcp",
        {"mcp": {"server": "git", "session": {"callback_url": "file:///etc/passwd"}}},
        "detail.mcp.session.callback_url",
    ),
    ("http", {"http": "http://[::1]:8765/records"}, "detail.http"),
]


@pytest.fixture
def task(runtime):  # type: ignore[no-untyped-def]
    return task_create(title="Onboard customers", actor="test", runtime=runtime[0])


@pytest.mark.parametrize(("mechanism", "detail", "field"), STEERING, ids=[s[2] for s in STEERING])
def test_registering_an_item_that_names_a_url_is_refused_at_the_api_naming_the_field(
    api, task, mechanism, detail, field
):
    before = ledger_counts()
    answer = api.post(
        f"/tasks/{task.pk}/items",
        {"kind": "external_operation", "noun": "record", "mechanism": mechanism, "handle": "resp_x", "detail": detail},
    )
    assert answer.status == 422, answer.body
    assert (answer.body["error"], answer.body["field"]) == ("declaration_refused", field)
    assert ledger_counts() == before


@pytest.mark.parametrize(("mechanism", "detail", "field"), STEERING, ids=[s[2] for s in STEERING])
def test_the_in_process_door_refuses_the_same_declarations(runtime, task, mechanism, detail, field):
    before = ledger_counts()
    local = LocalRuntime(runtime=runtime[0])
    with pytest.raises(InvalidRequest) as refused:
        local.register(task.pk, kind="external_operation", noun="record", mechanism=mechanism, detail=detail)
    assert (refused.value.code, refused.value.field) == ("declaration_refused", field)
    assert ledger_counts() == before


def test_recording_a_handle_cannot_add_a_url_either(api, task):
    running = make_item(task, noun="draft", state=S.RUNNING, mechanism="openai")
    answer = api.post(
        f"/items/{running.pk}/handle", {"handle": "resp_x", "detail": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}}
    )
    assert answer.status == 422 and answer.body["field"] == "detail.openai.base_url"
    running.refresh_from_db()
    assert running.handle == "" and "openai" not in running.detail


def test_naming_a_configured_system_with_its_effect_is_accepted(api, task):
    answer = api.post(
        f"/tasks/{task.pk}/items",
        {
            "kind": "external_operation",
            "noun": "record",
            "mechanism": "http",
            "detail": {"http": {"system": "crm", "effect": "created"}, "tool": {"arguments": {"url": "data"}}},
        },
    )
    assert answer.status == 201, answer.body
