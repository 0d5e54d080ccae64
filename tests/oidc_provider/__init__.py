"""A real OpenID Connect provider for the single sign-on tests: node's `oidc-provider` (pinned in
package.json and package-lock.json here, installed by `make oidc-provider`), started on a free
loopback port by `provider.mjs`.

The test owns the provider's signing key (so it can forge a token that differs from a real one in
one respect only) and its accounts file (people, passwords, groups; `disabled` is a person who left),
which the provider reads again at every lookup.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa

HERE = Path(__file__).resolve().parent
PROVIDER_JS = HERE / "provider.mjs"
LIBRARY = HERE / "node_modules" / "oidc-provider" / "package.json"
CLIENT_ID = "stopdesk"
CLIENT_SECRET = "stopdesk-test-client-secret-0123456789"
KID = "test-key-1"


def missing() -> list[str]:
    return [] if LIBRARY.exists() else ["oidc-provider (npm; run `make oidc-provider`)"]


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def private_jwk(key: rsa.RSAPrivateKey) -> dict[str, str]:
    numbers = key.private_numbers()
    public = numbers.public_numbers
    return {
        "kty": "RSA",
        "kid": KID,
        "alg": "RS256",
        "use": "sig",
        "n": _b64(public.n),
        "e": _b64(public.e),
        "d": _b64(numbers.d),
        "p": _b64(numbers.p),
        "q": _b64(numbers.q),
        "dp": _b64(numbers.dmp1),
        "dq": _b64(numbers.dmq1),
        "qi": _b64(numbers.iqmp),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TestProvider:
    """One provider process; `people` are written to its accounts file."""

    __test__ = False

    def __init__(self, workdir: Path, redirect_base: str) -> None:
        self.workdir = workdir
        self.redirect_base = redirect_base.rstrip("/")
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.accounts_file = workdir / "accounts.json"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def people(self, accounts: dict[str, dict[str, Any]]) -> None:
        tmp = self.accounts_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(accounts))
        tmp.replace(self.accounts_file)  # the provider never reads half a file

    def person(self, name: str, **changes: Any) -> None:
        accounts = json.loads(self.accounts_file.read_text())
        accounts[name].update(changes)
        self.people(accounts)

    def start(self) -> None:
        self.port = _free_port()
        config = {
            "port": self.port,
            "issuer": self.issuer,
            "accounts_file": str(self.accounts_file),
            "signing_key": private_jwk(self.key),
            "client": {
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uris": [f"{self.redirect_base}/sso/callback/"],
                "post_logout_redirect_uris": [f"{self.redirect_base}/login/"],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "client_secret_basic",
                "require_auth_time": True,
            },
        }
        if not self.accounts_file.exists():
            self.people({})
        config_path = self.workdir / "provider.json"
        config_path.write_text(json.dumps(config))
        log = (self.workdir / "provider.log").open("ab")
        self.process = subprocess.Popen(
            ["node", str(PROVIDER_JS), str(config_path)],
            cwd=HERE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "NODE_ENV": "test"},
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the test OpenID provider did not start: {self.log()}")

    def log(self) -> str:
        path = self.workdir / "provider.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.process = None


@contextmanager
def running(workdir: Path, redirect_base: str) -> Iterator[TestProvider]:
    provider = TestProvider(workdir, redirect_base)
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()
