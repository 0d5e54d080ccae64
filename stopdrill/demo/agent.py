"""The demo agent: invoice analysis that really runs, against the sandbox, through the ledger.

One Celery task (a LedgerTask, so the run itself is a work item, "agent run") does what an agent
runtime does, in stages, paced so a person has time to press Stop at each one:

1. drafts: two OpenAI background responses (model requests; Stop cancels them: "discarded");
2. tools:  an MCP tool call (a remote tool; read-only, so stopping it costs nothing);
3. record: a CRM record, created with an idempotency key (reversible: archive, with approval);
4. email:  a message through the outbox (irreversible: it can only be reported);
5. done:   waits for the drafts, then finishes and closes its task (no more work will come).

Every child is registered before it is started, and passes the boundary before it starts and
before its external action (the agent helpers `response_create` and `http_submit` in `stopdesk.agent` do both). Between
stages the agent asks the ledger whether Stop was requested; once it was, it ends its own item
`cancelled` and leaves everything that crossed the boundary to reconciliation.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

import anyio
from celery import shared_task
from django.conf import settings

from reconcile.mechanisms.http.agent import http_submit
from reconcile.mechanisms.mcp.agent import mcp_call_tool
from reconcile.mechanisms.openai.agent import openai_client, response_create
from stopdesk.agent.workers import LedgerTask, StopRequested
from stopdesk.logs import log_context
from stopdesk.services.closing import task_close
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_finish, item_register
from stopdesk.states import Kind
from stopdrill.demo import sandbox

log = logging.getLogger(__name__)

STAGES = ("drafts", "tools", "record", "email", "done")
MODEL = "gpt-4.1-mini"
DRAFTS = (
    ("Draft the variance summary for invoice batch 42", "Summarise the variances in invoice batch 42."),
    ("Draft the vendor letter for invoice batch 42", "Draft a letter to ACME about the disputed lines."),
)


def stage_index(stage: str) -> int:
    """Stages up to and including this one run without pauses ("" runs everything paced)."""
    return STAGES.index(stage) if stage else -1


class InvoiceAnalysis:
    """One run of the agent. `celery_task` is the LedgerTask running it (for the stop checks)."""

    def __init__(self, celery_task: Any, *, task_id: int, item_id: int, fast_until: str, pace: float) -> None:
        self.celery_task = celery_task
        self.task_id = task_id
        self.item_id = item_id
        self.fast = stage_index(fast_until)
        self.pace = pace
        self.actor = f"agent:invoice-analysis:{task_id}"
        self.drafts: list[tuple[int, str]] = []  # (item id, response id)

    # --- pacing ---------------------------------------------------------------------------------

    def pause(self, before: str) -> None:
        """Wait before a stage (unless fast-forwarding past it), checking for Stop twice a second."""
        self.celery_task.raise_if_stopped()
        if STAGES.index(before) <= self.fast:
            return
        log.info("next stage, %s, in %.0fs", before, self.pace)
        self.sleep(self.pace)

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        self.celery_task.raise_if_stopped()
        while time.monotonic() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            self.celery_task.raise_if_stopped()

    def child(self, *, kind: str, noun: str, mechanism: str, label: str) -> int:
        item = item_register(
            task=self.task_id,
            kind=kind,
            noun=noun,
            actor=self.actor,
            mechanism=mechanism,
            label=label,
            parent=self.item_id,
        )
        return item.pk

    # --- stages ---------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.schedule_drafts()
        self.pause("tools")
        lookup = self.call_tool()
        self.pause("record")
        record = self.create_record(lookup)
        self.pause("email")
        email = self.send_email(record)
        self.wait_for_drafts()
        return {"record": record, "email": email, "drafts": [r for _, r in self.drafts]}

    def schedule_drafts(self) -> None:
        for label, prompt in DRAFTS:
            item_id = self.child(kind=Kind.MODEL_REQUEST, noun="draft", mechanism="openai", label=label)
            with log_context(item=item_id):
                response = response_create(
                    item_id=item_id, actor=self.actor, model=MODEL, input=prompt, metadata={"demo": "invoice-analysis"}
                )
                log.info("draft scheduled as background response %s", response.id)
            self.drafts.append((item_id, response.id))

    def call_tool(self) -> str:
        item_id = self.child(
            kind=Kind.REMOTE_TOOL, noun="lookup", mechanism="mcp", label="Look up ACME's open invoices (MCP)"
        )
        with log_context(item=item_id):
            seconds = 0.2 if STAGES.index("tools") <= self.fast else max(1.0, self.pace / 3)
            # Through the MCP adapter: it records the server, tool, protocol and annotations,
            # passes the boundary, and cancels the call if Stop arrives while it runs.
            result = anyio.run(
                partial(
                    mcp_call_tool,
                    item_id=item_id,
                    url=settings.STOPDESK_MCP_URL,
                    tool="slow_lookup",
                    arguments={"query": "ACME", "seconds": seconds},
                    actor=self.actor,
                )
            )
        if result is None:  # stopped during the call; the adapter recorded the item
            self.celery_task.raise_if_stopped()
            return ""
        if result.is_error:
            raise RuntimeError("tool slow_lookup answered an error")
        return " ".join(getattr(part, "text", "") for part in result.content).strip()

    def create_record(self, lookup: str) -> str:
        crm = _system_url("crm")
        item_id = self.child(
            kind=Kind.EXTERNAL_OPERATION, noun="record", mechanism="http", label="Open a review case in the CRM"
        )
        with log_context(item=item_id):
            submitted = http_submit(
                item_id=item_id,
                actor=self.actor,
                idempotency_key=f"stopdesk-demo-{self.task_id}-case",
                url=f"{crm}/records",
                json={
                    "name": f"Invoice review, batch 42 (task {self.task_id})",
                    "vendor": "ACME",
                    "lookup": lookup[:80],
                },
                declaration={"system": "crm", "effect": "created"},
            )
            log.info("CRM record: accepted=%s %s", submitted.accepted, submitted.record or submitted.error)
        return submitted.record.record_id if submitted.record else ""

    def send_email(self, record_id: str) -> str:
        outbox = _system_url("outbox")
        item_id = self.child(
            kind=Kind.EXTERNAL_OPERATION, noun="email", mechanism="http", label="Tell accounts a review case is open"
        )
        with log_context(item=item_id):
            submitted = http_submit(
                item_id=item_id,
                actor=self.actor,
                idempotency_key=f"stopdesk-demo-{self.task_id}-email",
                url=f"{outbox}/messages",
                json={
                    "to": "accounts@example.test",
                    "subject": "Invoice batch 42 is under review",
                    "body": f"A review case {record_id or '(pending)'} was opened for ACME's invoice batch 42.",
                },
                declaration={"system": "outbox", "effect": "sent"},
            )
            log.info("email: accepted=%s %s", submitted.accepted, submitted.record or submitted.error)
        return submitted.record.record_id if submitted.record else ""

    def wait_for_drafts(self) -> None:
        """Poll the background responses and report each result to the ledger."""
        if STAGES.index("done") <= self.fast:
            sandbox.fast_forward_responses([response_id for _, response_id in self.drafts])
        client = openai_client()
        pending = list(self.drafts)
        while pending:
            for item_id, response_id in list(pending):
                response = client.responses.retrieve(response_id)
                if response.status in ("queued", "in_progress"):
                    continue
                pending.remove((item_id, response_id))
                with log_context(item=item_id):
                    item_finish(
                        item_id=item_id,
                        succeeded=response.status == "completed",
                        actor=self.actor,
                        outcome=f"response {response.status}",
                        evidence={"response_id": response_id, "status": response.status},
                    )
            if pending:
                self.sleep(1.0)


@shared_task(base=LedgerTask, bind=True, name="stopdrill.demo.invoice_analysis", time_limit=1800, soft_time_limit=1790)
def invoice_analysis(
    self: LedgerTask, *, item_id: int, stopdesk_task_id: int, fast_until: str = "", pace: float = 15.0
) -> dict[str, Any]:
    agent = InvoiceAnalysis(self, task_id=stopdesk_task_id, item_id=item_id, fast_until=fast_until, pace=pace)
    try:
        result = agent.run()
    except TaskStopped as exc:
        # A child was refused at the boundary: Stop came first, nothing was sent for it.
        raise StopRequested() from exc
    # The agent owns its whole task, so it says when the task is over; until then the task page
    # keeps offering Stop, even while every child so far has settled.
    task_close(task_id=stopdesk_task_id, actor=agent.actor, reason="The invoice analysis finished.")
    return result


def _system_url(name: str) -> str:
    """The system's base URL, from the HTTP adapter's one configuration of external systems."""
    return str(settings.STOPDESK_MECHANISMS["http"]["options"]["systems"][name]["base_url"]).rstrip("/")
