"""Grafana dashboards for the metrics otel_llm emits, generated from plain data (DESIGN.md sections 3 and 5).

``render_dashboards()`` maps file names to the JSON checked in under ``grafana/dashboards/``; ``otel-llm dashboards``
writes them or, with ``--check``, fails when the checked-in files differ. Every query names metrics through
``_semconv.prometheus_name`` and reads both name sets (per series ``a or b``) and both bucket spellings, like the
alert rules of ``_rules``, whose thresholds the panels draw as lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from functools import reduce
from itertools import pairwise
from pathlib import Path
from typing import Any, Final

from otel_llm import _rules
from otel_llm import _semconv as sc
from otel_llm._rules import RuleConfig, le_matcher, number
from otel_llm._semconv import prometheus_name

Json = dict[str, Any]
# one name set's view of a quantity: (family, extra label matchers)
Source = tuple[tuple[str, str], ...]

DEFAULT_OUTPUT_DIR: Final = Path("grafana/dashboards")
SCHEMA_VERSION: Final = 39
DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
RATE: Final = "$__rate_interval"
RANGE: Final = "$__range"

JOB: Final = _rules.JOB
PROVIDER: Final = _rules.PROVIDER
MODEL: Final = _rules.MODEL
OPERATION: Final = prometheus_name(sc.OPERATION_NAME)
ERROR_TYPE: Final = _rules.ERROR_TYPE
TOKEN_TYPE: Final = prometheus_name(sc.TOKEN_TYPE)
PROMPT_SIZE: Final = prometheus_name(sc.PROMPT_SIZE)
STREAM: Final = prometheus_name(sc.REQUEST_STREAM)
RATE_LIMIT_RESOURCE: Final = prometheus_name(sc.RATE_LIMIT_RESOURCE)
PER_MODEL: Final = (JOB, PROVIDER, MODEL)

# (label, dashboard variable) pairs every query filters on
FILTERS: Final = ((JOB, "job"), (PROVIDER, "provider"), (MODEL, "model"), (OPERATION, "operation"))

_S, _X = sc.STABLE_NAMES, sc.LATEST_EXPERIMENTAL_NAMES


def _source(*pairs: tuple[sc.Instrument | None, str]) -> Source:
    found: dict[str, str] = {}
    for instrument, matchers in pairs:
        if instrument is not None:
            found.setdefault(prometheus_name(instrument), matchers)
    return tuple(found.items())


TTFT: Final = _source((_S.time_to_first_chunk, ""), (_X.time_to_first_chunk, ""))
TPOT: Final = _source((_S.time_per_output_token, ""), (_X.time_per_output_token, ""))
CHUNK_GAP: Final = _source((_S.time_per_output_chunk, ""), (_X.time_per_output_chunk, ""))
# every operation's duration: the newer names keep embeddings' apart (same buckets), streams are inference only
INFERENCE_DURATION: Final = _source((_S.duration, ""), (_X.duration, ""))
DURATION: Final = _source((_S.duration, ""), (_X.duration, ""), (_X.embeddings_duration, ""))
INPUT_TOKENS: Final = _source((_S.token_usage, f'{TOKEN_TYPE}="{sc.TOKEN_INPUT}"'), (_X.input_tokens, ""),
                              (_X.embeddings_input_tokens, ""))
OUTPUT_TOKENS: Final = _source((_S.token_usage, f'{TOKEN_TYPE}="{sc.TOKEN_OUTPUT}"'), (_X.output_tokens, ""))
PROMPT_LENGTH: Final = _source((_S.prompt_length, ""), (_X.prompt_length, ""))
RATE_LIMIT_REMAINING: Final = _source((_S.rate_limit_remaining, ""), (_X.rate_limit_remaining, ""))
RATE_LIMIT_LIMIT: Final = _source((_S.rate_limit_limit, ""), (_X.rate_limit_limit, ""))

FAILED: Final = f'{ERROR_TYPE}!~"{"|".join(("", *_rules.CALLER_ENDED_ERROR_TYPES))}"'
FAILED_ANY: Final = f'{ERROR_TYPE}!=""'
RATE_LIMITED: Final = f'{ERROR_TYPE}=~"{"|".join(_rules.RATE_LIMIT_ERROR_TYPES)}"'


# --- PromQL ---------------------------------------------------------------------------------------------------


def _selector(*extra: str) -> str:
    matchers = [f'{label}=~"${variable}"' for label, variable in FILTERS] + [m for m in extra if m]
    return "{" + ", ".join(matchers) + "}"


def _by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def series(source: Source, suffix: str, *, extra: str = "", window: str = RATE, offset: str = "",
           function: str = "rate") -> str:
    """``function(a{filters}[window]) or function(b{filters}[window])`` over the name sets of ``source``."""
    shift = f" offset {offset}" if offset else ""
    return " or ".join(
        f"{function}({family}{suffix}{_selector(matchers, extra)}[{window}]{shift})" for family, matchers in source
    )


def total(source: Source, suffix: str, by: Sequence[str] = (), **options: str) -> str:
    """The sum of each family of ``source``, added where several have the group (an instance that switched name sets
    within the window; embeddings and inference of one model) and each alone elsewhere, as the alert rules take
    them (``_rules.sum_by``)."""
    sums = [f"sum{_by(by)}{' ' if by else ''}({series((family,), suffix, **options)})" for family in source]
    return reduce(added, sums)


def added(first: str, second: str) -> str:
    """``_rules.added`` on one line: the two added for the groups both have, either alone for the others."""
    return f"(({first} + {second}) or {first} or {second})"


def quantile(q: float, source: Source, by: Sequence[str] = (), *, window: str = RATE, offset: str = "") -> str:
    buckets = total(source, "_bucket", ("le", *by), window=window, offset=offset)
    return f"histogram_quantile({number(q)}, {buckets})"


def share(part: str, whole: str) -> str:
    return f"{part} / {whole}"


def heatmap_buckets(source: Source) -> str:
    # one row per bucket edge whichever exporter spelled it (le="2.0" and le="2" become "2")
    increases = series(source, "_bucket", function="increase")
    return f'sum by (le) (label_replace({increases}, "le", "$1", "le", "(.+)\\\\.0"))'


def mean(source: Source, by: Sequence[str] = (), window: str = RATE) -> str:
    return f"{total(source, '_sum', by, window=window)} / {total(source, '_count', by, window=window)}"


def streams(by: Sequence[str] = (), window: str = RATE) -> str:
    """Streamed requests as the TTFT SLO counts them (the alert rules' ``_streams``): those with a first token, and
    those that failed before one (in the duration histogram only); not those their caller ended before one."""
    not_by_caller = total(INFERENCE_DURATION, "_count", by, extra=f'{STREAM}="true", {_rules.NOT_CALLER_ENDED}',
                          window=window)
    by_caller_after_a_token = total(TTFT, "_count", by, extra=_rules.CALLER_ENDED, window=window)
    return added(not_by_caller, by_caller_after_a_token)


def fast_share(config: RuleConfig, by: Sequence[str] = (), window: str = RATE) -> str:
    """Share of streams whose first token came within the SLO threshold (a bucket edge, so exact); 0 where none
    came at all, at most 1 where all did (the rules' clamp: rates extrapolated series by series)."""
    every = streams(by, window)
    fast = total(TTFT, "_bucket", by, extra=le_matcher(config.slo_threshold), window=window)
    return f"clamp_max({share(f'({fast} or {every} * 0)', every)}, 1)"


def slow_share(config: RuleConfig, by: Sequence[str] = (), window: str = RATE) -> str:
    return f"1 - ({fast_share(config, by, window)})"


def legend(*labels: str, prefix: str = "") -> str:
    """A Grafana legend naming ``labels`` (``{{label}}``), after ``prefix``."""
    return " ".join([prefix] * bool(prefix) + [f"{{{{{label}}}}}" for label in labels])


# --- panels ---------------------------------------------------------------------------------------------------


def target(expr: str, legend_format: str = "", *, ref: str = "A", instant: bool = False, fmt: str = "time_series",
           exemplar: bool = False) -> Json:
    return {
        "datasource": DATASOURCE,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend_format or "__auto",
        "range": not instant,
        "instant": instant,
        "format": fmt,
        "exemplar": exemplar,
    }


def _targets(*queries: tuple[str, str]) -> list[Json]:
    return [target(expr, text, ref=chr(ord("A") + i)) for i, (expr, text) in enumerate(queries)]


def _thresholds(*steps: tuple[float, str]) -> Json:
    return {"mode": "absolute", "steps": [{"color": "green", "value": None}]
            + [{"color": color, "value": value} for value, color in steps]}


def timeseries(title: str, description: str, targets: list[Json], unit: str, *, line: float | None = None,
               bars: bool = False, log: bool = False) -> Json:
    """A time series panel; ``line`` draws a threshold (an alert's or a rule of thumb) as a red dashed line."""
    custom: Json = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 60 if bars else 0,
        "showPoints": "never",
        "spanNulls": False,
        "axisSoftMin": 0,
        "thresholdsStyle": {"mode": "off" if line is None else "dashed"},
    }
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": 2}
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "color": {"mode": "palette-classic"},
                "custom": custom,
                "thresholds": _thresholds() if line is None else _thresholds((line, "red")),
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "right", "showLegend": True, "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def stat(title: str, description: str, targets: list[Json], unit: str, *, steps: tuple[tuple[float, str], ...] = (),
         base: str = "green", decimals: int | None = None) -> Json:
    thresholds = _thresholds(*steps)
    thresholds["steps"][0]["color"] = base
    defaults: Json = {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": thresholds}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "value_and_name",
            "wideLayout": True,
        },
        "targets": targets,
    }


