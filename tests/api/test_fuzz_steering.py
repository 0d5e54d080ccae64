"""The stateful fuzzer, hostile about where the server connects: declarations (`detail` at
registration and with a handle) drawn from a grammar of nested overrides (URLs, hosts, schemes
such as file: and gopher:, IPv6, redirects, `@` userinfo, names resolving to loopback), rows
carrying such overrides written straight into the ledger (as rows from before they were refused),
and after each step the server's own I/O paths run on them: Stop, a reconciler sweep, every
adapter's cancel and read-back, a compensation's read and reversal.

Two witnesses, and the test fails if either sees the server reach an address nobody configured:
a real listener on 127.0.0.1 and ::1 that every override in the grammar points at, and an audit
hook (`sys.addaudithook`, the interpreter's own record of `socket.connect`) that sees every
connection the process makes, to the listener or anywhere else.

`STOPDESK_FUZZ_REQUESTS` sets how many API requests the run makes (default 600, a minute or so
in CI); `make fuzz-steering` runs it with 5,000."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from reconcile.mechanisms import registry
from reconcile.mechanisms.base import ItemRef
from reconcile.mechanisms.http.sandbox import CRM
from reconcile.mechanisms.mcp.sandbox import MCPToolServer
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from reconcile.services.compensation import compensation_request
from reconcile.services.reconcile import sweep_once
from stopdesk.models import ExternalRecord, WorkItem
from stopdrill.sandbox.server import BackgroundServer
from tests.api.conftest import Api
from tests.api.test_fuzz_stateful import RuntimeApi, state
from tests.listener import Listener

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.slow]

REQUESTS = int(os.environ.get("STOPDESK_FUZZ_REQUESTS", "600"))
STEPS = 50
LISTENER = Listener()  # started by the test; its port is in every override below


class Connections:
    """Every `socket.connect` this process makes while watching, from any thread."""

    def __init__(self) -> None:
        self.watching = False
        self.seen: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.watching or event != "socket.connect":
            return
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2:
            with self.lock:
                self.seen.append((str(address[0]), int(address[1])))


_connections: Connections | None = None


def connections() -> Connections:
    global _connections
    if _connections is None:  # an audit hook cannot be removed: one per process
        _connections = Connections()
    return _connections


def _port() -> int:
    return LISTENER.port


# --- the grammar of overrides ----------------------------------------------------------------

HOSTS = st.sampled_from(
    [
        "127.0.0.1:{port}",
        "[::1]:{port}",
        "localhost:{port}",
        "127.1:{port}",
        "2130706433:{port}",  # 127.0.0.1 as one number
        "0x7f.0.0.1:{port}",
        "[::ffff:127.0.0.1]:{port}",
        "[0:0:0:0:0:0:0:1]:{port}",
        "user:pass@127.0.0.1:{port}",
        "crm@127.0.0.1:{port}",
        "127.0.0.1:{crm}@127.0.0.1:{port}",  # the configured CRM as userinfo, the listener as host
        "localhost.:{port}",
        "169.254.169.254",  # a cloud metadata address
    ]
)
SCHEMES = st.sampled_from(["http", "https", "file", "gopher", "ftp", "dict", "ws", "HTTP"])
PATHS = st.sampled_from(
    [
        "/records/acc-9/archive",
        "/v1",
        "/mcp",
        "/records?idempotency_key={idempotency_key}",
        "/records/{record_id}",
        "/redirect?to=http://127.0.0.1:{port}/x",
        "/%2e%2e/admin",
        "",
    ]
)


@st.composite
def urls(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(
            st.sampled_from(["file:///etc/passwd", "gopher://127.0.0.1:{port}/_FLUSHALL", "//127.0.0.1:{port}/x"])
        )
    if kind == 1:  # a redirect from the configured system to the listener
        return "http://127.0.0.1:{crm}/redirect?to=http://127.0.0.1:{port}/"
    return f"{draw(SCHEMES)}://{draw(HOSTS)}{draw(PATHS)}"


STEERING_KEYS = st.sampled_from(
    [
        "url",
        "base_url",
        "lookup_url",
        "record_url",
        "cancel_url",
        "callback_url",
        "endpoint",
        "host",
        "redirect",
        "headers",
        "default_headers",
        "api_key",
        "bearer_token",
        "Authorization",
        "reverse",
        "command",
        "env",
    ]
)
FACT_KEYS = st.sampled_from(["system", "server", "effect", "transport", "tool", "model", "session", "server_tasks"])
LEAVES = st.one_of(
    urls(),
    st.sampled_from(["crm", "outbox", "sandbox", "evil", "crm~x", "http://127.0.0.1:{port}", "streamable_http"]),
    st.booleans(),
)
OVERRIDES = st.recursive(
    LEAVES,
    lambda inner: st.dictionaries(st.one_of(STEERING_KEYS, FACT_KEYS), inner, max_size=3),
    max_leaves=4,
)
LISTENED = st.builds(
    lambda scheme, host, path: f"{scheme}://{host}{path}",
    st.sampled_from(["http", "https", "HTTP"]),
    st.sampled_from(["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "user@127.0.0.1:{port}"]),
    PATHS,
)
SECTION = st.one_of(
    # The keys the adapters read, each pointed somewhere: flat, beside a real system, or nested.
    st.builds(lambda key, url: {key: url}, STEERING_KEYS, st.one_of(LISTENED, urls())),
    st.builds(
        lambda system, key, url: {"system": system, key: url},
        st.sampled_from(["crm", "outbox", "evil"]),
        st.sampled_from(["lookup_url", "record_url", "cancel_url", "base_url", "url"]),
        LISTENED,
    ),
    st.builds(lambda url: {"system": "crm", "reverse": {"action": "archive", "url": url}}, LISTENED),
    st.builds(
        lambda url: {"server": url, "url": url, "tool": "slow_export", "server_tasks": True, "session": {"id": "s-1"}},
        LISTENED,
    ),
    st.builds(
        lambda url: {"tool": "t", "status_check": {"tool": "git_log", "arguments": {}}, "server": url, "url": url},
        LISTENED,
    ),
    st.dictionaries(st.one_of(STEERING_KEYS, FACT_KEYS), OVERRIDES, max_size=3),
)
CLEAN = st.sampled_from(
    [
        {"http": {"system": "crm", "effect": "created"}},
        {"http": {"system": "outbox"}},
        {"http": {"system": "evil"}},
        {"openai": {"model": "m"}},
        {"mcp": {"server": "sandbox", "tool": "slow_export", "server_tasks": True, "session": {"id": "s-1"}}},
        {"mcp": {"server": "http://127.0.0.1:{port}/mcp", "url": "http://127.0.0.1:{port}/mcp", "tool": "t"}},
    ]
)
DETAILS = st.one_of(CLEAN, st.fixed_dictionaries({}, optional={"http": SECTION, "openai": SECTION, "mcp": SECTION}))
MECHANISMS = st.sampled_from(["http", "openai", "mcp"])
# A mechanism and a declaration aimed at the section its adapter reads (and, at times, others).
DECLARED = MECHANISMS.flatmap(
    lambda mechanism: st.tuples(
        st.just(mechanism),
        st.one_of(SECTION.map(lambda own: {mechanism: own}), CLEAN),
    )
)


def _filled(value: Any) -> Any:
    """Point the grammar's placeholders at the listener (and the configured CRM, where a URL
    pretends to be it); the `{idempotency_key}`-style ones stay for the adapters to fill."""
    if isinstance(value, str):
        return value.replace("{port}", str(_port())).replace("{crm}", str(state["crm_port"]))
    if isinstance(value, dict):
        return {_filled(k): _filled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v) for v in value]
    return value


class HostileRuntime(RuntimeApi):
    @rule(target=RuntimeApi.items, task=RuntimeApi.tasks, declared=DECLARED)
    def register_with_a_declaration(self, task: int, declared: tuple[str, dict[str, Any]]) -> int:
        mechanism, detail = declared
        body = {
            "kind": "external_operation",
            "noun": "op",
            "mechanism": mechanism,
            "handle": "resp_fuzz",
            "idempotency_key": "op-1",
            "detail": _filled(detail),
        }
        answer = self.send("POST", f"/tasks/{task}/items", body)
        return int(answer.body["id"]) if answer.status == 201 else 0

    @rule(item=RuntimeApi.items, detail=DETAILS)
    def record_a_handle_with_a_declaration(self, item: int, detail: dict[str, Any]) -> None:
        self.send("POST", f"/items/{item}/handle", {"handle": "resp_fuzz", "detail": _filled(detail)})

    @rule(item=RuntimeApi.items, declared=DECLARED)
    def an_older_row_carries_overrides(self, item: int, declared: tuple[str, dict[str, Any]]) -> None:
        """Written straight into the ledger, as rows from before the doors refused them."""
        mechanism, detail = declared
        state["older_rows"] += str(_port()) in str(_filled(detail))
        WorkItem.objects.filter(pk=item).update(
            mechanism=mechanism,
            detail=_filled(detail),
            handle="resp_fuzz",
            idempotency_key="op-1",
            updated_at=timezone.now(),
        )

    @rule(item=RuntimeApi.items, system=st.sampled_from(["crm", "outbox", "evil", "crm~x"]))
    def attach_to_some_system(self, item: int, system: str) -> None:
        body = {"system": system, "record_id": "acc-10", "effect": "created", "version": "1", "reversible": True}
        self.send("POST", f"/items/{item}/records", body)

    @rule()
    def the_server_looks_at_them(self) -> None:
        """Every I/O path an adapter has, on the latest rows of each mechanism, whatever their state."""
        http = registry.get("http")
        rows = WorkItem.objects.filter(mechanism__in=["http", "openai", "mcp"]).order_by("-updated_at", "-id")[:6]
        for row in rows:
            adapter = registry.get(row.mechanism)
            ref = ItemRef.of(row)
            records = list(ExternalRecord.objects.filter(item_id=row.pk))
            calls = [lambda: adapter.cancel(ref), lambda: adapter.inspect(ref)]
            for record in records:
                calls += [
                    lambda r=record: compensation_request(r),
                    lambda r=record: http.read_version(r),  # type: ignore[attr-defined]
                    lambda r=record: http.reverse(r, "1"),  # type: ignore[attr-defined]
                ]
            for call in calls:
                try:
                    call()
                except Exception:  # as the sweep does: one row's failure is that row's, never the run's
                    state["raised"] += 1
            state["looked"] += 1

    @rule()
    def the_reconciler_sweeps(self) -> None:
        sweep_once(concurrency=1)


def _the_control_reads_the_configured_crm() -> None:
    """The positive control, whatever the fuzzer drew: an item naming the configured CRM is read
    back there, so a listener that saw nothing is known to be watching a server that connects."""
    api = state["api"]
    body = {"kind": "external_operation", "noun": "op", "mechanism": "http", "detail": {"http": {"system": "crm"}}}
    task = int(api.post("/tasks", {"title": "control"}).body["id"])
    item = int(api.post(f"/tasks/{task}/items", body).body["id"])
    assert api.post(f"/items/{item}/submit", {"idempotency_key": f"control-{item}"}).status == 200
    record = {"system": "crm", "record_id": "acc-10", "effect": "created", "version": "1", "reversible": True}
    assert api.post(f"/items/{item}/records", record).status == 201
    registry.get("http").read_version(ExternalRecord.objects.get(item_id=item))  # type: ignore[attr-defined]
    state["looked"] += 1


def _configured(crm: BackgroundServer, openai: BackgroundServer, mcp: BackgroundServer) -> dict[str, Any]:
    mechanisms = {name: dict(values) for name, values in django_settings.STOPDESK_MECHANISMS.items()}
    systems = {k: dict(v) for k, v in mechanisms["http"]["options"]["systems"].items()}
    systems["crm"]["base_url"] = crm.url
    systems["outbox"]["base_url"] = crm.url  # one party stands for both; only the address matters here
    timing = {"call_timeout_s": 1.0, "deadline_s": 5.0}
    return {
        **mechanisms,
        "http": {**timing, "options": {"systems": systems}},
        "openai": {**timing, "options": {"base_url": openai.url + "/v1", "api_key": "sk-server-key"}},
        "mcp": {**timing, "options": {"servers": {"sandbox": {"url": mcp.url + "/mcp"}}}},
    }


def test_the_server_never_connects_to_an_address_a_runtime_named(runtime, other_runtime):
    crm_party, openai_party, mcp_party = CRM(), OpenAIStandin(queue_s=0.01, run_s=5.0), MCPToolServer()
    with (
        BackgroundServer(crm_party.app, name="crm") as crm,
        BackgroundServer(openai_party.app, name="openai") as openai,
        BackgroundServer(mcp_party.app, name="mcp") as mcp,
    ):
        crm_party.seed("acc-9", name="Bystander Ltd")
        crm_party.seed("acc-10", name="ACME Ltd")
        LISTENER.start()
        db = connection.settings_dict
        redis = urlsplit(django_settings.CELERY_BROKER_URL)
        allowed = {
            ("127.0.0.1", crm.port),
            ("127.0.0.1", openai.port),
            ("127.0.0.1", mcp.port),
            (str(db.get("HOST") or "127.0.0.1"), int(db.get("PORT") or 5432)),
            (redis.hostname or "127.0.0.1", redis.port or 6379),
        }
        watch = connections()
        old = django_settings.STOPDESK_MECHANISMS
        django_settings.STOPDESK_MECHANISMS = _configured(crm, openai, mcp)
        registry.reset()
        state.update(
            api=Api(runtime[1]),
            other_api=Api(other_runtime[1]),
            sent=[],
            looked=0,
            raised=0,
            older_rows=0,
            crm_port=crm.port,
        )
        state["first_task"] = int(state["api"].post("/tasks", {"title": "anchor"}).body["id"])
        watch.seen.clear()
        watch.watching = True
        try:
            run_state_machine_as_test(
                HostileRuntime,
                settings=settings(
                    max_examples=max(1, REQUESTS // 25),
                    stateful_step_count=STEPS,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
            _the_control_reads_the_configured_crm()
        finally:
            watch.watching = False
            LISTENER.stop()
            django_settings.STOPDESK_MECHANISMS = old
            registry.reset()
        reached = {(host, port) for host, port in watch.seen if port != 0}
        unconfigured = sorted(a for a in reached if a not in allowed)
        sent = state["sent"]
        print(
            f"\nsteering fuzz: {len(sent)} API requests, {state['looked']} adapter passes "
            f"({state['raised']} calls raised) over {state['older_rows']} rows naming the listener, "
            f"{len(watch.seen)} connections made, {len(unconfigured)} to unconfigured addresses, "
            f"{len(LISTENER.arrivals)} at the listener"
        )
        assert unconfigured == [], unconfigured
        assert LISTENER.arrivals == [], LISTENER.arrivals[:3]
        assert len(sent) >= REQUESTS * 0.8, len(sent)
        assert state["looked"] > 0 and ("127.0.0.1", crm.port) in reached  # the server did its own calls
        assert 422 in sent  # overrides were refused at the door
