"""An item's registration as one value: `ItemSpec` travels from the clients through the API door and
the runtime to the services and the boundary's statement, so the list of registration fields is
written here, once (the API validates it with `stopdesk.agent.schemas.RegisterItem`, and a test
keeps the two in step). The keyword methods (`register(task_id, kind=..., noun=...)`) are thin
wrappers that build one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ItemSpec:
    kind: str
    noun: str
    noun_plural: str = ""
    mechanism: str = "manual"
    handle: str = ""
    label: str = ""
    parent: int | None = None  # another item of the same task
    idempotency_key: str = ""
    detail: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ITEM_FIELDS}


ITEM_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ItemSpec))
NOUN_MAX = 40  # the ledger's column and the API's limit


def noun_of(words: str) -> str:
    """A noun made of names someone else chose (a tool's name may be 128 characters): clipped to
    fit, with an ellipsis. The whole name stays in the item's detail."""
    return words if len(words) <= NOUN_MAX else words[: NOUN_MAX - 1] + "…"