def instant(*queries: tuple[str, str]) -> list[Json]:
    return [target(expr, text, ref=chr(ord("A") + i), instant=True) for i, (expr, text) in enumerate(queries)]


def heatmap(title: str, description: str, source: Source, unit: str) -> Json:
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "steps": 64,
                      "reverse": False, "fill": "dark-orange"},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "yAxis": {"axisPlacement": "left", "reverse": False, "unit": unit},
        },
        "targets": [target(heatmap_buckets(source), "{{le}}", fmt="heatmap", exemplar=True)],
    }


def table(title: str, description: str, columns: Sequence[tuple[str, str, str]]) -> Json:
    """One row per service/provider/model; ``columns`` are (header, unit, instant query grouped by PER_MODEL)."""
    targets = [target(expr, ref=chr(ord("A") + i), instant=True, fmt="table")
               for i, (_, _, expr) in enumerate(columns)]
    rename = {f"Value #{t['refId']}": header for t, (header, _, _) in zip(targets, columns, strict=True)}
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
            "overrides": [
                {"matcher": {"id": "byName", "options": header}, "properties": [{"id": "unit", "value": unit}]}
                for header, unit, _ in columns
            ],
        },
        "options": {"showHeader": True, "cellHeight": "sm", "sortBy": [{"displayName": columns[0][0], "desc": True}]},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {
                JOB: "service", PROVIDER: "provider", MODEL: "model", **rename}}},
        ],
        "targets": targets,
    }


