"""The event types Spillway emits, and the two webhook bodies (generic JSON, Slack-compatible). Pure.

A type is a stable dotted name a subscription filters on; adding one is adding a line here. The
generic body carries everything; the Slack body is `{"text": ...}`, which Slack incoming webhooks,
Mattermost and Rocket.Chat all accept.
"""

from __future__ import annotations

from typing import Any, Final

# name: the sentence a person reads (format keys come from the event's object and data).
TYPES: Final[dict[str, str]] = {
    "change.applied": "{object} is applied on every node (revision {revision})",
    "rollout.failed": "Rollout {rollout} of {object} failed: {error}",
    "rollout.rolled_back": "Rollout {rollout} of {object} was rolled back",
    "rollout.canary_failed": "Rollout {rollout} of {object} stopped at its canary: {reason}",
    "drift.found": "{object} drifted: {detail}",
    "drift.repaired": "{object} serves the verified config again",
    "node.health_changed": "Node {object} is {status}",
    "member.health_changed": "Member {object} is {status}",
    "overflow.started": "Pool {object} overflows out of {region}",
    "overflow.stopped": "Pool {object} no longer overflows out of {region}",
    "steering.failed_over": "Pool {object}: region {region} fails over (healthy share {healthy_share})",
    "steering.failed_back": "Pool {object}: region {region} serves its own traffic again",
    "steering.drained": "Pool {object}: region {region} is drained (healthy share {healthy_share})",
    "steering.undrained": "Pool {object}: region {region} is no longer drained",
    "drill.started": "Drill {object}: draining {share_pct}% of {region} for {duration_s} s",
    "drill.passed": "Drill {object} passed: {region}'s traffic was absorbed ({summary})",
    "drill.failed": "Drill {object} failed and was restored at once: {reason}",
    "steering.sticky_full": "Pool {object}: region {region} is full; its sticky sessions may move",
    "steering.sticky_room": "Pool {object}: region {region} has room again; sticky sessions stay there",
    "capacity.run_finished": "Capacity run {object} {status}: {outcome}",
    "certificate.expiring": "Certificate {object} expires in {days} days",
    "certificate.renewed": "Certificate {object} was renewed",
    "job.failed": "Job {object} {status}: {error}",
    "test": "Test event for subscription {object}",
}
FORMATS: Final = ("generic", "slack")


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def summary(event_type: str, object_repr: str, data: dict[str, Any]) -> str:
    template = TYPES.get(event_type, event_type + " on {object}")
    return template.format_map(_Missing({**{k: v for k, v in data.items() if k != "object"},
                                         "object": object_repr}))


def slack_escape(text: str) -> str:
    """Text as Slack shows it literally: `&`, `<` and `>` escaped, so a value a tenant wrote (a job's error, a
    name) cannot become a mention (`<!channel>`) or a link with another label (`<https://evil|Sign in>`)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def body(fmt: str, event: dict[str, Any]) -> dict[str, Any]:
    """`event`: id, type, at (ISO), org (slug or None), object_type, object_id, object_repr, data."""
    text = summary(event["type"], event["object_repr"], event["data"])
    if fmt == "slack":
        org = f"[{event['org']}] " if event.get("org") else ""
        return {"text": slack_escape(f"{org}{text}")}
    return {
        "id": event["id"], "type": event["type"], "at": event["at"], "org": event.get("org"),
        "object": {"type": event["object_type"], "id": event["object_id"], "repr": event["object_repr"]},
        "summary": text, "data": event["data"],
    }


def backoff_s(attempt: int, base_s: float, cap_s: float = 600.0) -> float:
    """Delay before attempt `attempt + 1` (attempt counts from 1): base, 4 x base, 16 x base, ... capped."""
    return min(cap_s, base_s * (4 ** (attempt - 1)))
