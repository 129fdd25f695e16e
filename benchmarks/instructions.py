"""Instructions per request that otel_llm adds to the openai client, counted by valgrind: the figure that does not
move with the neighbours of a shared 2-core machine.

    .venv/bin/python benchmarks/instructions.py          # needs valgrind; about 3 minutes
    .venv/bin/python benchmarks/instructions.py --caches # and cache misses; about 7 minutes

Same workloads and telemetry pipeline as overhead.py (the real client reading real SSE bytes from its own
transport; a TracerProvider with a BatchSpanProcessor, a MeterProvider with a reader). Each configuration runs in a
child process under cachegrind twice, with few and with many requests after the same warm-up; the difference
divided by the extra requests is the count per request, free of start-up and imports. The garbage collector runs
as usual (after the warm-up's objects are frozen), so allocation pressure is counted too.

The microseconds beside each count are that count at the client's own pace (its instructions per request over its
CPU time per request, measured natively here): what the added instructions cost if they ran as fast as the
client's. Ours run between the client's, with colder caches, so the side-by-side timings of overhead.py come out
higher; this is the part of the overhead that is ours to cut.

With ``--caches`` valgrind also simulates the caches: the first-level instruction and data caches of this machine
(32 KiB each) and, as the last level, a 1 MiB one like its per-core second level (the third level, 32 MiB, holds
everything here). What a request reads first from beyond a cache it fills costs it ~12 cycles (first level) or ~40
(second): our code and data, pushed out by the client's between two requests, and the client's, pushed out by ours.
These misses, not the instructions, are most of what the side-by-side timings add to our instruction count. In this
mode the span processor's export thread does not wake during the run (its work is the SDK's; waking at valgrind's
pace it moved these counts by thousands).
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


# what valgrind reports, and how the figures below name it
INSTRUCTIONS = {"instructions": r"I\s+refs"}
MISSES = {"L1 instruction misses": r"I1\s+misses", "L1 data misses": r"D1\s+misses", "L2 misses": r"LL misses"}


def count(config: str, requests: int, caches: bool = False) -> dict[str, int]:
    chunks, instrumented, usage, _, _ = CONFIGS[config]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OTEL_LLM_STREAM_USAGE": "true" if usage else "false"}
    simulate = ["--cache-sim=no"]
    if caches:
        simulate = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64"]
        env["OTEL_BSP_SCHEDULE_DELAY"] = str(10**9)  # ms: the export thread waits for a full batch
    result = subprocess.run(
        ["valgrind", "--tool=cachegrind", *simulate, "--cachegrind-out-file=/dev/null",
         sys.executable, str(HERE), "--child", str(chunks), str(int(instrumented)), str(requests)],
        capture_output=True, text=True, env=env, check=True)
    counts = {}
    for name, pattern in {**INSTRUCTIONS, **(MISSES if caches else {})}.items():
        found = re.search(pattern + r":\s+([\d,]+)", result.stderr)
        if found is None:
            raise RuntimeError(f"no {name} from valgrind:\n{result.stderr[-2000:]}")
        counts[name] = int(found.group(1).replace(",", ""))
    return counts


def per_request(config: str, few: int | None = None, many: int | None = None) -> float:
    """Instructions per request."""
    return per_request_counts(config, few, many)["instructions"]


def per_request_counts(config: str, few: int | None = None, many: int | None = None,
                       caches: bool = False) -> dict[str, float]:
    few, many = few or CONFIGS[config][3], many or CONFIGS[config][4]
    with ThreadPoolExecutor(max_workers=2) as pool:
        low, high = pool.map(lambda requests: count(config, requests, caches), (few, many))
    return {name: (high[name] - low[name]) / (many - few) for name in low}


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
    parser.add_argument("--caches", action="store_true", help="simulate the caches too (see above)")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], bool(args.child[1]), args.child[2])
        return 0
    if subprocess.run(["which", "valgrind"], capture_output=True).returncode:
        print("valgrind is not installed here: apt-get install valgrind", file=sys.stderr)
        return 1
    all_counts = {config: per_request_counts(config, caches=args.caches) for config in CONFIGS}
    counts = {config: found["instructions"] for config, found in all_counts.items()}
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
    if args.caches:
        print("\ncache misses per request (simulated: 32 KiB first level, a 1 MiB second)")
        print(f"{'workload':<30}" + "".join(f" {name:>22}" for name in MISSES))
        for config, found in all_counts.items():
            off = all_counts[config.split(" on")[0] + " off"] if " on" in config else None
            cells = (f"{found[name]:,.0f}" if off is None else f"{found[name] - off[name]:+,.0f}" for name in MISSES)
            print(f"{config:<30}" + "".join(f" {cell:>22}" for cell in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
