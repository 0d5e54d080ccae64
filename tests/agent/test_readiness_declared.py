"""Tool readiness knows the tools framework runs use, from the ledger: what each declares (or its
MCP server's annotations say), and an undeclared tool as possibly destructive, so the page says
which tools to declare or take out of the agent's tool set; the policy judges them the same way."""

from __future__ import annotations

import asyncio

import pytest
from django.utils.text import slugify

from reconcile import readiness
from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn
from reconcile.models import DrillResult, DrillRun
from stopdesk.agent.frameworks.declare import declare
from stopdesk.agent.frameworks.mcp_tools import mcp_declaration
from stopdesk.services.errors import ToolNotReady
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from tests.agent.kit import FRAMEWORKS, Tools
from tests.factories import make_task

pytestmark = [pytest.mark.postgres]


def _tool_detail(name: str, declaration, **extra):  # type: ignore[no-untyped-def]
    return {"tool": {"framework": "langgraph", "name": name, "call_id": "c1", **declaration.as_detail(), **extra}}


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_the_tools_a_framework_run_called_are_judged_by_their_declarations(
    framework, model, runtime, crm, client, cast
):
    party, url = model
    _, crm_url = crm
    name = party.load_script(
        Script.build(
            f"readiness-{framework}",
            [
                Turn(
                    tool_calls=(
                        ToolCall("lookup", {"q": "Acme"}),
                        ToolCall("wait_a_bit", {"n": 1}),
                        ToolCall("create_lead", {"name": "Acme"}),
                    )
                ),
                Turn(text="done"),
            ],
        )
    )
    task = runtime.create_task("Add Acme")

    asyncio.run(FRAMEWORKS[framework](runtime, task.id, url, name, Tools(crm_url=crm_url)))

    verdicts = {v.tool: v for v in readiness.verdicts() if v.framework == framework}
    lookup, wait, lead = (verdicts[f"{framework}:{t}"] for t in ("lookup", "wait_a_bit", "create_lead"))
    assert (lookup.status, lookup.does) == (readiness.READY, "read-only")
    assert (wait.status, wait.does) == (readiness.NOT_READY, "undeclared")
    assert "possibly destructive" in " ".join(wait.reasons)
    # Declared external, keyed, with a status lookup at the CRM: a call cut off by Stop is looked up.
    assert lead.does == "external action on crm with an idempotency key, reversible (archive)"
    assert lead.inspect and lead.status == readiness.READY

    client.force_login(cast["admin"])
    html = client.get("/readiness/").content.decode()
    assert f'id="tool-{slugify(f"{framework}:wait_a_bit")}"' in html and "undeclared" in html
    narrow = html[html.index('id="readiness-narrow"') :].split("</p>")[0]
    named = [chunk.split("</code>")[0] for chunk in narrow.split("<code>")[1:]]
    assert named == [f"{framework}:wait_a_bit"]  # not the read-only lookup, not the keyed, looked-up lead


@pytest.mark.django_db
def test_what_each_declaration_means_for_readiness():
    cases = {
        "read": (declare(read_only=True)(lambda: None), readiness.READY),
        "undo": (declare(reversible="delete the draft")(lambda: None), readiness.LIMITED),
        "burn": (declare(irreversible=True)(lambda: None), readiness.NOT_READY),
        "mail": (declare(system="mailer", idempotency_key=lambda a: "k")(lambda: None), readiness.NOT_READY),
        "what": (lambda: None, readiness.NOT_READY),
    }
    from stopdesk.agent.frameworks.declare import declaration_of

    got = {
        name: readiness.declared_verdict(_tool_detail(name, declaration_of(fn))["tool"]).status
        for name, (fn, _) in cases.items()
    }
    assert got == {name: status for name, (_, status) in cases.items()}
    mailer = readiness.declared_verdict(_tool_detail("mail", declaration_of(cases["mail"][0]))["tool"])
    assert "missing a status lookup for mailer" in mailer.reasons[0]


@pytest.mark.django_db
def test_an_mcp_served_tool_is_judged_by_the_servers_annotations():
    hints = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}
    remote = {"server": "git", "tool": "git_push", "annotations": hints}
    verdict = readiness.declared_verdict(
        _tool_detail("git_push", mcp_declaration("git_push", hints), mcp=remote)["tool"]
    )
    assert verdict.status == readiness.NOT_READY
    assert verdict.does == (
        "served by MCP server git; destructiveHint=true, idempotentHint=false, openWorldHint=true, readOnlyHint=false"
    )
    read = {**hints, "readOnlyHint": True}
    assert (
        readiness.declared_verdict(
            _tool_detail("git_log", mcp_declaration("git_log", read), mcp={**remote, "annotations": read})["tool"]
        ).status
        == readiness.READY
    )


@pytest.mark.django_db
def test_a_failed_framework_drill_makes_even_a_read_only_tool_not_ready():
    run = DrillRun.objects.create(passed=False)
    DrillResult.objects.create(
        run=run, drill="slow_tool", mechanism="langgraph", expected="x", observed="y", passed=False
    )
    from stopdesk.agent.frameworks.declare import declaration_of

    lookup = declaration_of(declare(read_only=True)(lambda: None))
    verdict = readiness.declared_verdict(_tool_detail("lookup", lookup)["tool"])
    assert verdict.status == readiness.NOT_READY and "slow_tool" in verdict.reasons[-1]


@pytest.mark.django_db
def test_enforce_refuses_an_undeclared_framework_tool_and_lets_a_read_only_one_through(settings):
    from stopdesk.agent.frameworks.declare import UNDECLARED, declaration_of

    settings.STOPDESK_READINESS_POLICY = "enforce"
    task = make_task()
    lookup = declaration_of(declare(read_only=True)(lambda: None))

    item_register(task=task, kind=Kind.LOCAL_WORKER, noun="lookup", actor="a", detail=_tool_detail("lookup", lookup))
    with pytest.raises(ToolNotReady) as refused:
        item_register(
            task=task, kind=Kind.LOCAL_WORKER, noun="wait", actor="a", detail=_tool_detail("wait_a_bit", UNDECLARED)
        )
    assert refused.value.tool == "langgraph:wait_a_bit"
