"""Single sign-on, in real Chromium against a real OpenID Connect provider (node's oidc-provider,
tests/oidc_provider) on loopback, at a person's pace: sign in, the role from the group, a group
removed at the provider and the role gone at the first request after the session's lifetime, a
person who left signed out, sign-out ending the provider's session, an approval confirmed by a
fresh sign-in at the provider, forged and expired ID tokens refused, and a misconfigured provider
explained on a page."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth.models import User

from stopdesk.sso import provider as sso_provider
from stopdesk.states import CompensationState
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, KID, TestProvider, running
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect, proposal

pytestmark = [pytest.mark.browser, pytest.mark.oidc_provider, pytest.mark.django_db(transaction=True)]

KEY_DELAY_MS = 60  # a person typing
# A session lifetime long enough for a page or two within it on a loaded machine.
LIFETIME_S = 8
NAME = "Acme Login"
ROLES = {
    "operator": ["sd-operators"],
    "reviewer": ["sd-reviewers"],
    "approver": ["sd-approvers"],
    "admin": ["sd-admins"],
}
PEOPLE = {
    "alice": {
        "password": "alice-idp-pass",
        "email": "alice@acme.test",
        "name": "Alice Ng",
        "groups": ["sd-operators", "sd-reviewers"],
    },
    "dora": {
        "password": "dora-idp-pass",
        "email": "dora@acme.test",
        "name": "Dora Ek",
        "groups": ["sd-approvers", "everyone"],
    },
    "nobody": {"password": "nobody-idp-pass", "email": "nobody@acme.test", "name": "No Role", "groups": ["everyone"]},
}


@pytest.fixture(scope="module")
def idp(live_server, tmp_path_factory) -> Iterator[TestProvider]:  # type: ignore[no-untyped-def]
    with running(tmp_path_factory.mktemp("idp"), live_server.url) as provider:
        yield provider


def sso_settings(issuer: str, changes: dict) -> dict:  # type: ignore[no-untyped-def]
    return {
        "issuer": issuer,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "name": NAME,
        "scopes": "openid email profile groups",
        "groups_claim": "groups",
        "username_claim": "preferred_username",
        "roles": ROLES,
        "session_seconds": 300,
        "sign_algo": "RS256",
        **changes,
    }


@pytest.fixture
def configure(settings, idp, roles):  # type: ignore[no-untyped-def]
    """configure(**changes): single sign-on on, against the test provider (or as changed)."""
    idp.people(json.loads(json.dumps(PEOPLE)))

    def apply(**changes):  # type: ignore[no-untyped-def]
        conf = sso_settings(idp.issuer, changes)
        settings.STOPDESK_OIDC = conf
        csp = {**settings.SECURE_CSP}
        csp["form-action"] = [*csp["form-action"], f"http://{urlsplit(conf['issuer']).netloc}"]
        settings.SECURE_CSP = csp
        sso_provider.forget_discovery()
        return conf

    apply()
    yield apply
    sso_provider.forget_discovery()


@pytest.fixture
def page(browser, live_server):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1280, "height": 900})

    def loopback_only(route) -> None:  # type: ignore[no-untyped-def]
        host = urlsplit(route.request.url).hostname
        if host in ("localhost", "127.0.0.1"):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", loopback_only)
    page = context.new_page()
    page.set_default_timeout(15000)
    yield page
    context.close()


def _sign_in_at_provider(page, name: str, password: str) -> None:  # type: ignore[no-untyped-def]
    page.get_by_role("heading", name="Sign in to the test provider").wait_for()
    page.get_by_label("Username").press_sequentially(name, delay=KEY_DELAY_MS)
    page.get_by_label("Password").press_sequentially(password, delay=KEY_DELAY_MS)
    page.get_by_role("button", name="Sign in").click()


def _sign_in(page, base: str, name: str, shots: Path | None = None) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base}/login/")
    if shots is not None:
        page.screenshot(path=str(shots / "sso-sign-in.png"), full_page=True)
    page.get_by_role("link", name=f"Sign in with {NAME}").click()
    _sign_in_at_provider(page, name, PEOPLE[name]["password"])


def _groups(name: str) -> set[str]:
    return set(User.objects.get(username=name).groups.values_list("name", flat=True))


def test_sign_in_through_the_provider_gives_the_roles_of_the_groups(live_server, configure, page, shots):
    _sign_in(page, live_server.url, "alice", shots)
    page.wait_for_url(f"{live_server.url}/tasks/")
    page.get_by_text(re.compile(r"^alice · (operators, reviewers|reviewers, operators)$")).wait_for()
    assert _groups("alice") == {"operators", "reviewers"}
    alice = User.objects.get(username="alice")
    assert not alice.has_usable_password()  # no password here: only the provider signs her in
    assert (alice.email, alice.is_staff) == ("alice@acme.test", False)
    page.get_by_role("link", name="Review queue").click()
    page.wait_for_url(f"{live_server.url}/queue/")


def test_a_person_in_no_mapped_group_is_refused_with_a_page_that_says_so(live_server, configure, page):
    _sign_in(page, live_server.url, "nobody")
    page.get_by_role("heading", name="No role in stopdesk").wait_for()
    assert "none of the groups that give a role" in page.locator("[role=alert]").inner_text()
    assert not User.objects.filter(username="nobody").exists()
    page.goto(f"{live_server.url}/tasks/")
    page.wait_for_url(re.compile(r"/login/"))


def test_a_removed_group_loses_its_role_at_the_first_request_after_the_lifetime(live_server, configure, idp, page):
    configure(session_seconds=LIFETIME_S)
    _sign_in(page, live_server.url, "alice")
    page.wait_for_url(f"{live_server.url}/tasks/")
    signed_in = time.monotonic()
    idp.person("alice", groups=["sd-operators"])  # taken out of the reviewers at the provider
    page.goto(f"{live_server.url}/queue/")  # within the lifetime: the role granted at sign-in holds
    page.get_by_role("heading", name="Review queue").wait_for()
    page.wait_for_timeout(max(0, int((LIFETIME_S + 0.5 - (time.monotonic() - signed_in)) * 1000)))
    page.goto(f"{live_server.url}/queue/")  # past it: re-checked at the provider on the way
    page.get_by_role("heading", name="Not allowed").wait_for()
    assert _groups("alice") == {"operators"}
    page.get_by_text(re.compile(r"^alice · operators$")).wait_for()
    page.goto(f"{live_server.url}/tasks/")  # the operator role stays
    page.get_by_role("heading", name="Tasks").first.wait_for()


def test_a_person_who_left_is_signed_out_at_the_first_request_after_the_lifetime(live_server, configure, idp, page):
    configure(session_seconds=3)
    _sign_in(page, live_server.url, "alice")
    page.wait_for_url(f"{live_server.url}/tasks/")
    idp.person("alice", disabled=True)
    page.wait_for_timeout(3500)
    page.goto(f"{live_server.url}/tasks/")
    page.wait_for_url(re.compile(r"/login/"))
    page.get_by_text(f"Your sign-in at {NAME} has ended. Sign in again.").wait_for()


def test_a_form_sent_after_the_lifetime_goes_through_the_provider_and_runs_on_the_new_roles(
    live_server, configure, idp, page, crm
):
    """A POST is not run on roles older than the lifetime: here a proposal, by a person whose
    reviewer role was removed meanwhile, is not made."""
    from reconcile.models import Compensation

    configure(session_seconds=LIFETIME_S)
    record = crm_effect(system_url("crm"))
    _sign_in(page, live_server.url, "alice")
    page.wait_for_url(f"{live_server.url}/tasks/")
    signed_in = time.monotonic()
    page.goto(f"{live_server.url}/records/{record.pk}/propose/")
    page.get_by_role("button", name=re.compile("Propose")).wait_for()
    idp.person("alice", groups=["sd-operators"])
    page.wait_for_timeout(max(0, int((LIFETIME_S + 0.5 - (time.monotonic() - signed_in)) * 1000)))
    page.get_by_role("button", name=re.compile("Propose")).click()
    page.get_by_role("heading", name="Not allowed").wait_for()  # the form's page, re-checked: 403
    assert not Compensation.objects.exists()
    assert _groups("alice") == {"operators"}


def test_sign_out_ends_the_provider_session_too(live_server, configure, page):
    _sign_in(page, live_server.url, "alice")
    page.wait_for_url(f"{live_server.url}/tasks/")
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("heading", name="Sign out of the test provider?").wait_for()
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url(re.compile(r"/login/"))
    page.goto(f"{live_server.url}/tasks/")
    page.wait_for_url(re.compile(r"/login/"))
    # The provider asks for the password again: its session ended with stopdesk's.
    page.get_by_role("link", name=f"Sign in with {NAME}").click()
    page.get_by_role("heading", name="Sign in to the test provider").wait_for()


def test_an_approval_is_confirmed_by_a_fresh_sign_in_at_the_provider(live_server, configure, page, roles, crm, shots):
    from reconcile.models import Compensation

    compensation = proposal(crm_effect(system_url("crm")), roles["reviewer"])
    _sign_in(page, live_server.url, "dora")
    page.wait_for_url(f"{live_server.url}/tasks/")
    started = time.time()
    page.goto(f"{live_server.url}/compensations/{compensation.pk}/")
    assert page.get_by_role("button", name="Approve and run").count() == 0  # no password here to enter
    page.screenshot(path=str(shots / "sso-approval-confirm.png"), full_page=True)
    page.get_by_role("link", name=f"Confirm with {NAME}").click()
    # The provider asks again although its session is alive (prompt=login, max_age=0).
    _sign_in_at_provider(page, "dora", PEOPLE["dora"]["password"])
    page.wait_for_url(f"{live_server.url}/compensations/{compensation.pk}/")
    page.get_by_text(f"You signed in again at {NAME} recently").wait_for()
    page.get_by_role("button", name="Approve and run").click()
    page.get_by_text("Approved.").wait_for()
    compensation.refresh_from_db()
    assert compensation.approved_by.username == "dora"
    assert compensation.approved_at.timestamp() >= started
    assert Compensation.objects.count() == 1


class TamperingTokenEndpoint:
    """A man in the middle in front of the provider's token endpoint: the provider's real answer
    for a real sign-in, with its ID token replaced by `forge(claims)`."""

    def __init__(self, token_endpoint: str) -> None:
        self.token_endpoint = token_endpoint
        self.forge = lambda claims: ""
        self.seen: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                answer = httpx.post(outer.token_endpoint, content=body, headers=headers, timeout=10).json()
                claims = jwt.decode(answer["id_token"], options={"verify_signature": False})
                outer.seen.append(claims)
                answer["id_token"] = outer.forge(claims)
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tampering(configure, idp):  # type: ignore[no-untyped-def]
    endpoint = httpx.get(f"{idp.issuer}/.well-known/openid-configuration").json()["token_endpoint"]
    proxy = TamperingTokenEndpoint(endpoint)
    configure(endpoints={"token_endpoint": proxy.url})
    yield proxy
    proxy.close()


def _refused(page, live_server, why: str) -> None:  # type: ignore[no-untyped-def]
    page.get_by_role("heading", name="That sign-in could not be trusted").wait_for()
    assert why in page.locator("[role=alert]").inner_text()
    page.goto(f"{live_server.url}/tasks/")
    page.wait_for_url(re.compile(r"/login/"))  # nobody was signed in


def test_an_id_token_with_a_forged_signature_is_refused(live_server, idp, tampering, page):
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tampering.forge = lambda claims: jwt.encode(
        {**claims, "groups": ["sd-admins"]}, stranger, algorithm="RS256", headers={"kid": KID}
    )
    _sign_in(page, live_server.url, "alice")
    _refused(page, live_server, "did not verify")
    assert tampering.seen and tampering.seen[0]["sub"] == "alice"
    assert not User.objects.filter(username="alice").exists()


def test_an_expired_id_token_is_refused_even_with_the_providers_signature(live_server, idp, tampering, page):
    now = int(time.time())
    tampering.forge = lambda claims: jwt.encode(
        {**claims, "iat": now - 7200, "exp": now - 3600}, idp.key, algorithm="RS256", headers={"kid": KID}
    )
    _sign_in(page, live_server.url, "alice")
    _refused(page, live_server, "its ID token has expired")
    assert not User.objects.filter(username="alice").exists()


def test_the_same_token_re_signed_with_the_providers_key_is_accepted(live_server, idp, tampering, page):
    """The forging above is faithful: re-signing the real claims with the real key signs in."""
    tampering.forge = lambda claims: jwt.encode(claims, idp.key, algorithm="RS256", headers={"kid": KID})
    _sign_in(page, live_server.url, "alice")
    page.wait_for_url(f"{live_server.url}/tasks/")
    assert _groups("alice") == {"operators", "reviewers"}


def test_a_provider_that_cannot_be_reached_is_explained_on_a_page(live_server, configure, page, shots):
    configure(issuer="http://127.0.0.1:9")  # nothing listens on the discard port
    page.goto(f"{live_server.url}/login/")
    page.get_by_role("link", name=f"Sign in with {NAME}").click()
    page.get_by_role("heading", name="Single sign-on is not working").wait_for()
    assert "could not reach the provider" in page.locator("[role=alert]").inner_text()
    page.screenshot(path=str(shots / "sso-provider-unreachable.png"), full_page=True)
    # Local accounts still sign in.
    page.get_by_role("link", name="Back to sign-in").click()
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill("operator-pass-123")
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_url(f"{live_server.url}/tasks/")


def test_a_wrong_client_secret_is_explained_on_a_page(live_server, configure, page):
    configure(client_secret="not-the-secret")
    _sign_in(page, live_server.url, "alice")
    page.get_by_role("heading", name="Single sign-on is not working").wait_for()
    text = page.locator("[role=alert]").inner_text()
    assert "invalid_client" in text and "STOPDESK_OIDC_CLIENT_SECRET" in text


def test_a_local_account_is_never_taken_over_by_a_provider_name(live_server, configure, idp, page, roles):
    """`approver` signs in here with a password; the provider's `approver` is someone else."""
    idp.people({**PEOPLE, "approver": {**PEOPLE["dora"], "email": "someone@acme.test"}})
    page.goto(f"{live_server.url}/login/")
    page.get_by_role("link", name=f"Sign in with {NAME}").click()
    _sign_in_at_provider(page, "approver", PEOPLE["dora"]["password"])
    page.get_by_role("heading", name="That name belongs to a local account").wait_for()
    page.goto(f"{live_server.url}/tasks/")
    page.wait_for_url(re.compile(r"/login/"))


