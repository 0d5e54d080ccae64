"""A CrewAI crew run through `stopdesk.agent.frameworks.crewai`, as its own process in the CrewAI
venv (`make crewai-venv`: crewai cannot be installed beside the server), against a stopdesk server
over HTTP and the sandbox's scripted model. The drills, the benchmark and the tests start it:

    tests/frameworks_venvs/crewai/bin/python stopdrill/crewai_child.py '<json config>'
    tests/frameworks_venvs/crewai/bin/python stopdrill/crewai_child.py --stdin   # says "ready", reads the config

It imports nothing of Django: only crewai, httpx and stopdesk's client side. It prints one JSON line
per event (`tool_started`, `tool_returned`, `end`) so whoever started it can follow it. Config keys:
`stopdesk_url`, `token`, `task_id`, `model_url`, `model`, `tools` (names below), `tasks` (how many
crew tasks, one agent), `step_s`, `block_s`, `watch` ("push", or "never": only the boundary stands
between Stop and the next call), `uninterruptible_s`, `lead` (the drill's CRM lead), `max_uses`
(a tool's name: how many calls CrewAI lets it have), and `bench` (repeats: time plain and recorded
kickoffs, alternating, and print the medians).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# No call home from CrewAI: no telemetry, no tracing, no first-run trace prompt.
os.environ.update(
    CREWAI_DISABLE_TELEMETRY="true",
    CREWAI_DISABLE_TRACKING="true",
    OTEL_SDK_DISABLED="true",
    CREWAI_TRACING_ENABLED="false",
    CREWAI_TESTING="true",
    CREWAI_DISABLE_VERSION_CHECK="true",
)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
LOOPBACK = ("127.", "::1", "localhost")


def _loopback_only(event: str, args: tuple[Any, ...]) -> None:
    """Refuse, and say so, any connection or name lookup beyond this machine: the process talks to
    the stopdesk server and the scripted model on loopback, and to nothing else."""
    if event not in ("socket.connect", "socket.getaddrinfo"):
        return
    target = args[1] if event == "socket.connect" else args[0]
    host = target[0] if isinstance(target, tuple) else target
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str) or host.startswith(("/", *LOOPBACK)) or host == "":
        return
    print(json.dumps({"event": "network_refused", "host": host}), flush=True)
    raise ConnectionRefusedError(f"this process reaches loopback only, not {host}")


sys.addaudithook(_loopback_only)

import httpx  # noqa: E402 - after the loopback guard
from crewai import LLM, Agent, Crew, Task  # noqa: E402 - after the loopback guard
from crewai.tools import tool  # noqa: E402 - after the loopback guard

from stopdesk import stop_requested  # noqa: E402 - after the loopback guard
from stopdesk.agent.frameworks import RunStopped, ToolStopped, declare  # noqa: E402 - after the loopback guard
from stopdesk.agent.frameworks.crewai import run_crew  # noqa: E402 - after the loopback guard
from stopdesk.client import AsyncClient  # noqa: E402 - after the loopback guard


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


def tools_for(config: dict[str, Any]) -> dict[str, Any]:
    step = float(config.get("step_s", 0.05))
    block = float(config.get("block_s", 1.0))

    @tool("look_up")
    @declare(read_only=True, noun="lookup")
    async def look_up(company: str) -> str:
        """Look a company up in the directory."""
        say("tool_started", tool="look_up")
        await asyncio.sleep(step)
        say("tool_returned", tool="look_up")
        return f"{company}: 12 employees, based in Lyon"

    @tool("write_report")
    @declare(read_only=True, noun="report")
    async def write_report(company: str) -> str:
        """Write a long report about a company."""
        say("tool_started", tool="write_report")
        await asyncio.sleep(block)
        say("tool_returned", tool="write_report")
        return f"A report on {company}"

    @tool("blocking_export")
    @declare(read_only=True, noun="export")
    def blocking_export(name: str) -> str:
        """Export a company's records (a plain function: nothing interrupts it)."""
        say("tool_started", tool="blocking_export")
        time.sleep(block)
        say("tool_returned", tool="blocking_export")
        return f"exported {name}"

    @tool("careful_export")
    @declare(read_only=True, noun="export")
    def careful_export(name: str) -> str:
        """Export a company's records page by page, stopping when Stop is asked."""
        say("tool_started", tool="careful_export")
        pages = 0
        deadline = time.monotonic() + block
        while time.monotonic() < deadline:
            if stop_requested():
                say("tool_returned", tool="careful_export", pages=pages)
                raise ToolStopped(f"stopped after {pages} pages")
            time.sleep(0.05)
            pages += 1
        say("tool_returned", tool="careful_export", pages=pages)
        return f"exported {name}: {pages} pages"

    @tool("work")
    async def work(step: int) -> str:
        """Do one step of the job."""
        await asyncio.sleep(step_s_bench(config))
        return f"step {step} done"

    chosen = {t.name: t for t in (look_up, write_report, blocking_export, careful_export, work)}
    for name, uses in config.get("max_uses", {}).items():
        chosen[name].max_usage_count = int(uses)  # CrewAI refuses the calls past it
    lead = config.get("lead")
    if lead:
        chosen["create_lead"] = lead_tool(lead)
    return {name: chosen[name] for name in config.get("tools", [])}


