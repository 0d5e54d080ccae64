"""A CrewAI crew whose every tool call and model request is in stopdesk, and which stops when you
press Stop on its task page.

CrewAI cannot be installed beside the stopdesk server (it pins older mcp and openai), so the crew
runs in an environment of its own, with stopdesk's client side, and talks to the server over HTTP:

    python -m venv crewai-env && crewai-env/bin/pip install ".[crewai]"   # or: make crewai-venv
    STOPDESK_URL=http://127.0.0.1:8000 STOPDESK_TOKEN=sd_... \
    OPENAI_BASE_URL=http://127.0.0.1:<sandbox openai port>/v1 crewai-env/bin/python docs/examples/crewai_agent.py

Against the sandbox, the model is the stand-in's scripted model (no key), reached through CrewAI's
own OpenAI provider; against OpenAI, set OPENAI_API_KEY and MODEL. STEP_SECONDS paces the tools so
there is time to press Stop.
"""

import asyncio
import os

# CrewAI calls home unless told not to: no telemetry, no tracing, no version check.
os.environ.update(
    CREWAI_DISABLE_TELEMETRY="true",
    CREWAI_DISABLE_TRACKING="true",
    OTEL_SDK_DISABLED="true",
    CREWAI_TRACING_ENABLED="false",
    CREWAI_DISABLE_VERSION_CHECK="true",
)

import httpx
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

from stopdesk.agent.frameworks import RunStopped, declare
from stopdesk.agent.frameworks.crewai import run_crew
from stopdesk.client import AsyncClient

STEP = float(os.environ.get("STEP_SECONDS", "1"))
BASE_URL = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")

SCRIPT = {
    "name": "research-acme",
    "turns": [
        {
            "tool_calls": [
                {"name": "look_up", "arguments": {"company": "Acme"}},
                {"name": "look_up", "arguments": {"company": "Acme's parent"}},
            ]
        },
        {"tool_calls": [{"name": "write_report", "arguments": {"company": "Acme"}}]},
        {"text": "Acme has 12 employees; the report is ready."},
    ],
}


@tool("look_up")
@declare(read_only=True, noun="lookup")
async def look_up(company: str) -> str:
    """Look a company up in the directory."""
    await asyncio.sleep(STEP)
    return f"{company}: 12 employees, based in Lyon"


@tool("write_report")
@declare(read_only=True, noun="report")
async def write_report(company: str) -> str:
    """Write a long report about a company."""
    await asyncio.sleep(3 * STEP)
    return f"A report on {company}"


async def main() -> None:
    model = os.environ.get("MODEL") or await load_script(BASE_URL, SCRIPT)
    llm = LLM(model=f"openai/{model}", base_url=BASE_URL, api_key=os.environ.get("OPENAI_API_KEY", "no-key-needed"))
    researcher = Agent(
        role="researcher", goal="Research companies", backstory="Careful.", tools=[look_up, write_report], llm=llm
    )
    research = Task(description="Research Acme", expected_output="One line about Acme", agent=researcher)
    crew = Crew(agents=[researcher], tasks=[research], tracing=False)
    async with AsyncClient(os.environ["STOPDESK_URL"], os.environ["STOPDESK_TOKEN"]) as sd:
        task = await sd.create_task("Research Acme (CrewAI)")
        print(f"task {task.id}: press Stop on its page to stop it", flush=True)
        try:
            output = await run_crew(sd, task.id, crew)
            print(output.raw)
        except RunStopped:
            print("stopped: the run ended and no tool ran after Stop")
        # The task is over: it takes no new work. Until this, it stays open and keeps its Stop.
        await sd.close_task(task.id)
        print((await sd.get_task(task.id)).summary)


async def load_script(base_url: str, script: dict) -> str:
    """Give the sandbox's scripted model its script; returns the model name that selects it."""
    async with httpx.AsyncClient() as http:
        answer = await http.post(base_url.removesuffix("/v1") + "/_control/scripts", json=script)
        answer.raise_for_status()
        return answer.json()["model"]


if __name__ == "__main__":
    asyncio.run(main())
