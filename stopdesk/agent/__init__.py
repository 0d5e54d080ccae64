"""The agent side: everything an agent's own code calls to run under stopdesk.

- `stopdesk.agent.runtime.LocalRuntime`: the runtime API in-process (the HTTP API is a door in
  front of it; `stopdesk.client` is the same API over HTTP, without Django);
- `stopdesk.agent.workers`: the Celery base task `LedgerTask` and `dispatch`;
- `stopdesk.agent.aio`: the asyncio supervisor `supervise`;
- `stopdesk.agent.openai`, `.mcp`, `.http`: an external action through the boundary, its handle
  recorded before anything else (`response_create`, `mcp_call_tool`, `mcp_start_task`,
  `http_submit`). Each is its mechanism's agent part (`reconcile/mechanisms/<name>/agent.py`),
  offered here under the names agent code uses.

These modules import the ledger services; the adapters in `reconcile.mechanisms` do not, and only
talk to their systems. Nothing is imported here, so each helper loads only what it needs.
"""
