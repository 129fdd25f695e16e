"""Instructions per request that otel_llm adds to the openai client, counted by valgrind: the figure that does not
move with the neighbours of a shared 2-core machine. Beside it, what OpenTelemetry's own openai instrumentation
(openai-v2, installed as benchmarks/peers.py does) adds, counted the same way.

    .venv/bin/python benchmarks/instructions.py          # needs valgrind; about 4 minutes
    .venv/bin/python benchmarks/instructions.py --caches # and cache misses; about 12 minutes

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
from typing import NamedTuple

from peers import OURS, PEER, install_peer, with_peer

HERE = Path(__file__).resolve()

OFF = "off"


class Config(NamedTuple):
    workload: str
    chunks: int  # content chunks, 0: not streamed
    instrumentation: str  # OFF, OURS or PEER
    usage: bool = True  # we ask for the usage chunk
    few: int = 10  # requests in the two runs whose difference is counted
    many: int = 60


_STREAM_16, _STREAM_256, _PLAIN = ("stream 16", 16), ("stream 256", 256), ("non-streaming", 0)
CONFIGS: dict[str, Config] = {
    "stream 16 off": Config(*_STREAM_16, OFF),
    "stream 16 on": Config(*_STREAM_16, OURS),
    "stream 16 on, no usage chunk": Config(*_STREAM_16, OURS, usage=False),
    f"stream 16 {PEER}": Config(*_STREAM_16, PEER),
    "stream 256 off": Config(*_STREAM_256, OFF, few=2, many=22),
    "stream 256 on": Config(*_STREAM_256, OURS, few=2, many=22),
    f"stream 256 {PEER}": Config(*_STREAM_256, PEER, few=2, many=22),
    "non-streaming off": Config(*_PLAIN, OFF),
    "non-streaming on": Config(*_PLAIN, OURS),
    f"non-streaming {PEER}": Config(*_PLAIN, PEER),
}
WARM_UP = 10


def child(chunks: int, instrumentation: str, requests: int) -> None:
    sys.path.insert(0, str(HERE.parent))
    import overhead

    import otel_llm

    client = overhead.client_for(chunks)
    run = overhead.run_sync_stream if chunks else overhead.run_plain
    if instrumentation != OFF:
        tracer_provider, meter_provider, reader = overhead._pipeline()
        if instrumentation == OURS:
            from otel_llm import _telemetry

            # what our writer thread writes (spans made, values batched) is written by the collection at the end,
            # as in overhead.py: counted the same in every run, not woken by a timer that runs more often in the
            # longer run under valgrind
            _telemetry.WRITE_BATCH = _telemetry.LATER_WAIT_S = None
            otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        else:
            from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

            OpenAIInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    for _ in range(WARM_UP):
        run(client)
    gc.collect()
    gc.freeze()
    for _ in range(requests):
        run(client)
    if instrumentation != OFF:  # writes what waits, adds the values in our batch; the SDK's own work per collection
        reader.collect()


# what valgrind reports, and how the figures below name it
INSTRUCTIONS = {"instructions": r"I\s+refs"}
MISSES = {"L1 instruction misses": r"I1\s+misses", "L1 data misses": r"D1\s+misses", "L2 misses": r"LL misses"}


def count(config: str, requests: int, caches: bool = False) -> dict[str, int]:
    found = CONFIGS[config]
    # the batch processor's export thread waits for a full batch, not its 5 s timer: under valgrind a run lasts
    # long enough for it to wake a different number of times in each run
    env = {**os.environ, "PYTHONHASHSEED": "0", "OTEL_LLM_STREAM_USAGE": "true" if found.usage else "false",
           "OTEL_BSP_SCHEDULE_DELAY": str(10**9)}
    if found.instrumentation == PEER:
        env = with_peer(env)
    simulate = ["--cache-sim=no"]
    if caches:
        simulate = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64"]
    result = subprocess.run(
        ["valgrind", "--tool=cachegrind", *simulate, "--cachegrind-out-file=/dev/null",
         sys.executable, str(HERE), "--child", str(found.chunks), found.instrumentation, str(requests)],
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
    few, many = few or CONFIGS[config].few, many or CONFIGS[config].many
    if CONFIGS[config].instrumentation == PEER:
        install_peer()  # before the two runs in parallel: one install, not two at once into the same folder
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
    parser.add_argument("--child", nargs=3, metavar=("CHUNKS", "INSTRUMENTATION", "REQUESTS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--caches", action="store_true", help="simulate the caches too (see above)")
    args = parser.parse_args(argv)
    if args.child:
        child(int(args.child[0]), args.child[1], int(args.child[2]))
        return 0
    if subprocess.run(["which", "valgrind"], capture_output=True).returncode:
        print("valgrind is not installed here: apt-get install valgrind", file=sys.stderr)
        return 1
    all_counts = {config: per_request_counts(config, caches=args.caches) for config in CONFIGS}
    counts = {config: found["instructions"] for config, found in all_counts.items()}
    off_of = {config.workload: name for name, config in CONFIGS.items() if config.instrumentation == OFF}
    print(f"instructions per request that otel_llm and {PEER} add to the openai client (valgrind cachegrind)")
    print(f"{'workload':<30} {'instructions':>14} {'added':>12} {'~us at client pace':>19}")
    for workload, off_config in off_of.items():
        off = counts[off_config]
        pace = off / native_us(CONFIGS[off_config].chunks)  # instructions per us
        print(f"{off_config:<30} {off:>14,.0f}")
        for name in (name for name, config in CONFIGS.items() if config.workload == workload and name != off_config):
            added = counts[name] - off
            print(f"{name:<30} {counts[name]:>14,.0f} {added:>+12,.0f} {added / pace:>+19.1f}")
    for instrumentation, on in ((OURS, "on"), (PEER, PEER)):
        per_chunk = ((counts[f"stream 256 {on}"] - counts["stream 256 off"])
                     - (counts[f"stream 16 {on}"] - counts["stream 16 off"])) / (256 - 16)
        fixed = counts[f"stream 16 {on}"] - counts["stream 16 off"] - 16 * per_chunk
        print(f"{instrumentation}: per further chunk {per_chunk:+,.0f} instructions; fixed per streamed request "
              f"{fixed:+,.0f}")
    if args.caches:
        print("\ncache misses per request (simulated: 32 KiB first level, a 1 MiB second)")
        print(f"{'workload':<30}" + "".join(f" {name:>22}" for name in MISSES))
        for name, found in all_counts.items():
            config = CONFIGS[name]
            off_counts = None if config.instrumentation == OFF else all_counts[off_of[config.workload]]
            cells = (f"{found[miss]:,.0f}" if off_counts is None else f"{found[miss] - off_counts[miss]:+,.0f}"
                     for miss in MISSES)
            print(f"{name:<30}" + "".join(f" {cell:>22}" for cell in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
