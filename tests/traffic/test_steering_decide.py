"""Failover and auto capacity drain decisions: thresholds, hysteresis, at most half the regions drained."""

from __future__ import annotations

from apps.traffic.steering import HOLD_S, Decision, decide


def test_region_under_threshold_fails_over_and_comes_back_only_after_margin_and_hold() -> None:
    d, changes = decide({"a": 0.5, "b": 1.0}, 0.7, False, Decision(), now=0.0)
    assert d.failed_over == {"a"} and [c.action for c in changes] == ["failed_over"]
    d, changes = decide({"a": 0.75, "b": 1.0}, 0.7, False, d, now=1.0)  # over 70% but under 80%: stays
    assert d.failed_over == {"a"} and not changes
    d, changes = decide({"a": 0.9, "b": 1.0}, 0.7, False, d, now=2.0)
    assert d.failed_over == {"a"} and not changes  # healthy, but not for HOLD_S yet
    d, changes = decide({"a": 0.9, "b": 1.0}, 0.7, False, d, now=2.0 + HOLD_S)
    assert d.failed_over == set() and [c.action for c in changes] == ["failed_back"]


def test_flapping_health_around_the_threshold_makes_no_events() -> None:
    d, first = decide({"a": 0.6}, 0.7, False, Decision(), now=0.0)
    events = list(first)
    for i in range(1, 40):  # 0.6 / 0.85 alternating every 250 ms for 10 s
        d, changes = decide({"a": 0.85 if i % 2 else 0.6}, 0.7, False, Decision.from_json(d.to_json()), now=i * 0.25)
        events += changes
    assert [c.action for c in events] == ["failed_over"]


def test_auto_drain_never_drains_more_than_half_the_regions_least_healthy_first() -> None:
    d, changes = decide({"a": 0.1, "b": 0.2, "c": 0.0, "d": 1.0}, None, True, Decision(), now=0.0)
    assert d.drained == {"a", "c"}
    assert sorted(c.region for c in changes) == ["a", "c"]
    d, _ = decide({"a": 0.3, "b": 0.2, "c": 0.0, "d": 1.0}, None, True, d, now=1.0)
    assert d.drained == {"a", "c"}  # a under 35%: stays drained (hysteresis)
    d, changes = decide({"a": 0.5, "b": 0.2, "c": 0.0, "d": 1.0}, None, True, d, now=2.0)
    d, changes = decide({"a": 0.5, "b": 0.2, "c": 0.0, "d": 1.0}, None, True, d, now=2.0 + HOLD_S)
    assert d.drained == {"b", "c"}
    assert {(c.region, c.action) for c in changes} == {("a", "undrained"), ("b", "drained")}
