"""placeholder: the demo agent's Celery tasks land here."""
