"""Fleets' facade for reads: what other apps, the pages, the API and the tests ask of fleets.

The reads themselves live where their concern does: database queries in `queries.py` (which fleets' own
modules import), member health and VIP holders in `health/`, which fleets serve an LB and what a node would
route in `config/`. Other apps import fleets' models, `services` and this module, nothing else
(tests/fleets/test_module_layers.py).
"""

from __future__ import annotations

from apps.fleets.config.preview import lb_preview_change
from apps.fleets.config.render.chain import backend_name
from apps.fleets.config.render.frontends import listener_frontend
from apps.fleets.config.route_tester import route_test
from apps.fleets.config.serving import ServingFleet, serving, what_if
from apps.fleets.config.stored import diff_lines
from apps.fleets.health.members import MemberHealth, member_health
from apps.fleets.health.pool_counters import NodeCounters, pool_counters
from apps.fleets.health.vips import NOT_SERVED, FleetVip, listener_vip, unserved_static_ips
from apps.fleets.models import fleets_visible_to
from apps.fleets.node.outside_rollout import read_state
from apps.fleets.pages import (
    HISTORY_REVISIONS,
    HISTORY_ROLLOUTS,
    can_push,
    deploy_state,
    failing_checks,
    fleet_overview,
    history,
    nodes_reporting,
    recent_rollouts,
)
from apps.fleets.queries import (
    SUMMARY_ROWS,
    challenge_answers,
    enabled_nodes,
    fleet_binds_one_address,
    fleet_ids_for_lb,
    fleet_lbs,
    fleet_pin,
    fleet_snapshot,
    health_rows,
    latest_revision,
    latest_revision_pk,
    lb_applied_state,
    lb_fleets,
    node_conn,
    node_regions,
    node_spec,
    pool_nodes,
    reference_node,
    remember_revision_snapshot,
    render_problems_for,
    revision_snapshot,
    route_specs,
    text_revision,
    vrrp_nodes,
    vrrp_spec,
)

__all__ = [
    "HISTORY_REVISIONS",
    "HISTORY_ROLLOUTS",
    "NOT_SERVED",
    "SUMMARY_ROWS",
    "FleetVip",
    "MemberHealth",
    "NodeCounters",
    "ServingFleet",
    "backend_name",
    "can_push",
    "challenge_answers",
    "deploy_state",
    "diff_lines",
    "enabled_nodes",
    "failing_checks",
    "fleet_binds_one_address",
    "fleet_ids_for_lb",
    "fleet_lbs",
    "fleet_overview",
    "fleet_pin",
    "fleet_snapshot",
    "fleets_visible_to",
    "health_rows",
    "history",
    "latest_revision",
    "latest_revision_pk",
    "lb_applied_state",
    "lb_fleets",
    "lb_preview_change",
    "listener_frontend",
    "listener_vip",
    "member_health",
    "node_conn",
    "node_regions",
    "node_spec",
    "nodes_reporting",
    "pool_counters",
    "pool_nodes",
    "read_state",
    "recent_rollouts",
    "reference_node",
    "remember_revision_snapshot",
    "render_problems_for",
    "revision_snapshot",
    "route_specs",
    "route_test",
    "serving",
    "text_revision",
    "unserved_static_ips",
    "vrrp_nodes",
    "vrrp_spec",
    "what_if",
]
