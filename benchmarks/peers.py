"""otel_llm beside OpenTelemetry's own openai instrumentation (``opentelemetry-instrumentation-openai-v2``), the best
of the peers issue 2 measures against, both timed by overhead.py's side-by-side harness.

    .venv/bin/python benchmarks/peers.py            # about 6 minutes; fetches openai-v2 from PyPI on its first run
    .venv/bin/python benchmarks/peers.py --quick    # a smoke run (the test suite runs this)

Both patch the same methods, so each runs in a process of its own. They take turns workload by workload, for two
rounds: how much a figure moves between rounds is the machine's drift. Each figure is the median of paired
differences against the uninstrumented client in the same process, as in overhead.py's first view, and each
process checks that its instrumentation recorded one span per instrumented request.

openai-v2 and what it needs beyond this venv (pinned below; it still imports the old httpx) are installed into
.peers/ and put on the path of its own processes only: no other process here sees its entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OURS, PEER, PEER_VERSION = "otel_llm", "openai-v2", "2.4b0"
PEER_REQUIREMENTS = (f"opentelemetry-instrumentation-openai-v2=={PEER_VERSION}", "opentelemetry-util-genai==1.1b0",
                     "httpx==0.28.1", "httpcore==1.0.9")
PEER_PATH = REPO / ".peers" / f"{PEER}-{PEER_VERSION}"
# otel_llm as shipped, and asking for no usage on streams as openai-v2 does (so recording no stream token counts or
# time per output token either)
NO_USAGE = "otel_llm, no usage"
INSTRUMENTATIONS = (OURS, NO_USAGE, PEER)
# (name, content chunks (0: not streamed), pairs in a full run). A two-chunk stream (the fewest with a chunk gap and
# a time per output token to record) costs the fixed part and two chunks: a steadier figure of the fixed part than
# one drawn through long streams, whose median moves by more than the whole fixed part here.
WORKLOADS = (("stream 2 chunks", 2, 3000), ("stream 16 chunks", 16, 2000), ("stream 256 chunks", 256, 300),
             ("non-streaming", 0, 4000))


def install_peer() -> None:
    """openai-v2 and its missing dependencies, once, into PEER_PATH (complete only once the stamp is written)."""
    stamp = PEER_PATH / ".installed"
    if stamp.exists() and stamp.read_text() == "\n".join(PEER_REQUIREMENTS):
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--upgrade", "--target", str(PEER_PATH), *PEER_REQUIREMENTS], check=True)
    stamp.write_text("\n".join(PEER_REQUIREMENTS))


def measure(instrumentation: str, workload_index: int, scale: int) -> dict[str, Any]:
    """In a child process: one workload side by side under one instrumentation, as overhead.py's first view."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import overhead

    name, chunks, pairs = WORKLOADS[workload_index]
    workload = overhead.Workload(name, chunks, pairs // scale)
    if instrumentation in (OURS, NO_USAGE):
        configuration = overhead.Configuration(instrumentation, stream_usage=instrumentation == OURS)
        off, on, delta, moves = overhead.side_by_side(workload, configuration)  # checks what it recorded itself
    else:
        off, on, delta, moves = overhead._summary(_peer_side_by_side(overhead, workload))
    return {"off": off, "on": on, "delta": delta, "moves": moves}


def _peer_side_by_side(overhead: Any, workload: Any) -> list[tuple[int, int]]:
    """overhead.py's (off, on) pairs with openai-v2 instrumenting, into a pipeline like ours (no deferred work)."""
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    exporter = overhead._DropSpans()
    tracer_provider, meter_provider, _ = overhead._pipeline(exporter=exporter)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        measured = overhead._alternate(workload, lambda run, client, bare: run(client), lambda: 0)
    finally:
        instrumentor.uninstrument()
        tracer_provider.shutdown()
    if exporter.dropped < len(measured):  # the warm-up's spans come on top
        raise RuntimeError(f"{PEER} recorded {exporter.dropped} spans for {len(measured)} instrumented requests")
    return measured  # type: ignore[no-any-return]


def with_peer(environment: dict[str, str]) -> dict[str, str]:
    """A child process's environment with openai-v2 on its path."""
    return {**environment, "PYTHONPATH": os.pathsep.join(filter(None, (str(PEER_PATH), environment.get("PYTHONPATH"))))}


def _children(instrumentation: str, workload_indices: Sequence[int], scale: int) -> list[dict[str, Any]]:
    """The workloads measured one after another in one child process under one instrumentation."""
    environment = with_peer(dict(os.environ)) if instrumentation == PEER else dict(os.environ)
    result = subprocess.run([sys.executable, __file__, "--child", instrumentation,
                             ",".join(map(str, workload_indices)), str(scale)],
                            capture_output=True, text=True, env=environment, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{instrumentation}:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _round(scale: int, batched: bool) -> dict[tuple[str, str], dict[str, Any]]:
    """Every instrumentation on every workload it changes (usage is asked for on streams only), by (instrumentation,
    workload): taking turns workload by workload, each in a process of its own; batched (a smoke run), in one
    process per instrumentation, since starting one takes longer than a smoke run's workload."""
    wanted = [(instrumentation, index) for index, (_, chunks, _) in enumerate(WORKLOADS)
              for instrumentation in INSTRUMENTATIONS if instrumentation != NO_USAGE or chunks]
    if not batched:
        return {(instrumentation, WORKLOADS[index][0]): _children(instrumentation, [index], scale)[0]
                for instrumentation, index in wanted}
    found = {}
    for instrumentation in INSTRUMENTATIONS:
        indices = [index for measured, index in wanted if measured == instrumentation]
        results = _children(instrumentation, indices, scale)
        found.update({(instrumentation, WORKLOADS[index][0]): result
                      for index, result in zip(indices, results, strict=True)})
    return found


def _row(first: str, second: str, columns: Sequence[str]) -> str:
    return f"{first:<20} {second:>5}" + "".join(f" {column:>18}" for column in columns)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run, one round")
    parser.add_argument("--child", nargs=3, metavar=("INSTRUMENTATION", "WORKLOADS", "SCALE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        instrumentation, workload_indices, scale = args.child
        print(json.dumps([measure(instrumentation, int(index), int(scale)) for index in workload_indices.split(",")]))
        return 0

    import openai

    install_peer()
    scale, rounds = (10, 1) if args.quick else (1, 2)
    print(f"otel_llm beside {PEER} {PEER_VERSION} (its defaults): openai {openai.__version__}, Python "
          f"{sys.version.split()[0]}; CPU time of the calling thread, +us per request over the uninstrumented client "
          "(how far the median moves within the run)")
    print(_row("workload", "round", INSTRUMENTATIONS))
    deltas: dict[tuple[str, str], list[float]] = {}
    for round_number in range(1, rounds + 1):
        found = _round(scale, batched=args.quick)
        for name, _, _ in WORKLOADS:
            figures = []
            for instrumentation in INSTRUMENTATIONS:
                result = found.get((instrumentation, name))
                if result is None:
                    figures.append("(as shipped)")
                    continue
                deltas.setdefault((instrumentation, name), []).append(result["delta"])
                figures.append(f"{result['delta']:+.1f} ({result['moves']:.1f})")
            print(_row(name, str(round_number), figures), flush=True)

    (few_name, few_chunks, _), (short_name, short_chunks, _), (long_name, long_chunks, _) = WORKLOADS[:3]
    print(f"\na stream's cost split (us): per further chunk through the {short_chunks}- and {long_chunks}-chunk "
          f"figures; fixed, the {few_chunks}-chunk figure less {few_chunks} such chunks")
    for round_number in range(rounds):
        per_chunk = [(deltas[instrumentation, long_name][round_number] -
                      deltas[instrumentation, short_name][round_number]) / (long_chunks - short_chunks)
                     for instrumentation in INSTRUMENTATIONS]
        fixed = [deltas[instrumentation, few_name][round_number] - few_chunks * chunk
                 for instrumentation, chunk in zip(INSTRUMENTATIONS, per_chunk, strict=True)]
        print(_row("fixed per stream", str(round_number + 1), [f"{us:+.1f}" for us in fixed]))
        print(_row("per further chunk", str(round_number + 1), [f"{us:+.2f}" for us in per_chunk]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
