"""The in-process runtime: `LocalRuntime`, the one runtime every door and integration calls (the
HTTP API serves it; the framework integrations run on it). `local` is the facade, `info` maps the
ledger's rows to the answers both doors give, `errors` turns the services' refusals into those
doors' errors, and `watch` is `watch_stop`'s handle.

    from stopdesk.agent.runtime import LocalRuntime
"""

from stopdesk.agent.runtime.local import LocalRuntime
from stopdesk.agent.runtime.watch import LocalStopWatch

__all__ = ["LocalRuntime", "LocalStopWatch"]
