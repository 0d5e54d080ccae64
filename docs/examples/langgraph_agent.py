"""A LangGraph agent (LangChain's `create_agent`) whose every tool call and model request is in
stopdesk, and which stops when you press Stop on its task page.

    pip install ".[langgraph]"
    STOPDESK_URL=http://127.0.0.1:8000 STOPDESK_TOKEN=sd_... \
    OPENAI_BASE_URL=http://127.0.0.1:<sandbox openai port>/v1 python docs/examples/langgraph_agent.py

Against the sandbox, the model is the stand-in's scripted model (no key); against OpenAI, set
OPENAI_API_KEY and MODEL. STEP_SECONDS paces the tools so there is time to press Stop.
"""

import asyncio
import os

import httpx
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from stopdesk.agent.frameworks import RunStopped, declare
from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware, run_agent
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


@tool
@declare(read_only=True, noun="lookup")
async def look_up(company: str) -> str:
    """Look a company up in the directory."""
    await asyncio.sleep(STEP)
    return f"{company}: 12 employees, based in Lyon"


@declare(read_only=True, noun="report")  # above or below @tool: either counts
@tool
async def write_report(company: str) -> str:
    """Write a long report about a company."""
    await asyncio.sleep(3 * STEP)
    return f"A report on {company}"


async def main() -> None:
    model = os.environ.get("MODEL") or await load_script(BASE_URL, SCRIPT)
    chat = ChatOpenAI(model=model, base_url=BASE_URL, api_key=os.environ.get("OPENAI_API_KEY", "no-key-needed"))
    graph = create_agent(chat, tools=[look_up, write_report], middleware=[StopdeskMiddleware()])
    async with AsyncClient(os.environ["STOPDESK_URL"], os.environ["STOPDESK_TOKEN"]) as sd:
        task = await sd.create_task("Research Acme (LangGraph)")
        print(f"task {task.id}: press Stop on its page to stop it", flush=True)
        try:
            state = await run_agent(sd, task.id, graph, {"messages": [{"role": "user", "content": "Research Acme"}]})
            print(state["messages"][-1].content)
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
