"""A stream of issuance rounds: each round's deployment overlaps the next round's orders at the CA,
and what falls due while a round runs is taken by the next round."""

from __future__ import annotations

import threading
import time

import pytest

from apps.acme import services


@pytest.mark.django_db(transaction=True)  # the deployment runs in its own thread and connection
def test_a_rounds_deployment_overlaps_the_next_rounds_orders_and_late_arrivals_join_the_next_round(
        monkeypatch) -> None:
    spans: list[tuple[str, tuple[int, ...], float, float]] = []
    lock = threading.Lock()
    arrivals = [[3, 4], [5], []]  # due() after each round: what arrived meanwhile

    def span(kind: str, ids: tuple[int, ...], seconds: float) -> None:
        start = time.monotonic()
        time.sleep(seconds)
        with lock:
            spans.append((kind, ids, start, time.monotonic()))

    def obtain(ids, force, now, step):  # type: ignore[no-untyped-def]
        span("ca", tuple(ids), 0.3)
        return list(ids)

    def deliver(jobs, step):  # type: ignore[no-untyped-def]
        span("deploy", tuple(jobs), 0.4)
        return [f"order-{j}" for j in jobs]

    monkeypatch.setattr(services, "_obtain", obtain)
    monkeypatch.setattr(services, "_deliver", deliver)
    monkeypatch.setattr(services, "due", lambda now=None: arrivals.pop(0) if arrivals else [])

    orders = services.managed_certificates_stream(managed_ids=[1, 2])

    assert orders == ["order-1", "order-2", "order-3", "order-4", "order-5"]
    by = {(kind, ids): (start, end) for kind, ids, start, end in spans}
    assert set(by) == {("ca", (1, 2)), ("deploy", (1, 2)), ("ca", (3, 4)), ("deploy", (3, 4)), ("ca", (5,)),
                       ("deploy", (5,))}
    # round 1's deployment and round 2's orders at the CA run at the same time
    deploy_1, ca_2 = by[("deploy", (1, 2))], by[("ca", (3, 4))]
    assert ca_2[0] < deploy_1[1] and deploy_1[0] < ca_2[1]
    # a round is deployed only once its certificates are stored, one deployment at a time
    assert by[("deploy", (3, 4))][0] >= max(by[("ca", (3, 4))][1], deploy_1[1])


@pytest.mark.django_db
def test_inside_a_transaction_the_rounds_run_one_after_the_other(monkeypatch) -> None:
    """Another thread's connection would not see what this transaction stored: no overlap then."""
    seen: list[str] = []
    monkeypatch.setattr(services, "_obtain", lambda ids, force, now, step: seen.append(f"ca{ids}") or list(ids))
    monkeypatch.setattr(services, "_deliver",
                        lambda jobs, step: seen.append(f"deploy{jobs}") or [threading.current_thread().name])
    arrivals = [[2], []]
    monkeypatch.setattr(services, "due", lambda now=None: arrivals.pop(0) if arrivals else [])
    orders = services.managed_certificates_stream(managed_ids=[1])
    assert seen == ["ca[1]", "deploy[1]", "ca[2]", "deploy[2]"]
    assert set(orders) == {threading.current_thread().name}
