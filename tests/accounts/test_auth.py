"""Tokens, sessions, login throttling, security headers and settings that fail fast."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.accounts.services import token_create
from tests.processes import REPO


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.mark.django_db
def test_token_secret_is_shown_once_and_stored_hashed(alice):
    response = alice.client.post("/api/v1/tokens/", {"name": "pipeline", "scopes": ["read", "deploy"]},
                                 format="json")
    assert response.status_code == 201
    secret = response.json()["token"]
    assert secret.startswith("spw_") and len(secret) > 40
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert secret not in (token.secret_hash, token.prefix)
    assert "token" not in alice.client.get(f"/api/v1/tokens/{token.pk}/").json()
    assert bearer(secret).get("/api/v1/load-balancers/").status_code == 200


@pytest.mark.django_db
def test_revoked_expired_and_forged_tokens_get_401(alice):
    issued = token_create(org=alice.org, name="t", scopes=["read"])
    client = bearer(issued.secret)
    assert client.get("/api/v1/routes/").status_code == 200
    alice.client.post(f"/api/v1/tokens/{issued.token.pk}/revoke/")
    assert client.get("/api/v1/routes/").status_code == 401
    expiring = token_create(org=alice.org, name="e", scopes=["read"], expires_at=timezone.now() + timedelta(hours=1))
    ApiToken.objects.filter(pk=expiring.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(expiring.secret).get("/api/v1/routes/").status_code == 401
    forged = issued.secret[:-4] + "AAAA"
    assert bearer(forged).get("/api/v1/routes/").json()["code"] == "not_authenticated"


@pytest.mark.django_db
def test_read_scope_cannot_write_and_last_used_is_recorded(alice, world):
    issued = token_create(org=alice.org, name="ro", scopes=["read"])
    client = bearer(issued.secret)
    assert client.get("/api/v1/pools/").status_code == 200
    assert client.post("/api/v1/pools/", {"lb": world.acme_lb.pk, "name": "x"}, format="json").status_code == 403
    issued.token.refresh_from_db()
    assert issued.token.last_used_at is not None


@pytest.mark.django_db
def test_mktoken_prints_a_working_token(acme, capsys):
    call_command("mktoken", "--org", "acme", "--scopes", "read,write")
    secret = capsys.readouterr().out.strip()
    assert bearer(secret).get("/api/v1/routes/").status_code == 200


@pytest.mark.django_db
def test_login_works_and_is_throttled_after_repeated_failures(alice, settings):
    settings.LOGIN_THROTTLE_ATTEMPTS = 5
    client = Client()
    for _ in range(5):
        assert client.post("/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    blocked = client.post("/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert blocked.status_code == 429
    assert int(blocked["Retry-After"]) > 0
    from django.core.cache import cache

    cache.clear()
    ok = client.post("/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert ok.status_code == 302
    page = client.get("/")
    assert page.status_code == 200 and b"acme" in page.content


@pytest.mark.django_db
def test_pages_carry_csp_and_no_inline_script(alice):
    client = Client()
    client.force_login(alice.user)
    response = client.get("/")
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert b"<script>" not in response.content
    assert response["X-Frame-Options"] == "DENY"


def _settings_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG", "SPILLWAY_TESTING"}}
    # A var dir of its own: the var/local.env a `make run` wrote in this checkout would supply the missing secret.
    var_dir = tempfile.mkdtemp(prefix="spw-settings-")
    return subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=REPO, capture_output=True,
                          text=True, env={**base, "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                                          "SPILLWAY_TESTING": "0", "SPILLWAY_VAR_DIR": var_dir, **env}, timeout=60)


def test_settings_fail_fast_on_missing_secret_and_bad_values():
    missing = _settings_check({"DEBUG": "0"})
    assert missing.returncode != 0 and "SECRET_KEY is required" in missing.stderr
    bad_bool = _settings_check({"DEBUG": "maybe"})
    assert bad_bool.returncode != 0 and "DEBUG='maybe' is not a boolean" in bad_bool.stderr
    bad_url = _settings_check({"DEBUG": "1", "DATABASE_URL": "nosuchdb://x"})
    assert bad_url.returncode != 0 and "DATABASE_URL" in bad_url.stderr
    secure = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings as s;"
                               "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE)"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "SPILLWAY_TESTING": "0", "DEBUG": "0",
             "SECRET_KEY": "x" * 50, "FIELD_ENCRYPTION_KEY": "k"})
    assert secure.stdout.split() == ["True", "True"], secure.stderr


@pytest.mark.django_db(transaction=True)
def test_parallel_login_attempts_get_no_more_password_checks_than_the_limit(live_server, settings):
    """GIVEN 30 wrong-password attempts for one user sent at once to a threaded server WHEN they race
    THEN at most LOGIN_THROTTLE_ATTEMPTS of them reach the password check; the rest answer 429."""
    import re
    from concurrent.futures import ThreadPoolExecutor

    import requests
    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    settings.CSRF_COOKIE_SECURE = settings.SESSION_COOKIE_SECURE = False  # plain http on loopback
    settings.LOGIN_THROTTLE_ATTEMPTS = 5
    cache.clear()
    get_user_model().objects.create_user("mallory-target", password="correct-horse-battery")
    url = f"{live_server.url}/login/"

    def attempt(_):
        session = requests.Session()
        page = session.get(url, timeout=10)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        return session.post(url, data={"username": "mallory-target", "password": "wrong",
                                       "csrfmiddlewaretoken": token},
                            headers={"Referer": url}, timeout=10).status_code

    try:
        with ThreadPoolExecutor(max_workers=30) as pool:
            codes = list(pool.map(attempt, range(30)))
    finally:
        cache.clear()  # the loopback address is locked out now; later tests log in from it

    assert codes.count(429) >= 30 - settings.LOGIN_THROTTLE_ATTEMPTS, codes
    assert set(codes) <= {200, 429}, codes


@pytest.mark.django_db
def test_the_throttle_holds_against_username_variants_and_the_attackers_own_logins(settings):
    """Review finding: ' charlie', 'charlie<TAB>' and a fullwidth 'c' all log in as charlie but had their own
    counters, and logging into one's own account cleared the address's counter."""
    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    settings.LOGIN_THROTTLE_ATTEMPTS = 5
    cache.clear()
    users = get_user_model().objects
    users.create_user("charlie-target", password="correct-horse-battery")
    users.create_user("mallory", password="mallory-own-pass")
    client = Client()
    variants = [" charlie-target", "charlie-target\t", "\uff43harlie-target", "charlie-target\u00a0"]
    codes = []
    try:
        for i in range(12):
            codes.append(client.post("/login/", {"username": variants[i % 4], "password": f"guess-{i}"}).status_code)
            if i % 3 == 2:  # the attacker logs into its own account between guesses
                Client().post("/login/", {"username": "mallory", "password": "mallory-own-pass"})
        assert codes.count(200) <= settings.LOGIN_THROTTLE_ATTEMPTS, codes
        assert 429 in codes
    finally:
        cache.clear()


@pytest.mark.django_db
def test_many_people_behind_one_address_can_all_log_in(settings):
    """Successful logins do not use up the address's allowance (an office behind one NAT address)."""
    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    settings.LOGIN_THROTTLE_ATTEMPTS = 5
    cache.clear()
    for n in range(settings.LOGIN_THROTTLE_ATTEMPTS + 3):
        get_user_model().objects.create_user(f"colleague{n}", password="correct-horse-battery")
        assert Client().post("/login/", {"username": f"colleague{n}",
                                         "password": "correct-horse-battery"}).status_code == 302
    cache.clear()
