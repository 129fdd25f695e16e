"""``otel-llm demo`` and ``otel-llm bench`` end to end against the built-in simulator: the figures read back from
otel_llm's metrics agree with the simulator's ground truth, the latency/throughput trade-off shows, 429s reach
``error.type`` and the rate-limit gauges, and bad input ends in one line with a non-zero exit status."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import wire
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from test_buckets import histogram_quantile
from test_export import Receiver

import otel_llm
from otel_llm import _console, _readout, cli
from otel_llm import _semconv as sc
from otel_llm.cli import EXIT_ENDPOINT, EXIT_INTERRUPTED, EXIT_USAGE, RATE_LIMIT_TOKENS_PER_MINUTE, main
from otel_llm.simulator import DEFAULT_MODEL, EngineConfig, Simulator, TruthRecord

OTEL_LLM = Path(sys.executable).parent / "otel-llm"

# How close the metrics must be to the truth. histogram_quantile(q) finds the bucket that holds the ceil(q*n)-th
# smallest recorded value and interpolates inside it, so its answer lies within that bucket: it can be off by up to
# one bucket width, LATENCY_BUCKETS <= 1.32x and CHUNK_BUCKETS 1.26x apart. The recorded values are the client's, not
# the server's: TTFT runs from before the client sends to after it parses, so it exceeds the truth by the client's
# own time, measured here at 1-7 ms per request up to concurrency 4 on a quiet machine and more when other processes
# take the CPU. We allow CLIENT_EXCESS_S for all but RANK_SLACK requests of a level: the answer must then lie between
# the lower edge of the bucket holding the truth's (k - RANK_SLACK)-th value and the upper edge of the bucket holding
# its (k + RANK_SLACK)-th value plus CLIENT_EXCESS_S. A TPOT spreads the excess of its first and last chunk over
# (tokens - 1) gaps, so it may move by CLIENT_EXCESS_S / (tokens - 1) either way.
# At 16 streams the client itself falls behind (up to ~30 ms per request here), which its metrics rightly include
# and the server cannot know: that level is checked for the trade-off only. p99 is not asserted: of 40 requests it
# is the slowest one, which a single scheduling hiccup moves (tests/test_buckets.py proves the buckets' p99 accuracy).
CLIENT_EXCESS_S = 0.015
RANK_SLACK = 2
AGREEMENT_LEVELS = (1, 4)
MAX_TOKENS = 12


def run(*argv: str) -> tuple[int, str, str]:
    """main(argv) in this process: exit status, stdout, stderr. It must leave nothing instrumented behind."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    assert not otel_llm.OtelLLMInstrumentor().is_instrumented_by_opentelemetry
    return status, out.getvalue(), err.getvalue()


def bench_args(sim: Simulator, *extra: str) -> list[str]:
    return ["bench", "--base-url", sim.base_url, "--model", DEFAULT_MODEL, "--max-tokens", str(MAX_TOKENS), *extra]


def allowed(true_values: Sequence[float], q: float, bounds: Sequence[float], shift: tuple[float, float]) -> tuple[
        float, float]:
    """The range histogram_quantile(q) may answer in for client values within `shift` of `true_values` (see above)."""
    ordered = sorted(true_values)
    k = math.ceil(q * len(ordered)) - 1
    low = ordered[max(k - RANK_SLACK, 0)] + shift[0]
    high = ordered[min(k + RANK_SLACK, len(ordered) - 1)] + shift[1]
    return max((b for b in bounds if b < low), default=0.0), min((b for b in bounds if b >= high), default=math.inf)


# --- the readout ----------------------------------------------------------------------------------------------


