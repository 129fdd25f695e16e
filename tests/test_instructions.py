"""The instruction-counting benchmark runs under valgrind and sees the instrumentation (apart from
test_benchmark.py, so the two run on separate workers: each takes a minute or so)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instruction_counts_see_the_instrumentation() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    import instructions

    off, on, peer = (instructions.per_request(f"non-streaming {state}", few=1, many=9)
                     for state in ("off", "on", instructions.PEER))
    # per request, start-up and imports taken out: the span and records cost ~0.31 M instructions, far less than
    # the client's own ~5 M; openai-v2, counted the same way, ~0.8 M. Beside other work (this suite runs two tests
    # at once) a whole run's count moves by up to ~0.35 M: 8 requests apart, that is ~0.04 M a request
    assert 100_000 < on - off < 0.2 * off
    assert 100_000 < peer - off < 0.3 * off


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_cache_misses_are_simulated() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    import instructions

    # one whole run (imports and start-up included; per-request differences of so few requests move by more than
    # the instrumentation adds under the simulation): every figure parsed, each where a real run puts it
    found = instructions.count("non-streaming off", 1, caches=True)
    assert set(found) == {"instructions", *instructions.MISSES}
    assert 100_000_000 < found["instructions"]
    assert 0.001 * found["instructions"] < found["L1 data misses"] < 0.1 * found["instructions"]
    assert 1_000 < found["L2 misses"] < found["L1 data misses"] + found["L1 instruction misses"]
