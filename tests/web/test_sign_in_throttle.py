"""Sign-in throttling: counted per (username, client address) with a ceiling per address, shared by
every web process, with approval re-authentication on a counter of its own, and the client address
taken from X-Forwarded-For only behind a proxy the operator named."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from stopdesk.views.auth import REAUTH_SESSION_KEY

pytestmark = pytest.mark.django_db


def _login(address: str, username: str, password: str, **headers: str) -> int:
    client = Client(REMOTE_ADDR=address, headers=headers)
    return client.post(reverse("login"), {"username": username, "password": password}).status_code


def test_a_stranger_cannot_lock_an_approver_out(roles):
    for _ in range(12):
        _login("203.0.113.66", "approver", "wrong")
    assert _login("203.0.113.66", "approver", "approver-pass-123") == 429  # the stranger is stopped
    assert _login("198.51.100.7", "approver", "approver-pass-123") == 302  # the approver is not


def test_one_address_guessing_many_accounts_hits_the_per_address_ceiling(roles, settings):
    settings.STOPDESK_LOGIN_ADDRESS_ATTEMPTS = 8
    answers = [_login("203.0.113.9", f"someone-{n}", "wrong") for n in range(8)]
    assert answers == [200] * 8
    assert _login("203.0.113.9", "operator", "operator-pass-123") == 429
    assert _login("203.0.113.10", "operator", "operator-pass-123") == 302


def test_the_pair_limit_still_stops_guessing_one_account_from_one_address(roles):
    assert [_login("203.0.113.5", "operator", "wrong") for _ in range(5)] == [200] * 5
    assert _login("203.0.113.5", "operator", "operator-pass-123") == 429


def test_approval_reauthentication_has_its_own_counter(roles, as_user):
    for _ in range(6):
        _login("127.0.0.1", "approver", "wrong")  # sign-in for this person and address is locked
    client = as_user("approver")
    answer = client.post(reverse("reauth"), {"password": "approver-pass-123", "next": "/queue/"})
    assert answer.status_code == 302 and client.session.get(REAUTH_SESSION_KEY)
    for _ in range(5):
        assert client.post(reverse("reauth"), {"password": "wrong"}).status_code == 400
    assert client.post(reverse("reauth"), {"password": "approver-pass-123"}).status_code == 429
    # ... and a locked re-authentication does not lock sign-in from another address.
    assert _login("198.51.100.8", "approver", "approver-pass-123") == 302


def test_a_forwarded_header_is_ignored_without_a_trusted_proxy(roles):
    for n in range(5):
        _login("203.0.113.77", "operator", "wrong", x_forwarded_for=f"10.9.9.{n}")
    assert _login("203.0.113.77", "operator", "operator-pass-123", x_forwarded_for="10.9.9.200") == 429


def test_behind_a_trusted_proxy_the_forwarded_client_is_counted(roles, settings):
    settings.STOPDESK_TRUSTED_PROXIES = ["127.0.0.1", "10.0.0.0/8"]
    for _ in range(5):
        _login("127.0.0.1", "operator", "wrong", x_forwarded_for="203.0.113.1, 10.1.2.3")
    blocked = _login("127.0.0.1", "operator", "operator-pass-123", x_forwarded_for="203.0.113.1, 10.1.2.3")
    other = _login("127.0.0.1", "operator", "operator-pass-123", x_forwarded_for="198.51.100.1")
    # The locked client cannot escape by prepending a made-up hop: only what the proxies added counts.
    spoofed = _login("127.0.0.1", "operator", "operator-pass-123", x_forwarded_for="198.51.100.2, 203.0.113.1")
    assert (blocked, other, spoofed) == (429, 302, 429)
