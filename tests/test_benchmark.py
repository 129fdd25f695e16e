"""The benchmarks run and print their figures (smoke runs: the figures themselves are read by people)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "overhead.py"
NUMBER = r"[+-]?\d+\.\d+"


def test_overhead_benchmark_prints_every_figure() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--memory-requests", "1000"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for workload in ("stream 16 chunks", "stream 256 chunks", "stream 1024 chunks", "async stream 256"):
        assert re.search(rf"^{workload}(\s+{NUMBER}){{5}}$", out, re.M), out
    assert re.search(rf"^non-streaming(\s+{NUMBER}){{4}}\s*$", out, re.M), out
    # what a user can choose, each checked by the benchmark to have taken effect (spans, usage asked for)
    delta = rf"{NUMBER} \({NUMBER}\)"
    assert re.search(rf"^as shipped \(from 1\)\s+{delta}\s+{delta}$", out, re.M), out
    assert re.search(rf"^spans sampled out \(ALWAYS_OFF\)\s+{delta}\s+{delta}$", out, re.M), out
    for configuration in ("OTEL_LLM_STREAM_USAGE=false", "both", "no usage asked, no chunk gaps recorded"):
        assert re.search(rf"^{configuration}\s+{delta}\s+\(streams only\)$", out, re.M), out
    # the floor: the client inside one bare SDK span, otel_llm not installed
    for workload in ("stream 16 chunks", "non-streaming"):
        assert re.search(rf"^span alone, {workload}(\s+{NUMBER}){{4}}$", out, re.M), out
    # and the least a conforming instrumentation records: that span with the response's attributes, three records
    assert re.search(rf"^span and 3 records, non-streaming(\s+{NUMBER}){{4}}$", out, re.M), out
    assert re.search(rf"^span, TTFT and 2 records, stream 16 chunks(\s+{NUMBER}){{4}}$", out, re.M), out
    for figure in ("chunk path \\(SDK -> caller\\)", "per chunk in total", "fixed per streamed request",
                   "non-streaming request"):
        assert re.search(rf"^{figure}: {NUMBER} us", out, re.M), out
    growth = re.search(rf"over 1000 streamed requests \(({NUMBER}) MiB\)", out)
    assert growth is not None, out
    # memory is O(1) per chunk and nothing is kept per request once it finished
    assert float(growth.group(1)) < 1.0


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instruction_counts_see_the_instrumentation() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import instructions

    off, on = (instructions.per_request(f"non-streaming {state}", few=1, many=3) for state in ("off", "on"))
    # per request, start-up and imports taken out: the span and records cost ~0.34 M instructions (run to run the
    # count moves by ~0.01 M), far less than the client's own ~5 M
    assert 100_000 < on - off < 0.2 * off


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_cache_misses_are_simulated() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import instructions

    # one whole run (imports and start-up included; per-request differences of so few requests move by more than
    # the instrumentation adds under the simulation): every figure parsed, each where a real run puts it
    found = instructions.count("non-streaming off", 1, caches=True)
    assert set(found) == {"instructions", *instructions.MISSES}
    assert 100_000_000 < found["instructions"]
    assert 0.001 * found["instructions"] < found["L1 data misses"] < 0.1 * found["instructions"]
    assert 1_000 < found["L2 misses"] < found["L1 data misses"] + found["L1 instruction misses"]
