"""asyncio children: tasks of the agent's own event loop, cancelled through their supervisor."""