# --- what the descriptions say about resolution -------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{number(value * 1000)} ms" if value < 1 else f"{number(value)} s"


def _bucket_note(buckets: Sequence[float], low: float, high: float) -> str:
    widest = max(b / a for a, b in pairwise(buckets) if low <= a and b <= high)
    return (
        f"Quantiles are interpolated linearly inside histogram buckets: edges from {_seconds(buckets[0])} to "
        f"{_seconds(buckets[-1])}, at most {round((widest - 1) * 100)}% apart between {_seconds(low)} and "
        f"{_seconds(high)}, which keeps p99 within about 10% of the exact value there; anything slower than "
        f"{_seconds(buckets[-1])} shows as {_seconds(buckets[-1])}. A p99 needs about 1,000 requests per point to be "
        "stable."
    )


LATENCY_NOTE: Final = _bucket_note(sc.LATENCY_BUCKETS, 0.1, 5.0)
CHUNK_NOTE: Final = _bucket_note(sc.CHUNK_BUCKETS, 0.001, 1.0)
COUNT_NOTE: Final = (
    "Token and character histograms have buckets at powers of 4, so a quantile is only placed within a factor of "
    "4 (interpolated linearly inside it); sums and rates are exact."
)
NAMES_NOTE: Final = "Reads both metric-name sets (default and gen_ai_latest_experimental)."


