"""Instructions per request that otel_llm adds to the openai client, counted by valgrind: the figure that does not
move with the neighbours of a shared 2-core machine.

    .venv/bin/python benchmarks/instructions.py          # needs valgrind; about 10 minutes

Same workloads and telemetry pipeline as overhead.py (the real client reading real SSE bytes from its own
transport; a TracerProvider with a BatchSpanProcessor, a MeterProvider with a reader). Each configuration runs in a
child process under cachegrind twice, with few and with many requests after the same warm-up; the difference
divided by the extra requests is the count per request, free of start-up and imports. The garbage collector runs
as usual (after the warm-up's objects are frozen), so allocation pressure is counted too.

The microseconds beside each count are that count at the client's own pace (its instructions per request over its
CPU time per request, measured natively here): what the added instructions cost if they ran as fast as the
client's. Ours run between the client's, with colder caches, so the side-by-side timings of overhead.py come out
higher; this is the part of the overhead that is ours to cut.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()

# name -> (content chunks, 0: not streamed; instrumented; usage chunk asked for by us; requests few, many)
CONFIGS: dict[str, tuple[int, bool, bool, int, int]] = {
    "stream 16 off": (16, False, True, 10, 60),
    "stream 16 on": (16, True, True, 10, 60),
    "stream 16 on, no usage chunk": (16, True, False, 10, 60),
    "stream 256 off": (256, False, True, 2, 22),
    "stream 256 on": (256, True, True, 2, 22),
    "non-streaming off": (0, False, True, 10, 60),
    "non-streaming on": (0, True, True, 10, 60),
}
WARM_UP = 10


def child(chunks: int, instrumented: bool, requests: int) -> None:
    sys.path.insert(0, str(HERE.parent))
    import overhead

    import otel_llm

    client = overhead.client_for(chunks)
    run = overhead.run_sync_stream if chunks else overhead.run_plain
    if instrumented:
        tracer_provider, meter_provider, reader = overhead._pipeline()
        otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    for _ in range(WARM_UP):
        run(client)
    gc.collect()
    gc.freeze()
    for _ in range(requests):
        run(client)
    if instrumented:  # adds the values waiting in our batch: a count per value, the SDK's own per collection
        reader.collect()


def count(config: str, requests: int) -> int:
    chunks, instrumented, usage, _, _ = CONFIGS[config]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OTEL_LLM_STREAM_USAGE": "true" if usage else "false"}
    result = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, str(HERE), "--child", str(chunks), str(int(instrumented)), str(requests)],
        capture_output=True, text=True, env=env, check=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{result.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def per_request(config: str, few: int | None = None, many: int | None = None) -> float:
    few, many = few or CONFIGS[config][3], many or CONFIGS[config][4]
    with ThreadPoolExecutor(max_workers=2) as pool:
        low, high = pool.map(lambda requests: count(config, requests), (few, many))
    return (high - low) / (many - few)


def native_us(chunks: int) -> float:
    """CPU time per uninstrumented request, natively."""
    sys.path.insert(0, str(HERE.parent))
    import overhead

    client = overhead.client_for(chunks)
    run = overhead.run_sync_stream if chunks else overhead.run_plain
    for _ in range(20):
        run(client)
    best = []
    for _ in range(5):
        start = time.thread_time_ns()
        for _ in range(20):
            run(client)
        best.append((time.thread_time_ns() - start) / 20 / 1e3)
    return min(best)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--child", nargs=3, type=int, metavar=("CHUNKS", "INSTRUMENTED", "REQUESTS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], bool(args.child[1]), args.child[2])
        return 0
    if subprocess.run(["which", "valgrind"], capture_output=True).returncode:
        print("valgrind is not installed here: apt-get install valgrind", file=sys.stderr)
        return 1
    counts = {config: per_request(config) for config in CONFIGS}
    print("otel_llm: instructions per request added to the openai client (valgrind cachegrind)")
    print(f"{'workload':<30} {'instructions':>14} {'added':>12} {'~us at client pace':>19}")
    for workload, chunks in (("stream 16", 16), ("stream 256", 256), ("non-streaming", 0)):
        off = counts[f"{workload} off"]
        pace = off / native_us(chunks)  # instructions per us
        print(f"{workload + ' off':<30} {off:>14,.0f}")
        for config in (c for c in CONFIGS if c.startswith(workload + " on")):
            added = counts[config] - off
            print(f"{config:<30} {counts[config]:>14,.0f} {added:>+12,.0f} {added / pace:>+19.1f}")
    per_chunk = ((counts["stream 256 on"] - counts["stream 256 off"])
                 - (counts["stream 16 on"] - counts["stream 16 off"])) / (256 - 16)
    fixed = counts["stream 16 on"] - counts["stream 16 off"] - 16 * per_chunk
    print(f"per further chunk: {per_chunk:+,.0f} instructions; fixed per streamed request: {fixed:+,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
