"""Fixtures for the pages: the cast in their roles, clients signed in as each, the sandbox CRM
as a real server on loopback, and Celery jobs run eagerly."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache
from django.test import Client

from reconcile.mechanisms.http.sandbox import CRM
from stopdesk.permissions import roles_ensure
from stopdrill.sandbox.server import BackgroundServer

GROUPS = {"operator": "operators", "reviewer": "reviewers", "approver": "approvers", "approver2": "approvers"}


@pytest.fixture(autouse=True)
def _fast_passwords(settings) -> None:  # type: ignore[no-untyped-def]
    # The cast's passwords are hashed per test; PBKDF2's deliberate slowness is not under test here.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    # The sign-in rate limit counts in the cache; one test's wrong passwords must not lock out the next.
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def roles(cast):  # type: ignore[no-untyped-def]
    """The cast, each in their group (a flushed test database has no migration data, so ensure it)."""
    from django.contrib.auth.models import Group

    roles_ensure()
    for name, group in GROUPS.items():
        cast[name].groups.add(Group.objects.get(name=group))
    return cast


@pytest.fixture
def as_user(roles):  # type: ignore[no-untyped-def]
    """as_user("reviewer") -> a Client signed in as that person (no recent password entry)."""

    def make(name: str, **kwargs) -> Client:  # type: ignore[no-untyped-def]
        client = Client(**kwargs)
        client.force_login(roles[name])
        return client

    return make


@pytest.fixture(scope="session")
def crm_server() -> Iterator[tuple[CRM, BackgroundServer]]:
    party = CRM()
    with BackgroundServer(party.app, name="crm") as server:
        yield party, server


@pytest.fixture
def crm(crm_server, settings):  # type: ignore[no-untyped-def]
    """The sandbox CRM, reset, with the HTTP adapter's "crm" system pointing at it."""
    party, server = crm_server
    party.reset()
    mechanisms = copy.deepcopy(settings.STOPDESK_MECHANISMS)
    mechanisms["http"]["options"]["systems"]["crm"]["base_url"] = server.url
    settings.STOPDESK_MECHANISMS = mechanisms
    return party


def system_url(name: str) -> str:
    """A configured external system's base URL (the HTTP adapter's `systems` option)."""
    return str(django_settings.STOPDESK_MECHANISMS["http"]["options"]["systems"][name]["base_url"])


@pytest.fixture
def eager() -> Iterator[None]:
    from stopdesk.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


HTMX = {"HTTP_HX_REQUEST": "true"}


def htmx(target: str) -> dict[str, str]:
    return {**HTMX, "HTTP_HX_TARGET": target}
