"""Agent framework integrations, one module per framework, each behind its own extra:

- `stopdesk.agent.frameworks.openai_agents` — `pip install "stopdesk[openai-agents]"`
- `stopdesk.agent.frameworks.pydantic_ai` — `pip install "stopdesk[pydantic-ai]"`
- `stopdesk.agent.frameworks.langgraph` — `pip install "stopdesk[langgraph]"`
- `stopdesk.agent.frameworks.claude_agent_sdk` — `pip install "stopdesk[claude-agent-sdk]"`
- `stopdesk.agent.frameworks.crewai` — `pip install "stopdesk[crewai]"` (client side only: crewai
  cannot be installed beside the server; the crew records over HTTP)

Only those modules import their framework; `core` and `declare` import none.
"""

from stopdesk.agent.frameworks.core import STOPPED_RESULT, RunStopped, StopdeskRun
from stopdesk.agent.frameworks.declare import ToolDeclaration, declare
from stopdesk.agent.frameworks.threads import ToolStopped, stop_requested

__all__ = ["STOPPED_RESULT", "RunStopped", "StopdeskRun", "ToolDeclaration", "ToolStopped", "declare", "stop_requested"]
