"""The local sandbox: the external parties stopdesk's demo, drills and tests talk to.

Each party is a real HTTP server on 127.0.0.1 (no Django anywhere in this package). A mechanism's
stand-in lives in its folder (`reconcile/mechanisms/<name>/sandbox.py`: the OpenAI Responses API,
the MCP tool server, the CRM); here are the machinery and the parties no mechanism owns:

- `outbox.Outbox`: irreversible sends, status lookup by idempotency key.
- `webhooks.WebhookReceiver`: verifies and records the notifications stopdesk delivers.

Start one with `server.BackgroundServer(party.app)`, or all of them with `server.start_all()`.
Run `python -m stopdrill.sandbox` to serve them for a walkthrough.
"""
