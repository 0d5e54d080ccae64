"""The runtime HTTP API (/api/v1/): a thin door in front of `stopdesk.agent.runtime.LocalRuntime`."""
