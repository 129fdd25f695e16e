"""Prometheus recording and alerting rules for the metrics otel_llm emits (DESIGN.md section 6).

``render_rules(RuleConfig())`` is the text of ``grafana/alerts/otel_llm_rules.yml``; ``otel-llm rules`` renders it
with other thresholds. Every query accepts both metric-name sets of DESIGN.md section 3 (each summed on its own and
the two added where a group has both, as an instance that switches sets has for a window's length) and both bucket
spellings (``le="2"`` from the Collector, ``le="2.0"`` from the Python exporter).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import reduce
from pathlib import Path
from typing import Final

from otel_llm import _semconv as sc
from otel_llm._semconv import prometheus_name

ALERT_TTFT_REGRESSION: Final = "LLMTimeToFirstTokenP99Regression"
ALERT_TTFT_SLO_BURN: Final = "LLMTimeToFirstTokenSLOBurn"
ALERT_TPOT_REGRESSION: Final = "LLMTimePerOutputTokenP99Regression"
ALERT_ERROR_RATIO: Final = "LLMErrorRatioHigh"
ALERT_RATE_LIMITED: Final = "LLMRateLimited"
ALERT_NAMES: Final = (
    ALERT_TTFT_REGRESSION,
    ALERT_TTFT_SLO_BURN,
    ALERT_TPOT_REGRESSION,
    ALERT_ERROR_RATIO,
    ALERT_RATE_LIMITED,
)

RATE_LIMIT_ERROR_TYPES: Final = sc.RATE_LIMIT_ERROR_TYPES
CALLER_ENDED_ERROR_TYPES: Final = sc.CALLER_ENDED_ERROR_TYPES

JOB: Final = "job"
PROVIDER: Final = prometheus_name(sc.PROVIDER_NAME)
MODEL: Final = prometheus_name(sc.REQUEST_MODEL)
ERROR_TYPE: Final = prometheus_name(sc.ERROR_TYPE)
STREAM: Final = prometheus_name(sc.REQUEST_STREAM)
# streams the caller ended (cancelled, dropped) and every other operation, for the SLO's streams here and in dashboards
CALLER_ENDED: Final = f'{ERROR_TYPE}=~"{"|".join(CALLER_ENDED_ERROR_TYPES)}"'
NOT_CALLER_ENDED: Final = f'{ERROR_TYPE}!~"{"|".join(CALLER_ENDED_ERROR_TYPES)}"'
# every alert is judged per service, provider and model; the recorded series carry exactly these labels
GROUP_LABELS: Final = (JOB, PROVIDER, MODEL)
_LEVEL: Final = "job_provider_model"
_QUANTILE: Final = 0.99

_DURATION = re.compile(r"^([1-9][0-9]*)(ms|s|m|h|d|w|y)$")
_DURATION_SECONDS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
# Prometheus keeps a duration in int64 nanoseconds and refuses to parse a longer one (a little over 292y)
_LONGEST_DURATION_S: Final = (2**63 - 1) / 1e9
# the rules assume no scrape interval of their own: at Prometheus's default of 1m, a rate() window under 1m may hold
# fewer than the two samples it needs, and the SDK's default export interval (60 s) changes a series only that often
SHORTEST_RATE_WINDOW: Final = "1m"
_PLAIN_YAML = re.compile(r"^[A-Za-z_][A-Za-z0-9_:.]*$")


def duration_seconds(duration: str) -> float:
    """Seconds in a Prometheus duration of one unit (``30m``, ``1d``); ValueError otherwise."""
    match = _DURATION.match(duration)
    if match is None:
        raise ValueError(f"{duration!r} is not a Prometheus duration of one unit, like 30m, 6h or 1d")
    return int(match[1]) * _DURATION_SECONDS[match[2]]


def _check_duration(name: str, value: str, *, rate_window: bool = False) -> None:
    """A duration Prometheus can parse; a ``rate_window`` also at least `SHORTEST_RATE_WINDOW` long."""
    try:
        seconds = duration_seconds(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if seconds > _LONGEST_DURATION_S:
        raise ValueError(f"{name} {value} is longer than Prometheus can parse (at most 292y, or 106751d)")
    if rate_window and seconds < duration_seconds(SHORTEST_RATE_WINDOW):
        raise ValueError(f"{name} {value} is shorter than {SHORTEST_RATE_WINDOW}: rate() needs two samples in its "
                         f"window, which a shorter one may not hold at a {SHORTEST_RATE_WINDOW} scrape or export "
                         "interval")


def number(value: float) -> str:
    """A float as PromQL reads it, without float noise: 2.0 -> ``2``, 1 - 0.99 -> ``0.01``."""
    text = repr(round(value, 12))
    return text[:-2] if text.endswith(".0") else text


def le_matcher(bound: float) -> str:
    """A ``le`` matcher for one bucket edge that accepts every exporter's spelling (``2`` and ``2.0``)."""
    spellings = dict.fromkeys((number(bound), repr(float(bound))))
    if len(spellings) == 1:
        return f'le="{next(iter(spellings))}"'
    return 'le=~"' + "|".join(s.replace(".", "\\\\.") for s in spellings) + '"'