# --- the dashboard --------------------------------------------------------------------------------------------


def _quantiles(source: Source, by: Sequence[str], legend: str) -> list[Json]:
    return _targets(*((quantile(q, source, by), f"p{round(q * 100)} {legend}") for q in (0.5, 0.95, 0.99)))


def _overview(config: RuleConfig) -> list[tuple[Json, int, int]]:
    threshold = number(config.slo_threshold)
    change_steps = ((0.2, "orange"), (config.regression_ratio - 1, "red"))

    def quantiles_now(source: Source) -> list[Json]:
        return instant(*((quantile(q, source, window=RANGE), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)))

    def change(source: Source) -> list[Json]:
        return instant(*(
            (f"{quantile(q, source, window=RANGE)} / {quantile(q, source, window=RANGE, offset='$shift')} - 1",
             f"p{round(q * 100)}")
            for q in (0.5, 0.95, 0.99)
        ))

    return [
        (stat("Requests/s", f"Operations per second (every operation, streamed or not). {NAMES_NOTE}",
              _targets((total(DURATION, "_count"), "requests/s")), "reqps"), 4, 5),
        (stat("Output tokens/s", "Output tokens per second as the providers report them (never estimated). "
              + NAMES_NOTE, _targets((total(OUTPUT_TOKENS, "_sum"), "tokens/s")), "short"), 4, 5),
        (stat("Errors", "Share of operations that failed: error.type set, other than cancelled or abandoned streams "
              "(the caller's choice).",
              _targets((share(f"({total(DURATION, '_count', extra=FAILED)} or vector(0))",
                              total(DURATION, "_count")), "failed")),
              "percentunit", steps=((0.01, "orange"), (config.error_ratio, "red"))), 4, 5),
        (stat("Rate limited (429)/s", "Operations per second that ended with a rate-limit error after the client's "
              f"own retries ({', '.join(_rules.RATE_LIMIT_ERROR_TYPES)}).",
              _targets((f"{total(DURATION, '_count', extra=RATE_LIMITED)} or vector(0)", "429/s")), "reqps",
              steps=((0.001, "orange"),)), 4, 5),
        (stat(f"TTFT SLO: share within {threshold} s",
              f"Share of streamed requests whose first content chunk arrived within {threshold} s over the dashboard "
              f"range; the SLO target is {number(config.slo_target * 100)}%. The threshold is a bucket edge, so this "
              "share is exact.",
              instant((fast_share(config, window=RANGE), "within SLO")),
              "percentunit", base="red", steps=((config.slo_target, "green"),), decimals=2), 8, 5),
        (stat("Time to first token", "p50, p95 and p99 time to first content chunk over the dashboard range, "
              f"streamed requests only. {LATENCY_NOTE}", quantiles_now(TTFT), "s"), 6, 5),
        (stat("TTFT change vs $shift", "The same quantiles over the same range one comparison shift earlier: "
              f"+{number((config.regression_ratio - 1) * 100)}% is the regression alert's ratio "
              f"({number(config.regression_ratio)}x). Bucket interpolation limits "
              "small changes: under about 10% is noise.", change(TTFT), "percentunit", steps=change_steps), 6, 5),
        (stat("Time per output token", "p50, p95 and p99 per-request time per output token over the dashboard "
              f"range: (last content chunk - first) / (output tokens - 1). {CHUNK_NOTE}", quantiles_now(TPOT), "s"),
         6, 5),
        (stat("TPOT change vs $shift", "The same quantiles one comparison shift earlier. Changes under about 10% are "
              "within bucket resolution.", change(TPOT), "percentunit", steps=change_steps), 6, 5),
    ]


