"""A Claude Code agent (the Claude Agent SDK) whose every tool use is in stopdesk, with what each
command and file edit touched, and which stops when you press Stop on its task page.

    pip install ".[claude-agent-sdk]"
    STOPDESK_URL=http://127.0.0.1:8000 STOPDESK_TOKEN=sd_... \
    ANTHROPIC_BASE_URL=http://127.0.0.1:<sandbox openai port> ANTHROPIC_API_KEY=anything \
    DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 DISABLE_AUTOUPDATER=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 python docs/examples/claude_agent_sdk_agent.py

Against the sandbox, the model is the stand-in's scripted model, which also answers Anthropic's
Messages API (no key); against Anthropic, set ANTHROPIC_API_KEY and MODEL, and leave
ANTHROPIC_BASE_URL unset. The agent works in WORKDIR (default: a new temporary directory).
STEP_SECONDS paces the long command so there is time to press Stop.
"""

import asyncio
import os
import tempfile

import httpx
from claude_agent_sdk import ClaudeAgentOptions

from stopdesk.agent.frameworks import RunStopped
from stopdesk.agent.frameworks.claude_agent_sdk import run_agent
from stopdesk.client import AsyncClient

STEP = float(os.environ.get("STEP_SECONDS", "1"))
BASE_URL = os.environ.get("ANTHROPIC_BASE_URL", "")
WORKDIR = os.environ.get("WORKDIR") or tempfile.mkdtemp(prefix="claude-agent-")

SCRIPT = {
    "name": "tidy-notes",
    "turns": [
        {"tool_calls": [{"name": "Write", "arguments": {"file_path": f"{WORKDIR}/NOTES.md", "content": "# Notes\n"}}]},
        # A read-only command that runs for a while (the CLI refuses a bare `sleep`).
        {
            "tool_calls": [
                {"name": "Bash", "arguments": {"command": f"timeout {3 * STEP:g} tail -f NOTES.md; cat NOTES.md"}}
            ]
        },
        {"text": "The notes are written and checked."},
    ],
}


async def main() -> None:
    scripted = BASE_URL.startswith("http://127.0.0.1") and not os.environ.get("MODEL")
    if scripted:
        await load_script(BASE_URL, SCRIPT)
    options = ClaudeAgentOptions(
        cwd=WORKDIR,
        allowed_tools=["Bash", "Write", "Edit", "Read"],
        setting_sources=[],
        model=os.environ.get("MODEL") or "claude-sonnet-4-5",
    )
    # The scripted model reads which script to follow from the prompt.
    prompt = ("[script:tidy-notes] " if scripted else "") + "Write NOTES.md and check it."
    async with AsyncClient(os.environ["STOPDESK_URL"], os.environ["STOPDESK_TOKEN"]) as sd:
        task = await sd.create_task("Tidy the notes (Claude Agent SDK)")
        print(f"task {task.id}: press Stop on its page to stop it", flush=True)
        try:
            result = await run_agent(sd, task.id, prompt, options=options)
            print(result.result if result is not None else "")
        except RunStopped:
            print("stopped: the session was interrupted and no tool ran after Stop")
        # The task is over: it takes no new work. Until this, it stays open and keeps its Stop.
        await sd.close_task(task.id)
        print((await sd.get_task(task.id)).summary)


async def load_script(base_url: str, script: dict) -> None:
    """Give the sandbox's scripted model its script."""
    async with httpx.AsyncClient() as http:
        answer = await http.post(base_url + "/_control/scripts", json=script)
        answer.raise_for_status()


if __name__ == "__main__":
    asyncio.run(main())
