"""The ledger reaches reconcile only through ports, which reconcile registers when Django starts."""

from __future__ import annotations

import pytest

from reconcile.readiness import registration_check
from reconcile.selectors import tasks_with_open_work
from reconcile.tasks import cancellations_dispatch
from stopdesk import ports


def test_reconcile_registers_every_port_at_start_up():
    assert ports.cancellations_dispatch._impl is cancellations_dispatch
    assert ports.registration_check._impl is registration_check
    assert ports.tasks_with_open_work._impl is tasks_with_open_work


def test_a_port_used_before_registration_says_which():
    def _open_thing(item_id: int) -> None:
        """A port nobody registered."""

    port = ports.Port(_open_thing)
    with pytest.raises(ports.PortNotRegistered, match="'open_thing' is not registered"):
        port(1)