def family_names(*instruments: sc.Instrument | None) -> tuple[str, ...]:
    """Prometheus family names of ``instruments``, once each, in order (the two name sets share some)."""
    return tuple(dict.fromkeys(prometheus_name(i) for i in instruments if i is not None))


def _ttft_families() -> tuple[str, ...]:
    return family_names(sc.STABLE_NAMES.time_to_first_chunk, sc.LATEST_EXPERIMENTAL_NAMES.time_to_first_chunk)


def _tpot_families() -> tuple[str, ...]:
    return family_names(sc.STABLE_NAMES.time_per_output_token, sc.LATEST_EXPERIMENTAL_NAMES.time_per_output_token)


def _inference_duration_families() -> tuple[str, ...]:
    return family_names(sc.STABLE_NAMES.duration, sc.LATEST_EXPERIMENTAL_NAMES.duration)


def _duration_families() -> tuple[str, ...]:
    """Every operation's: the newer names keep embeddings' duration apart from inference."""
    return family_names(sc.STABLE_NAMES.duration, sc.LATEST_EXPERIMENTAL_NAMES.duration,
                        sc.LATEST_EXPERIMENTAL_NAMES.embeddings_duration)


@dataclass(frozen=True, slots=True)
class BurnWindows:
    """One multi-window burn-rate pair: page when both windows burn the error budget ``factor`` times too fast."""

    long: str
    short: str
    factor: float


