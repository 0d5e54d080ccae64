"""The runtime API's wire vocabulary, shared by both doors and both sides: the errors (`errors`),
the answers (`types`) and the external-action pattern (`action`). The HTTP client, the in-process
runtime, the API and the services all speak it; it imports nothing of Django, Celery or httpx, so
an agent process that only has the client needs nothing else."""
