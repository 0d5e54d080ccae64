"""Signing the audit chain's heads with Ed25519, and the anchors that carry them out of the database.

An anchor is one JSON line: the heads a seal moved (`[task, seq, hash]`), when, and the signature
of the key that signed them, with that key's public half and id so a reader needs nothing else.
The private key never enters the database: it comes from the environment or a file. Whoever can
rewrite the events and recompute every hash still cannot sign a new head with it, so a rewritten
chain no longer matches the heads already delivered outside.

Pure apart from reading and appending files: the sealer calls it, and so does the offline check.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ANCHOR_VERSION = 1


class SigningKeyError(ValueError):
    """A signing or public key that cannot be read."""


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    source: str  # where it came from, for the operator (never the key itself)

    @property
    def public_b64(self) -> str:
        return public_key_b64(self.private.public_key())

    @property
    def key_id(self) -> str:
        return key_id(self.public_b64)

    def sign(self, message: bytes) -> str:
        return base64.b64encode(self.private.sign(message)).decode()


def public_key_b64(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def key_id(public_b64: str) -> str:
    """A short name of a public key: the first 16 hex digits of the SHA-256 of its 32 bytes."""
    return "ed25519:" + hashlib.sha256(base64.b64decode(public_b64)).hexdigest()[:16]


def key_generate_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def key_write(path: Path, pem: bytes) -> None:
    """Create a key file readable by its owner only; never overwrite one (that would orphan the
    anchors it signed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
        out.flush()
        os.fsync(out.fileno())


def key_parse(text: str | bytes, *, source: str) -> SigningKey:
    """A PEM (PKCS#8) private key, or the base64 of its 32-byte seed."""
    data = text.encode() if isinstance(text, str) else text
    try:
        if b"-----BEGIN" in data:
            private = serialization.load_pem_private_key(data, password=None)
        else:
            private = Ed25519PrivateKey.from_private_bytes(base64.b64decode(data.strip(), validate=True))
    except (ValueError, TypeError) as error:
        raise SigningKeyError(f"{source}: not an Ed25519 private key (PEM or base64 of 32 bytes): {error}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyError(f"{source}: an Ed25519 key is needed, not {type(private).__name__}")
    return SigningKey(private, source)


def public_key_parse(text: str, *, source: str) -> str:
    """A public key as PEM or base64 of its 32 bytes, or a private key (its public half); returns
    the base64 of the 32 bytes."""
    if "PRIVATE KEY" in text:
        return key_parse(text, source=source).public_b64
    try:
        if "-----BEGIN" in text:
            public = serialization.load_pem_public_key(text.encode())
            if not isinstance(public, Ed25519PublicKey):
                raise SigningKeyError(f"{source}: an Ed25519 key is needed, not {type(public).__name__}")
            return public_key_b64(public)
        return public_key_b64(Ed25519PublicKey.from_public_bytes(base64.b64decode(text.strip(), validate=True)))
    except (ValueError, TypeError) as error:
        raise SigningKeyError(f"{source}: not an Ed25519 public key: {error}") from None


def signature_valid(public_b64: str, signature_b64: str, message: bytes) -> bool:
    try:
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_b64))
        public.verify(base64.b64decode(signature_b64), message)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# --- anchors -------------------------------------------------------------------------------------


def anchor_make(
    key: SigningKey, heads: Iterable[tuple[int, int, str]], *, at: datetime | None = None
) -> dict[str, Any]:
    """A signed statement of chain heads: `[task, seq, hash]` each (task 0: events without a task)."""
    statement: dict[str, Any] = {
        "v": ANCHOR_VERSION,
        "at": (at or datetime.now(UTC)).isoformat(),
        "key_id": key.key_id,
        "public_key": key.public_b64,
        "heads": [[int(task), int(seq), str(value)] for task, seq, value in heads],
    }
    statement["sig"] = key.sign(canonical(statement))
    return statement


def anchor_valid(statement: dict[str, Any]) -> bool:
    unsigned = {k: v for k, v in statement.items() if k != "sig"}
    public = str(statement.get("public_key", ""))
    return (
        statement.get("v") == ANCHOR_VERSION
        and key_id(public) == statement.get("key_id")
        and signature_valid(public, str(statement.get("sig", "")), canonical(unsigned))
    )


def anchor_file(directory: Path, at: datetime) -> Path:
    """One file a day, so the operator can rotate (copy away, archive) whole days."""
    return directory / f"anchors-{at:%Y-%m-%d}.jsonl"


def anchor_append(directory: Path, statement: dict[str, Any]) -> Path:
    """Append one anchor and wait until it is on disk; raises OSError when it cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    path = anchor_file(directory, datetime.fromisoformat(statement["at"]))
    with open(path, "ab") as out:
        out.write(canonical(statement) + b"\n")
        out.flush()
        os.fsync(out.fileno())
    return path


@dataclass
class Anchored:
    """The newest signed head of each chain found in an anchors directory."""

    heads: dict[int, tuple[int, str, str]]  # task -> (seq, hash, when signed)
    key_ids: set[str]
    lines: int = 0
    problems: list[str] | None = None


def anchors_read(directory: Path, *, trusted_key: str | None = None) -> Anchored:
    """Read every `*.jsonl` in `directory`. A line that does not parse, whose signature does not
    verify, or (with `trusted_key`, base64 of the public key) that another key signed, is a
    problem, and its heads are not trusted. Two anchors giving one place two hashes is a problem
    too: something was sealed twice at that place."""
    found = Anchored(heads={}, key_ids=set(), problems=[])
    assert found.problems is not None
    seen: dict[tuple[int, int], str] = {}
    if not directory.is_dir():
        found.problems.append(f"{directory}: no such anchors directory")
        return found
    for path, number, statement in _anchor_lines(directory, found.problems):
        where = f"{path.name} line {number}"
        if not anchor_valid(statement):
            found.problems.append(f"{where}: the signature does not verify")
            continue
        if trusted_key is not None and statement["public_key"] != trusted_key:
            found.problems.append(f"{where}: signed by {statement['key_id']}, not the trusted key")
            continue
        found.lines += 1
        found.key_ids.add(statement["key_id"])
        for task, seq, value in statement["heads"]:
            if seen.setdefault((task, seq), value) != value:
                found.problems.append(f"{where}: task {task} seq {seq} was anchored before with another hash")
            newest = found.heads.get(task)
            if newest is None or seq > newest[0]:
                found.heads[task] = (seq, value, statement["at"])
    return found


def _anchor_lines(directory: Path, problems: list[str]) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    for path in sorted(directory.glob("*.jsonl")):
        with open(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    statement = json.loads(line)
                except ValueError:
                    problems.append(f"{path.name} line {number}: not JSON")
                    continue
                if not isinstance(statement, dict):
                    problems.append(f"{path.name} line {number}: not an anchor")
                    continue
                yield path, number, statement
