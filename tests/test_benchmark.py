"""The overhead benchmark runs and prints its figures (a smoke run: the figures themselves are read by people)."""

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
    for workload in ("stream 16 chunks", "stream 256 chunks", "stream 1024 chunks", "async stream 256"):
        assert re.search(rf"^{workload}(\s+{NUMBER}){{5}}$", out, re.M), out
    assert re.search(rf"^non-streaming(\s+{NUMBER}){{4}}\s*$", out, re.M), out
    for figure in ("chunk path \\(SDK -> caller\\)", "per chunk in total", "fixed per streamed request",
                   "non-streaming request"):
        assert re.search(rf"^{figure}: {NUMBER} us", out, re.M), out
    growth = re.search(rf"over 1000 streamed requests \(({NUMBER}) MiB\)", out)
    assert growth is not None, out
    # memory is O(1) per chunk and nothing is kept per request once it finished
    assert float(growth.group(1)) < 1.0