def _ttft_row(config: RuleConfig) -> list[tuple[Json, int, int]]:
    threshold = number(config.slo_threshold)
    window, by_model = config.regression_window, [MODEL]
    p99_now = quantile(0.99, TTFT, by_model, window=window)
    p99_then = quantile(0.99, TTFT, by_model, window=window, offset="$shift")
    return [
        (timeseries("TTFT p50 / p95 / p99 by model",
                    "Time from the request being issued to the first chunk that carries output content (role-only "
                    f"and start events do not count), streamed requests. {LATENCY_NOTE} {NAMES_NOTE}",
                    _quantiles(TTFT, by_model, legend(MODEL)), "s"), 12, 9),
        (timeseries("TTFT p99 now and $shift earlier",
                    f"p99 over the alert's {window} window, now and one comparison shift earlier (dashed). "
                    + LATENCY_NOTE,
                    _targets((p99_now, legend(MODEL, prefix="now")),
                             (p99_then, legend(MODEL, prefix="$shift earlier"))), "s"), 12, 9),
        (timeseries("TTFT p99 ratio to $shift earlier",
                    f"p99 over {window} divided by the same p99 one comparison shift earlier. The red line is the "
                    f"regression alert's ratio ({number(config.regression_ratio)}x; the alert also needs "
                    f"+{number(config.regression_min_increase)} s and {config.regression_min_requests} streams per "
                    f"window, compares with {config.regression_offset} earlier and holds {config.regression_for}).",
                    _targets((f"{p99_now} / {p99_then}", legend(MODEL))), "none",
                    line=config.regression_ratio), 12, 8),
        (heatmap("TTFT distribution (exemplars link to traces)",
                 "Streams per TTFT bucket over time; exemplar dots open the trace of a request in that bucket (OTLP "
                 "and Collector paths keep exemplars; the Python Prometheus exporter drops them). Rows are the SDK's "
                 "bucket edges.", TTFT, "s"), 12, 8),
        (timeseries(f"Share of streams slower than {threshold} s",
                    f"Share of streamed requests whose first content chunk took longer than {threshold} s (the SLO "
                    f"threshold, a bucket edge, so exact). The red line is the error budget "
                    f"({number(config.error_budget * 100)}%); the SLO burn alert pages at "
                    + ", ".join(f"{number(p.factor)}x over {p.long}/{p.short}" for p in config.burn_windows) + ".",
                    _targets((slow_share(config, by_model), legend(MODEL))), "percentunit",
                    line=config.error_budget), 12, 8),
        (timeseries("Streamed requests per p99 point",
                    "How many streams each point of the p99 panels summarises. Below the red line (about 1,000) a "
                    "p99 rests on the slowest handful of requests and jumps around.",
                    _targets((total(TTFT, "_count", by_model, function="increase"), legend(MODEL))),
                    "short", line=1000, bars=True), 12, 8),
        (timeseries("TTFT p99 by prompt size",
                    "p99 time to first token split by the prompt-size class of the request (characters sent), to "
                    f"tell a slow provider from long prompts. {LATENCY_NOTE}",
                    _targets((quantile(0.99, TTFT, [PROMPT_SIZE]), legend(PROMPT_SIZE))), "s"), 12, 8),
        (timeseries("TTFT per 1k input tokens",
                    "Mean time to first token divided by mean input tokens per request, times 1,000: prefill cost "
                    "per 1k tokens by model. Means, not quantiles (exact from sums and counts); input tokens include "
                    "non-streamed requests of the same model.",
                    _targets((f"({mean(TTFT, by_model)}) / ({mean(INPUT_TOKENS, by_model)}) * 1000",
                              legend(MODEL))), "s"), 12, 8),
    ]


