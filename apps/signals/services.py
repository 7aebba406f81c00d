"""Writes of golden signals: the collector's buckets, the coarse roll-up and retention."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.signals import hist
from apps.signals.aggregate import HIST_FIELDS, ROW_FIELDS, SUM_FIELDS, BucketKey, Dims, Open, Sums
from apps.signals.models import RequestSample, SignalBucket
from apps.signals.sampling import Sample, row_values

FINE_STEP_S = 5
COARSE_STEP_S = 300
FINE_KEEP = timedelta(hours=6)
SAMPLE_KEEP = FINE_KEEP  # at most 12 rows per LB and second (sampling.py): ~260k per LB at the most
COARSE_KEEP = timedelta(days=8)
UNIQUE_FIELDS = ["kind", "ref_id", "node", "step_s", "start"]
UPDATE_FIELDS = ["org_id", "lb_id", "pool_id", "region", *ROW_FIELDS]


def _row(key: BucketKey, entry: Open, step_s: int) -> SignalBucket:
    start, (kind, ref_id, node) = key
    sums, dims = entry.sums, entry.dims
    return SignalBucket(
        kind=kind, ref_id=ref_id, node=node, start=datetime.fromtimestamp(start, UTC), step_s=step_s,
        org_id=dims.org_id, lb_id=dims.lb_id, pool_id=dims.pool_id, region=dims.region,
        **{f: getattr(sums, f) for f in SUM_FIELDS}, **{f: hist.sparse(getattr(sums, f)) for f in HIST_FIELDS},
    )


def buckets_write(entries: Iterable[tuple[BucketKey, Open]], step_s: int = FINE_STEP_S) -> int:
    """Store the collector's open buckets, overwriting what it wrote of them before (it holds their whole
    sums: a bucket is written every second while it is open, so a chart lags a request by about that)."""
    rows = [_row(key, entry, step_s) for key, entry in entries]
    if rows:
        SignalBucket.objects.bulk_create(rows, batch_size=2000, update_conflicts=True,
                                         unique_fields=UNIQUE_FIELDS, update_fields=UPDATE_FIELDS)
    return len(rows)


def samples_write(samples: list[Sample]) -> int:
    if samples:
        RequestSample.objects.bulk_create([RequestSample(**row_values(s)) for s in samples], batch_size=2000)
    return len(samples)


def signals_rollup(*, now: datetime | None = None, windows: int = 3) -> int:
    """Sum the fine buckets of the last `windows` closed coarse windows into coarse rows (idempotent:
    a window is recomputed whole and overwritten), then drop rows past their retention. Returns rows written."""
    now = now or timezone.now()
    epoch = int(now.timestamp()) // COARSE_STEP_S * COARSE_STEP_S
    written = 0
    for n in range(windows, 0, -1):
        start = epoch - n * COARSE_STEP_S
        fine = SignalBucket.objects.filter(step_s=FINE_STEP_S, start__gte=datetime.fromtimestamp(start, UTC),
                                           start__lt=datetime.fromtimestamp(start + COARSE_STEP_S, UTC))
        coarse: dict[BucketKey, Open] = {}
        for row in fine.values_list("kind", "ref_id", "node", "org_id", "lb_id", "pool_id", "region",
                                    *ROW_FIELDS).iterator(2000):
            key = (start, (row[0], row[1], row[2]))
            entry = coarse.get(key)
            if entry is None:
                entry = coarse[key] = Open(Dims(*row[3:7]), Sums())
            entry.sums.add_row(row[7:])
        with transaction.atomic():
            written += buckets_write(coarse.items(), COARSE_STEP_S)
    SignalBucket.objects.filter(step_s=FINE_STEP_S, start__lt=now - FINE_KEEP).delete()
    SignalBucket.objects.filter(step_s=COARSE_STEP_S, start__lt=now - COARSE_KEEP).delete()
    RequestSample.objects.filter(at__lt=now - SAMPLE_KEEP).delete()
    return written
