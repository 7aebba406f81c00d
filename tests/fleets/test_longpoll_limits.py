"""Long-polls cannot take every web thread, and expensive endpoints are rate limited per principal."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from django.core.cache import cache

from apps.accounts.services import token_authenticate
from apps.balancers.models import LoadBalancer
from apps.core.api import throttles
from apps.fleets.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting_url(shared) -> str:
    Node.objects.create(fleet=shared["fleet"], name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                        config_dir="/etc/spw/n1")
    wanted = LoadBalancer.objects.get(pk=shared["lb"].pk).revision + 1  # never applied
    return f"/api/v1/load-balancers/{shared['lb'].pk}/applied/?revision={wanted}&timeout=2"


def _timed(client, url: str):
    started = time.monotonic()
    response = client.get(url)
    return response, time.monotonic() - started


def test_a_principal_holding_its_wait_slots_gets_the_state_at_once(waiting_url, alice, bob, settings) -> None:
    settings.LONGPOLL_SLOTS_PER_PRINCIPAL = 1
    alice.client.get(waiting_url.replace("timeout=2", "timeout=0"))  # warm-up: first-request costs
    with throttles.wait_slot(_principal(alice)) as may_wait:  # alice's one slot is taken
        assert may_wait
        response, elapsed = _timed(alice.client, waiting_url)
        assert response.status_code == 202 and elapsed < 1.0 and response["Retry-After"] == "1"
        assert response.json()["applied"] is False and response.json()["nodes"]
        # Another principal still waits its full timeout.
        response, elapsed = _timed(bob.client, waiting_url)
        assert response.status_code == 202 and elapsed >= 2 and "Retry-After" not in response
    response, elapsed = _timed(alice.client, waiting_url)
    assert elapsed >= 2


def test_a_process_with_its_wait_slots_taken_answers_every_long_poll_at_once(waiting_url, alice) -> None:
    held = []
    while throttles._process_slots.acquire(blocking=False):
        held.append(1)
    try:
        assert held, "the process has wait slots"
        alice.client.get(waiting_url.replace("timeout=2", "timeout=0"))  # warm-up: first-request costs
        response, elapsed = _timed(alice.client, waiting_url)
        assert response.status_code == 202 and elapsed < 1.0
    finally:
        for _ in held:
            throttles._process_slots.release()


def test_preview_and_long_polls_are_rate_limited_per_principal(shared, waiting_url, alice, bob,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(throttles.PrincipalRateThrottle, "THROTTLE_RATES", {"preview": "2/min", "longpoll": "3/min"})
    lb = shared["lb"]
    for persona in (alice, bob):  # token ids repeat across test databases; their counts must not
        cache.delete_many([f"throttle_{scope}_{_principal(persona).actor}" for scope in ("preview", "longpoll")])
    url = waiting_url.replace("timeout=2", "timeout=0")
    assert [alice.client.get(url).status_code for _ in range(4)] == [202, 202, 202, 429]
    limited = alice.client.get(url)
    assert limited.json()["code"] == "throttled" and int(limited["Retry-After"]) > 0
    assert bob.client.get(url).status_code == 202  # the limit is alice's token's, not the org's or the IP's
    preview = f"/api/v1/load-balancers/{lb.pk}/preview/"
    codes = [alice.client.post(preview).status_code for _ in range(3)]
    assert codes[2] == 429 and 429 not in codes[:2], codes


def test_back_to_back_long_polls_outlive_the_slot_counts_lifetime(waiting_url, alice, monkeypatch) -> None:
    """GIVEN a client asking again as each long-poll ends (a 100k-route rollout takes minutes), WHEN the
    slot count set by the first wait expires during a later one, THEN that long-poll still answers (202),
    not 500; each wait renews the count's lifetime."""
    monkeypatch.setattr(throttles, "_SLOT_TTL_S", 1)
    key = f"longpoll:{_principal(alice).actor}"
    cache.delete(key)
    assert alice.client.get(waiting_url.replace("timeout=2", "timeout=0")).status_code == 202
    with throttles.wait_slot(_principal(alice)) as may_wait:
        assert may_wait
        cache.delete(key)  # what its expiry does
    assert cache.get(key) is None
    response = alice.client.get(waiting_url)  # holds a slot for 2 s, past the 1 s lifetime set before it
    assert response.status_code == 202


def _principal(persona) -> SimpleNamespace:
    """What wait_slot reads of a principal: its actor, here the persona's token."""
    return SimpleNamespace(actor=f"token:{token_authenticate(persona.token).pk}")
