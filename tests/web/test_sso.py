"""Single sign-on without a browser: its settings from the environment, off by default, local and
Django admin sign-in beside it, and a session past its lifetime held at every kind of request
(against the real test provider, tests/oidc_provider)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from stopdesk.config import ConfigError
from stopdesk.sso import provider as sso_provider
from stopdesk.sso.environment import from_environment
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, TestProvider, running
from tests.web.conftest import HTMX

# The pages' autouse fixtures clear the sign-in counters, which live in the database cache.
pytestmark = pytest.mark.django_db

ENV = {
    "STOPDESK_OIDC_ISSUER": "https://login.example.com/realms/acme/",
    "STOPDESK_OIDC_CLIENT_ID": "stopdesk",
    "STOPDESK_OIDC_CLIENT_SECRET": "s3cret",
    "STOPDESK_OIDC_ROLES": "approver=finance-leads, cfo-office;operator=ops;admin=it-admins",
}


def test_nothing_configured_means_single_sign_on_off():
    assert from_environment({}) == {}


def test_the_environment_gives_the_provider_and_the_role_mapping():
    conf = from_environment(ENV)
    assert conf["issuer"] == "https://login.example.com/realms/acme"
    assert conf["roles"] == {"approver": ["finance-leads", "cfo-office"], "operator": ["ops"], "admin": ["it-admins"]}
    assert (conf["groups_claim"], conf["session_seconds"], conf["sign_algo"]) == ("groups", 300, "RS256")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"STOPDESK_OIDC_CLIENT_SECRET": ""}, "STOPDESK_OIDC_CLIENT_SECRET"),
        ({"STOPDESK_OIDC_ROLES": ""}, "STOPDESK_OIDC_ROLES is empty"),
        ({"STOPDESK_OIDC_ROLES": "boss=ceo"}, "roles are operator, reviewer, approver, admin"),
        ({"STOPDESK_OIDC_ROLES": "approver="}, "names no group"),
        ({"STOPDESK_OIDC_ISSUER": "login.example.com"}, "is not a URL"),
        ({"STOPDESK_OIDC_ISSUER": "http://login.example.com"}, "https"),
        ({"STOPDESK_OIDC_SESSION_SECONDS": "soon"}, "STOPDESK_OIDC_SESSION_SECONDS"),
    ],
)
def test_a_misconfiguration_is_one_readable_line(change, words):
    with pytest.raises(ConfigError) as caught:
        from_environment({**ENV, **change})
    assert words in caught.value.message


def test_off_the_sign_in_page_offers_no_provider_and_its_pages_are_not_there(settings, client):
    settings.STOPDESK_OIDC = {}
    assert "Sign in with" not in client.get("/login/").content.decode()
    assert client.get("/sso/login/").status_code == 404
    assert client.get("/sso/callback/?code=x&state=y").status_code == 404


@pytest.fixture(scope="module")
def idp(tmp_path_factory) -> Iterator[TestProvider]:
    with running(tmp_path_factory.mktemp("idp"), "http://testserver") as provider:
        yield provider


@pytest.fixture
def sso_on(settings, idp):  # type: ignore[no-untyped-def]
    settings.STOPDESK_OIDC = {
        "issuer": idp.issuer,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "name": "Acme Login",
        "scopes": "openid email profile groups",
        "groups_claim": "groups",
        "username_claim": "preferred_username",
        "roles": {"operator": ["sd-operators"], "approver": ["sd-approvers"]},
        "session_seconds": 300,
        "sign_algo": "RS256",
    }
    sso_provider.forget_discovery()
    yield idp
    sso_provider.forget_discovery()


@pytest.mark.oidc_provider
def test_local_admins_still_sign_in_to_the_django_admin(sso_on, roles):
    client = Client()
    page = client.post("/admin/login/?next=/admin/", {"username": "admin", "password": "admin-pass-123"})
    assert page.status_code == 302 and page["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200
    local = Client()
    assert local.post("/login/", {"username": "operator", "password": "operator-pass-123"}).status_code == 302
    assert local.get("/tasks/").status_code == 200


def _expired_sso_session(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user, backend=sso_provider.BACKEND)
    session = client.session
    session["oidc_id_token_expiration"] = time.time() - 1
    session.save()
    return client


@pytest.mark.oidc_provider
def test_a_session_past_its_lifetime_goes_to_the_provider_without_prompting(sso_on, roles):
    client = _expired_sso_session(roles["operator"])
    answer = client.get("/tasks/")
    assert answer.status_code == 302
    target = urlsplit(answer["Location"])
    assert f"{target.scheme}://{target.netloc}" == sso_on.issuer
    query = parse_qs(target.query)
    assert query["prompt"] == ["none"] and query["client_id"] == [CLIENT_ID]


@pytest.mark.oidc_provider
def test_an_htmx_request_past_the_lifetime_reloads_its_page_instead_of_answering(sso_on, roles):
    client = _expired_sso_session(roles["operator"])
    answer = client.get("/tasks/", **HTMX, HTTP_HX_CURRENT_URL="http://testserver/tasks/")
    assert answer.status_code == 200 and answer["HX-Redirect"] == "http://testserver/tasks/"
    assert b"<tr" not in answer.content


@pytest.mark.oidc_provider
def test_a_post_past_the_lifetime_is_not_run_and_comes_back_to_its_page(sso_on, roles, eager):
    from stopdesk.models import StopRequest
    from tests.web.scenes import running_task

    task = running_task()
    client = _expired_sso_session(roles["operator"])
    answer = client.post(
        f"/tasks/{task.pk}/stop/", {"reason": "stale roles"}, HTTP_REFERER=f"http://testserver/tasks/{task.pk}/"
    )
    assert answer.status_code == 303 and answer["Location"].startswith(sso_on.issuer)
    assert not StopRequest.objects.filter(task=task).exists()
    assert client.session["oidc_login_next"] == f"http://testserver/tasks/{task.pk}/"


@pytest.mark.oidc_provider
def test_a_password_session_is_never_sent_to_the_provider(sso_on, roles):
    client = Client()
    client.force_login(roles["operator"], backend="django.contrib.auth.backends.ModelBackend")
    assert client.get("/tasks/").status_code == 200


def test_a_provider_session_ends_when_single_sign_on_is_turned_off(settings, roles):
    settings.STOPDESK_OIDC = {}
    client = Client()
    client.force_login(roles["operator"], backend=sso_provider.BACKEND)
    answer = client.get("/tasks/")
    assert answer.status_code == 302 and answer["Location"].startswith("/login/")
    assert "_auth_user_id" not in client.session