def _tpot_row(config: RuleConfig) -> list[tuple[Json, int, int]]:
    window, by_model = config.regression_window, [MODEL]
    p99_now = quantile(0.99, TPOT, by_model, window=window)
    p99_then = quantile(0.99, TPOT, by_model, window=window, offset="$shift")
    return [
        (timeseries("TPOT p50 / p95 / p99 by model",
                    "Per-request time per output token: (last content chunk - first content chunk) / (output tokens "
                    f"- 1), streamed requests with at least 2 output tokens. {CHUNK_NOTE}",
                    _quantiles(TPOT, by_model, legend(MODEL)), "s"), 12, 8),
        (timeseries("Gap between chunks p50 / p95 / p99 by model",
                    "Time between consecutive content chunks of a stream, one value per chunk after the first: long "
                    f"tails show stalls that per-request TPOT averages away. {CHUNK_NOTE} {NAMES_NOTE}",
                    _quantiles(CHUNK_GAP, by_model, legend(MODEL)), "s"), 12, 8),
        (heatmap("TPOT distribution (exemplars link to traces)",
                 "Streams per time-per-output-token bucket over time; exemplar dots open a trace in that bucket.",
                 TPOT, "s"), 12, 8),
        (timeseries("TPOT p99 ratio to $shift earlier",
                    f"p99 TPOT over {window} divided by the same one comparison shift earlier; the red line is the "
                    f"TPOT regression alert's ratio ({number(config.regression_ratio)}x, which also needs "
                    f"+{_seconds(config.tpot_min_increase)}). {CHUNK_NOTE}",
                    _targets((f"{p99_now} / {p99_then}", legend(MODEL))), "none",
                    line=config.regression_ratio), 12, 8),
    ]


def _duration_row() -> list[tuple[Json, int, int]]:
    return [
        (timeseries("Duration p50 / p95 / p99 by model and operation",
                    "Request issued to response fully received (or failed), every operation. "
                    f"{LATENCY_NOTE} {NAMES_NOTE}",
                    _quantiles(DURATION, [MODEL, OPERATION], legend(MODEL, OPERATION)),
                    "s"), 12, 8),
        (timeseries("Duration p99, streamed and not",
                    "p99 duration split by gen_ai.request.stream: a streamed duration runs to the last chunk, so "
                    f"compare it with TTFT, not with non-streamed calls. {LATENCY_NOTE}",
                    _targets((quantile(0.99, DURATION, [MODEL, STREAM]),
                              legend(MODEL, STREAM))), "s"), 12, 8),
        (heatmap("Duration distribution (exemplars link to traces)",
                 "Operations per duration bucket over time; exemplar dots open a trace in that bucket.",
                 DURATION, "s"), 24, 8),
    ]


def _workload_row() -> list[tuple[Json, int, int]]:
    by = [MODEL, OPERATION]
    return [
        (timeseries("Requests/s by model and operation", f"Operations per second. {NAMES_NOTE}",
                    _targets((total(DURATION, "_count", by), legend(MODEL, OPERATION))),
                    "reqps"), 12, 8),
        (timeseries("Tokens/s by model", "Input and output tokens per second as reported by the providers. "
                    + NAMES_NOTE,
                    _targets((total(INPUT_TOKENS, "_sum", [MODEL]), legend(MODEL, prefix="input")),
                             (total(OUTPUT_TOKENS, "_sum", [MODEL]), legend(MODEL, prefix="output"))),
                    "short"), 12, 8),
        (timeseries("Input tokens per request p50 / p95 / p99", f"Input tokens per operation. {COUNT_NOTE}",
                    _quantiles(INPUT_TOKENS, [MODEL], legend(MODEL)), "short", log=True), 8, 8),
        (timeseries("Output tokens per request p50 / p95 / p99", f"Output tokens per operation. {COUNT_NOTE}",
                    _quantiles(OUTPUT_TOKENS, [MODEL], legend(MODEL)), "short", log=True), 8, 8),
        (timeseries("Prompt length p50 / p95 / p99 (characters)",
                    f"Characters of all input text sent, measured before the call. {COUNT_NOTE}",
                    _quantiles(PROMPT_LENGTH, [MODEL], legend(MODEL)), "short", log=True), 8, 8),
    ]