def test_readout_takes_level_deltas_and_reads_quantiles_as_prometheus_does() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        histogram = provider.get_meter(sc.INSTRUMENTATION_SCOPE).create_histogram(
            "latency", unit="s", explicit_bucket_boundaries_advisory=list(sc.LATENCY_BUCKETS))
        rng = random.Random(1)
        for _ in range(50):
            histogram.record(rng.uniform(0.01, 0.1), {sc.ERROR_TYPE: "RateLimitError"})
        before = _readout.read(reader)
        level = [rng.lognormvariate(math.log(0.3), 0.8) for _ in range(2_000)]  # some beyond the last bucket
        for value in level:
            histogram.record(value, {"a": 1} if value < 0.3 else {"a": 2})
        histogram.record(0.05, {sc.ERROR_TYPE: "APITimeoutError"})
        now = _readout.read(reader)
    finally:
        provider.shutdown()
    delta = now.histogram("latency", since=before, match=lambda attributes: sc.ERROR_TYPE not in attributes)
    assert delta is not None and delta.count == len(level)
    for q in (0.5, 0.95, 0.99, 0.999):
        assert delta.quantile(q) == pytest.approx(histogram_quantile(q, sc.LATENCY_BUCKETS, level))
    assert now.counts_by("latency", sc.ERROR_TYPE, since=before) == {None: 2_000, "APITimeoutError": 1}
    assert math.isnan(_readout.Buckets((1.0,), (0, 0), 0.0).quantile(0.5))


# --- bench: one run shared by the figure tests ----------------------------------------------------------------


@dataclass
class BenchRun:
    status: int
    report: dict[str, Any]
    truth: list[list[TruthRecord]]  # per level, in the order of report["levels"]
    chart: Path
    stderr: str


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> BenchRun:
    chart = tmp_path_factory.mktemp("bench") / "chart.png"
    with Simulator(seed=7) as sim:
        # 200 requests within 10 s need 20/s: concurrency 1 gives ~10/s, 4 gives ~35/s
        status, out, err = run(*bench_args(sim, "--concurrency", "1,4,16", "--requests", "40",
                                           "--deadline", "200/10s", "--json", "--plot", str(chart)))
        records = sim.truth()
    assert status == 0, err
    report = json.loads(out)
    # the first request is bench's preflight; then each level's requests, arriving after the previous level ended
    truth, start = [], 1
    for level in report["levels"]:
        truth.append(records[start:start + level["requests"]])
        start += level["requests"]
    assert start == len(records)
    return BenchRun(status, report, truth, chart, err)


def test_bench_json_has_the_documented_keys(bench: BenchRun) -> None:
    report = bench.report
    assert set(report) == {"base_url", "model", "prompt_tokens", "max_tokens", "interrupted", "levels", "deadline"}
    assert (report["model"], report["prompt_tokens"], report["max_tokens"], report["interrupted"]) == (
        DEFAULT_MODEL, 256, MAX_TOKENS, False)
    assert [level["concurrency"] for level in report["levels"]] == [1, 4, 16]
    for level in report["levels"]:
        assert set(level) == {"concurrency", "requests", "ok", "errors", "elapsed_s", "requests_per_s",
                              "output_tokens_per_s", "ttft_s", "tpot_s", "duration_s", "interrupted"}
        assert (level["requests"], level["ok"], level["errors"], level["interrupted"]) == (40, 40, {}, False)
        for key in ("ttft_s", "tpot_s", "duration_s"):
            assert set(level[key]) == {"p50", "p95", "p99"}
            assert 0 < level[key]["p50"] <= level[key]["p95"] <= level[key]["p99"]
    assert set(report["deadline"]) == {"requests", "within_s", "needed_requests_per_s", "concurrency", "finish_s",
                                       "ttft_p99_s", "best_concurrency", "best_requests_per_s", "best_finish_s"}


