"""OpenAI background responses from agent code: create through the boundary, handle stored first.

The adapter that cancels and reads these responses back is `reconcile.mechanisms.openai.adapter`.
"""

from __future__ import annotations

import logging
from typing import Any

import openai as sdk

from reconcile.mechanisms.openai.adapter import client_for
from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.webhooks import webhook_wake_recorded
from reconcile.tasks import wakes_dispatch
from stopdesk.models import WorkItem
from stopdesk.services.items import item_set_handle
from stopdesk.services.transitions import item_submit

log = logging.getLogger(__name__)


def openai_client(
    *, base_url: str | None = None, api_key: str | None = None, timeout_s: float | None = None
) -> sdk.OpenAI:
    """The shared client for the endpoint stopdesk is configured with
    (STOPDESK_MECHANISMS["openai"]["options"]), with the SDK's retries off."""
    cfg = mechanism_settings("openai")
    return client_for(
        base_url=base_url or cfg.options.get("base_url"),
        api_key=api_key or cfg.options.get("api_key"),
        timeout_s=timeout_s or cfg.call_timeout_s,
    )


def response_create(
    *,
    item_id: int,
    actor: str,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout_s: float | None = None,
    **params: Any,
) -> Any:
    """Pass the boundary, create a background response with no SDK retries and with
    metadata linking it to the item, and store its id as the item's handle before anything else.

    Raises TaskStopped when Stop was requested first (nothing is sent). A create that does not
    answer leaves the item running with no handle; reconciliation marks it uncertain, because
    the run may exist and cannot be listed."""
    item = WorkItem.objects.get(pk=item_id)
    # A create is an external action: it passes the submit boundary whatever the item's state
    # (queued, running, or already cancelled by Stop's set-based update), which raises TaskStopped
    # once Stop was requested and refuses a second create for the same item. The key is our
    # correlation id (the Responses API takes no idempotency key); it also goes in the metadata.
    key = f"stopdesk-item-{item_id}"
    item_submit(item_id=item_id, idempotency_key=key, actor=actor)
    metadata = {
        **params.pop("metadata", {}),
        "stopdesk_item": str(item_id),
        "stopdesk_task": str(item.task_id),
        "stopdesk_key": key,
    }
    client = openai_client(base_url=base_url, api_key=api_key, timeout_s=timeout_s)
    response = client.responses.create(background=True, metadata=metadata, **params)
    # Only the id: the reconciler cancels and reads back at the configured endpoint, never at one
    # an item names (the server's key goes with it).
    item_set_handle(item_id=item_id, handle=response.id, actor=actor)
    # A fast response's webhook can overtake the create's answer; it was kept, and is acted on now.
    # Only a shortcut: if it cannot be queued, Stop's read-back and the polling still settle it.
    try:
        wakes_dispatch(webhook_wake_recorded(mechanism="openai", handle=response.id))
    except Exception:
        log.exception("queueing the read-back an early webhook asked for (%s) failed", response.id)
    return response
