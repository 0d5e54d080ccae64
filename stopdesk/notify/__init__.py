"""Notifications: an outbox written with the events that cause them, delivered by email and by
signed webhooks (Standard Webhooks) after commit, with retries and a delivery log; and the
heartbeat rows that readiness and /metrics read."""
