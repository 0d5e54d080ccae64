"""The demo agent end to end: a real worker process runs it against the sandbox, a person presses
Stop after the email went out, the canceller settles every child, and the summary tells the truth."""

import pytest

from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdesk.models import Task, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import SETTLED
from stopdesk.summary import task_summary
from stopdrill.demo.start import demo_task_start, demo_task_wait
from stopdrill.sandbox.server import start_all
from tests.workers.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_stop_after_the_email_reads_back_every_child_and_says_so(start_worker, settings):
    # Drafts run long enough on the stand-in that Stop finds them in progress.
    with start_all(openai=OpenAIStandin(run_s=600)) as sandbox:
        urls = sandbox.urls
        env = {
            "OPENAI_BASE_URL": urls["openai"],
            "STOPDESK_MCP_URL": urls["mcp"],
            "STOPDESK_CRM_URL": urls["crm"],
            "STOPDESK_OUTBOX_URL": urls["outbox"],
        }
        settings.STOPDESK_MECHANISMS = {
            **settings.STOPDESK_MECHANISMS,
            "openai": {"options": {"base_url": urls["openai"], "api_key": "sandbox"}},
        }
        start_worker("demo@test", lease_seconds=30, extra_env=env)
        task = demo_task_start(stage="email", pace=30)
        assert demo_task_wait(task, "email", timeout_s=60), "the agent did not reach the email stage"
        assert len(sandbox.outbox.messages()) == 1 and len(sandbox.crm.records()) == 1

        # The real dispatch: one cancellation job per in-flight item, run by the worker.
        task_request_stop(task_id=task.pk, actor="user:operator")
        wait_for(lambda: not WorkItem.objects.filter(task=task).exclude(state__in=SETTLED).exists(), timeout=60)

        task = Task.objects.get(pk=task.pk)
        assert task_summary(task) == (
            "Stopped new work. One record created; review required. Two drafts discarded. "
            "One agent run stopped before it finished. One email sent; it cannot be recalled. One lookup completed."
        )
        # The drafts were cancelled on the stand-in itself, not only in our ledger.
        drafts = WorkItem.objects.filter(task=task, noun="draft")
        assert {sandbox.openai.get(d.handle)["status"] for d in drafts} == {"cancelled"}
        # Nothing new went out after the stop.
        assert len(sandbox.outbox.messages()) == 1 and len(sandbox.crm.records()) == 1