def _outcomes_row(config: RuleConfig) -> list[tuple[Json, int, int]]:
    # each endpoint's own share (its remaining over its own limit), then the least of a model's endpoints: the least
    # remaining over the largest limit of two endpoints would be neither's
    remaining = f"({series(RATE_LIMIT_REMAINING, '', function='last_over_time')})"
    limit = f"({series(RATE_LIMIT_LIMIT, '', function='last_over_time')})"
    headroom = f"min by ({MODEL}, {RATE_LIMIT_RESOURCE}) ({remaining} / {limit})"
    return [
        (timeseries("Errors/s by type",
                    "Failed operations per second by error.type (the exception's class name; cancelled and "
                    "abandoned are streams the caller did not finish).",
                    _targets((total(DURATION, "_count", [ERROR_TYPE], extra=FAILED_ANY), legend(ERROR_TYPE))),
                    "reqps", bars=True), 12, 8),
        (timeseries("Error share by model",
                    "Share of operations that failed, cancelled and abandoned streams excluded. The red line is the "
                    f"error alert's threshold ({number(config.error_ratio * 100)}% over {config.outcome_window}).",
                    _targets((share(total(DURATION, "_count", [MODEL], extra=FAILED),
                                    total(DURATION, "_count", [MODEL])), legend(MODEL))),
                    "percentunit", line=config.error_ratio), 12, 8),
        (timeseries("Rate limited (429)/s by model",
                    "Operations per second that ended rate limited after the client's own retries "
                    f"({', '.join(_rules.RATE_LIMIT_ERROR_TYPES)}).",
                    _targets((total(DURATION, "_count", [MODEL], extra=RATE_LIMITED), legend(MODEL))),
                    "reqps", bars=True), 12, 8),
        (timeseries("Rate-limit headroom",
                    "Remaining requests or tokens divided by the limit, from the rate-limit headers of the latest "
                    "response (gauges, only for providers that send them); of a model served by several endpoints, "
                    "the one with the least. Under the red line (10%) the next burst will be throttled.",
                    _targets((headroom, legend(MODEL, RATE_LIMIT_RESOURCE))),
                    "percentunit", line=0.1), 12, 8),
    ]


def _per_model(config: RuleConfig) -> list[tuple[Json, int, int]]:
    def q(value: float, source: Source) -> str:
        return quantile(value, source, PER_MODEL, window=RANGE)

    columns = [
        ("requests/s", "reqps", total(DURATION, "_count", PER_MODEL, window=RANGE)),
        ("errors", "percentunit", share(total(DURATION, "_count", PER_MODEL, extra=FAILED, window=RANGE),
                                         total(DURATION, "_count", PER_MODEL, window=RANGE))),
        ("429/s", "reqps", total(DURATION, "_count", PER_MODEL, extra=RATE_LIMITED, window=RANGE)),
        ("streams", "short", total(TTFT, "_count", PER_MODEL, window=RANGE, function="increase")),
        ("TTFT p50", "s", q(0.5, TTFT)),
        ("TTFT p99", "s", q(0.99, TTFT)),
        (f"within {number(config.slo_threshold)} s", "percentunit", fast_share(config, PER_MODEL, RANGE)),
        ("TPOT p99", "s", q(0.99, TPOT)),
        ("duration p99", "s", q(0.99, DURATION)),
        ("output tokens/s", "short", total(OUTPUT_TOKENS, "_sum", PER_MODEL, window=RANGE)),
    ]
    return [
        (table("Per model", "One row per service, provider and model over the dashboard range: request and error "
               "rates, streams, TTFT and TPOT quantiles, SLO share and output tokens. Quantiles interpolate inside "
               "buckets (about 10% on p99) and need about 1,000 streams to be stable: check the streams column.",
               columns), 24, 8),
    ]


def _layout(rows: Sequence[tuple[str, list[tuple[Json, int, int]]]]) -> list[Json]:
    panels: list[Json] = []
    y = 0
    for title, row in rows:
        panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        y += 1
        x = line_height = 0
        for panel, width, height in row:
            if x + width > 24:
                y, x, line_height = y + line_height, 0, 0
            panel["gridPos"] = {"h": height, "w": width, "x": x, "y": y}
            panels.append(panel)
            x, line_height = x + width, max(line_height, height)
        y += line_height
    for number_, panel in enumerate(panels, start=1):
        panel["id"] = number_
    return panels


def _variable(name: str, label: str, query_label: str, filters: Sequence[tuple[str, str]]) -> Json:
    names = "|".join(f"{family}_count" for family, _ in DURATION)
    matchers = ", ".join([f'__name__=~"{names}"'] + [f'{lbl}=~"${var}"' for lbl, var in filters])
    query = f"label_values({{{matchers}}}, {query_label})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "sort": 1,
        "regex": "",
        "hide": 0,
    }


