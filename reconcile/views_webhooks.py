"""`POST /hooks/openai`: OpenAI's webhooks, a wake-up for the read-back of the response named.

The signature is the credential: the official SDK's `webhooks.unwrap` checks it (Standard
Webhooks: HMAC-SHA256 over `webhook-id.webhook-timestamp.body` with OPENAI_WEBHOOK_SECRET, and a
timestamp at most 300 s from now either way, so a captured delivery cannot be replayed later).

Answers:
- 200 for every verified delivery, whether the response is ours, unknown, or delivered before,
  with the same body: the answer says nothing about what stopdesk knows;
- 400 with what was wrong (signature, timestamp, a header, the body) and nothing written;
- 503 when the read-back cannot be queued (the broker is down): the delivery is not kept, so
  OpenAI's retry is taken;
- 503 while no secret is configured: the endpoint cannot tell OpenAI from anyone, so it takes
  nothing, and OpenAI keeps retrying until it is configured (polling covers the meantime).
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import openai as sdk
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from reconcile.services.webhooks import Delivery, webhook_forget, webhook_receive
from reconcile.tasks import wakes_dispatch

# The event types that name a response; any other (batch, eval, ...) is acknowledged and ignored.
RESPONSE_EVENTS = frozenset({"response.completed", "response.cancelled", "response.failed", "response.incomplete"})
RECEIVED = {"received": True}
log = logging.getLogger(__name__)
LONGEST_ID = 200


@cache
def _verifier(secret: str) -> sdk.OpenAI:
    # Used only for `webhooks.unwrap`, which sends nothing; the key and address are never used.
    return sdk.OpenAI(api_key="webhook-verification-only", base_url="http://127.0.0.1:9", webhook_secret=secret)


def _refuse(message: str, field: str) -> JsonResponse:
    return JsonResponse({"error": message, "field": field}, status=400)


@csrf_exempt
@require_POST
def openai_webhook(request: HttpRequest) -> JsonResponse:
    secret = settings.STOPDESK_OPENAI_WEBHOOK_SECRET
    if not secret:
        return JsonResponse(
            {"error": "OpenAI webhooks are not configured here: set OPENAI_WEBHOOK_SECRET to the endpoint's secret."},
            status=503,
        )
    try:
        event: Any = _verifier(secret).webhooks.unwrap(request.body, request.headers)
    except sdk.InvalidWebhookSignatureError as exc:
        return _refuse(f"Webhook signature rejected: {exc}.", "webhook-signature")
    except ValueError as exc:  # a missing header, or a signed body that is not JSON
        text = str(exc)
        field = next((h for h in ("webhook-id", "webhook-timestamp", "webhook-signature") if h in text), "body")
        return _refuse(f"Webhook rejected: {text}.", field)
    event_type = str(getattr(event, "type", "") or "")
    if event_type not in RESPONSE_EVENTS:
        return JsonResponse(RECEIVED)
    response_id = getattr(getattr(event, "data", None), "id", None)
    if not isinstance(response_id, str) or not response_id or len(response_id) > LONGEST_ID:
        return _refuse("A response event names its response as data.id, a string of 1 to 200 characters.", "data.id")
    webhook_id = request.headers["webhook-id"]
    if len(webhook_id) > LONGEST_ID:
        return _refuse("webhook-id is longer than 200 characters.", "webhook-id")
    delivery = Delivery(provider="openai", webhook_id=webhook_id, event_type=event_type, handle=response_id)
    woken = webhook_receive(delivery=delivery)
    if woken:
        try:
            wakes_dispatch(woken)  # webhook_receive has committed
        except Exception:
            # Not a 2xx, and not kept: OpenAI delivers it again later, and polling covers meanwhile.
            log.exception("queueing the read-back of %s failed; the delivery is left for a retry", response_id)
            webhook_forget(provider=delivery.provider, webhook_id=webhook_id)
            return JsonResponse({"error": "The read-back could not be queued; deliver again later."}, status=503)
    return JsonResponse(RECEIVED)
