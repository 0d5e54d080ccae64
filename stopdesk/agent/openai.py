"""`response_create` and `openai_client`, where agent code is documented to find them; they live
with their mechanism (reconcile/mechanisms/openai/agent.py)."""

from reconcile.mechanisms.openai.agent import openai_client, response_create

__all__ = ["openai_client", "response_create"]
