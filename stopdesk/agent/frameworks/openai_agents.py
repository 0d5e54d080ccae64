"""OpenAI Agents SDK (openai-agents 0.24): every tool call and model request in the ledger, and Stop.

    from agents import Agent, OpenAIResponsesModel, Runner
    from stopdesk.agent.frameworks.openai_agents import instrument, stopdesk_tool, run_agent

    @stopdesk_tool(read_only=True)
    async def lookup(q: str) -> str: ...

    agent = Agent(name="sales", tools=[lookup], model=OpenAIResponsesModel("gpt-5", client))
    result = await run_agent(runtime, task.id, agent, "Add Acme as a lead")   # RunStopped on Stop

`@declare` above or below a plain `@function_tool` counts too (the FunctionTool keeps the function
as `__wrapped__`); an MCP server's tools are declared by name, `run_agent(declarations=...)`. The
agents the run can hand off to are instrumented with it, so their tools are recorded as well.

Hook points (read in the installed SDK): a `FunctionTool`'s `on_invoke_tool(ToolContext, json)`
runs the body after the SDK's own guardrails and approvals, and `ToolContext.tool_call_id` is the
model's call id, so the wrapper puts the boundary right before the body. A tool's exception reaches
the wrapper (the body runs from a copy whose failure policy is "raise"), so a failed call is
recorded failed, and the tool's own formatter then answers the model. Model requests go through a
`Model` wrapper (`get_response` / `stream_response`), which also sees hosted `mcp_call` items the
provider ran (a `HostedMCPTool`) and records them as children of the request's item, also when
the answer arrives after Stop (`hosted.py`). A request that offers hosted MCP tools can act on the
provider's side, so it passes the boundary before it is sent, where a plain draft is recorded
while it is out. Stop cancels the asyncio task of `Runner.run`, or
calls `RunResultStreaming.cancel(mode="immediate")` for a streamed run.

What Stop interrupts: an `async def` tool at its next await. A plain `def` tool runs in
`asyncio.to_thread`, which no cancel reaches: it is recorded as still running and then as it ended
(`core`), unless it checks `stop_requested()` and raises `ToolStopped`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from agents import Agent, FunctionTool, Handoff, HostedMCPTool, Runner, function_tool
from agents.models.interface import Model
from agents.result import RunResult, RunResultStreaming
from agents.tool import resolve_function_tool_failure_error_function, set_function_tool_failure_error_function

from stopdesk.agent.frameworks.core import CURRENT, StopdeskRun
from stopdesk.agent.frameworks.declare import UNDECLARED, ToolDeclaration, declaration_of, declare
from stopdesk.agent.frameworks.hosted import record_hosted_calls
from stopdesk.protocol.errors import StopRequested

FRAMEWORK = "openai-agents"


def guard_tool(
    tool: FunctionTool,
    declaration: ToolDeclaration | None = None,
    *,
    kind: str = "",
    extra: dict[str, Any] | None = None,
) -> FunctionTool:
    """The same tool, with the ledger and the boundary around its body (a copy; `tool` is unchanged)."""
    declared = declaration or declaration_of(tool)
    formatter = resolve_function_tool_failure_error_function(tool)
    # The body runs from a copy whose failure policy is "raise", so the ledger sees the exception
    # (the SDK's invoker binds the policy to the tool it was made for); the tool's own formatter
    # then answers the model, as it would have without stopdesk.
    inner = dataclasses.replace(tool)
    set_function_tool_failure_error_function(inner, None)
    original = inner.on_invoke_tool

    async def invoke(ctx: Any, payload: str) -> Any:
        run = CURRENT.get()
        if run is None:
            return await tool.on_invoke_tool(ctx, payload)
        try:
            return await run.tool_call(
                call_id=ctx.tool_call_id,
                name=tool.name,
                arguments=_arguments(payload),
                body=lambda: original(ctx, payload),
                declaration=declared,
                kind=kind,
                extra=extra,
            )
        except Exception as exc:
            if formatter is None:
                raise
            answer = formatter(ctx, exc)
            return await answer if inspect.isawaitable(answer) else answer

    guarded = dataclasses.replace(tool, on_invoke_tool=invoke)
    setattr(guarded, "__stopdesk_tool__", declared)  # noqa: B010 - the attribute name is shared with declare()
    return guarded


def stopdesk_tool(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """`@function_tool` plus a declaration (the `declare()` keywords) and the guard, in one decorator.
    Other keywords go to `function_tool`."""
    declare_keys = {"read_only", "reversible", "irreversible", "system", "idempotency_key", "http", "noun"}
    declared = {k: options.pop(k) for k in list(options) if k in declare_keys}

    def build(target: Callable[..., Any]) -> FunctionTool:
        if declared or declaration_of(target) is UNDECLARED:
            declare(target, **declared)
        return guard_tool(function_tool(target, **options), declaration_of(target))

    return build(fn) if fn is not None else build


def guard_mcp_tool(tool: FunctionTool, declaration: ToolDeclaration | None = None) -> FunctionTool:
    """A tool the SDK made from an MCP server's tool list: recorded as a remote tool with the
    server's annotations. What it does is `declaration` when the application declared it (by
    name), else what the annotations say: read-only only when the server says `readOnlyHint`,
    otherwise possibly destructive (the spec's default)."""
    server, name, _ = tool._mcp_tool_binding or ("", tool.name, None)
    hints = getattr(tool, "_mcp_annotations", None)
    read_only = bool(getattr(hints, "read_only_hint", None) or getattr(hints, "readOnlyHint", None))
    annotations = hints.model_dump(by_alias=True, exclude_none=True) if hints is not None else {}
    declaration = declaration or ToolDeclaration(effect="read_only" if read_only else "unknown", noun=f"{name} call")
    extra = {"mcp": {"server": server, "tool": name, "annotations": annotations}}
    return guard_tool(tool, declaration, kind="remote_tool", extra=extra)


@dataclasses.dataclass
class StopdeskAgent(Agent[Any]):
    """An Agent whose MCP servers' tools are guarded too: the SDK lists them on every turn.
    `stopdesk_declarations` says what tools do by name, for those no `@declare` can reach."""

    stopdesk_declarations: dict[str, ToolDeclaration] = dataclasses.field(default_factory=dict)

    async def get_mcp_tools(self, run_context: Any) -> list[Any]:
        tools = await super().get_mcp_tools(run_context)
        return [
            guard_mcp_tool(t, self.stopdesk_declarations.get(t.name))
            if isinstance(t, FunctionTool) and not _guarded(t)
            else t
            for t in tools
        ]


def _guarded(tool: FunctionTool) -> bool:
    return getattr(tool.on_invoke_tool, "__name__", "") == "invoke"


class StopdeskModel(Model):
    """A model whose every request is a draft item, refused after Stop."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        run = CURRENT.get()
        if run is None:
            return await self.inner.get_response(*args, **kwargs)
        acts = _launches_hosted(args, kwargs)
        async with run.model_request(acts=acts) as draft:
            if acts:
                await _pass_before_sending(run, draft)
            response = await self.inner.get_response(*args, **kwargs)
            # Before the boundary's verdict on the answer: a discarded answer's calls still ran.
            record_hosted_calls(run, response.output, draft)
        return response

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        run = CURRENT.get()
        if run is None:
            async for event in self.inner.stream_response(*args, **kwargs):
                yield event
            return
        acts = _launches_hosted(args, kwargs)
        async with run.model_request(acts=acts) as draft:
            if acts:
                await _pass_before_sending(run, draft)
            async for event in self.inner.stream_response(*args, **kwargs):
                kind = getattr(event, "type", "")
                # Each hosted call as soon as its item is done, so a stream cut short by Stop keeps
                # the calls it already reported; the completed response repeats them (recorded once).
                if kind == "response.output_item.done":
                    record_hosted_calls(run, [getattr(event, "item")], draft)  # noqa: B009 - narrows the union
                elif kind == "response.completed":
                    record_hosted_calls(run, getattr(event, "response").output, draft)  # noqa: B009
                yield event

    async def close(self) -> None:
        await self.inner.close()

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)


def instrument(
    agent: Agent[Any],
    declarations: dict[str, ToolDeclaration] | None = None,
    _clones: dict[int, StopdeskAgent] | None = None,
) -> Agent[Any]:
    """A clone of `agent` whose function tools (and its MCP servers' tools) are guarded and whose
    model requests are recorded, and so are those of every agent it can hand off to (the run goes
    on with the handoff's agent, whose tools would otherwise pass unrecorded). A tool's declaration
    is read from the tool (`@declare` above or below `@function_tool`), or from `declarations` (by
    tool name), which also reaches the tools of the agent's MCP servers."""
    declarations = declarations or {}
    clones = {} if _clones is None else _clones
    if id(agent) in clones:  # agents that hand off to each other: one clone each
        return clones[id(agent)]
    tools = []
    for tool in agent.tools:
        if isinstance(tool, FunctionTool) and not _guarded(tool):
            tool = guard_tool(tool, declarations.get(tool.name))
        tools.append(tool)
    if not isinstance(agent.model, Model):
        raise TypeError(
            f"give the agent {agent.name!r} a Model instance (e.g. OpenAIResponsesModel(...)) so its requests are recorded"
        )
    model = agent.model if isinstance(agent.model, StopdeskModel) else StopdeskModel(agent.model)
    fields = {f.name: getattr(agent, f.name) for f in dataclasses.fields(agent) if f.init}
    named = {**fields.get("stopdesk_declarations", {}), **declarations}
    clone = StopdeskAgent(**{**fields, "tools": tools, "model": model, "stopdesk_declarations": named})
    clones[id(agent)] = clones[id(clone)] = clone
    clone.handoffs = [_instrument_handoff(h, declarations, clones) for h in agent.handoffs]
    return clone


def _instrument_handoff(target: Any, declarations: dict[str, ToolDeclaration], clones: dict[int, StopdeskAgent]) -> Any:
    """A handoff whose agent is instrumented: an Agent directly; a `handoff(...)` object by the
    agent its invoker returns (checked now, when the handoff still knows its agent)."""
    if isinstance(target, Agent):
        return instrument(target, declarations, clones)
    if not isinstance(target, Handoff):
        return target
    known = target._agent_ref() if target._agent_ref is not None else None
    if isinstance(known, Agent):
        instrument(known, declarations, clones)
    original = target.on_invoke_handoff

    async def invoke(ctx: Any, payload: str) -> Any:
        return instrument(await original(ctx, payload), declarations, clones)

    guarded = copy.copy(target)
    guarded.on_invoke_handoff = invoke
    return guarded


async def run_agent(
    runtime: Any,
    task_id: int,
    agent: Agent[Any],
    input: Any,
    *,
    streamed: bool = False,
    on_event: Callable[[Any], Any] | None = None,
    declarations: dict[str, ToolDeclaration] | None = None,
    cleanup_s: float = 5.0,
    watch: Any = None,
    poll_s: float = 0.2,
    uninterruptible_s: float = 300.0,
    **runner_kwargs: Any,
) -> RunResult | RunResultStreaming:
    """Run `agent` under `task_id`: the ledger sees every call, and Stop ends the run (RunStopped).
    `declarations`: what tools do by name, for tools no `@declare` reaches (an MCP server's)."""
    agent = instrument(agent, declarations)
    async with StopdeskRun(
        runtime,
        task_id,
        framework=FRAMEWORK,
        agent=agent.name,
        cleanup_s=cleanup_s,
        watch=watch,
        poll_s=poll_s,
        uninterruptible_s=uninterruptible_s,
    ) as run:
        if not streamed:
            return await run.run(Runner.run(agent, input, **runner_kwargs))
        result = Runner.run_streamed(agent, input, **runner_kwargs)
        run.on_stop(lambda: result.cancel(mode="immediate"))

        async def consume() -> RunResultStreaming:
            async for event in result.stream_events():
                if on_event is not None:
                    on_event(event)
            return result

        return await run.run(consume())


def _launches_hosted(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the request offers hosted MCP tools (`tools`, the Model interface's 4th argument)."""
    tools = kwargs.get("tools", args[3] if len(args) > 3 else [])
    return any(isinstance(tool, HostedMCPTool) for tool in tools or [])


async def _pass_before_sending(run: StopdeskRun, draft: asyncio.Future[Any]) -> None:
    """A request that may run tools on the provider's side is an action, not a draft: it waits for
    its item to pass the boundary before it is sent (a draft's is written while it is out)."""
    if (await asyncio.shield(draft)).refused:
        run.stop_seen()
        raise StopRequested(f"Task {run.task_id} was stopped; the request was not sent.", task=run.task_id)


def _arguments(payload: str) -> dict[str, Any]:
    try:
        parsed = json.loads(payload or "{}")
    except ValueError:
        return {"unparsed": payload[:500]}
    return parsed if isinstance(parsed, dict) else {"value": parsed}
