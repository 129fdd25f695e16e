"""``otel-llm``: the command line.

    otel-llm demo                     # no API key, no Docker: the built-in simulator at concurrency 1, 4, 16, 64
    otel-llm bench --base-url http://localhost:8000/v1 --model NAME --concurrency 1,4,16 --deadline 4000/2h
    otel-llm rules ...                # Prometheus recording and alerting rules (otel-llm rules --help)
    otel-llm dashboards ...           # Grafana dashboards (otel-llm dashboards --help)

``demo`` and ``bench`` drive the real ``openai.AsyncOpenAI`` client (streamed chat completions, no retries) with
otel_llm instrumented, and read every latency figure back from otel_llm's own metrics, in process, the way
Prometheus's ``histogram_quantile`` reads the buckets. ``demo`` prints the simulator's exact ground truth beside
them. Both export over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and serve a Prometheus scrape endpoint with
``--prometheus-port``.

``bench --json`` prints one object whose keys are listed in `JSON_KEYS` (and at the end of ``otel-llm bench --help``).

Exit status: 0 done; 1 the endpoint cannot serve the run (unreachable, 401, unknown model, not an OpenAI stream);
2 a bad option; 130 interrupted with Ctrl-C (what was measured so far is still printed).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TextIO
from urllib.parse import urlsplit

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import otel_llm
from otel_llm import _export, _readout
from otel_llm import _semconv as sc
from otel_llm._console import EXIT_INTERRUPTED, interrupted
from otel_llm._dashboards import main_dashboards
from otel_llm._rules import main_rules
from otel_llm._settings import load_settings
from otel_llm.simulator import DEFAULT_MODEL, EngineConfig, Quantiles, Simulator, TruthSummary, summarize

# the openai client is an optional extra: _loadgen, which imports it, is imported by demo and bench only
if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from otel_llm._loadgen import LevelRun, Workload

EXIT_ENDPOINT = 1
EXIT_USAGE = 2

# the trade-off is visible at these levels with the simulator's default 32-slot engine
DEMO_LEVELS = (1, 4, 16, 64)
DEMO_PROMPT_TOKENS = 200
# the rate-limit phase: this many requests at this concurrency against a budget worth about 20 of them
RATE_LIMIT_REQUESTS = 40
RATE_LIMIT_CONCURRENCY = 8
RATE_LIMIT_TOKENS_PER_MINUTE = 5_000
# p99 reads as the slowest request or two below this many per level
ROUGH_P99_BELOW = 100

JSON_KEYS = """\
--json prints one object (times in seconds, rates per second, null when unknown):
  base_url, model, prompt_tokens, max_tokens (null: no limit), interrupted (bool),
  levels: [{concurrency (requests in flight: the level asked for, or its requests when fewer), requests, ok,
            errors: {why requests failed (the exception's class; cancelled: cut short by Ctrl-C): count},
            elapsed_s, requests_per_s, output_tokens_per_s, ttft_s: {p50, p95, p99}, tpot_s: {p50, p95, p99},
            duration_s: {p50, p95, p99}, interrupted}],
  deadline: null, or {requests, within_s, needed_requests_per_s, concurrency (smallest level that meets it, or
            null), finish_s, ttft_p99_s (what that level costs), best_concurrency, best_requests_per_s,
            best_finish_s (the fastest level measured)}"""


class _UsageError(Exception):
    """A bad option or a missing optional package; the message says what to do."""


class _CannotMeasure(Exception):
    """The run would measure nothing in this process; the message says why."""


def main(argv: Sequence[str] | None = None) -> int:
    """The ``otel-llm`` console script; returns the exit status."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except (KeyboardInterrupt, RuntimeError) as error:  # starting up or winding down; Ctrl-C during the levels
        if not interrupted(error):  # prints what they measured
            raise
        print("otel-llm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(args: list[str]) -> int:
    if args and args[0] in _DELEGATED:
        try:
            return _DELEGATED[args[0]](args[1:])
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    parser = _parser()
    try:
        options = parser.parse_args(args)
    except SystemExit as exc:  # --help, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if options.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    command: Callable[[argparse.Namespace], int] = options.run
    try:
        return command(options)
    except _UsageError as exc:
        print(f"otel-llm {options.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (_CannotMeasure, OSError) as exc:  # OSError: e.g. the simulator cannot bind on this machine
        print(f"otel-llm {options.command}: error: {exc}", file=sys.stderr)
        return EXIT_ENDPOINT


# subcommands with parsers of their own: everything after the name goes to them
_DELEGATED: dict[str, Callable[[Sequence[str]], int]] = {"rules": main_rules, "dashboards": main_dashboards}


# --- options --------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line instead of argparse's usage block."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        levels = []
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive whole numbers separated by commas, like 1,4,16; got {text!r}")
    return levels


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number (0 or more), got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    value = _duration_s(text)
    if value is None or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration like 30, 45s, 10m or 1h30m; got {text!r}")
    return value


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def _duration_s(text: str) -> float | None:
    """Seconds in ``90``, ``90s``, ``15m``, ``2h``, ``1h30m``; None when it is none of those."""
    text = text.strip().lower()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) else None
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        return None
    hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


@dataclass(frozen=True, slots=True)
class _Deadline:
    """``requests`` must finish within ``within_s`` seconds."""

    requests: int
    within_s: float

    @property
    def needed_requests_per_s(self) -> float:
        return self.requests / self.within_s


def _deadline(text: str) -> _Deadline:
    count, _, within = text.partition("/")
    count = count.strip().replace(",", "").replace("_", "")
    seconds = _duration_s(within) if within else None
    if not count.isdigit() or int(count) < 1 or seconds is None or seconds <= 0:
        raise argparse.ArgumentTypeError(
            f"expected REQUESTS/DURATION such as 4000/2h or 500/30m (requests that must finish within that time); "
            f"got {text!r}")
    return _Deadline(int(count), seconds)


def _base_url(text: str) -> str:
    if not re.match(r"https?://[^/\s]+", text):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL such as http://localhost:8000/v1, "
                                         f"got {text!r}")
    try:
        port = urlsplit(text).port
    except ValueError as exc:  # a port out of 0-65535, or not a number
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from exc
    if port == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: port 0 cannot be connected to")
    return text.rstrip("/")


def _port(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return int(text)


def _parser() -> _Parser:
    parser = _Parser(prog="otel-llm", description="otel_llm's command line: a demo, a benchmark, rules, dashboards.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = commands.add_parser(
        "demo", help="watch otel_llm measure a simulated LLM server (no API key, no Docker; ~20 s)",
        description="Start the built-in LLM simulator, instrument the openai client with otel_llm, drive it at "
                    "several concurrency levels and print, per level, what otel_llm's metrics measured beside the "
                    "simulator's exact ground truth; then a short phase over a tokens-per-minute budget (429s).")
    demo.add_argument("--levels", type=_levels, default=list(DEMO_LEVELS),
                      help="concurrency levels (default 1,4,16,64)")
    demo.add_argument("--requests", type=_positive_int,
                      help="requests per level (default: 3 x the level, at least 16)")
    demo.add_argument("--duration", type=_seconds, default=10.0,
                      help="stop sending new requests in a level after this long (default 10s)")
    demo.add_argument("--seed", type=int, default=0, help="the simulator's seed (default 0)")
    demo.add_argument("--rate-limit-requests", type=_count, default=RATE_LIMIT_REQUESTS,
                      help=f"requests in the rate-limit phase (default {RATE_LIMIT_REQUESTS}; 0 skips it)")
    _add_export_options(demo)
    demo.set_defaults(run=_demo)

    bench = commands.add_parser(
        "bench", help="measure an OpenAI-compatible endpoint's latency/throughput trade-off",
        description="Drive an OpenAI-compatible endpoint (streamed chat completions, no retries) at several "
                    "concurrency levels through otel_llm and report, per level, throughput and the TTFT/TPOT "
                    "percentiles read from otel_llm's metrics. Ctrl-C stops and prints what was measured.",
        epilog=JSON_KEYS, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--base-url", type=_base_url, required=True,
                       help="the endpoint, usually ending in /v1 (e.g. http://localhost:8000/v1)")
    bench.add_argument("--model", required=True, help="the model to ask for")
    bench.add_argument("--api-key", help="the API key (default: $OPENAI_API_KEY, else a dummy for local servers)")
    bench.add_argument("--concurrency", type=_levels, default=[1, 4, 16],
                       help="concurrency levels, requests in flight (default 1,4,16); a level keeps at most its "
                            "--requests in flight")
    bench.add_argument("--requests", type=_positive_int,
                       help="requests per level (default: 3 x the level, at least 16)")
    bench.add_argument("--prompt-tokens", type=_positive_int, default=256,
                       help="prompt length in tokens, about 4 characters each (default 256)")
    bench.add_argument("--max-tokens", type=_count, default=256,
                       help="max_tokens of each request (default 256; 0 sends none and lets the model stop)")
    bench.add_argument("--duration", type=_seconds,
                       help="stop sending new requests in a level after this long (default: no limit)")
    bench.add_argument("--timeout", type=_seconds, default=300.0,
                       help="fail a request that takes longer than this, streamed answer included (default 300s)")
    bench.add_argument("--deadline", type=_deadline,
                       help="REQUESTS/DURATION, e.g. 4000/2h: report the smallest measured concurrency that "
                            "finishes that many requests in time, and the TTFT p99 it costs")
    bench.add_argument("--json", action="store_true", help="print the results as JSON only (keys below)")
    bench.add_argument("--plot", type=Path, metavar="FILE.png",
                       help="also draw TTFT p50/p99 against throughput per level (needs matplotlib)")
    _add_export_options(bench)
    bench.set_defaults(run=_bench)

    # listed for --help only: main() hands these to their own parsers before this one runs
    commands.add_parser("rules", help="Prometheus recording and alerting rules (otel-llm rules --help)",
                        add_help=False)
    commands.add_parser("dashboards", help="Grafana dashboards (otel-llm dashboards --help)", add_help=False)
    return parser


def _add_export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus-port", type=_port, metavar="PORT",
                        help="serve the metrics for Prometheus on this port (all interfaces, /metrics) and keep "
                             "serving after the run until Ctrl-C or --linger")
    parser.add_argument("--linger", type=_seconds, metavar="SECONDS",
                        help="with --prometheus-port: stop serving this long after the run (default: at Ctrl-C)")


def _check_export_options(options: argparse.Namespace) -> None:
    if options.linger is not None and options.prometheus_port is None:
        raise _UsageError("--linger needs --prometheus-port")


def _default_requests(concurrency: int) -> int:
    """Three rounds per worker, at least 16: the demo's defaults then take about 20 s on the simulator."""
    return max(16, 3 * concurrency)


def _plan(levels: Sequence[int], requests: int | None, option: str) -> list[tuple[int, int]]:
    """(concurrency, requests) per level. A level keeps at most its requests in flight, so that is the concurrency it
    runs at and reports; two levels that would run alike are refused rather than measured twice."""
    plan = [(min(level, requests or _default_requests(level)), requests or _default_requests(level))
            for level in levels]
    capped = [level for level, (concurrency, _) in zip(levels, plan, strict=True) if concurrency < level]
    if len({concurrency for concurrency, _ in plan}) < len(plan):
        raise _UsageError(
            f"{option} {','.join(map(str, capped))} with --requests {requests}: a level keeps at most its requests in "
            f"flight, so more than one level would run at concurrency {requests}; raise --requests to "
            f"{max(levels)} or drop levels above {requests}")
    return plan


def _require(module: str, what: str) -> None:
    """Fail with the install command when an optional package is missing (imported now, used later)."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise _UsageError(f"{what} needs {module}: pip install 'otel-llm[{_EXTRAS.get(module, module)}]'") from exc


_EXTRAS = {"opentelemetry.exporter.prometheus": "prometheus", "matplotlib": "plot"}


# --- telemetry for one run ------------------------------------------------------------------------------------


class _Telemetry:
    """Providers for one run: metrics read back in process, OTLP export when configured, a Prometheus endpoint when
    asked; otel_llm instrumented into them, its warnings in one line. Everything is undone on exit, so the process
    is left as it was."""

    def __init__(self, service_name: str, prometheus_port: int | None) -> None:
        self.names: sc.MetricNames = load_settings().metric_names
        self._service_name = service_name
        self._prometheus_port = prometheus_port
        self._stack: list[Callable[[], object]] = []  # undo actions, run last first

    def __enter__(self) -> _Telemetry:
        if not _export.sdk_enabled():
            raise _CannotMeasure("OTEL_SDK_DISABLED is true, which turns off otel_llm's own metrics, and every figure "
                                 "comes from them; unset it for this command")
        if otel_llm.OtelLLMInstrumentor().is_instrumented_by_opentelemetry:
            raise _UsageError("otel_llm is already instrumented in this process (opentelemetry-instrument?); run "
                              "otel-llm directly: it exports over OTLP itself when OTEL_EXPORTER_OTLP_ENDPOINT is set")
        try:
            self._log_in_one_line()
            own_name = "OTEL_SERVICE_NAME" not in os.environ
            resource = Resource.create({SERVICE_NAME: self._service_name} if own_name else {})
            self.reader = InMemoryMetricReader()
            readers: list[MetricReader] = [self.reader]
            if _otlp_configured("METRICS"):
                readers += [PeriodicExportingMetricReader(exporter) for exporter in _export.metric_exporters()]
            if self._prometheus_port is not None:
                readers.append(self._serve_prometheus(self._prometheus_port))
            self.meter_provider: MeterProvider = MeterProvider(resource=resource, metric_readers=readers)
            self._stack.append(self.meter_provider.shutdown)
            span_exporters = _export.span_exporters() if _otlp_configured("TRACES") else []
            # spans nobody exports are not worth recording; metrics do not depend on them
            self.tracer_provider: TracerProvider = TracerProvider(
                resource=resource, sampler=None if span_exporters else ALWAYS_OFF)
            for span_exporter in span_exporters:
                self.tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
            self._stack.append(self.tracer_provider.shutdown)
            otel_llm.instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)
            self._stack.append(otel_llm.uninstrument)
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._undo()

    def _undo(self) -> None:
        while self._stack:
            self._stack.pop()()

    def _log_in_one_line(self) -> None:
        """otel_llm's own warnings (say, about a server's odd stream) as one line on stderr, without a traceback."""
        handler = _OneLineHandler()
        logger = logging.getLogger("otel_llm")
        propagate, logger.propagate = logger.propagate, False
        logger.addHandler(handler)

        def restore() -> None:
            logger.removeHandler(handler)
            logger.propagate = propagate

        self._stack.append(restore)

    def _serve_prometheus(self, port: int) -> MetricReader:
        _require("opentelemetry.exporter.prometheus", "--prometheus-port")
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        reader = PrometheusMetricReader()  # registers with prometheus_client's registry; shutdown unregisters
        try:
            server, _thread = start_http_server(port)
        except OSError as exc:
            reader.shutdown()
            raise _UsageError(f"--prometheus-port {port}: {exc.strerror or exc}; pick a free port") from exc

        def stop() -> None:
            server.shutdown()
            server.server_close()

        self._stack.append(stop)
        return reader

    def snapshot(self) -> _readout.Snapshot:
        return _readout.read(self.reader)


class _OneLineHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        detail = f" ({type(error).__name__}: {error})" if error is not None else ""
        print(f"{record.getMessage()}{detail}", file=sys.stderr)


def _otlp_configured(signal: str) -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))


def _linger(options: argparse.Namespace, out: TextIO) -> None:
    """Keep the Prometheus endpoint up after the run, until Ctrl-C or --linger."""
    if options.prometheus_port is None:
        return
    until = "Ctrl-C" if options.linger is None else f"Ctrl-C or {_hms(options.linger)}"
    print(f"\nserving the metrics at http://localhost:{options.prometheus_port}/metrics until {until}", file=out,
          flush=True)
    with suppress(KeyboardInterrupt):  # longer than a lock can wait is as good as until Ctrl-C
        threading.Event().wait(None if options.linger is None else min(options.linger, threading.TIMEOUT_MAX))


# --- running levels -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Truth:
    """The simulator's exact account of one level."""

    summary: TruthSummary
    duration_p99: float

    @classmethod
    def take(cls, sim: Simulator) -> _Truth:
        """The records so far, which are then forgotten: the next level starts afresh."""
        records = sim.truth()
        sim.reset_truth()
        durations = Quantiles.of((r.finished_ns - r.received_ns) / 1e9 for r in records if r.status == 200)
        return cls(summarize(records), durations.p99)


@dataclass(frozen=True, slots=True)
class _Level:
    """One measured level: the load generator's counts and wall time, and what the metrics say."""

    run: LevelRun
    figures: _readout.Figures
    interrupted: bool
    max_seconds: float | None  # the --duration it ran under

    @property
    def errors(self) -> dict[str, int]:
        """Failed requests by what ended them, as the load generator saw it (otel_llm's error.type says `cancelled`
        for a stream it closed on a malformed chunk); requests Ctrl-C cut short, which only the metrics saw end,
        count as cancelled."""
        errors = dict(self.run.errors)
        cut_short = self.figures.operations - self.run.done
        if cut_short > 0:
            errors[sc.ERROR_CANCELLED] = errors.get(sc.ERROR_CANCELLED, 0) + cut_short
        return errors

    @property
    def stopped_by_duration(self) -> bool:
        """--duration ran out before the level sent all its requests."""
        return not self.interrupted and self.run.done < self.run.planned

    @property
    def requests_per_s(self) -> float:
        elapsed = self.run.elapsed_s
        return self.figures.ok / elapsed if elapsed else math.nan

    @property
    def output_tokens_per_s(self) -> float:
        tokens, elapsed = self.figures.output_tokens, self.run.elapsed_s
        return tokens / elapsed if tokens is not None and elapsed else math.nan


class _Levels:
    """Runs levels one after another and reads each one's figures from the metrics; keeps the level under way, so
    what was measured before Ctrl-C can still be read."""

    def __init__(self, telemetry: _Telemetry, progress: _Progress) -> None:
        self.telemetry = telemetry
        self.progress = progress
        self.done: list[_Level] = []
        self._current: tuple[LevelRun, _readout.Snapshot, float | None] | None = None
        self._sent = 0

    async def run(self, client: AsyncOpenAI, workload: Workload, concurrency: int, requests: int,
                  max_seconds: float | None, label: str = "") -> _Level:
        from otel_llm._loadgen import LevelRun, run_level

        run = LevelRun(concurrency, requests)
        before = self.telemetry.snapshot()
        self._current = (run, before, max_seconds)
        label = label or f"concurrency {concurrency}"
        self.progress.update(label, run)
        await run_level(client, workload, run, first_index=self._sent, max_seconds=max_seconds,
                        on_progress=lambda r: self.progress.update(label, r))
        self._sent += run.done
        self._current = None
        return self._read(run, before, max_seconds, interrupted=False)

    def finish_interrupted(self) -> _Level | None:
        """Read the figures of the level Ctrl-C cut short, if one was under way."""
        if self._current is None:
            return None
        run, before, max_seconds = self._current
        self._current = None
        return self._read(run, before, max_seconds, interrupted=True)

    def _read(self, run: LevelRun, before: _readout.Snapshot, max_seconds: float | None, interrupted: bool) -> _Level:
        self.progress.clear()
        figures = _readout.figures(self.telemetry.snapshot(), before, self.telemetry.names)
        level = _Level(run, figures, interrupted, max_seconds)
        self.done.append(level)
        return level


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal, at most 10 times a second."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._enabled = stream.isatty()
        self._drawn_ns = 0

    def update(self, label: str, run: LevelRun) -> None:
        now = time.perf_counter_ns()
        if not self._enabled or (now - self._drawn_ns < 100_000_000 and run.done < run.planned):
            return
        self._drawn_ns = now
        width = 30
        filled = width * run.done // max(run.planned, 1)
        self._stream.write(f"\r  {label:<16} [{'#' * filled}{'.' * (width - filled)}] {run.done}/{run.planned}"
                           f"  {run.elapsed_s:.1f} s\x1b[K")
        self._stream.flush()

    def clear(self) -> None:
        if self._enabled and self._drawn_ns:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._drawn_ns = 0


@contextmanager
def _frozen_heap() -> Iterator[None]:
    """Keep the collector off everything allocated before the run: a full collection over the imports (the SDKs,
    matplotlib; pytest's heap under tests) pauses the client for 50-100 ms, which it would measure as latency."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(slots=True)
class _Interruption:
    happened: bool = False
    level: _Level | None = None  # the level Ctrl-C cut short; None when it came between levels


@contextmanager
def _until_interrupted(levels: _Levels) -> Iterator[_Interruption]:
    """End the block quietly at Ctrl-C, keeping the level under way."""
    interruption = _Interruption()
    try:
        with _frozen_heap():
            yield interruption
    except KeyboardInterrupt:
        interruption.happened = True
        interruption.level = levels.finish_interrupted()


# --- demo -----------------------------------------------------------------------------------------------------


def _demo(options: argparse.Namespace) -> int:
    _require("openai", "otel-llm demo")
    _check_export_options(options)
    from otel_llm._loadgen import EndpointProblem, Workload, make_client, preflight

    out = sys.stdout
    plan = _plan(options.levels, options.requests, "--levels")
    workload = Workload(DEFAULT_MODEL, DEMO_PROMPT_TOKENS, None, 60.0)
    limited_config = EngineConfig(tokens_per_minute=RATE_LIMIT_TOKENS_PER_MINUTE)
    with Simulator(seed=options.seed) as sim, Simulator(limited_config, seed=options.seed) as limited, \
            _Telemetry("otel-llm-demo", options.prometheus_port) as telemetry:
        levels = _Levels(telemetry, _Progress(sys.stderr))
        print(f"otel-llm demo: the openai client, instrumented by otel_llm, against a simulated LLM server at "
              f"{sim.base_url} (seed {options.seed}).\n"
              "Left: what otel_llm's metrics say (bucket quantiles, as Prometheus computes them). Right: the "
              "simulator's exact timings\n(the q-th percentile is the ceil(q*n)-th fastest request: the one in whose "
              "bucket Prometheus's quantile falls).\nTTFT = time to first token, TPOT = time per output token.",
              file=out)

        async def measure() -> None:
            async with make_client(sim.base_url, "sim", max(options.levels), workload.timeout_s) as client:
                await preflight(client, workload, sim.base_url)  # warms up the connection and the client
                sim.reset_truth()
                for concurrency, requests in plan:
                    level = await levels.run(client, workload, concurrency, requests, options.duration)
                    _print_demo_level(level, _Truth.take(sim), out)
            if options.rate_limit_requests:
                async with make_client(limited.base_url, "sim", RATE_LIMIT_CONCURRENCY, workload.timeout_s) as client:
                    await levels.run(client, workload, RATE_LIMIT_CONCURRENCY, options.rate_limit_requests, None,
                                     "rate limit")

        with _until_interrupted(levels) as interruption:
            try:
                asyncio.run(measure())
            except EndpointProblem as exc:  # the built-in simulator failed us: say so, no traceback
                print(f"otel-llm demo: error: {exc}", file=sys.stderr)
                return EXIT_ENDPOINT
        main_levels = levels.done[:len(plan)]
        if interruption.level is not None and len(levels.done) <= len(plan):  # cut short before the 429 phase
            _print_demo_level(interruption.level, _Truth.take(sim), out)
        _print_trade_off(main_levels, out)
        if interruption.happened:
            _say_interrupted("demo", levels.done, out)
            return EXIT_INTERRUPTED
        if options.rate_limit_requests:
            _print_rate_limit(levels.done[-1], limited, telemetry, out)
        _linger(options, out)
    return 0


def _print_demo_level(level: _Level, truth: _Truth, out: TextIO) -> None:
    figures, t = level.figures, truth.summary
    print(f"\nconcurrency {level.run.concurrency}: {figures.operations} requests in {level.run.elapsed_s:.1f} s"
          f"{_how_it_ended(level)}", file=out)
    rows = [
        ("", "otel_llm metrics", "simulator truth"),
        ("requests/s", _num(level.requests_per_s), _num(t.requests_per_s)),
        ("output tokens/s", _num(level.output_tokens_per_s), _num(t.output_tokens_per_s)),
        ("TTFT p50 / p95 / p99 (ms)", _triple(figures.ttft), _triple(t.ttft)),
        ("TPOT p50 / p95 / p99 (ms)", _triple(figures.tpot), _triple(t.tpot)),
        ("duration p99 (s)", _num(figures.duration.p99), _num(truth.duration_p99)),
        ("errors", _errors(figures.errors), _truth_errors(t)),
    ]
    for label, measured, exact in rows:
        print(f"  {label:<27}{measured:>22}{exact:>22}", file=out)


def _print_trade_off(levels: Sequence[_Level], out: TextIO) -> None:
    if not levels:
        return
    print("\nThe trade-off, from otel_llm's metrics (more requests in flight buy throughput with latency):", file=out)
    _print_table(levels, out)
    print("Metrics and truth differ by up to a bucket (quantiles interpolate in buckets ~1.3x wide), plus the client's "
          "own time:\nits clock runs from before it sends to after it parses, a few ms, more when many streams keep it "
          "busy.", file=out)
    rough = _rough_p99(levels)
    if rough is not None:
        print(rough, file=out)


def _rough_p99(levels: Sequence[_Level]) -> str | None:
    """Say when a p99 rests on few requests (the successful ones its buckets hold), and which option limited them."""
    counts = [(count, level) for level in levels for count in (level.figures.ttft.count, level.figures.tpot.count)
              if count]
    if not counts:
        return None
    fewest, level = min(counts, key=lambda pair: pair[0])
    if fewest >= ROUGH_P99_BELOW:
        return None
    remedy = "--duration" if level.stopped_by_duration else "--requests"
    return f"p99 of {_requests(fewest)} is rough (about the slowest one or two); raise {remedy} for a steadier figure"


def _how_it_ended(level: _Level) -> str:
    """A note for a level that did not send all it planned: Ctrl-C, or --duration ran out."""
    if level.interrupted:
        return " (interrupted)"
    if level.stopped_by_duration and level.max_seconds is not None:
        limit = f"{level.max_seconds:g}s" if level.max_seconds < 60 else _hms(level.max_seconds)
        return f" (--duration {limit} ran out after {level.run.done} of {_requests(level.run.planned)})"
    return ""


def _say_interrupted(command: str, measured: Sequence[_Level], out: TextIO | None) -> None:
    """After Ctrl-C: point at the figures printed (to ``out``; None: the JSON says it), or say there are none."""
    if measured:
        if out is not None:
            print("\ninterrupted: the figures above are what was measured", file=out)
    else:
        print(f"otel-llm {command}: interrupted before any request was measured", file=sys.stderr)


def _requests(count: int) -> str:
    return f"{count} request" if count == 1 else f"{count} requests"


def _print_table(levels: Sequence[_Level], out: TextIO) -> None:
    header = ("concurrency", "requests/s", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
              "TPOT p99 ms", "errors")
    print("  " + "".join(f"{title:>13}" for title in header[:-1]) + f"  {header[-1]}", file=out)
    for level in levels:
        print(_table_row(level), file=out)


def _table_row(level: _Level) -> str:
    f = level.figures
    cells = (str(level.run.concurrency), _num(level.requests_per_s), _num(level.output_tokens_per_s),
             _num(f.ttft.p50, 1000), _num(f.ttft.p99, 1000), _num(f.tpot.p50, 1000), _num(f.tpot.p99, 1000))
    return "  " + "".join(f"{cell:>13}" for cell in cells) + f"  {_errors(level.errors)}{_how_it_ended(level)}"


def _print_rate_limit(level: _Level, limited: Simulator, telemetry: _Telemetry, out: TextIO) -> None:
    truth = summarize(limited.truth())
    gauges = _readout.rate_limits(telemetry.snapshot(), telemetry.names,
                                  lambda attributes: attributes.get(sc.SERVER_PORT) == limited.port)
    print(f"\nRate limiting: {level.figures.operations} requests at concurrency {level.run.concurrency} against a "
          f"simulator with a {RATE_LIMIT_TOKENS_PER_MINUTE:,} tokens/min budget", file=out)
    print(f"  {'errors by error.type':<27}{_errors(level.figures.errors):>22}{_truth_errors(truth):>22}", file=out)
    for resource, (remaining, limit) in gauges.items():
        print(f"  {'rate-limit gauge, ' + resource:<27}{f'{_count_text(remaining)} left of {_count_text(limit)}':>22}",
              file=out)


def _errors(errors: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(errors.items())) or "none"


def _truth_errors(truth: TruthSummary) -> str:
    others = truth.requests - truth.ok - truth.rate_limited
    parts = [f"HTTP 429 {truth.rate_limited}"] if truth.rate_limited else []
    if others:
        parts.append(f"unfinished {others}")
    return ", ".join(parts) or "none"


# --- bench ----------------------------------------------------------------------------------------------------


def _bench(options: argparse.Namespace) -> int:
    _require("openai", "otel-llm bench")
    if options.plot is not None:
        _require("matplotlib", "--plot")
        if not options.plot.parent.is_dir():
            raise _UsageError(f"--plot {options.plot}: the directory {options.plot.parent} does not exist")
        if options.plot.is_dir():
            raise _UsageError(f"--plot {options.plot}: a directory; give a file name, such as {options.plot}/bench.png")
    _check_export_options(options)
    from otel_llm._loadgen import EndpointProblem, Workload, make_client, preflight

    out = sys.stdout
    api_key = options.api_key or os.environ.get("OPENAI_API_KEY") or "sk-no-key-needed"
    workload = Workload(options.model, options.prompt_tokens, options.max_tokens or None, options.timeout)
    plan = _plan(options.concurrency, options.requests, "--concurrency")
    with _Telemetry("otel-llm-bench", options.prometheus_port) as telemetry:
        levels = _Levels(telemetry, _Progress(sys.stderr))
        table = None if options.json else out

        async def measure() -> None:
            async with make_client(options.base_url, api_key, max(options.concurrency), options.timeout) as client:
                await preflight(client, workload, options.base_url)
                if table is not None:
                    print(f"otel-llm bench: {options.model} at {options.base_url}, {options.prompt_tokens}-token "
                          f"prompts, max_tokens {options.max_tokens or 'unset'}; latencies from otel_llm's metrics",
                          file=table)
                    _print_table([], table)
                for concurrency, requests in plan:
                    level = await levels.run(client, workload, concurrency, requests, options.duration)
                    if table is not None:
                        print(_table_row(level), file=table, flush=True)

        try:
            with _until_interrupted(levels) as interruption:
                asyncio.run(measure())
        except EndpointProblem as exc:
            print(f"otel-llm bench: error: {exc}", file=sys.stderr)
            return EXIT_ENDPOINT
        verdict = _deadline_verdict(options.deadline, levels.done) if options.deadline else None
        if table is None:
            json.dump(_bench_json(options, levels.done, verdict, interruption.happened), out, indent=2)
            out.write("\n")
        else:
            if interruption.level is not None:
                print(_table_row(interruption.level), file=table)
            if verdict is not None:
                print("\n" + _deadline_text(options.deadline, verdict), file=table)
            rough = _rough_p99(levels.done)
            if rough is not None:
                print(f"\n{rough}", file=table)
        if options.plot is not None and levels.done:
            _plot(levels.done, options.plot, f"{options.model} at {options.base_url}")
            if table is not None:
                print(f"chart: {options.plot}", file=table)
        if interruption.happened:
            _say_interrupted("bench", levels.done, table)
            return EXIT_INTERRUPTED
        _linger(options, sys.stderr if table is None else table)
    return 0


def _deadline_verdict(deadline: _Deadline, levels: Sequence[_Level]) -> dict[str, Any]:
    """The smallest measured concurrency that finishes ``deadline.requests`` in time at its measured throughput,
    and the fastest level, for when none does."""
    measured = [level for level in levels if level.requests_per_s > 0]
    meets = [level for level in measured if deadline.requests / level.requests_per_s <= deadline.within_s]
    chosen = min(meets, key=lambda level: level.run.concurrency, default=None)
    best = max(measured, key=lambda level: level.requests_per_s, default=None)
    return {
        "requests": deadline.requests,
        "within_s": deadline.within_s,
        "needed_requests_per_s": deadline.needed_requests_per_s,
        "concurrency": chosen.run.concurrency if chosen else None,
        "finish_s": deadline.requests / chosen.requests_per_s if chosen else None,
        "ttft_p99_s": _finite(chosen.figures.ttft.p99) if chosen else None,
        "best_concurrency": best.run.concurrency if best else None,
        "best_requests_per_s": best.requests_per_s if best else None,
        "best_finish_s": deadline.requests / best.requests_per_s if best else None,
    }


def _deadline_text(deadline: _Deadline, verdict: Mapping[str, Any]) -> str:
    head = (f"Deadline: {deadline.requests:,} requests within {_hms(deadline.within_s)} needs "
            f"{_num(verdict['needed_requests_per_s'])} requests/s.")
    if verdict["concurrency"] is not None:
        return (f"{head} Smallest measured concurrency that meets it: {verdict['concurrency']} (done in "
                f"{_hms(verdict['finish_s'])}), at a TTFT p99 of {_num(verdict['ttft_p99_s'], 1000)} ms.")
    if verdict["best_concurrency"] is None:
        return f"{head} No level completed a request, so none can be judged."
    shortfall = verdict["needed_requests_per_s"] / verdict["best_requests_per_s"]
    return (f"{head} No measured level meets it: the fastest, concurrency {verdict['best_concurrency']} at "
            f"{_num(verdict['best_requests_per_s'])} requests/s, would take {_hms(verdict['best_finish_s'])}; it "
            f"needs {shortfall:.1f}x that throughput. Measure higher --concurrency, or add serving capacity if "
            "throughput has stopped rising.")


def _bench_json(options: argparse.Namespace, levels: Sequence[_Level], verdict: Mapping[str, Any] | None,
                interrupted: bool) -> dict[str, Any]:
    def percentiles(p: _readout.Percentiles) -> dict[str, float | None]:
        return {"p50": _finite(p.p50), "p95": _finite(p.p95), "p99": _finite(p.p99)}

    return {
        "base_url": options.base_url,
        "model": options.model,
        "prompt_tokens": options.prompt_tokens,
        "max_tokens": options.max_tokens or None,
        "interrupted": interrupted,
        "levels": [
            {
                "concurrency": level.run.concurrency,
                "requests": level.figures.operations,
                "ok": level.figures.ok,
                "errors": dict(sorted(level.errors.items())),
                "elapsed_s": level.run.elapsed_s,
                "requests_per_s": _finite(level.requests_per_s),
                "output_tokens_per_s": _finite(level.output_tokens_per_s),
                "ttft_s": percentiles(level.figures.ttft),
                "tpot_s": percentiles(level.figures.tpot),
                "duration_s": percentiles(level.figures.duration),
                "interrupted": level.interrupted,
            }
            for level in levels
        ],
        "deadline": verdict,
    }


def _plot(levels: Sequence[_Level], path: Path, title: str) -> None:
    """TTFT p50 and p99 against throughput, one point per level, as a PNG."""
    from matplotlib.figure import Figure

    by_tokens = all(not math.isnan(level.output_tokens_per_s) for level in levels)
    xs = [level.output_tokens_per_s if by_tokens else level.requests_per_s for level in levels]
    figure = Figure(figsize=(7, 4.5), dpi=100)
    axes = figure.add_subplot()
    axes.plot(xs, [level.figures.ttft.p50 * 1000 for level in levels], "o-", label="TTFT p50")
    axes.plot(xs, [level.figures.ttft.p99 * 1000 for level in levels], "s--", label="TTFT p99")
    for x, level in zip(xs, levels, strict=True):
        axes.annotate(f"c={level.run.concurrency}", (x, level.figures.ttft.p99 * 1000), textcoords="offset points",
                      xytext=(4, 6), fontsize=8)
    axes.margins(x=0.1, y=0.1)  # room for the labels of the outermost points
    axes.set_xlabel("output tokens/s" if by_tokens else "requests/s")
    axes.set_ylabel("time to first token (ms)")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")


# --- numbers --------------------------------------------------------------------------------------------------


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def _num(value: float | None, scale: float = 1.0) -> str:
    """Three significant figures or whole numbers; '-' when unknown."""
    if value is None or math.isnan(value):
        return "-"
    scaled = value * scale
    if abs(scaled) >= 100:
        return f"{scaled:,.0f}"
    return f"{scaled:.1f}" if abs(scaled) >= 10 else f"{scaled:.2f}"


def _count_text(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


class _Percentiles(Protocol):
    """`_readout.Percentiles` (bucket quantiles) or the simulator's `Quantiles` (exact)."""

    @property
    def p50(self) -> float: ...
    @property
    def p95(self) -> float: ...
    @property
    def p99(self) -> float: ...


def _triple(p: _Percentiles) -> str:
    """p50 / p95 / p99 in milliseconds."""
    return " / ".join(_num(value, 1000) for value in (p.p50, p.p95, p.p99))


def _hms(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
