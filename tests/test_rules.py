"""Alert rules: the checked-in file is what otel_llm._rules renders, promtool accepts it, and the promtool unit tests
in grafana/alerts/tests prove what each alert means (DESIGN.md section 6)."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import prom
import pytest
import yaml
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest

from otel_llm import _rules
from otel_llm import _semconv as sc
from otel_llm._rules import RuleConfig, main_rules, render_rules

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "grafana" / "alerts" / "otel_llm_rules.yml"
RULE_TESTS = sorted((ROOT / "grafana" / "alerts" / "tests").glob("*.yml"))


def test_checked_in_rules_are_what_the_generator_renders() -> None:
    assert RULES.read_text(encoding="utf-8") == render_rules(), (
        "grafana/alerts/otel_llm_rules.yml drifted; regenerate: otel-llm rules -o grafana/alerts/otel_llm_rules.yml"
    )


def test_promtool_accepts_the_rules() -> None:
    result = prom.run_promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_exist_for_every_alert() -> None:
    tested = {t["alertname"] for f in RULE_TESTS for g in yaml.safe_load(f.read_text())["tests"]
              for t in g.get("alert_rule_test", [])}
    assert tested == set(_rules.ALERT_NAMES)


@pytest.fixture(scope="module")
def promtool_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """Every ``promtool test rules`` run of this module, started at once (each replays a day of samples)."""
    mutated = tmp_path_factory.mktemp("no_quiet_guard")
    # the same SLO test against rules without the quiet-model guard: it must fail, or the tests have no teeth
    (mutated / "tests").mkdir()
    (mutated / "otel_llm_rules.yml").write_text(render_rules(RuleConfig(slo_min_requests=1)))
    (mutated / "tests" / "ttft_slo_burn.yml").write_text((RULES.parent / "tests" / "ttft_slo_burn.yml").read_text())
    runs = {path.stem: path for path in RULE_TESTS} | {"no_quiet_guard": mutated / "tests" / "ttft_slo_burn.yml"}
    processes = {name: prom.start_promtool("test", "rules", path) for name, path in runs.items()}
    outputs = {name: process.communicate(timeout=60)[0] for name, process in processes.items()}
    return {name: (processes[name].returncode, output) for name, output in outputs.items()}


@pytest.mark.parametrize("name", [path.stem for path in RULE_TESTS])
def test_promtool_unit_tests_pass(promtool_runs: dict[str, tuple[int, str]], name: str) -> None:
    returncode, output = promtool_runs[name]
    assert returncode == 0, output


def test_rule_tests_use_the_sdks_bucket_edges() -> None:
    """Test histograms are subsets of the real ones, so the scenarios stay ones the SDK can produce."""
    buckets = {f"{family}_bucket": instrument.buckets for instrument, kind in prom.instrument_kinds().values()
               if kind == "histogram" for family in [sc.prometheus_name(instrument)]}
    checked = 0
    for test_file in RULE_TESTS:
        for group in yaml.safe_load(test_file.read_text())["tests"]:
            for series in group["input_series"]:
                name = series["series"].split("{")[0]
                le = re.search(r'le="([^"]+)"', series["series"])
                if le is not None and le[1] != "+Inf":
                    assert float(le[1]) in buckets[name], f"{test_file.name}: {name} le={le[1]} is not an SDK edge"
                    checked += 1
    assert checked > 30


def test_a_quiet_model_would_page_without_the_minimum_request_count(
    promtool_runs: dict[str, tuple[int, str]],
) -> None:
    returncode, output = promtool_runs["no_quiet_guard"]
    assert returncode != 0
    assert 'gen_ai_request_model="chat-quiet"' in output


def test_rules_read_only_series_the_sdk_emits() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    names = {name for group in groups for rule in group["rules"]
             for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*(?:\{|\[| offset|$|\s))", rule["expr"])}
    metric_like = {n for n in names if n.startswith(("gen_ai_", "otel_llm_", "job_provider_model:"))}
    unknown = metric_like - prom.emitted_series() - recorded - prom.attribute_labels()
    assert not unknown
    # both name sets are read wherever a name set differs
    text = RULES.read_text()
    for instrument in (sc.STABLE_NAMES.time_to_first_chunk, sc.LATEST_EXPERIMENTAL_NAMES.time_to_first_chunk,
                       sc.STABLE_NAMES.duration, sc.LATEST_EXPERIMENTAL_NAMES.duration):
        assert sc.prometheus_name(instrument) + "_bucket" in text or sc.prometheus_name(instrument) + "_count" in text


def test_every_alert_groups_by_service_provider_and_model() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            for by in re.findall(r"sum by \(([^)]*)\)", rule["expr"]):
                assert by.split(", ")[:3] == ["job", "gen_ai_provider_name", "gen_ai_request_model"]
    alerts = {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}
    assert alerts["LLMTimeToFirstTokenP99Regression"]["labels"] == {"severity": "warning"}
    assert alerts["LLMTimeToFirstTokenP99Regression"]["for"] == "15m"
    assert alerts["LLMTimeToFirstTokenSLOBurn"]["labels"] == {"severity": "page"}


# --- names as Prometheus sees them ----------------------------------------------------------------------------


def test_prometheus_names_are_what_the_sdk_prometheus_exporter_emits() -> None:
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter(sc.INSTRUMENTATION_SCOPE)
    attributes = {sc.OPERATION_NAME: sc.OP_CHAT, sc.PROVIDER_NAME: sc.PROVIDER_OPENAI, sc.REQUEST_MODEL: "m",
                  sc.ERROR_TYPE: "RateLimitError", sc.PROMPT_SIZE: sc.prompt_size_class(10)}
    for instrument, kind in prom.instrument_kinds().values():
        if kind == "histogram":
            meter.create_histogram(instrument.name, instrument.unit, instrument.description,
                                   explicit_bucket_boundaries_advisory=instrument.buckets).record(2.0, attributes)
        elif kind == "counter":
            meter.create_counter(instrument.name, instrument.unit, instrument.description).add(3, attributes)
        else:
            meter.create_gauge(instrument.name, instrument.unit, instrument.description).set(5, attributes)
    exposition = generate_latest(registry).decode()
    provider.shutdown()

    seen = {line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if line and line[0] != "#"}
    assert seen - {"target_info"} == prom.emitted_series()
    labels = set(re.findall(r"[{,]([a-zA-Z_][a-zA-Z0-9_]*)=", exposition))
    assert {sc.prometheus_name(key) for key in attributes} <= labels
    assert sc.prometheus_name(sc.REQUEST_MODEL) == "gen_ai_request_model"
    # the Python exporter spells the SLO bucket le="2.0"; the rules' matcher takes it and the Collector's le="2"
    ttft = sc.prometheus_name(sc.STABLE_NAMES.time_to_first_chunk)
    assert f'{ttft}_bucket{{' in exposition and 'le="2.0"' in exposition


def test_design_spellings_of_prometheus_names() -> None:
    ttft = sc.STABLE_NAMES.time_to_first_chunk
    assert sc.prometheus_name(ttft) == "gen_ai_client_operation_time_to_first_chunk_seconds"
    assert sc.STABLE_NAMES.token_usage is not None
    assert sc.prometheus_name(sc.STABLE_NAMES.token_usage) == "gen_ai_client_token_usage"
    assert sc.prometheus_name(sc.STABLE_NAMES.rate_limit_remaining) == "otel_llm_client_rate_limit_remaining"
    assert sc.prometheus_name(sc.PROMPT_SIZE) == "otel_llm_prompt_size"
    with pytest.raises(ValueError, match="unit 'furlong'"):
        sc.prometheus_name(sc.Instrument("x.y", "furlong", ""))


@pytest.mark.parametrize(("bound", "matcher", "matches", "rejects"), [
    (2.0, r'le=~"2|2\\.0"', ["2", "2.0"], ["20", "2x0", "2.5"]),
    (0.5, 'le="0.5"', ["0.5"], ["0.50"]),
    (60.0, r'le=~"60|60\\.0"', ["60", "60.0"], ["6"]),
])
def test_bucket_matcher_accepts_both_exporter_spellings(
    bound: float, matcher: str, matches: list[str], rejects: list[str]
) -> None:
    assert _rules.le_matcher(bound) == matcher
    op, value = matcher[2:4], matcher.split('"')[1].replace("\\\\", "\\")
    pattern = re.compile(value if op == "=~" else re.escape(value))
    assert all(pattern.fullmatch(s) for s in matches)
    assert not any(pattern.fullmatch(s) for s in rejects)


# --- configuration --------------------------------------------------------------------------------------------


def test_defaults_are_the_design_contract() -> None:
    config = RuleConfig()
    assert (config.regression_ratio, config.regression_min_increase, config.regression_window,
            config.regression_offset, config.regression_min_requests, config.regression_for) == (
        1.5, 0.25, "30m", "1d", 100, "15m")
    assert (config.slo_threshold, config.slo_target) == (2.0, 0.99)
    assert [(w.long, w.short, w.factor) for w in config.burn_windows] == [("1h", "5m", 14.4), ("6h", "30m", 6.0)]


@pytest.mark.parametrize(("changes", "message"), [
    ({"slo_threshold": 1.9}, r"slo_threshold 1.9 s is not a bucket edge of the latency histograms .* nearest edges: "
                             + _rules.number(max(b for b in sc.LATENCY_BUCKETS if b < 1.9)) + ", 2$"),
    ({"slo_threshold": 100.0}, r"nearest edges: 60$"),
    ({"slo_threshold": math.nan}, r"slo_threshold nan s is not a bucket edge .* nearest edges: 0.02, .*, 60$"),
    ({"slo_target": 1.0}, "slo_target must lie strictly between 0 and 1"),
    ({"slo_target": 0.9}, r"burn factor 14.4 with slo_target 0.9 would need 144% slow requests"),
    ({"regression_ratio": 1.0}, "regression_ratio must be a finite number above 1"),
    ({"regression_ratio": math.inf}, "regression_ratio must be a finite number above 1, got inf"),
    ({"regression_ratio": 1.0000000000001}, "is 1 to the 12 digits the rules are written with"),
    ({"regression_min_increase": math.inf}, "regression_min_increase must be a finite number of seconds"),
    ({"regression_window": "30 minutes"}, "regression_window: '30 minutes' is not a Prometheus duration"),
    ({"regression_window": "2d"}, "regression_offset 1d is shorter than regression_window 2d"),
    ({"regression_min_requests": 0}, "regression_min_requests must be a whole number"),
    ({"burn_windows": (_rules.BurnWindows("5m", "1h", 14.4),)}, "the short window must be the shorter one"),
    ({"slo_target": 0.9999999999999}, r"^slo_target 0.9999999999999 leaves no error budget: 1 - target rounds to 0 at "
                                      "the 12 digits the rules are written with"),
    ({"regression_offset": "293y"}, r"^regression_offset 293y is longer than Prometheus can parse \(at most 292y"),
    ({"regression_offset": "106752d"}, "regression_offset 106752d is longer than Prometheus can parse"),
    ({"regression_window": "59s"}, r"^regression_window 59s is shorter than 1m: rate\(\) needs two samples"),
    ({"outcome_window": "500ms"}, "outcome_window 500ms is shorter than 1m"),
    ({"burn_windows": (_rules.BurnWindows("1h", "30s", 14.4),)}, "burn window 30s is shorter than 1m"),
])
def test_bad_configuration_is_refused_clearly(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(RuleConfig(), **changes)


def test_other_thresholds_render_valid_rules(tmp_path: Path) -> None:
    config = RuleConfig(regression_ratio=2, regression_window="1h", regression_min_requests=500, slo_threshold=1.0,
                        slo_target=0.995, slo_min_requests=50)
    text = render_rules(config)
    assert 'le=~"1|1\\\\.0"' in text and "/ 0.005 > 14.4" in text and "> 2 * " in text and ">= 500" in text
    (tmp_path / "rules.yml").write_text(text)
    result = prom.run_promtool("check", "rules", tmp_path / "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


# --- command line ---------------------------------------------------------------------------------------------


def test_main_rules_prints_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_rules([]) == 0
    assert capsys.readouterr().out == render_rules()

    out = tmp_path / "alerts" / "rules.yml"
    assert main_rules(["--ratio", "2", "--window", "1h", "--min-requests", "300", "--slo-threshold", "5",
                       "--slo-target", "0.999", "-o", str(out)]) == 0
    expected = render_rules(RuleConfig(regression_ratio=2, regression_window="1h", regression_min_requests=300,
                                       slo_threshold=5.0, slo_target=0.999))
    assert out.read_text() == expected
    assert main_rules(["--ratio", "2", "--window", "1h", "--min-requests", "300", "--slo-threshold", "5",
                       "--slo-target", "0.999", "-o", str(out), "--check"]) == 0
    assert main_rules(["-o", str(out), "--check"]) == 1
    assert "differs" in capsys.readouterr().err


@pytest.mark.parametrize("output", ["a directory", "missing/parent/is/a/file/rules.yml"])
def test_main_rules_names_an_output_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    output: str) -> None:
    (tmp_path / "a directory").mkdir()
    (tmp_path / "missing").write_text("a file where a directory would go")
    with pytest.raises(SystemExit) as exit_info:
        main_rules(["-o", str(tmp_path / output)])
    assert exit_info.value.code == 2
    assert f"otel-llm rules: error: --output {tmp_path / output}: " in capsys.readouterr().err


def test_main_rules_check_of_a_file_that_is_not_text_says_it_differs(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rules.yml").write_bytes(b"\xff\xfe not UTF-8")
    assert main_rules(["-o", str(tmp_path / "rules.yml"), "--check"]) == 1
    assert "differs" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--window", "300y", "--offset", "300y"], "regression_offset 300y is longer than Prometheus can parse"),
    (["--window", "30s"], "regression_window 30s is shorter than 1m"),
    (["--slo-target", "0.9999999999999"], "slo_target 0.9999999999999 leaves no error budget"),
])
def test_main_rules_refuses_what_prometheus_cannot_use(argv: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main_rules(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"otel-llm rules: error: {message}")


def test_main_rules_takes_durations_up_to_the_longest_prometheus_parses(tmp_path: Path) -> None:
    assert main_rules(["--window", "1m", "--offset", "106751d", "-o", str(tmp_path / "days.yml")]) == 0
    assert main_rules(["--window", "292y", "--offset", "292y", "-o", str(tmp_path / "years.yml")]) == 0
    for name in ("days.yml", "years.yml"):
        result = prom.run_promtool("check", "rules", tmp_path / name)
        assert result.returncode == 0, result.stdout + result.stderr


def test_main_rules_refuses_a_threshold_off_the_bucket_edges(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main_rules(["--slo-threshold", "1.9"])
    assert exit_info.value.code == 2
    assert "not a bucket edge" in capsys.readouterr().err
