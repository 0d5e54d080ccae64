"""Drills against a user's own integration, with reversible or read-only test actions only.

    python manage.py stopdrill --crm-url https://crm.example.test
    python manage.py stopdrill --openai-api-key sk-... [--openai-base-url URL] [--openai-model M]
    python manage.py stopdrill --mcp-url https://tools.example.test/mcp --mcp-tool search

No control routes are used: faults that need the sandbox's controls are not applicable, and the
checks that read the sandbox's request log use what each contract offers instead:

- CRM (the sandbox CRM's contract: `POST /records` with Idempotency-Key, `GET
  /records?idempotency_key=K`, `GET /records/{id}` with version/ETag, `POST /records/{id}/archive`
  with If-Match): each drill creates one record under a fresh key; the checker looks every key up
  (an effect the ledger denies, or one whose item never passed the boundary, is a violation), and
  at the end every record the drills created is archived with If-Match on the version just read.
- OpenAI Responses API (or a compatible server): a short background response, cancelled; the
  checker retrieves each response by id.
- MCP: one tool, which must be annotated read-only (refused otherwise); nothing to reverse.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlparse

import anyio
import httpx

from reconcile.mechanisms.http.agent import http_submit
from reconcile.mechanisms.mcp import servers as mcp_servers
from reconcile.mechanisms.mcp.agent import describe, mcp_call_tool
from reconcile.mechanisms.openai.agent import openai_client, response_create
from reconcile.mechanisms.registry import mechanism_settings
from stopdesk.models import WorkItem
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.agent import crm_declaration
from stopdrill.drills.catalogue import DRILLS
from stopdrill.drills.core import Child, DrillContext
from stopdrill.drills.drivers import REVIEW, Driver

AGENT = "drill:agent"
NEEDS_CONTROLS = "not applicable: needs the sandbox's fault controls"
RUN_ON_SANDBOX = {
    "slow_child": NEEDS_CONTROLS,
    "disconnected_client": NEEDS_CONTROLS,
    "cancel_endpoint_down": NEEDS_CONTROLS,
}


@dataclass
class Integration:
    crm_url: str = ""
    openai_base_url: str = ""
    openai_api_key: str = ""
    openai_model: str = "gpt-4o-mini"
    mcp_url: str = ""
    mcp_tool: str = ""
    mcp_arguments: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 10.0
    # item id -> the idempotency key its CRM create uses (recorded before the create is sent).
    crm_keys: dict[int, str] = field(default_factory=dict)
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def label(self) -> str:
        parts = []
        if self.crm_url:
            parts.append(f"crm {urlparse(self.crm_url).netloc}")
        if self.openai_base_url or self.openai_api_key:
            parts.append(f"openai {urlparse(self.openai_base_url).netloc or 'api.openai.com'}")
        if self.mcp_url:
            parts.append(f"mcp {urlparse(self.mcp_url).netloc}:{self.mcp_tool}")
        return "integration: " + ", ".join(parts)

    @property
    def crm_system(self) -> str:
        return f"crm@{urlparse(self.crm_url).netloc}"

    def settings_overrides(self) -> dict[str, dict[str, Any]]:
        if not (self.openai_base_url or self.openai_api_key):
            return {}
        options = {k: v for k, v in (("base_url", self.openai_base_url), ("api_key", self.openai_api_key)) if v}
        return {"openai": {"options": options}}

    def drivers(self, mechanisms: list[str] | None) -> list[Driver]:
        found: list[Driver] = []
        if self.crm_url:
            found.append(IntegrationCrmDriver(self))
        if self.openai_base_url or self.openai_api_key:
            found.append(IntegrationOpenAIDriver(self))
        if self.mcp_url:
            why = mcp_refusal(self)
            cls: type[IntegrationMcpDriver] = IntegrationMcpDriver
            if why:
                every = [d.name for d in DRILLS]
                cls = type(
                    "RefusedMcpDriver",
                    (IntegrationMcpDriver,),
                    {"expected": {}, "not_applicable": dict.fromkeys(every, why)},
                )
            found.append(cls(self))
        return [d for d in found if not mechanisms or d.mechanism in mechanisms]

    # --- what the contracts say about the world ---------------------------------------------

    def crm_lookup(self, key: str) -> httpx.Response:
        with httpx.Client(timeout=self.timeout_s) as http:
            return http.get(self.crm_url.rstrip("/") + "/records", params={"idempotency_key": key})

    def world(self, items: list[WorkItem]) -> list[tuple[str, str, str, str]]:
        """(system, key or handle, item id, effect) for each effect the contracts can find."""
        found: list[tuple[str, str, str, str]] = []
        for item in items:
            key = self.crm_keys.get(item.pk)
            if key:
                answer = self.crm_lookup(key)
                if answer.status_code == 200:
                    body = answer.json()
                    found.append(("crm", key, str(item.pk), f"record {body.get('id')} created"))
                elif answer.status_code != 404:
                    found.append(("crm", key, str(item.pk), f"lookup answered HTTP {answer.status_code}"))
            if item.mechanism == "openai" and item.handle:
                client = openai_client(
                    base_url=self.openai_base_url or None, api_key=self.openai_api_key or None, timeout_s=self.timeout_s
                )
                status = client.responses.with_raw_response.retrieve(item.handle).http_response.json().get("status")
                if status in ("completed", "queued", "in_progress"):
                    found.append(("openai", item.handle, str(item.pk), f"response {item.handle} {status}"))
        return found

    def reverse_all(self) -> list[str]:
        """Archive every CRM record the drills created, with If-Match on the version just read."""
        lines: list[str] = []
        base = self.crm_url.rstrip("/")
        with httpx.Client(timeout=self.timeout_s) as http:
            for item_id, key in sorted(self.crm_keys.items()):
                try:
                    found = http.get(base + "/records", params={"idempotency_key": key})
                    if found.status_code == 404:
                        lines.append(f"item {item_id}: nothing was created under key {key}")
                        continue
                    if found.status_code != 200:
                        lines.append(
                            f"NOT archived: item {item_id} key {key}: lookup answered HTTP {found.status_code}"
                        )
                        continue
                    record_id = str(found.json()["id"])
                    current = http.get(f"{base}/records/{quote(record_id, safe='')}")
                    body = current.json()
                    if body.get("status") == "archived":
                        lines.append(f"item {item_id}: record {record_id} was already archived")
                        continue
                    etag = current.headers.get("etag") or f'"{body.get("version")}"'
                    archived = http.post(
                        f"{base}/records/{quote(record_id, safe='')}/archive",
                        headers={"If-Match": etag, "X-Actor": "stopdesk-drill"},
                    )
                    if archived.status_code < 300:
                        lines.append(f"archived record {record_id} (item {item_id}, If-Match {etag})")
                    else:
                        lines.append(
                            f"NOT archived: record {record_id} (item {item_id}, If-Match {etag}): "
                            f"HTTP {archived.status_code}"
                        )
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    lines.append(f"NOT archived: item {item_id} key {key}: {type(exc).__name__}: {exc}"[:200])
        return lines


class _IntegrationDriver(Driver):
    def __init__(self, integration: Integration) -> None:
        self.integration = integration

    def _task(self, ctx: DrillContext) -> Any:
        assert ctx.task is not None
        return ctx.task

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        """No request log here: the child passed the boundary (its call is on the wire or answered)."""
        item = WorkItem.objects.filter(pk=child.item_id).values("started_at", "submitted_at").first()
        return bool(item and (item["started_at"] or item["submitted_at"])) or child.done.is_set()


class IntegrationCrmDriver(_IntegrationDriver):
    mechanism = "http"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"completed"}),
        "after_acceptance": frozenset({"completed"}),
        "duplicate_stop": frozenset({"completed"}),
    }
    not_applicable = RUN_ON_SANDBOX

    @property
    def label(self) -> str:
        return f"http (your CRM at {urlparse(self.integration.crm_url).netloc})"

    def child(self, ctx: DrillContext, variant: str) -> Child:

        base = self.integration.crm_url.rstrip("/")
        decl = crm_declaration(base, self.integration.crm_system)
        item = item_register(
            task=self._task(ctx), kind=Kind.EXTERNAL_OPERATION, noun="record", actor=AGENT, mechanism="http",
            detail={"http": decl},
        )  # fmt: skip
        key = f"stopdesk-drill-{self.integration.nonce}-{item.pk}"
        self.integration.crm_keys[item.pk] = key  # before the create: reversed at the end whatever happens

        def run() -> Any:
            return http_submit(
                item_id=item.pk, actor=AGENT, idempotency_key=key, url=base + "/records",
                json={"name": f"stopdesk drill test record {key}", "stopdesk_drill": True}, declaration=decl,
            )  # fmt: skip

        return ctx.add(Child(item.pk, run, key=key))

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        return self.integration.crm_lookup(child.key).status_code == 200


class IntegrationOpenAIDriver(_IntegrationDriver):
    mechanism = "openai"
    # A short response may well finish before the cancel reaches it; a cancelled one may flip.
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"cancelled", "completed", REVIEW}),
        "after_acceptance": frozenset({"cancelled", "completed", REVIEW}),
        "duplicate_stop": frozenset({"cancelled", "completed", REVIEW}),
    }
    not_applicable = RUN_ON_SANDBOX

    @property
    def label(self) -> str:
        return f"openai (your endpoint at {urlparse(self.integration.openai_base_url).netloc or 'api.openai.com'})"

    def child(self, ctx: DrillContext, variant: str) -> Child:

        item = item_register(
            task=self._task(ctx), kind=Kind.MODEL_REQUEST, noun="draft", actor=AGENT, mechanism="openai"
        )
        integration = self.integration

        def run() -> Any:
            return response_create(
                item_id=item.pk, actor=AGENT, base_url=integration.openai_base_url or None,
                api_key=integration.openai_api_key or None, model=integration.openai_model,
                input="Reply with the single word: ok", max_output_tokens=16,
            ).id  # fmt: skip

        return ctx.add(Child(item.pk, run))

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        return bool(WorkItem.objects.filter(pk=child.item_id).exclude(handle="").exists()) or child.done.is_set()


class IntegrationMcpDriver(_IntegrationDriver):
    mechanism = "mcp"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"cancelled", "completed"}),
        "duplicate_stop": frozenset({"cancelled", "completed"}),
    }

    not_applicable = {
        **RUN_ON_SANDBOX,
        "after_acceptance": "not applicable: a plain tools/call has no acceptance apart from its answer "
        "that the client can see (the sandbox reads its server's journal)",
    }

    @property
    def label(self) -> str:
        return f"mcp (your tool {self.integration.mcp_tool} at {urlparse(self.integration.mcp_url).netloc})"

    def child(self, ctx: DrillContext, variant: str) -> Child:

        item = item_register(task=self._task(ctx), kind=Kind.REMOTE_TOOL, noun="lookup", actor=AGENT, mechanism="mcp")
        integration = self.integration

        def run() -> Any:
            return anyio.run(
                functools.partial(
                    mcp_call_tool, item_id=item.pk, url=integration.mcp_url, tool=integration.mcp_tool,
                    arguments=integration.mcp_arguments, actor=AGENT, poll_s=0.05, timeout_s=integration.timeout_s,
                )
            )  # fmt: skip

        return ctx.add(Child(item.pk, run))


def mcp_refusal(integration: Integration) -> str:
    """Why the MCP tool may not be drilled on the user's server ("" when it may): only a tool the
    server annotates read-only is called."""

    async def facts_of_tool() -> dict[str, Any]:
        spec = mcp_servers.resolve(integration.mcp_url, mechanism_settings("mcp").options)
        async with mcp_servers.open_client(spec, timeout_s=integration.timeout_s) as conn:
            return await describe(conn, integration.mcp_tool, {})

    try:
        facts = anyio.run(facts_of_tool)
    except Exception as exc:
        return f"could not describe {integration.mcp_tool!r}: {type(exc).__name__}: {exc}"[:300]
    if not facts["annotations"]["readOnlyHint"]:
        return (
            f"refused: {integration.mcp_tool!r} is not annotated read-only; a user's integration "
            "is drilled only with read-only or reversible test actions"
        )
    return ""
