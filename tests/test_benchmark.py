"""The benchmarks run and print their figures (smoke runs: the figures themselves are read by people)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "overhead.py"
NUMBER = r"[+-]?\d+\.\d+"


def test_overhead_benchmark_prints_every_figure() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--memory-requests", "1000"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for workload in ("stream 2 chunks", "stream 16 chunks", "stream 256 chunks", "stream 1024 chunks",
                     "async stream 256"):
        assert re.search(rf"^{workload}(\s+{NUMBER}){{5}}$", out, re.M), out
    assert re.search(rf"^non-streaming(\s+{NUMBER}){{4}}\s*$", out, re.M), out
    # what a user can choose, each checked by the benchmark to have taken effect (spans, usage asked for)
    delta = rf"{NUMBER} \({NUMBER}\)"
    assert re.search(rf"^as shipped \(from 1\)\s+{delta}\s+{delta}$", out, re.M), out
    assert re.search(rf"^spans sampled out \(ALWAYS_OFF\)\s+{delta}\s+{delta}$", out, re.M), out
    for configuration in ("OTEL_LLM_STREAM_USAGE=false", "both", "no usage asked, no chunk gaps recorded",
                          "no chunk gaps recorded"):
        assert re.search(rf"^{configuration}\s+{delta}\s+\(streams only\)$", out, re.M), out
    # the floor: the client inside one bare SDK span, otel_llm not installed
    for workload in ("stream 16 chunks", "non-streaming"):
        assert re.search(rf"^span alone, {workload}(\s+{NUMBER}){{4}}$", out, re.M), out
    # and the least a conforming instrumentation records: that span with the response's attributes, three records
    assert re.search(rf"^span and 3 records, non-streaming(\s+{NUMBER}){{4}}$", out, re.M), out
    # for streams of 2 (a stream's fixed part) and 16 chunks: the least a stream asking for no usage records; what
    # asking for usage costs the client itself; and the least that records, asking for usage, its counts too
    for workload in ("stream 2 chunks", "stream 16 chunks"):
        for floor in ("span, TTFT and 2 records", "usage asked, nothing else", "span, TTFT and 5 records, usage asked"):
            assert re.search(rf"^{floor}, {workload}(\s+{NUMBER}){{4}}$", out, re.M), out
    for figure in ("chunk path \\(SDK -> caller\\)", "per chunk in total", "fixed per streamed request",
                   "non-streaming request"):
        assert re.search(rf"^{figure}: {NUMBER} us", out, re.M), out
    growth = re.search(rf"over 1000 streamed requests \(({NUMBER}) MiB\)", out)
    assert growth is not None, out
    # memory is O(1) per chunk and nothing is kept per request once it finished
    assert float(growth.group(1)) < 1.0


def test_peer_benchmark_times_openai_v2_beside_otel_llm() -> None:
    """OpenTelemetry's openai-v2, fetched from PyPI into .peers/, timed by the same harness as otel_llm as shipped
    and asking for no usage; each run checks that its instrumentation recorded a span per request (else it fails)."""
    result = subprocess.run([sys.executable, str(SCRIPT.parent / "peers.py"), "--quick"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^workload\s+round\s+otel_llm\s+otel_llm, no usage\s+openai-v2$", out, re.M), out
    delta = rf"{NUMBER} \({NUMBER}\)"
    for workload in ("stream 2 chunks", "stream 16 chunks", "stream 256 chunks"):
        assert re.search(rf"^{workload}\s+1\s+{delta}\s+{delta}\s+{delta}$", out, re.M), out
    assert re.search(rf"^non-streaming\s+1\s+{delta}\s+\(as shipped\)\s+{delta}$", out, re.M), out
    for figure in ("fixed per stream", "per further chunk"):
        assert re.search(rf"^{figure}\s+1(\s+{NUMBER}){{3}}$", out, re.M), out
