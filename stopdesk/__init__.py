"""stopdesk: the ledger that makes an agent's Stop button honest.

Nothing is imported here, so `import stopdesk.client` (httpx only) and the pure parts
(`stopdesk.states`, `reconcile.engine`) load without Django. The Celery app is loaded when Django
starts (`StopdeskConfig.ready`) and by `celery -A stopdesk`, which finds `stopdesk.celery`.
"""