@pytest.mark.timing  # the client's figures within 15 ms of the server's
def test_bench_figures_agree_with_the_simulator_truth(bench: BenchRun) -> None:
    for level, records in zip(bench.report["levels"], bench.truth, strict=True):
        assert all(record.status == 200 and len(record.token_ns) == MAX_TOKENS for record in records)
        if level["concurrency"] not in AGREEMENT_LEVELS:
            continue
        ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
        tpots = [r.tpot_s for r in records if r.tpot_s is not None]
        tpot_shift = CLIENT_EXCESS_S / (MAX_TOKENS - 1)
        for q, key in ((0.5, "p50"), (0.95, "p95")):
            low, high = allowed(ttfts, q, sc.LATENCY_BUCKETS, (0.0, CLIENT_EXCESS_S))
            assert low <= level["ttft_s"][key] <= high, (level["concurrency"], key, level["ttft_s"], low, high)
            low, high = allowed(tpots, q, sc.CHUNK_BUCKETS, (-tpot_shift, tpot_shift))
            assert low <= level["tpot_s"][key] <= high, (level["concurrency"], key, level["tpot_s"], low, high)
        # throughput: the same responses over nearly the same wall time (the client's runs a little longer)
        elapsed = (max(r.finished_ns for r in records) - min(r.received_ns for r in records)) / 1e9
        assert level["requests_per_s"] == pytest.approx(len(records) / elapsed, rel=0.1)
        assert level["output_tokens_per_s"] == pytest.approx(len(records) * MAX_TOKENS / elapsed, rel=0.1)


@pytest.mark.timing  # rates and p50s compared across levels in wall-clock time: failed once in five beside a worker
def test_bench_shows_throughput_and_latency_rising_with_concurrency(bench: BenchRun) -> None:
    levels = bench.report["levels"]
    throughput = [level["requests_per_s"] for level in levels]
    assert throughput == sorted(throughput) and len(set(throughput)) == len(throughput), throughput
    # more sequences share the engine: prefill and every decode step slow down (EngineConfig.batch_slowdown)
    assert levels[-1]["ttft_s"]["p50"] > levels[0]["ttft_s"]["p50"]
    assert levels[-1]["tpot_s"]["p50"] > levels[0]["tpot_s"]["p50"]


def test_bench_deadline_picks_the_smallest_concurrency_that_meets_it(bench: BenchRun) -> None:
    deadline, levels = bench.report["deadline"], bench.report["levels"]
    assert (deadline["requests"], deadline["within_s"], deadline["needed_requests_per_s"]) == (200, 10.0, 20.0)
    rates = {level["concurrency"]: level["requests_per_s"] for level in levels}
    assert rates[1] < 20 < rates[4], rates
    assert deadline["concurrency"] == 4
    assert deadline["finish_s"] == pytest.approx(200 / rates[4])
    assert deadline["ttft_p99_s"] == levels[1]["ttft_s"]["p99"]
    assert deadline["best_concurrency"] == max(rates, key=lambda c: rates[c])


def test_bench_plot_writes_a_png(bench: BenchRun) -> None:
    data = bench.chart.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # a drawn chart, not an empty canvas


def test_bench_table_and_a_deadline_no_level_meets() -> None:
    with Simulator(seed=1) as sim:
        status, out, err = run(*bench_args(sim, "--concurrency", "1,2", "--requests", "6", "--deadline",
                                           "1,000,000/1h"))
    assert status == 0, err
    assert re.search(r"^\s+concurrency\s+requests/s\s+output tok/s\s+TTFT p50 ms", out, re.M), out
    rows = re.findall(r"^\s+([12])\s+\d[\d.,]*\s+\d[\d.,]*\s+\d[\d.,]*\s+\d[\d.,]*\s+\d[\d.,]*\s+\d[\d.,]*\s+none$",
                      out, re.M)
    assert rows == ["1", "2"], out
    assert "Deadline: 1,000,000 requests within 1h00m needs 278 requests/s. No measured level meets it: the " \
           "fastest, concurrency 2" in out
    assert "p99 of 6 requests is rough" in out


def test_bench_reads_the_latest_experimental_metric_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", sc.LATEST_EXPERIMENTAL_OPT_IN)
    with Simulator(seed=2) as sim:
        status, out, err = run(*bench_args(sim, "--concurrency", "2", "--requests", "4", "--json"))
    assert status == 0, err
    level = json.loads(out)["levels"][0]
    assert level["ok"] == 4
    assert level["output_tokens_per_s"] > 0
    assert level["ttft_s"]["p50"] > 0 and level["tpot_s"]["p50"] > 0


