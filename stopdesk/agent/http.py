"""`http_submit`, where agent code is documented to find it; it lives with its mechanism
(reconcile/mechanisms/http/agent.py)."""

from reconcile.mechanisms.http.agent import Submitted, http_submit

__all__ = ["Submitted", "http_submit"]