def _templating() -> list[Json]:
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {},
         "options": [], "refresh": 1, "regex": "", "hide": 0},
        _variable("job", "Service", JOB, []),
        _variable("provider", "Provider", PROVIDER, [(JOB, "job")]),
        _variable("model", "Model", MODEL, [(JOB, "job"), (PROVIDER, "provider")]),
        _variable("operation", "Operation", OPERATION, [(JOB, "job"), (PROVIDER, "provider"), (MODEL, "model")]),
        {"name": "shift", "label": "Compare with", "type": "custom", "query": "1d,1w",
         "current": {"selected": True, "text": "1d", "value": "1d"},
         "options": [{"selected": True, "text": "1d", "value": "1d"}, {"selected": False, "text": "1w", "value": "1w"}],
         "includeAll": False, "multi": False, "hide": 0},
    ]


def alerts_query() -> str:
    names = "|".join(_rules.ALERT_NAMES)
    return f'ALERTS{{alertname=~"{names}", alertstate="firing", {JOB}=~"$job", {PROVIDER}=~"$provider", ' \
           f'{MODEL}=~"$model"}}'


def _annotations() -> list[Json]:
    return [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"name": "otel_llm alerts", "datasource": DATASOURCE, "enable": True, "hide": False, "iconColor": "red",
         "expr": alerts_query(), "step": "60s", "titleFormat": "{{alertname}}",
         "textFormat": legend(*PER_MODEL, "severity"), "tagKeys": f"severity,{MODEL}", "useValueForTime": False},
    ]


def llm_dashboard(config: RuleConfig) -> Json:
    rows = [
        ("Overview", _overview(config)),
        ("Time to first token", _ttft_row(config)),
        ("Time per output token", _tpot_row(config)),
        ("Duration", _duration_row()),
        ("Workload", _workload_row()),
        ("Outcomes", _outcomes_row(config)),
        ("Per model", _per_model(config)),
    ]
    return {
        "uid": "otel-llm-clients",
        "title": "LLM clients (otel_llm)",
        "description": "Latency (TTFT, TPOT, duration), workload and outcomes of instrumented LLM client calls.",
        "tags": ["otel_llm", "llm", "genai"],
        "editable": True,
        "graphTooltip": 1,
        "fiscalYearStartMonth": 0,
        "id": None,
        "links": [],
        "liveNow": False,
        "refresh": "1m",
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "weekStart": "",
        "version": 1,
        "annotations": {"list": _annotations()},
        "templating": {"list": _templating()},
        "panels": _layout(rows),
    }


def render_dashboards(config: RuleConfig | None = None) -> dict[str, str]:
    """File name -> JSON text of every dashboard, with the thresholds of ``config`` (defaults when None)."""
    dashboard = llm_dashboard(config or RuleConfig())
    return {"otel_llm.json": json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"}


def main_dashboards(argv: Sequence[str] | None = None) -> int:
    """``otel-llm dashboards``: write the dashboards to a directory, or ``--check`` that it holds them unchanged."""
    parser = argparse.ArgumentParser(
        prog="otel-llm dashboards", description="Render the Grafana dashboards for otel_llm metrics."
    )
    _rules.add_config_arguments(parser)
    parser.add_argument("-o", "--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                        help="directory of the dashboard JSON files (default %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a file in --output-dir differs from what is rendered")
    arguments = parser.parse_args(argv)
    try:
        rendered = render_dashboards(_rules.config_from_arguments(arguments))
    except ValueError as exc:
        parser.error(str(exc))
    directory: Path = arguments.output_dir
    if arguments.check:
        stale = [name for name, text in rendered.items()
                 if not (directory / name).is_file() or (directory / name).read_bytes() != text.encode()]
        for name in stale:
            print(f"{directory / name} differs from the generated dashboard; regenerate with "
                  f"otel-llm dashboards -o {directory}", file=sys.stderr)
        return 1 if stale else 0
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (directory / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        parser.error(f"--output-dir {directory}: {exc.strerror or exc}")
    return 0