@dataclass(frozen=True, slots=True)
class RuleConfig:
    """Thresholds of the generated rules. Change them by regenerating the files, not by editing expressions."""

    # p99 regression (TTFT and TPOT): now against the same window ``regression_offset`` earlier
    regression_ratio: float = 1.5
    regression_min_increase: float = 0.25  # seconds, TTFT
    tpot_min_increase: float = 0.01  # seconds, time per output token
    regression_window: str = "30m"
    regression_offset: str = "1d"
    regression_min_requests: int = 100  # streamed requests in each of the two windows
    regression_for: str = "15m"
    # TTFT SLO: slo_target of streamed requests see their first token within slo_threshold seconds
    slo_threshold: float = 2.0
    slo_target: float = 0.99
    burn_windows: tuple[BurnWindows, ...] = (BurnWindows("1h", "5m", 14.4), BurnWindows("6h", "30m", 6.0))
    slo_min_requests: int = 100  # streamed requests in a pair's long window before it may page
    slo_for: str = "2m"
    # outcomes: failed and throttled operations as a share of all operations
    error_ratio: float = 0.05
    rate_limited_ratio: float = 0.02
    outcome_window: str = "15m"
    outcome_min_requests: int = 100
    outcome_for: str = "10m"

    def __post_init__(self) -> None:
        for name in ("regression_offset", "regression_for", "slo_for", "outcome_for"):
            _check_duration(name, getattr(self, name))
        for name in ("regression_window", "outcome_window"):
            _check_duration(name, getattr(self, name), rate_window=True)
        if duration_seconds(self.regression_offset) < duration_seconds(self.regression_window):
            raise ValueError(
                f"regression_offset {self.regression_offset} is shorter than regression_window "
                f"{self.regression_window}: the two windows would overlap"
            )
        if not 1 < self.regression_ratio < math.inf:
            raise ValueError(f"regression_ratio must be a finite number above 1, got {self.regression_ratio}")
        if number(self.regression_ratio) == "1":
            raise ValueError(f"regression_ratio {self.regression_ratio} is 1 to the 12 digits the rules are written "
                             "with: it must be above 1")
        for name in ("regression_min_increase", "tpot_min_increase"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds, zero or more, got {getattr(self, name)}")
        for name in ("regression_min_requests", "slo_min_requests", "outcome_min_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of requests of at least 1, got {value!r}")
        if self.slo_threshold not in sc.LATENCY_BUCKETS:
            below = [b for b in sc.LATENCY_BUCKETS if b < self.slo_threshold]
            above = [b for b in sc.LATENCY_BUCKETS if b > self.slo_threshold]
            near = ", ".join(number(b) for b in (below[-1:] + above[:1])) or ", ".join(map(number, sc.LATENCY_BUCKETS))
            raise ValueError(
                f"slo_threshold {number(self.slo_threshold)} s is not a bucket edge of the latency histograms "
                f"(_semconv.LATENCY_BUCKETS), so no query can count requests under it exactly; nearest edges: {near}"
            )
        if not 0 < self.slo_target < 1:
            raise ValueError(f"slo_target must lie strictly between 0 and 1, got {self.slo_target}")
        if self.error_budget == 0:
            raise ValueError(f"slo_target {self.slo_target} leaves no error budget: 1 - target rounds to 0 at the 12 "
                             "digits the rules are written with; use a target of at most 0.999999999999")
        if not self.burn_windows:
            raise ValueError("burn_windows needs at least one pair of windows")
        for pair in self.burn_windows:
            _check_duration("burn window", pair.long, rate_window=True)
            _check_duration("burn window", pair.short, rate_window=True)
            if duration_seconds(pair.short) >= duration_seconds(pair.long):
                raise ValueError(f"burn windows {pair.long}/{pair.short}: the short window must be the shorter one")
            if not 0 < pair.factor * self.error_budget < 1:
                raise ValueError(
                    f"burn factor {number(pair.factor)} with slo_target {self.slo_target} would need "
                    f"{number(pair.factor * self.error_budget * 100)}% slow requests to page; it must stay under 100%"
                )
        for name in ("error_ratio", "rate_limited_ratio"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must lie strictly between 0 and 1, got {getattr(self, name)}")

    @property
    def error_budget(self) -> float:
        return round(1 - self.slo_target, 12)


# --- PromQL ---------------------------------------------------------------------------------------------------


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in text.splitlines())


def sum_by(
    function: str,
    families: Sequence[str],
    suffix: str,
    window: str,
    *,
    by: Sequence[str],
    matchers: str = "",
    offset: str = "",
) -> str:
    """``sum by (by) (function(a[window]))`` of each family, added where several have the group (an instance that
    switched name sets within the window: its old series still hold the time before the switch, the new ones the
    time after; a model both embeds and answers under the newer names) and each alone elsewhere:
    ``((A + B) or A or B)``, and so on for a third."""
    selector = f"{{{matchers}}}" if matchers else ""
    shift = f" offset {offset}" if offset else ""
    sums = [f"sum by ({', '.join(by)}) (\n  {function}({family}{suffix}{selector}[{window}]{shift})\n)"
            for family in families]
    return reduce(added, sums)


def added(first: str, second: str) -> str:
    """``((first + second) or first or second)``: the two added for the groups both have (a sum of two vectors keeps
    only those), either alone for the others."""
    both = f"(\n{_indent(first, 2)}\n  +\n{_indent(second, 2)}\n)"
    return f"(\n{_indent(both, 2)}\n  or\n{_indent(first, 2)}\n  or\n{_indent(second, 2)}\n)"


@dataclass(frozen=True, slots=True)
class Rule:
    """One recording rule (``alert`` empty) or alerting rule."""

    expr: str
    record: str = ""
    alert: str = ""
    for_: str = ""
    labels: Mapping[str, str] | None = None
    annotations: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class RuleGroup:
    name: str
    rules: tuple[Rule, ...]


def _record(name: str, expr: str) -> Rule:
    return Rule(expr=expr, record=name)


def _p99(families: Sequence[str], window: str, offset: str = "") -> str:
    rates = sum_by("rate", families, "_bucket", window, by=(*GROUP_LABELS, "le"), offset=offset)
    return f"histogram_quantile({number(_QUANTILE)},\n{_indent(rates, 2)}\n)"


def _increase(families: Sequence[str], window: str, offset: str = "", matchers: str = "") -> str:
    return sum_by("increase", families, "_count", window, by=GROUP_LABELS, offset=offset, matchers=matchers)


def _ratio(families: Sequence[str], suffix: str, matchers: str, window: str) -> str:
    part = sum_by("rate", families, suffix, window, by=GROUP_LABELS, matchers=matchers)
    whole = sum_by("rate", families, "_count", window, by=GROUP_LABELS)
    return f"{part}\n/\n{whole}"


def _grouping_text() -> str:
    return " / ".join(f"{{{{ $labels.{label} }}}}" for label in GROUP_LABELS)


def _baseline_query(record: str) -> str:
    # Go template: look up the baseline series of the alert's own labels to show it beside $value
    selector = ", ".join(f"{label}=%q" for label in GROUP_LABELS)
    arguments = " ".join(f"$labels.{label}" for label in GROUP_LABELS)
    return (
        f"{{{{ with printf `{record}{{{selector}}}` {arguments} | query }}}}"
        "{{ . | first | value | humanizeDuration }}{{ else }}no data{{ end }}"
    )


def _regression(
    config: RuleConfig, what: str, short: str, families: Sequence[str], alert: str, min_increase: float
) -> RuleGroup:
    window, offset = config.regression_window, config.regression_offset
    p99_now = f"{_LEVEL}:otel_llm_{short}_seconds:p99_{window}"
    p99_then = f"{p99_now}_offset{offset}"
    requests_now = f"{_LEVEL}:otel_llm_{short}_requests:increase{window}"
    requests_then = f"{requests_now}_offset{offset}"
    expr = "\n".join(
        (
            f"{p99_now}\n  > {number(config.regression_ratio)} * {p99_then}",
            "and",
            f"{p99_now} - {p99_then}\n  >= {number(min_increase)}",
            "and",
            f"{requests_now} >= {config.regression_min_requests}",
            "and",
            f"{requests_then} >= {config.regression_min_requests}",
        )
    )
    description = (
        f"p99 {what} over the last {window} is {{{{ $value | humanizeDuration }}}} against "
        f"{_baseline_query(p99_then)} in the same {window} {offset} earlier: more than "
        f"{number(config.regression_ratio)}x and at least {number(min_increase)}s higher, with at least "
        f"{config.regression_min_requests} streamed requests in each window, for {config.regression_for}."
    )
    return RuleGroup(
        f"otel_llm_{short}_regression",
        (
            _record(p99_now, _p99(families, window)),
            _record(p99_then, _p99(families, window, offset)),
            _record(requests_now, _increase(families, window)),
            _record(requests_then, _increase(families, window, offset)),
            Rule(
                alert=alert,
                expr=expr,
                for_=config.regression_for,
                labels={"severity": "warning"},
                annotations={
                    "summary": f"p99 {what} regressed for {_grouping_text()}",
                    "description": description,
                },
            ),
        ),
    )


def _streams(function: str, window: str) -> str:
    """Streamed requests, as the TTFT SLO counts them: each that got its first token, and each other that its caller
    did not end. A stream that failed or timed out before its first token (the longest wait of all) is in the
    duration histogram only; one its caller cancelled or dropped before then is the caller's choice."""
    not_by_caller = sum_by(function, _inference_duration_families(), "_count", window, by=GROUP_LABELS,
                           matchers=f'{STREAM}="true", {NOT_CALLER_ENDED}')
    by_caller_after_a_token = sum_by(function, _ttft_families(), "_count", window, by=GROUP_LABELS,
                                     matchers=CALLER_ENDED)
    return added(not_by_caller, by_caller_after_a_token)


def _slo_burn(config: RuleConfig) -> RuleGroup:
    threshold = number(config.slo_threshold)
    budget = number(config.error_budget)
    slow_ratio = f"{_LEVEL}:otel_llm_ttft_slow:ratio_rate"
    streams = f"{_LEVEL}:otel_llm_streams:"
    requests = f"{streams}increase"
    windows = list(dict.fromkeys(w for pair in config.burn_windows for w in (pair.long, pair.short)))
    longs = list(dict.fromkeys(pair.long for pair in config.burn_windows))
    rules: list[Rule] = []
    for window in windows:
        every = f"{streams}rate{window}"
        fast = sum_by("rate", _ttft_families(), "_bucket", window, by=GROUP_LABELS,
                      matchers=le_matcher(config.slo_threshold))
        rules.append(_record(every, _streams("rate", window)))
        # no stream of a group fast, or none with a first token at all: nothing fast, not nothing known. At most
        # all fast: each series' rate is extrapolated on its own, so with every stream fast the quotient can come
        # out a hair over 1
        rules.append(_record(f"{slow_ratio}{window}",
                             f"1 - clamp_max(\n  (\n{_indent(fast, 4)}\n    or\n    {every} * 0\n  )\n"
                             f"  /\n  {every},\n  1\n)"))
    rules.extend(_record(f"{requests}{window}", _streams("increase", window)) for window in longs)
    pairs = [
        "\n".join(
            (
                "(",
                f"  {slow_ratio}{pair.long} / {budget} > {number(pair.factor)}",
                "  and",
                f"  {slow_ratio}{pair.short} / {budget} > {number(pair.factor)}",
                "  and",
                f"  {requests}{pair.long} >= {config.slo_min_requests}",
                ")",
            )
        )
        for pair in config.burn_windows
    ]
    pair_text = " or ".join(f"{p.long} and {p.short} above {number(p.factor)}x" for p in config.burn_windows)
    target = number(config.slo_target * 100)
    rules.append(
        Rule(
            alert=ALERT_TTFT_SLO_BURN,
            expr="\nor\n".join(pairs),
            for_=config.slo_for,
            labels={"severity": "page"},
            annotations={
                "summary": f"Time-to-first-token SLO burning fast for {_grouping_text()}",
                "description": (
                    f"The error budget of the SLO '{target}% of streamed requests get their first token within "
                    f"{threshold}s' burns {{{{ $value | printf \"%.1f\" }}}}x too fast (pages when {pair_text}, "
                    f"with at least {config.slo_min_requests} streamed requests in the long window)."
                ),
            },
        )
    )
    return RuleGroup("otel_llm_ttft_slo", tuple(rules))


def _outcomes(config: RuleConfig) -> RuleGroup:
    families = _duration_families()
    window = config.outcome_window
    failed = f"{_LEVEL}:otel_llm_operations_failed:ratio_rate{window}"
    throttled = f"{_LEVEL}:otel_llm_operations_rate_limited:ratio_rate{window}"
    operations = f"{_LEVEL}:otel_llm_operations:increase{window}"
    not_failed = "|".join(("", *CALLER_ENDED_ERROR_TYPES))
    rate_limited = "|".join(RATE_LIMIT_ERROR_TYPES)

    def alert(name: str, record: str, ratio: float, summary: str, outcome: str) -> Rule:
        return Rule(
            alert=name,
            expr=f"{record} > {number(ratio)}\nand\n{operations} >= {config.outcome_min_requests}",
            for_=config.outcome_for,
            labels={"severity": "warning"},
            annotations={
                "summary": f"{summary} for {_grouping_text()}",
                "description": (
                    f"{{{{ $value | humanizePercentage }}}} of operations over the last {window} {outcome}; "
                    f"alert above {number(ratio * 100)}% with at least {config.outcome_min_requests} operations "
                    f"for {config.outcome_for}."
                ),
            },
        )

    return RuleGroup(
        "otel_llm_outcomes",
        (
            _record(failed, _ratio(families, "_count", f'{ERROR_TYPE}!~"{not_failed}"', window)),
            _record(throttled, _ratio(families, "_count", f'{ERROR_TYPE}=~"{rate_limited}"', window)),
            _record(operations, _increase(families, window)),
            alert(ALERT_ERROR_RATIO, failed, config.error_ratio, "LLM operations failing",
                  f"failed with an {sc.ERROR_TYPE} other than {' or '.join(CALLER_ENDED_ERROR_TYPES)}"),
            alert(ALERT_RATE_LIMITED, throttled, config.rate_limited_ratio, "LLM operations rate limited",
                  f"ended rate limited ({', '.join(RATE_LIMIT_ERROR_TYPES)})"),
        ),
    )


def rule_groups(config: RuleConfig) -> tuple[RuleGroup, ...]:
    return (
        _regression(
            config, "time to first token", "ttft", _ttft_families(), ALERT_TTFT_REGRESSION,
            config.regression_min_increase,
        ),
        _slo_burn(config),
        _regression(
            config, "time per output token", "tpot", _tpot_families(), ALERT_TPOT_REGRESSION, config.tpot_min_increase
        ),
        _outcomes(config),
    )


# --- YAML -----------------------------------------------------------------------------------------------------


def _scalar(value: str) -> str:
    return value if _PLAIN_YAML.match(value) else json.dumps(value)


def _block(key: str, value: str, indent: int) -> list[str]:
    pad = " " * indent
    if "\n" not in value:
        return [f"{pad}{key}: {_scalar(value)}"]
    return [f"{pad}{key}: |-", *(f"{pad}  {line}" if line else "" for line in value.splitlines())]


def _mapping(key: str, values: Mapping[str, str] | None, indent: int) -> list[str]:
    if not values:
        return []
    pad = " " * indent
    return [f"{pad}{key}:", *(f"{pad}  {k}: {_scalar(v)}" for k, v in values.items())]


def _header(config: RuleConfig) -> Iterable[str]:
    yield "# Prometheus recording and alerting rules for otel_llm metrics."
    yield "# Generated by otel_llm._rules (`otel-llm rules`): do not edit; regenerate with other thresholds."
    yield "# Proven by promtool unit tests in the otel_llm repository (grafana/alerts/tests). Settings:"
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name == "burn_windows":
            value = ", ".join(f"{p.long}/{p.short} at {number(p.factor)}x" for p in value)
        elif isinstance(value, float):
            value = number(value)
        yield f"#   {f.name}: {value}"


def render_rules(config: RuleConfig | None = None) -> str:
    """The rule file for ``config`` (defaults when None), as YAML text."""
    config = config or RuleConfig()
    lines = [*_header(config), "groups:"]
    for group in rule_groups(config):
        lines += [f"  - name: {group.name}", "    rules:"]
        for rule in group.rules:
            head = f"record: {rule.record}" if rule.record else f"alert: {rule.alert}"
            lines.append(f"      - {head}")
            lines += _block("expr", rule.expr, 8)
            if rule.for_:
                lines.append(f"        for: {rule.for_}")
            lines += _mapping("labels", rule.labels, 8)
            lines += _mapping("annotations", rule.annotations, 8)
    return "\n".join(lines) + "\n"


# --- command line ---------------------------------------------------------------------------------------------


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that change RuleConfig; shared by ``otel-llm rules`` and ``otel-llm dashboards``."""
    d = RuleConfig()
    parser.add_argument("--ratio", type=float, default=d.regression_ratio,
                        help="p99 regression: now / baseline above this (default %(default)s)")
    parser.add_argument("--min-increase", type=float, default=d.regression_min_increase,
                        help="p99 TTFT regression: at least this many seconds higher (default %(default)s)")
    parser.add_argument("--window", default=d.regression_window,
                        help="p99 regression window (default %(default)s)")
    parser.add_argument("--offset", default=d.regression_offset,
                        help="p99 regression: compare with the same window this long ago (default %(default)s)")
    parser.add_argument("--min-requests", type=int, default=d.regression_min_requests,
                        help="p99 regression: streamed requests needed in each window (default %(default)s)")
    parser.add_argument("--slo-threshold", type=float, default=d.slo_threshold,
                        help="TTFT SLO threshold in seconds, a latency bucket edge (default %(default)s)")
    parser.add_argument("--slo-target", type=float, default=d.slo_target,
                        help="TTFT SLO target share of streamed requests (default %(default)s)")
    parser.add_argument("--slo-min-requests", type=int, default=d.slo_min_requests,
                        help="TTFT SLO: streamed requests needed in a long burn window (default %(default)s)")


def config_from_arguments(arguments: argparse.Namespace) -> RuleConfig:
    return RuleConfig(
        regression_ratio=arguments.ratio,
        regression_min_increase=arguments.min_increase,
        regression_window=arguments.window,
        regression_offset=arguments.offset,
        regression_min_requests=arguments.min_requests,
        slo_threshold=arguments.slo_threshold,
        slo_target=arguments.slo_target,
        slo_min_requests=arguments.slo_min_requests,
    )


def main_rules(argv: Sequence[str] | None = None) -> int:
    """``otel-llm rules``: print the rule file, write it (``-o``), or check a file against it (``--check``)."""
    parser = argparse.ArgumentParser(
        prog="otel-llm rules", description="Render Prometheus recording and alerting rules for otel_llm metrics."
    )
    add_config_arguments(parser)
    parser.add_argument("-o", "--output", type=Path, help="write the rules to this file instead of stdout")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the --output file differs from what these options render")
    arguments = parser.parse_args(argv)
    try:
        text = render_rules(config_from_arguments(arguments))
    except ValueError as exc:
        parser.error(str(exc))
    output: Path | None = arguments.output
    if arguments.check:
        if output is None:
            parser.error("--check needs --output FILE")
        if not output.is_file() or output.read_bytes() != text.encode():
            print(f"{output} differs from the rendered rules; regenerate with otel-llm rules -o {output}",
                  file=sys.stderr)
            return 1
        return 0
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            parser.error(f"--output {output}: {exc.strerror or exc}")
    return 0
