"""Ids on the wire: what an id in a path or a body may be. Ids outside bigint would fail inside
PostgreSQL; they cannot exist, so they are unknown (404), never a server error."""

from __future__ import annotations

import re

from stopdesk.protocol.errors import NotFound

MAX_ID = 2**63 - 1
_ID = re.compile(r"[1-9][0-9]{0,18}")


def path_id(value: str, name: str) -> int:
    """A path's id (`task_id`, `item_id`), or NotFound naming what was looked for."""
    if not _ID.fullmatch(value) or int(value) > MAX_ID:
        raise NotFound(f"No {name.removesuffix('_id')} {value}.")
    return int(value)
