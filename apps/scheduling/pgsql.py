"""Set-based statements for PostgreSQL on the scheduler's hot path.

A burst of 1,000 runs is bound by round trips to the database more than by anything else:
on a busy machine every round trip waits for the database process to be scheduled. So each
step here is one statement (one round trip, one commit in autocommit mode), with one array
per column so the SQL text is constant and psycopg parses it once. Other databases (SQLite,
the zero-setup default) take the portable ORM paths in dispatcher.py and runner.py.

Every statement keeps the same guards as the portable path: a slot is inserted only if it has
no run (ON CONFLICT), a run is claimed only while pending, an outcome is written only while
the run is still running as that attempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection

# --- dispatcher ------------------------------------------------------------------------------

INSERT_RUNS = """
INSERT INTO scheduling_jobrun (job_id, scheduled_for, "trigger", missed_since, status, attempt, max_attempts,
                               attempts, enqueued_at, finished_at, error, worker, webhook_status, created_at)
SELECT job_id, scheduled_for, "trigger", missed_since, status, 1, max_attempts, '[]'::jsonb, NULL,
       CASE WHEN status = 'skipped' THEN %s::timestamptz END, error, '', '', %s
FROM unnest(%s::bigint[], %s::timestamptz[], %s::text[], %s::timestamptz[], %s::text[], %s::integer[], %s::text[])
     AS r(job_id, scheduled_for, "trigger", missed_since, status, max_attempts, error)
ON CONFLICT (job_id, scheduled_for) DO NOTHING
RETURNING id, job_id, status, "trigger"
"""

ADVANCE_JOBS = """
UPDATE scheduling_job AS j SET next_fire_at = v.next_fire_at
FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, next_fire_at)
WHERE j.id = v.id
"""


def insert_runs(rows: Iterable[Any], now: datetime) -> list[tuple[int, int, str, str]]:
    rows = list(rows)
    params = [now, now, [r.job_id for r in rows], [r.scheduled_for for r in rows], [r.trigger for r in rows],
              [r.missed_since for r in rows], [r.status for r in rows], [r.max_attempts for r in rows],
              [r.error for r in rows]]
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RUNS, params)
        return [tuple(r) for r in cursor.fetchall()]  # type: ignore[misc]


def advance_jobs(next_fire: dict[int, datetime | None]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(ADVANCE_JOBS, [list(next_fire), list(next_fire.values())])


# --- runner ----------------------------------------------------------------------------------

# Correlated lookups by primary key rather than a join: a chunk touches a few dozen jobs, and a
# join lets the planner scan the whole job table to hash it.
CLAIM_ALLOW = """
UPDATE scheduling_jobrun AS r
SET status = 'running', started_at = %(now)s, heartbeat_at = %(now)s, worker = %(worker)s, finished_at = NULL,
    deadline_at = %(now)s + make_interval(secs => (SELECT j.timeout_s FROM scheduling_job AS j WHERE j.id = r.job_id))
WHERE r.id = ANY(%(ids)s::bigint[]) AND r.status = 'pending' AND (r.not_before IS NULL OR r.not_before <= %(now)s)
  AND EXISTS (SELECT 1 FROM scheduling_job AS j WHERE j.id = r.job_id AND j.concurrency_policy = 'allow')
RETURNING r.id
"""

RECORD_FINAL = """
WITH done AS (
    UPDATE scheduling_jobrun AS r
    SET status = v.status, started_at = v.started_at, finished_at = %(now)s, duration_ms = v.duration_ms,
        output = v.output::jsonb, error = v.error, attempts = r.attempts || v.entry::jsonb
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(statuses)s::text[], %(started)s::timestamptz[],
                %(durations)s::integer[], %(outputs)s::text[], %(errors)s::text[], %(entries)s::text[])
         AS v(id, attempt, status, started_at, duration_ms, output, error, entry)
    WHERE r.id = v.id AND r.status = 'running' AND r.attempt = v.attempt
    RETURNING r.id, r.job_id, r.status
), last AS (
    -- A run that finishes late must not hide the outcome of a newer one.
    UPDATE scheduling_job AS j SET last_status = d.status, last_run_at = %(now)s
    FROM (SELECT DISTINCT ON (job_id) job_id, status FROM done ORDER BY job_id, id DESC) AS d
    WHERE j.id = d.job_id AND (j.last_run_at IS NULL OR j.last_run_at <= %(now)s)
)
SELECT id, status FROM done
"""


def claim_allow(run_ids: list[int], *, worker: str, now: datetime) -> list[int]:
    """Claim the pending, due runs of jobs whose policy is allow; returns their ids. The rest (other
    policies, early retries, already taken) are left for the careful path."""
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_ALLOW, {"now": now, "worker": worker[:200], "ids": run_ids})
        return [row[0] for row in cursor.fetchall()]


def record_final(outcomes: list[Any], entries: list[dict[str, Any]], *, now: datetime,
                 max_error_chars: int) -> dict[int, str]:
    """Write final outcomes and the jobs' last status in one statement; {run id: status} written."""
    params = {
        "now": now,
        "ids": [o.run.pk for o in outcomes],
        "attempts": [o.run.attempt for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "started": [o.started_at or o.run.started_at for o in outcomes],
        "durations": [o.duration_ms for o in outcomes],
        "outputs": [None if o.output is None else json.dumps(o.output) for o in outcomes],
        "errors": [o.error[:max_error_chars] for o in outcomes],
        "entries": [json.dumps([entry]) for entry in entries],
    }
    with connection.cursor() as cursor:
        cursor.execute(RECORD_FINAL, params)
        return dict(cursor.fetchall())
