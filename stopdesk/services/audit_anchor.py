"""Delivering the signed chain heads outside the database, inside the seal's transaction.

Each sealed batch signs the heads it moved and appends them to the anchors file (on disk, waited
for) and, when an endpoint takes the `audit_anchor` topic, to the webhook outbox. Both happen
before the seal commits: a seal whose heads cannot be anchored does not happen (the events stay
unsealed and `audit_verify` shows their age), so no sealed head goes unsigned.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from django.conf import settings

from stopdesk.audit_sign import SigningKey, anchor_append, anchor_make, key_generate_pem, key_parse, key_write
from stopdesk.notify.anchors import audit_anchor_notify

log = logging.getLogger(__name__)

_keys: dict[tuple[str, str, str], SigningKey] = {}


def signing_key() -> SigningKey:
    """The configured key (environment, then file); without one, the key under the data directory,
    generated on first use. Read once per process and configuration."""
    audit: dict[str, Any] = settings.STOPDESK_AUDIT
    config = (audit["SIGNING_KEY"], audit["SIGNING_KEY_FILE"], audit["DEV_KEY_FILE"])
    if config not in _keys:
        _keys[config] = _load(*config)
    return _keys[config]


def _load(value: str, key_file: str, dev_file: str) -> SigningKey:
    if value:
        return key_parse(value, source="STOPDESK_AUDIT_SIGNING_KEY")
    if key_file:
        return key_parse(Path(key_file).read_bytes(), source=key_file)
    path = Path(dev_file)
    if not path.exists():
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            key_write(path, key_generate_pem())
    key = key_parse(path.read_bytes(), source=str(path))
    log.warning(
        "audit anchors are signed with %s, a key kept beside the data (%s); set STOPDESK_AUDIT_SIGNING_KEY_FILE"
        " to a key the database's owner cannot read (docs/AUDIT.md)",
        key.key_id,
        path,
    )
    return key


def anchors_dir() -> Path:
    return Path(settings.STOPDESK_AUDIT["ANCHORS_DIR"])


def chain_heads_anchor(heads: list[tuple[int, int, str]]) -> dict[str, Any]:
    """Sign `heads` ([task, seq, hash] each) and deliver them; raises when the file cannot be
    written, so the caller's seal rolls back."""
    statement = anchor_make(signing_key(), heads)
    anchor_append(anchors_dir(), statement)
    audit_anchor_notify(statement)
    return statement
