"""Export: an org's objects as a canonical document (names, no ids, no secrets)."""

from __future__ import annotations

from typing import Any

from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Route
from apps.capacity.models import CapacityTest
from apps.configcode import document
from apps.scheduling.models import Job
from apps.scheduling.registry import params_for_export

POOL_FIELDS = ("algorithm", "overflow_policy", "overload", "preferred_regions", "failover_threshold", "auto_drain",
               "session_affinity", "health_path", "health_interval_s", "health_rise", "health_fall",
               "health_expected_status")
JOB_FIELDS = ("kind", "params", "schedule_type", "cron", "timezone", "interval_s", "start_at", "run_at", "end_at",
              "misfire_policy", "misfire_grace_s", "concurrency_policy", "max_retries", "retry_backoff_s",
              "timeout_s", "enabled", "webhook_url")
CAPACITY_FIELDS = ("hostname", "path", "address", "port", "mode", "steps", "step_duration_s", "think_time_s",
                   "max_connections", "slo_p99_ms", "slo_error_rate", "shards", "safety_factor", "timeout_s")


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def org_export(org: Any) -> dict[str, Any]:
    lbs = LoadBalancer.objects.filter(org=org)
    pools = Pool.objects.filter(org=org).select_related("lb")
    doc: dict[str, Any] = {
        "load_balancers": [{"name": lb.name, "kind": lb.kind} for lb in lbs],
        "pools": [{"lb": p.lb.name, "name": p.name, **{f: getattr(p, f) for f in POOL_FIELDS}} for p in pools],
        "pool_regions": [{"lb": r.pool.lb.name, "pool": r.pool.name, "region": r.region.slug,
                          "max_rate_per_member": r.max_rate_per_member, "capacity_scaler": r.capacity_scaler,
                          "traffic_dial": r.traffic_dial}
                         for r in PoolRegion.objects.filter(pool__org=org).select_related("pool__lb", "region")],
        "members": [{"lb": m.pool.lb.name, "pool": m.pool.name, "name": m.name, "region": m.region.slug,
                     "address": m.address, "port": m.port, "weight": m.weight, "admin_state": m.admin_state}
                    for m in Member.objects.filter(pool__org=org).select_related("pool__lb", "region")],
        "listeners": [{"lb": x.lb.name, "name": x.name, "protocol": x.protocol, "port": x.port,
                       "default_pool": x.default_pool.name if x.default_pool else None,
                       "certificate": x.certificate.name if x.certificate_id else None}
                      for x in Listener.objects.filter(lb__org=org).select_related("lb", "default_pool",
                                                                                   "certificate")],
        "routes": [{"lb": r.lb.name, "priority": r.priority, "hosts": list(r.hosts), "path_match": r.path_match,
                    "path": r.path, "redirect_url": r.redirect_url,
                    "targets": [{"pool": t.pool.name, "weight": t.weight} for t in r.targets.all()]}
                   for r in Route.objects.filter(org=org).select_related("lb").prefetch_related("targets__pool")],
        "capacity_tests": [{"name": t.name, **{f: _plain(getattr(t, f)) for f in CAPACITY_FIELDS},
                            "listener": f"{t.listener.lb.name}/{t.listener.name}" if t.listener_id else None,
                            "route": f"{t.route.lb.name}/{t.route.priority}" if t.route_id else None,
                            "pool": f"{t.pool.lb.name}/{t.pool.name}" if t.pool_id else None,
                            "region": t.region.slug if t.region_id else None}
                           for t in CapacityTest.objects.filter(org=org).select_related(
                               "listener__lb", "route__lb", "pool__lb", "region")],
        # A job's references by name (`member: web/api/m1`), never an id: applying resolves them in the org.
        "jobs": [{"name": j.name, **{f: _plain(getattr(j, f)) for f in JOB_FIELDS},
                  "params": params_for_export(j.kind, j.params or {})}
                 for j in Job.objects.filter(org=org)],
    }
    doc = document.canonical(doc)
    return {"version": document.VERSION, "org": org.slug, "etag": document.etag(doc),
            **{k: v for k, v in doc.items() if k != "version"}}