def step_s_bench(config: dict[str, Any]) -> float:
    return float(config.get("bench", {}).get("tool_s", 0.05))


def lead_tool(lead: dict[str, Any]) -> Any:
    """The drill's external action: create a lead in the sandbox CRM with an idempotency key."""
    key, base, timeout = lead["key"], lead["base"], float(lead["timeout"])

    @tool("create_lead")
    @declare(
        system=lead["system"],
        idempotency_key=lambda args: key,
        reversible="archive",
        noun="lead",
        http=lead["http"],
    )
    async def create_lead(name: str) -> str:
        """Create a lead in the CRM."""
        say("tool_started", tool="create_lead")
        async with httpx.AsyncClient(timeout=timeout) as http:
            answer = await http.post(base + "/records", json={"name": name}, headers={"Idempotency-Key": key})
        if answer.is_error:
            raise RuntimeError(f"the CRM answered {answer.status_code}")
        return f"created {answer.json()['id']}"

    return create_lead


def build_crew(config: dict[str, Any]) -> Crew:
    # The native OpenAI provider (no LiteLLM), pointed at the scripted model.
    llm = LLM(
        model="openai/" + config["model"],
        base_url=config["model_url"],
        api_key=os.environ.get("OPENAI_API_KEY", "no-key-needed"),
        max_retries=0,
    )
    agent = Agent(
        role="researcher",
        goal="Answer with what the tools find",
        backstory="A careful researcher.",
        tools=list(tools_for(config).values()),
        llm=llm,
        verbose=False,
        max_iter=int(config.get("max_iter", 25)),
    )
    tasks = [
        Task(description=f"Research Acme, part {n + 1}", expected_output="One line", agent=agent)
        for n in range(int(config.get("tasks", 1)))
    ]
    pause = float(config.get("task_pause_s", 0))

    def task_finished(output: Any) -> None:
        # The crew's own task callback: slow enough for Stop to land between two tasks.
        say("task_finished", output=output.raw)
        time.sleep(pause)

    return Crew(
        agents=[agent], tasks=tasks, tracing=False, verbose=False, task_callback=task_finished if pause else None
    )


async def never() -> None:
    await asyncio.Event().wait()


async def run(config: dict[str, Any]) -> int:
    async with AsyncClient(config["stopdesk_url"], config["token"]) as client:
        try:
            output = await run_crew(
                client,
                int(config["task_id"]),
                build_crew(config),
                watch=never if config.get("watch") == "never" else None,
                poll_s=0.05,
                uninterruptible_s=float(config.get("uninterruptible_s", 300)),
            )
        except RunStopped:
            say("end", outcome="stopped")
            return 0
        except Exception as exc:
            say("end", outcome="failed", error=f"{type(exc).__name__}: {exc}")
            return 1
    say("end", outcome="completed", output=output.raw)
    return 0


async def bench(config: dict[str, Any]) -> int:
    """Plain kickoffs and recorded ones, alternating; the medians of each, in seconds."""
    plain: list[float] = []
    recorded: list[float] = []
    cpu_plain: list[float] = []
    cpu_recorded: list[float] = []
    async with AsyncClient(config["stopdesk_url"], config["token"]) as client:
        await asyncio.to_thread(build_crew(config).kickoff)  # warm-up: imports, connections
        for task_id in config["bench"]["task_ids"]:
            began, cpu = time.perf_counter(), time.process_time()
            await asyncio.to_thread(build_crew(config).kickoff)
            plain.append(time.perf_counter() - began)
            cpu_plain.append(time.process_time() - cpu)
            began, cpu = time.perf_counter(), time.process_time()
            await run_crew(client, int(task_id), build_crew(config), poll_s=0.05)
            recorded.append(time.perf_counter() - began)
            cpu_recorded.append(time.process_time() - cpu)
    say(
        "bench",
        plain_s=statistics.median(plain),
        recorded_s=statistics.median(recorded),
        cpu_plain_s=statistics.median(cpu_plain),
        cpu_recorded_s=statistics.median(cpu_recorded),
    )
    return 0


def main() -> int:
    if sys.argv[1] == "--stdin":
        # Started ahead of its work (CrewAI takes seconds to import): ready, then the config.
        say("ready")
        config = json.loads(sys.stdin.readline())
    else:
        config = json.loads(sys.argv[1])
    return asyncio.run(bench(config) if config.get("bench") else run(config))


if __name__ == "__main__":
    sys.exit(main())
