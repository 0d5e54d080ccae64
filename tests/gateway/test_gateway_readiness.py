"""Readiness `enforce` narrows the tool set at the gateway: export_report (additive, no status
check, no drill) cannot account for a call Stop cuts off, so the client does not see it and
cannot call it; the others stay (read-only ones, and slow_write with its status check)."""

from __future__ import annotations

import pytest
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.mcp import sandbox as tools
from stopdesk.gateway.server import NOT_READY
from stopdesk.models import WorkItem
from tests.gateway.test_gateway_calls import through_gateway

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
ALL = {tools.SLOW_LOOKUP, tools.SLOW_WRITE, tools.READ_VALUE, tools.EXPORT_REPORT}


def listed(gateway) -> set[str]:  # type: ignore[no-untyped-def]
    listing = through_gateway(gateway.url, lambda c: c.list_tools(), mode="auto")
    return {t.name for t in listing.tools}


def test_tools_list_is_narrowed_only_when_the_policy_is_enforce(gateway, settings):
    assert listed(gateway) == ALL
    settings.STOPDESK_READINESS_POLICY = "enforce"
    assert listed(gateway) == ALL - {tools.EXPORT_REPORT}


def test_a_tool_that_is_not_ready_is_refused_with_the_reason_and_nothing_is_sent(gateway, settings):
    settings.STOPDESK_READINESS_POLICY = "enforce"
    with pytest.raises(MCPError) as raised:
        through_gateway(gateway.url, lambda c: c.call_tool(tools.EXPORT_REPORT, {"seconds": 0.05}), mode="auto")
    assert raised.value.error.code == NOT_READY
    assert "'export_report' is not ready (readiness policy enforce): missing capability: inspect" in (
        raised.value.error.message
    )
    assert gateway.party.wire("tools/call") == [] and not WorkItem.objects.exists()
    # A ready tool still passes.
    result = through_gateway(
        gateway.url, lambda c: c.call_tool(tools.SLOW_WRITE, {"key": "k", "value": "v", "seconds": 0.05}), mode="auto"
    )
    assert not result.is_error
