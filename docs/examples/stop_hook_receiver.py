"""A receiver for stopdesk's Stop hook: it verifies the signature, acts once per `webhook-id`, and
revokes the keys of what was in flight the moment Stop is pressed.

    STOPDESK_WEBHOOK_SECRET=whsec_... python docs/examples/stop_hook_receiver.py 8765

Register http://<host>:8765/ in the admin (Notifications > Webhook endpoints) with the topics
["stop_requested"] and the endpoint's secret here. `revoke` prints; put your secrets manager's
call there (rotate the runtime's API key, disable the system's token, ...).
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SECRET = os.environ["STOPDESK_WEBHOOK_SECRET"]  # keep the whsec_ prefix
acted_on: set[str] = set()  # webhook-ids already handled; keep them in a store that survives restarts


def revoke(*, runtime: str, system: str, task_id: int) -> None:
    """Revoke one key. Revoking twice must be harmless: a retry after a lost answer comes again."""
    print(f"revoked {system} key of runtime {runtime} (stop of task {task_id})", flush=True)


def on_stop(event: dict[str, Any]) -> None:
    data = event["data"]
    runtime = (data["runtime"] or {}).get("name") or "in-process"
    # One key per system a tool in flight acts on; a tool that declared no system by its name.
    for system in sorted({tool["system"] or tool["tool"] for tool in data["in_flight"]}):
        revoke(runtime=runtime, system=system, task_id=data["task_id"])


class Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            event = Webhook(SECRET).verify(body, {k.lower(): v for k, v in self.headers.items()})
        # A bare ValueError (no "v1,") and UnicodeDecodeError (a body not UTF-8) are bad signatures too.
        except (WebhookVerificationError, ValueError, UnicodeDecodeError):
            self._answer(401)
            return
        webhook_id = self.headers["webhook-id"]
        if event["type"] == "stopdesk.stop_requested" and webhook_id not in acted_on:
            on_stop(event)
            # Marked after revoking: a crash in between revokes again (harmless), never not at all.
            acted_on.add(webhook_id)
        self._answer(204)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the revocations are the output
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8765), Hook)
    print(json.dumps({"listening": server.server_address[1]}), flush=True)
    server.serve_forever()
