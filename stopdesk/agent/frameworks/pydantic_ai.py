"""pydantic-ai (pydantic-ai-slim 2.68): every tool call and model request in the ledger, and Stop.

    from pydantic_ai import Agent
    from stopdesk.agent.frameworks.pydantic_ai import run_agent

    @declare(read_only=True)
    async def lookup(q: str) -> str: ...

    agent = Agent(OpenAIChatModel("gpt-5", provider=OpenAIProvider(openai_client=client)), tools=[lookup])
    result = await run_agent(runtime, task.id, agent, "Add Acme as a lead", tools=[lookup])

Hook points (read in the installed package): a capability's `wrap_tool_execute(ctx, call=ToolCallPart,
tool_def, args, handler)` encloses the tool's whole execution and may answer without calling
`handler` (so after Stop the body never runs and the model reads a "stopped" result);
`wrap_model_request(ctx, request_context, handler)` encloses each model request. Stop fires a
`CancellationToken` passed to `agent.run(..., cancellation_token=)`: pydantic-ai cancels its own
run task, drains in-flight tool tasks and raises `RunCancelled`, which becomes `RunStopped` here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import CancellationToken, RunCancelled
from pydantic_ai.capabilities import AbstractCapability

from stopdesk.agent.frameworks.core import CURRENT, StopdeskRun
from stopdesk.agent.frameworks.declare import ToolDeclaration, declaration_of

FRAMEWORK = "pydantic-ai"


@dataclass
class StopdeskCapability(AbstractCapability[Any]):
    """Records each tool call (by the model's `tool_call_id`) and model request of a run under the
    active StopdeskRun. `declarations` says what each tool does, by tool name."""

    declarations: dict[str, ToolDeclaration] = field(default_factory=dict)

    @classmethod
    def for_tools(cls, tools: Iterable[Callable[..., Any]]) -> StopdeskCapability:
        return cls({getattr(t, "__name__", str(t)): declaration_of(t) for t in tools})

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        run = CURRENT.get()
        if run is None:
            return await handler(args)
        return await run.tool_call(
            call_id=call.tool_call_id,
            name=call.tool_name,
            arguments=dict(args) if isinstance(args, dict) else {"args": str(args)},
            body=lambda: handler(args),
            declaration=self.declarations.get(call.tool_name, declaration_of(None)),
        )

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        run = CURRENT.get()
        if run is None:
            return await handler(request_context)
        async with run.model_request():
            return await handler(request_context)


async def run_agent(
    runtime: Any,
    task_id: int,
    agent: Any,
    prompt: str,
    *,
    tools: Iterable[Callable[..., Any]] = (),
    declarations: dict[str, ToolDeclaration] | None = None,
    cleanup_s: float = 5.0,
    watch: Any = None,
    poll_s: float = 0.2,
    **run_kwargs: Any,
) -> Any:
    """`agent.run(prompt)` under `task_id`; Stop fires the run's CancellationToken (RunStopped)."""
    capability = StopdeskCapability.for_tools(tools)
    capability.declarations.update(declarations or {})
    token = CancellationToken()
    async with StopdeskRun(
        runtime, task_id, framework=FRAMEWORK, cleanup_s=cleanup_s, watch=watch, poll_s=poll_s
    ) as run:
        work = agent.run(
            prompt,
            cancellation_token=token,
            capabilities=[capability, *run_kwargs.pop("capabilities", [])],
            **run_kwargs,
        )
        return await run.run(work, cancel=token.cancel, stopped_errors=(RunCancelled,))