def test_bench_exports_over_otlp_when_the_endpoint_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        with Simulator(seed=3) as sim:
            status, _, err = run(*bench_args(sim, "--concurrency", "1", "--requests", "3", "--json"))
    finally:
        receiver.shutdown()
        receiver.server_close()
    assert status == 0, err
    assert [span.name for span in receiver.spans()] == [f"{sc.OP_CHAT} {DEFAULT_MODEL}"] * 4  # preflight + 3
    ttft = receiver.metric(sc.STABLE_NAMES.time_to_first_chunk.name)
    assert sum(point.count for point in ttft.histogram.data_points) == 4
    service = {attribute.value.string_value for request in receiver.metrics for rm in request.resource_metrics
               for attribute in rm.resource.attributes if attribute.key == "service.name"}
    assert service == {"otel-llm-bench"}


# --- demo -----------------------------------------------------------------------------------------------------


def test_demo_prints_metrics_beside_truth_and_shows_429s_in_error_type_and_gauges() -> None:
    status, out, err = run("demo", "--levels", "1,8", "--requests", "8", "--seed", "5")
    assert status == 0, err
    for level in (1, 8):
        block = out.split(f"\nconcurrency {level}: ")[1].split("\n\n")[0]
        assert re.search(r"^\s+otel_llm metrics\s+simulator truth$", block, re.M), block
        for row in ("requests/s", "output tokens/s", "duration p99 \\(s\\)"):
            assert re.search(rf"^  {row}\s+\d[\d.,]*\s+\d[\d.,]*$", block, re.M), (row, block)
        for row in ("TTFT", "TPOT"):
            triple = r"\d[\d.,]* / \d[\d.,]* / \d[\d.,]*"
            assert re.search(rf"^  {row} p50 / p95 / p99 \(ms\)\s+{triple}\s+{triple}$", block, re.M), block
        assert re.search(r"^  errors\s+none\s+none$", block, re.M), block
    assert "The trade-off, from otel_llm's metrics" in out
    assert "p99 of 8 requests is rough" in out

    limited = out.split("\nRate limiting: ")[1]
    assert limited.startswith(f"40 requests at concurrency 8 against a simulator with a "
                              f"{RATE_LIMIT_TOKENS_PER_MINUTE:,} tokens/min budget")
    errors = re.search(r"^  errors by error.type\s+RateLimitError (\d+)\s+HTTP 429 (\d+)$", limited, re.M)
    assert errors is not None, limited
    assert 0 < int(errors[1]) == int(errors[2]) < 40
    # the gauges hold what the simulator's x-ratelimit-* headers said
    tokens = re.search(r"^  rate-limit gauge, tokens\s+([\d,]+) left of ([\d,]+)$", limited, re.M)
    assert tokens is not None, limited
    assert int(tokens[2].replace(",", "")) == RATE_LIMIT_TOKENS_PER_MINUTE
    assert int(tokens[1].replace(",", "")) < RATE_LIMIT_TOKENS_PER_MINUTE
    requests = re.search(r"^  rate-limit gauge, requests\s+[\d,]+ left of ([\d,]+)$", limited, re.M)
    assert requests is not None and int(requests[1].replace(",", "")) == EngineConfig().requests_per_minute


