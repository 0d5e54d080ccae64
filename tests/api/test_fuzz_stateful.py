"""A stateful fuzzing run of the runtime API: a Hypothesis state machine that follows the API's own
links (a created task's id feeds registration, an item's id feeds start, submit, records, finish...)
and mixes in what a careless or hostile runtime sends: wrong states, repeated and reused
Idempotency-Keys, unsafe record ids, another runtime's ids, malformed bodies, Stop at any point.

Over 5,000 requests: no answer is a 5xx, every status is one the OpenAPI document lists for the
operation, and no refused request writes a row (the boundary's 409 task_stopped, whose
cancellation of the item is the record, is the one documented exception)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from stopdesk.api.views import OPERATIONS
from tests.api.conftest import Api, ledger_counts

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.slow]

EXAMPLES, STEPS = 140, 50  # up to 7,000 rules; Hypothesis ends some runs early, so ~6,000 requests
DOCUMENTED = {(op.method, op.path): {op.status, *op.errors} for op in OPERATIONS}
_TEMPLATES = [
    (op.method, re.compile("^" + re.sub(r"\{[a-z_]+\}", r"[^/]+", op.path) + "$"), op.path) for op in OPERATIONS
]

RECORD_IDS = st.sampled_from(
    ["crm-1", "crm-2", "../crm-2", "a/b", "a%2Fb", "what?x", "hash#x", "two words", "Zürich-日本", "..", "", "x" * 201]
)
KEYS = st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"]))
TEXT = st.text(max_size=30)
JUNK = st.one_of(
    st.none(),
    st.integers(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.sampled_from(["title", "status", "kind", "noun", "x", "record_id"]),
        st.one_of(TEXT, st.integers()),
        max_size=3,
    ),
)

state: dict[str, Any] = {}


def _documented(method: str, path: str) -> set[int]:
    for m, pattern, template in _TEMPLATES:
        if m == method and pattern.match(path):
            return DOCUMENTED[(m, template)]
    raise AssertionError(f"no operation for {method} {path}")


class RuntimeApi(RuleBasedStateMachine):
    tasks = Bundle("tasks")
    items = Bundle("items")

    def __init__(self) -> None:
        super().__init__()
        self.api: Api = state["api"]
        self.other: Api = state["other_api"]

    def send(self, method: str, path: str, body: Any = None, key: str | None = None, *, as_other: bool = False) -> Any:
        client = self.other if as_other else self.api
        headers = {"Idempotency-Key": key} if key else None
        before = ledger_counts()
        answer = client.call(
            method, path, body if body is not None else ({} if method == "POST" else None), headers=headers
        )
        state["sent"].append(answer.status)
        assert answer.status < 500, (method, path, body, answer.status, answer.body)
        assert answer.status in _documented(method, path), (method, path, answer.status, answer.body)
        refused = answer.status >= 400 and not (
            isinstance(answer.body, dict) and answer.body.get("error") == "task_stopped"
        )
        if refused:
            assert ledger_counts() == before, (method, path, body, key, answer.status, answer.body)
        return answer

    @initialize(target=tasks)
    def first_task(self) -> int:
        return int(self.send("POST", "/tasks", {"title": "fuzzed"}).body["id"])

    @rule(target=tasks, title=st.text(min_size=1, max_size=40), key=KEYS)
    def create_task(self, title: str, key: str | None) -> int:
        answer = self.send("POST", "/tasks", {"title": title}, key)
        return int(answer.body["id"]) if answer.status == 201 else state["first_task"]

    @rule(
        target=items,
        task=tasks,
        kind=st.sampled_from(["local_worker", "external_operation", "model_request", "bogus"]),
        key=KEYS,
    )
    def register(self, task: int, kind: str, key: str | None) -> int:
        answer = self.send("POST", f"/tasks/{task}/items", {"kind": kind, "noun": "draft"}, key)
        return int(answer.body["id"]) if answer.status == 201 else 0

    @rule(item=items, key=KEYS, worker=st.sampled_from(["", "w1", "w2"]))
    def start(self, item: int, key: str | None, worker: str) -> None:
        self.send("POST", f"/items/{item}/start", {"worker": worker}, key)

    @rule(item=items, key=KEYS, idem=st.sampled_from(["op-1", "op-2"]))
    def submit(self, item: int, key: str | None, idem: str) -> None:
        self.send("POST", f"/items/{item}/submit", {"idempotency_key": idem}, key)

    @rule(item=items)
    def heartbeat(self, item: int) -> None:
        self.send("POST", f"/items/{item}/heartbeat", {"lease_seconds": 30})

    @rule(item=items, record_id=RECORD_IDS, version=st.sampled_from(["", "1", "v2"]), key=KEYS)
    def attach(self, item: int, record_id: str, version: str, key: str | None) -> None:
        body = {"system": "crm", "record_id": record_id, "effect": "created", "version": version}
        self.send("POST", f"/items/{item}/records", body, key)

    @rule(item=items, status=st.sampled_from(["completed", "failed", "done"]), key=KEYS, detail=TEXT)
    def finish(self, item: int, status: str, key: str | None, detail: str) -> None:
        self.send("POST", f"/items/{item}/finish", {"status": status, "detail": detail}, key)

    @rule(item=items, key=KEYS, detail=TEXT)
    def uncertain(self, item: int, key: str | None, detail: str) -> None:
        self.send("POST", f"/items/{item}/uncertain", {"detail": detail, "evidence": {"why": detail}}, key)

    @rule(item=items, key=KEYS)
    def cancel(self, item: int, key: str | None) -> None:
        self.send("POST", f"/items/{item}/cancel", {"detail": "stopped"}, key)

    @rule(task=tasks, reason=TEXT)
    def stop(self, task: int, reason: str) -> None:
        self.send("POST", f"/tasks/{task}/stop", {"reason": reason})

    @rule(task=tasks)
    def read_task(self, task: int) -> None:
        self.send("GET", f"/tasks/{task}")

    @rule(item=items)
    def read_item(self, item: int) -> None:
        self.send("GET", f"/items/{item}")

    @rule(item=items, verb=st.sampled_from(["start", "finish", "records", "cancel"]))
    def another_runtime_pokes(self, item: int, verb: str) -> None:
        body = {"status": "completed"} if verb == "finish" else {}
        if verb == "records":
            body = {"system": "crm", "record_id": "crm-1", "effect": "created"}
        answer = self.send("POST", f"/items/{item}/{verb}", body, as_other=True)
        assert answer.status in (404, 422), answer.body  # never found, at most refused as malformed

    @rule(item=items, verb=st.sampled_from(["start", "submit", "records", "finish", "uncertain"]), junk=JUNK)
    def junk_body(self, item: int, verb: str, junk: Any) -> None:
        self.send("POST", f"/items/{item}/{verb}", junk if junk is not None else [])

    @rule(item=consumes(items))
    def forget(self, item: int) -> None:
        pass  # items leave the pool too, so new ones are drawn as often as old ones

    @invariant()
    def nothing_failed(self) -> None:
        assert all(status < 500 for status in state["sent"][-5:])


def test_a_stateful_run_of_5000_requests_has_no_server_error_and_no_refused_write(runtime, other_runtime):
    state.update(api=Api(runtime[1]), other_api=Api(other_runtime[1]), sent=[])
    state["first_task"] = int(state["api"].post("/tasks", {"title": "anchor"}).body["id"])
    run_state_machine_as_test(
        RuntimeApi,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    sent = state["sent"]
    assert len(sent) >= 5000, len(sent)
    assert max(sent) < 500
    # The run reached the ledger's every answer, not only the validators.
    assert {200, 201, 404, 409, 422} <= set(sent), sorted(set(sent))
