"""stopdesk: the ledger that makes an agent's Stop button honest.

Nothing is imported here, so `import stopdesk.client` (httpx and aiohttp only) and the pure parts
(`stopdesk.states`, `reconcile.engine`) load without Django. The Celery app is loaded when Django
starts (`StopdeskConfig.ready`) and by `celery -A stopdesk`, which finds `stopdesk.celery`.

`stopdesk.stop_requested()`: a tool body's check for Stop (`stopdesk.agent.frameworks.threads`),
loaded when it is first called.
"""


def stop_requested() -> bool:
    """Whether the stopdesk run this tool body runs under has heard Stop (False outside a run)."""
    from stopdesk.agent.frameworks.threads import stop_requested as heard

    return heard()
