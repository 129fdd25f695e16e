"""Bucket boundaries chosen for p99 accuracy (DESIGN.md section 3).

A p99 that Prometheus' histogram_quantile computes from our buckets lands within 10% of the exact p99 of the raw
samples, for realistic latency distributions from 20 ms to 60 s (TTFT, duration) and from 1 ms to 1 s (chunk gaps,
TPOT). Realistic here: lognormal with p99/p50 >= 2 (sigma >= 0.3) and heavy-tailed mixtures where 3% of requests
are four times slower. The quantile below follows Prometheus' own algorithm (linear interpolation inside the bucket
the rank falls in, lower edge 0 for the first bucket, the highest finite edge for the +Inf bucket).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence

import pytest

from otel_llm import _semconv as sc


def histogram_quantile(q: float, bounds: Sequence[float], samples: Sequence[float]) -> float:
    counts = [0] * (len(bounds) + 1)
    for value in samples:
        counts[bisect.bisect_left(bounds, value)] += 1  # buckets are upper-inclusive: le
    rank = q * len(samples)
    seen = 0
    for index, count in enumerate(counts):
        if seen + count >= rank:
            if index == len(bounds):
                return bounds[-1]
            lower = bounds[index - 1] if index else 0.0
            return lower + (bounds[index] - lower) * (rank - seen) / count
        seen += count
    raise AssertionError("unreachable: the rank is within the total count")


def exact_quantile(q: float, samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def distributions(low: float, high: float) -> list[tuple[str, list[float]]]:
    """Seeded samples whose exact p99 lies in [low, high]."""
    rng = random.Random(20261130)
    found = []
    for sigma in (0.3, 0.5, 0.8, 1.2):
        median = low / 4
        while median < high:
            p99 = median * math.exp(2.326 * sigma)
            if low <= p99 <= high:
                found.append((f"lognormal(median={median:.3g}s, sigma={sigma})",
                              [rng.lognormvariate(math.log(median), sigma) for _ in range(20_000)]))
            median *= 1.37
    base = low
    while base * 4 < high:
        slow = math.log(base * 4)
        fast = math.log(base)
        found.append((f"mixture(base={base:.3g}s, 3% x4)", [
            rng.lognormvariate(slow if rng.random() < 0.03 else fast, 0.3) for _ in range(20_000)]))
        base *= 2.1
    return [(name, samples) for name, samples in found if low <= exact_quantile(0.99, samples) <= high]


@pytest.mark.parametrize(("buckets", "low", "high"), [
    (sc.LATENCY_BUCKETS, 0.02, 60.0),
    (sc.CHUNK_BUCKETS, 0.001, 1.0),
], ids=["ttft-and-duration", "chunk-gaps-and-tpot"])
def test_p99_from_buckets_is_within_ten_percent(buckets: tuple[float, ...], low: float, high: float) -> None:
    cases = distributions(low, high)
    assert len(cases) > 40  # the whole range is covered, not a few convenient points
    errors = {name: abs(histogram_quantile(0.99, buckets, samples) / exact_quantile(0.99, samples) - 1)
              for name, samples in cases}
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= 0.10, f"{worst}: p99 off by {errors[worst]:.1%}"


def test_bucket_shape() -> None:
    for buckets in (sc.LATENCY_BUCKETS, sc.CHUNK_BUCKETS):
        assert list(buckets) == sorted(set(buckets))
        assert len(buckets) <= 32
    # SLO thresholds sit on bucket edges, in every latency histogram's range
    assert {0.5, 1.0, 2.0, 5.0} <= set(sc.LATENCY_BUCKETS)
    assert {0.5, 1.0} <= set(sc.CHUNK_BUCKETS)
    assert sc.COUNT_BUCKETS == tuple(4.0**i for i in range(14))