def test_demo_serves_prometheus_until_ctrl_c() -> None:
    port = free_port()
    process = subprocess.Popen(
        [str(OTEL_LLM), "demo", "--levels", "2", "--requests", "4", "--prometheus-port", str(port), "--linger", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        out = ""
        while "serving the metrics at" not in out:
            line = process.stdout.readline()
            assert line, process.stderr
            out += line
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    names = sc.STABLE_NAMES
    ttft = sc.prometheus_name(names.time_to_first_chunk)
    labels = r"[^}]*"
    assert re.search(rf'^{ttft}_bucket{{{labels}gen_ai_request_model="{DEFAULT_MODEL}"{labels}le="0.5"{labels}}} 5.0$',
                     scrape, re.M), scrape  # the demo's preflight and 4 requests, all in the first second
    limited = re.search(rf'^{sc.prometheus_name(names.duration)}_count{{{labels}error_type="RateLimitError"{labels}}} '
                        r'(\S+)$', scrape, re.M)
    assert limited is not None and float(limited[1]) > 0, scrape
    assert f"RateLimitError {float(limited[1]):.0f} " in out
    resource = sc.prometheus_name(sc.RATE_LIMIT_RESOURCE)
    assert re.search(rf'^{sc.prometheus_name(names.rate_limit_limit)}{{{labels}{resource}="tokens"{labels}}} '
                     rf'{RATE_LIMIT_TOKENS_PER_MINUTE}\.0$', scrape, re.M), scrape


# --- Ctrl-C and bad input -------------------------------------------------------------------------------------


def test_bench_ctrl_c_prints_what_was_measured() -> None:
    with Simulator(seed=4) as sim:
        process = subprocess.Popen([str(OTEL_LLM), *bench_args(sim, "--concurrency", "2", "--requests", "1000")],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert process.stdout is not None
            header = ""
            while "concurrency" not in header:
                header = process.stdout.readline()
                assert header, process.stderr
            time.sleep(1.0)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=20)
        finally:
            process.kill()
    assert process.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    row = re.search(r"^\s+2\s+(\d[\d.,]*)\s.*\s(cancelled \d+|none) \(interrupted\)$", out, re.M)
    assert row is not None, out
    assert float(row[1]) > 0
    assert "interrupted: the figures above are what was measured" in out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _GarbageStream(BaseHTTPRequestHandler):
    """Answers every request 200 with the server's `body` as an event stream."""

    protocol_version = "HTTP/1.1"
    server: Any

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        body: bytes = self.server.body
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def garbage_server(body: bytes) -> Iterator[str]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _GarbageStream)
    server.body = body
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


# a chat chunk whose content is not UTF-8: the openai client fails to decode the line
INVALID_UTF8 = b'data: {"choices": [{"delta": {"content": "\xff\xfe"}, "index": 0}]}\n\n'
# JSON, but not a chat-completion chunk: the load generator stops reading (otel_llm then records `cancelled`)
NOT_A_CHUNK = wire.sse({"foo": 1})


# chunks 0.25 s apart: no read waits as long as a 0.5 s timeout, but the whole answer takes 1 s
TRICKLE = [0.0, 0.25, 0.25, 0.25, 0.25]


def good_stream(**options: Any) -> wire.Reply:
    return wire.Reply.stream(wire.chat_stream(["Hello", " there", "!"]), **options)


def assert_one_line(err: str, *expected: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], lines[0]


def test_a_level_names_why_its_requests_failed_and_goes_on() -> None:
    with wire.LoopbackServer([good_stream(), wire.Reply.stream([INVALID_UTF8]), wire.Reply.stream([NOT_A_CHUNK]),
                              good_stream()]) as server:
        status, out, err = run("bench", "--base-url", server.base_url, "--model", "m", "--concurrency", "1",
                               "--requests", "3")
    assert status == 0, err
    row = next(line for line in out.splitlines() if re.match(r"\s+1\s", line))
    assert row.endswith("  MalformedStream 1, UnicodeDecodeError 1"), out
    # the quantiles come from the one request that succeeded, not from all three
    assert "p99 of 1 request is rough" in out


def test_timeout_bounds_the_whole_request_not_each_read() -> None:
    with wire.LoopbackServer([good_stream(), good_stream(delays=TRICKLE), good_stream()]) as server:
        status, out, err = run("bench", "--base-url", server.base_url, "--model", "m", "--concurrency", "1",
                               "--requests", "2", "--timeout", "0.5", "--json")
    assert status == 0, err
    level = json.loads(out)["levels"][0]
    assert (level["ok"], level["errors"]) == (1, {"APITimeoutError": 1})
    assert level["elapsed_s"] < 1.0  # the trickling answer was given up on, not waited for


def test_a_preflight_slower_than_the_timeout_is_one_line() -> None:
    with wire.LoopbackServer([good_stream(delays=TRICKLE)]) as server:
        status, _, err = run("bench", "--base-url", server.base_url, "--model", "m", "--timeout", "0.5")
    assert status == EXIT_ENDPOINT
    assert_one_line(err, "no complete answer from", "within the timeout", "raise --timeout")


@pytest.mark.parametrize("reply", [
    good_stream(drop_after=2),
    wire.Reply(200, b"not gzip at all", {"content-type": "text/event-stream", "content-encoding": "gzip"}),
], ids=["cut short", "bad gzip"])
def test_an_answer_that_breaks_off_is_not_a_connection_that_failed(reply: wire.Reply) -> None:
    with wire.LoopbackServer([reply]) as server:
        status, _, err = run("bench", "--base-url", server.base_url, "--model", "m")
    assert status == EXIT_ENDPOINT
    assert_one_line(err, f"{server.base_url} accepted the connection, but its answer broke off or could not be "
                         "decoded (", "check the server's log")
    assert "cannot connect" not in err


def test_a_redirect_to_where_nothing_listens_names_the_url_reached() -> None:
    elsewhere = f"http://127.0.0.1:{free_port()}/"
    with wire.LoopbackServer([wire.Reply(302, b"", {"location": elsewhere})]) as server:
        status, _, err = run("bench", "--base-url", server.base_url, "--model", "m")
    assert status == EXIT_ENDPOINT
    assert_one_line(err, f"cannot connect to {elsewhere} (where {server.base_url} redirected)", "check --base-url")


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_refuses_to_run_with_the_sdk_disabled(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with Simulator() as sim:
        args = bench_args(sim) if command == "bench" else ["demo"]
        status, out, err = run(*args)
        assert sim.truth() == []
    assert (status, out) == (EXIT_ENDPOINT, "")
    assert_one_line(err, f"otel-llm {command}: error: OTEL_SDK_DISABLED is true, which turns off otel_llm's own "
                         "metrics, and every figure comes from them")


def test_a_level_reports_the_concurrency_it_ran_at() -> None:
    with Simulator(seed=6) as sim:
        status, out, err = run(*bench_args(sim, "--concurrency", "1,64", "--requests", "8", "--deadline", "8/1h",
                                           "--json"))
    assert status == 0, err
    report = json.loads(out)
    assert [level["concurrency"] for level in report["levels"]] == [1, 8]  # 8 requests keep at most 8 in flight
    assert report["deadline"]["best_concurrency"] == 8


def test_levels_that_would_run_alike_are_refused() -> None:
    status, out, err = run("bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--concurrency", "4,16,64",
                           "--requests", "8")
    assert (status, out) == (EXIT_USAGE, "")
    assert_one_line(err, "--concurrency 16,64 with --requests 8: a level keeps at most its requests in flight, so "
                         "more than one level would run at concurrency 8")


def test_demo_says_when_duration_stopped_a_level_before_its_requests() -> None:
    status, out, err = run("demo", "--levels", "1", "--requests", "200", "--duration", "0.5",
                           "--rate-limit-requests", "0")
    assert status == 0, err
    head = re.search(r"^concurrency 1: (\d+) requests in [\d.]+ s \(--duration 0.5s ran out after (\d+) of 200 "
                     r"requests\)$", out, re.M)
    assert head is not None and head[1] == head[2], out
    assert f"p99 of {head[1]} requests is rough (about the slowest one or two); raise --duration" in out
    assert "--requests 200" not in out


# PYTHONPROFILEIMPORTTIME reports each import as it completes. The first OpenTelemetry module is done while the
# console script is still importing the command line, before main() runs; the first of the openai client's while
# main() is importing the rest of it (a few hundred ms).
@pytest.mark.parametrize(("argv", "loading"), [
    (["demo"], "opentelemetry"),
    (["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"], "openai"),
], ids=["the command line loading", "the client loading"])
def test_ctrl_c_while_starting_up_is_one_line(argv: list[str], loading: str) -> None:
    process = subprocess.Popen([str(OTEL_LLM), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.rpartition("|")[2].strip().startswith(loading):
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        process.kill()
    assert (process.returncode, out) == (EXIT_INTERRUPTED, "")
    assert [line for line in err.splitlines() if not line.startswith("import time:")] == ["otel-llm: interrupted"]


def test_ctrl_c_that_python_wrapped_while_a_class_was_defined_is_ctrl_c(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Python 3.11 turns an exception raised by __set_name__ into a RuntimeError: Ctrl-C while the openai client
    # loads pydantic's models comes as one
    class NameTaker:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    def interrupted_while_loading(args: list[str]) -> int:
        type("Model", (), {"field": NameTaker()})
        return 0

    monkeypatch.setattr(cli, "_main", interrupted_while_loading)
    assert main(["demo"]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "otel-llm: interrupted\n"
    assert not _console.interrupted(RuntimeError("an error of its own"))
    wrapped = RuntimeError("another wrapped")
    wrapped.__cause__ = ValueError()
    assert not _console.interrupted(wrapped)


def test_the_command_and_the_package_load_no_opentelemetry_until_asked() -> None:
    """``import otel_llm`` loads nothing of OpenTelemetry (so neither does the console script before main() runs,
    where Ctrl-C is caught); the instrumentor, which the ``opentelemetry_instrumentor`` entry point names, loads
    when asked for."""
    probe = ("import sys, otel_llm, otel_llm._console\n"
             "print(sorted(name for name in sys.modules if name.startswith('opentelemetry')))\n"
             "print(otel_llm.OtelLLMInstrumentor.__module__)")
    loaded, instrumentor = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                          check=True).stdout.splitlines()
    assert (loaded, instrumentor) == ("[]", "otel_llm._instrumentor")
    with pytest.raises(AttributeError, match="no attribute 'instrumentor'"):
        otel_llm.instrumentor  # type: ignore[attr-defined]  # noqa: B018


def test_ctrl_c_before_anything_was_measured_says_so() -> None:
    with wire.LoopbackServer([good_stream(headers_delay=30)]) as server:
        process = subprocess.Popen([str(OTEL_LLM), "bench", "--base-url", server.base_url, "--model", "m"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while not server.requests:  # the preflight request is waiting for its answer
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=20)
        finally:
            process.kill()
    assert (process.returncode, out) == (EXIT_INTERRUPTED, "")
    assert_one_line(err, "otel-llm bench: interrupted before any request was measured")


def test_unreachable_endpoint() -> None:
    status, out, err = run("bench", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m")
    assert (status, out) == (EXIT_ENDPOINT, "")
    assert_one_line(err, "otel-llm bench: error: cannot connect to", "check --base-url")


def test_wrong_api_key() -> None:
    with Simulator(api_key="sk-right") as sim:
        status, _, err = run(*bench_args(sim, "--api-key", "sk-wrong"))
    assert status == EXIT_ENDPOINT
    assert_one_line(err, "rejected the API key (401", "pass --api-key or set OPENAI_API_KEY")


def test_unknown_model() -> None:
    with Simulator() as sim:
        status, _, err = run("bench", "--base-url", sim.base_url, "--model", "no-such-model")
    assert status == EXIT_ENDPOINT
    assert_one_line(err, "does not serve model 'no-such-model' (404", "check --model")


def test_base_url_without_the_api_path() -> None:
    with Simulator() as sim:
        status, _, err = run("bench", "--base-url", sim.base_url.removesuffix("/v1"), "--model", DEFAULT_MODEL)
    assert status == EXIT_ENDPOINT
    assert_one_line(err, "/chat/completions was not found (404)", "it usually ends in /v1")


@pytest.mark.parametrize(("body", "expected"), [
    (b"data: {not json\n\n", "sent a malformed stream"),
    (b"<html>a web page</html>", "a stream that carried no content"),
    (INVALID_UTF8, "sent a malformed stream ('utf-8' codec can't decode byte 0xff"),
])
def test_malformed_stream(body: bytes, expected: str) -> None:
    with garbage_server(body) as base_url:
        status, _, err = run("bench", "--base-url", base_url, "--model", "m")
    assert status == EXIT_ENDPOINT
    assert_one_line(err, expected, "OpenAI-compatible endpoint that streams chat completions")


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("--deadline", "soon", "argument --deadline: expected REQUESTS/DURATION such as 4000/2h"),
    ("--deadline", "4000/0s", "argument --deadline: expected REQUESTS/DURATION"),
    ("--concurrency", "0,4", "argument --concurrency: expected positive whole numbers separated by commas"),
    ("--concurrency", "four", "argument --concurrency: expected positive whole numbers separated by commas"),
    ("--base-url", "localhost:8000", "argument --base-url: expected an http:// or https:// URL"),
    ("--base-url", "http://localhost:99999/v1", "argument --base-url: 'http://localhost:99999/v1': Port out of range"),
    ("--prometheus-port", "70000", "argument --prometheus-port: expected a port number from 1 to 65535"),
])
def test_bad_option_values(option: str, value: str, expected: str) -> None:
    args = {"--base-url": "http://127.0.0.1:9/v1", "--model": "m", option: value}
    status, out, err = run("bench", *(item for pair in args.items() for item in pair))
    assert (status, out) == (EXIT_USAGE, "")
    assert_one_line(err, f"otel-llm bench: error: {expected}", "see otel-llm bench --help")


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    status, _, err = run("bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--plot",
                         str(tmp_path / "chart.png"))
    assert status == EXIT_USAGE
    assert_one_line(err, "--plot needs matplotlib: pip install 'otel-llm[plot]'")
    assert not (tmp_path / "chart.png").exists()


def test_plot_into_a_directory_is_refused_before_any_request(tmp_path: Path) -> None:
    status, _, err = run("bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--plot", str(tmp_path))
    assert status == EXIT_USAGE
    assert_one_line(err, f"--plot {tmp_path}: a directory; give a file name")


def test_linger_without_a_prometheus_port() -> None:
    status, _, err = run("demo", "--linger", "5s")
    assert status == EXIT_USAGE
    assert_one_line(err, "otel-llm demo: error: --linger needs --prometheus-port")


def test_prometheus_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, _, err = run("bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--prometheus-port",
                             str(port))
    assert status == EXIT_USAGE
    assert_one_line(err, f"--prometheus-port {port}: Address already in use; pick a free port")


def test_refuses_to_run_where_otel_llm_is_already_instrumented(instrument: Any) -> None:
    instrument()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert status == EXIT_USAGE
    assert_one_line(err.getvalue(), "otel_llm is already instrumented in this process")
    assert otel_llm.OtelLLMInstrumentor().is_instrumented_by_opentelemetry  # the fixture's instrumentation is kept


@pytest.mark.parametrize("command", ["rules", "dashboards"])
def test_rules_and_dashboards_are_delegated(command: str, tmp_path: Path) -> None:
    status, out, err = run(command, "-o", str(tmp_path / command))
    assert status == 0, err
    assert out == ""
    assert (tmp_path / command).exists()


def test_dashboard_text_states_the_regression_ratio_it_was_given(tmp_path: Path) -> None:
    status, _, err = run("dashboards", "-o", str(tmp_path), "--ratio", "2")
    assert status == 0, err
    panels = json.loads((tmp_path / "otel_llm.json").read_text())["panels"]
    description = next(p["description"] for p in panels if p.get("title") == "TTFT change vs $shift")
    assert "+100% is the regression alert's ratio (2x)" in description
