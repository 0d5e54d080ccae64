"""Celery workers: queued tasks that pass the boundary before they run (`LedgerTask`)."""