def test_a_confirmation_without_a_fresh_sign_in_does_not_count(live_server, idp, tampering, page, roles, crm):
    """A provider that answers the confirmation without asking again (its auth_time from before
    the request) approves nothing."""
    from reconcile.models import Compensation

    compensation = proposal(crm_effect(system_url("crm")), roles["reviewer"])
    tampering.forge = lambda claims: jwt.encode(claims, idp.key, algorithm="RS256", headers={"kid": KID})
    _sign_in(page, live_server.url, "dora")
    page.wait_for_url(f"{live_server.url}/tasks/")
    page.goto(f"{live_server.url}/compensations/{compensation.pk}/")
    an_hour_ago = int(time.time()) - 3600
    tampering.forge = lambda claims: jwt.encode(
        {**claims, "auth_time": an_hour_ago}, idp.key, algorithm="RS256", headers={"kid": KID}
    )
    page.get_by_role("link", name=f"Confirm with {NAME}").click()
    _sign_in_at_provider(page, "dora", PEOPLE["dora"]["password"])
    page.get_by_role("heading", name="Your sign-in was not confirmed").wait_for()
    page.goto(f"{live_server.url}/compensations/{compensation.pk}/")
    assert page.get_by_role("button", name="Approve and run").count() == 0
    assert Compensation.objects.get(pk=compensation.pk).state == CompensationState.PROPOSED
