"""Dashboards: the checked-in JSON is what otel_llm._dashboards generates, every query names only series and labels
the SDK emits (from _semconv), and a real Prometheus accepts every query and answers it with data scraped from the
SDK's own Prometheus exporter, under both metric-name sets."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prom
import pytest
import yaml
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from otel_llm import _dashboards, _rules
from otel_llm import _semconv as sc
from otel_llm._dashboards import main_dashboards, render_dashboards

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "grafana" / "dashboards"
RULES = ROOT / "grafana" / "alerts" / "otel_llm_rules.yml"

# what Grafana puts in place of its variables when everything is selected
VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "15s", "$shift": "1d", "$job": ".*",
             "$provider": ".*", "$model": ".*", "$operation": ".*"}
ALERT_LABELS = {"alertname", "alertstate", "severity"}


def _dashboards_json() -> list[dict[str, Any]]:
    return [json.loads(text) for text in render_dashboards().values()]


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and annotation of every dashboard."""
    found = []
    for dashboard in _dashboards_json():
        for panel in _panels(dashboard):
            found += [(f"{panel['title']} {t['refId']}", t["expr"]) for t in panel.get("targets", [])]
        found += [(f"annotation {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    return found


def _variable_selectors() -> list[tuple[str, str, str]]:
    """(variable, series selector, label) of every label_values() variable."""
    found = []
    for dashboard in _dashboards_json():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((\{.*\}), (\w+)\)", variable["query"])
                assert match, variable["query"]
                found.append((variable["name"], match[1], match[2]))
    return found


def _substitute(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr.replace('"$1"', ""), expr
    return expr


def _metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[)", without_strings))
    for alternatives in re.findall(r'__name__=~"([^"]*)"', expr):
        names |= set(alternatives.split("|"))
    return names - {"by", "without"}


def _label_names(expr: str) -> set[str]:
    labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {label.strip() for label in clause.split(",") if label.strip()}
    for destination, source in re.findall(r',\s*"(\w+)",\s*"[^"]*",\s*"(\w+)",\s*"(?:[^"\\]|\\.)*"\s*\)', expr):
        labels |= {destination, source}  # label_replace(v, dst, replacement, src, regex)
    return labels


# --- generated and checked in ---------------------------------------------------------------------------------


def test_checked_in_dashboards_are_what_the_generator_renders() -> None:
    rendered = render_dashboards()
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(rendered)
    for name, text in rendered.items():
        assert (DASHBOARDS / name).read_text(encoding="utf-8") == text, (
            f"grafana/dashboards/{name} drifted; regenerate: otel-llm dashboards -o grafana/dashboards"
        )


def test_check_mode_fails_on_a_drifted_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_dashboards(["-o", str(tmp_path), "--check"]) == 1  # nothing written yet
    assert main_dashboards(["-o", str(tmp_path)]) == 0
    assert main_dashboards(["-o", str(tmp_path), "--check"]) == 0
    assert main_dashboards(["-o", str(tmp_path), "--check", "--ratio", "2"]) == 1  # the alert line moved
    (tmp_path / "otel_llm.json").write_text("{}")
    assert main_dashboards(["-o", str(tmp_path), "--check"]) == 1
    assert "differs from the generated dashboard" in capsys.readouterr().err
    assert main_dashboards(["-o", str(DASHBOARDS), "--check"]) == 0


def test_dashboard_shape() -> None:
    (dashboard,) = _dashboards_json()
    assert dashboard["schemaVersion"] == 39
    assert dashboard["uid"] == "otel-llm-clients" and dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "provider", "model", "operation", "shift"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert [o["value"] for o in variables["shift"]["options"]] == ["1d", "1w"]
    assert [p["title"] for p in dashboard["panels"] if p["type"] == "row"] == [
        "Overview", "Time to first token", "Time per output token", "Duration", "Workload", "Outcomes", "Per model"]
    assert {p["type"] for p in dashboard["panels"]} == {"row", "stat", "timeseries", "heatmap", "table"}
    annotations = [a for a in dashboard["annotations"]["list"] if a.get("expr")]
    assert annotations and all(name in annotations[0]["expr"] for name in _rules.ALERT_NAMES)


def test_every_panel_says_what_it_measures() -> None:
    for dashboard in _dashboards_json():
        for panel in _panels(dashboard):
            if panel["type"] != "row":
                assert len(panel.get("description", "")) > 40, panel["title"]
                assert panel["targets"], panel["title"]
    latency = [p for d in _dashboards_json() for p in _panels(d) if p["type"] in ("timeseries", "stat")
               and "p99" in json.dumps(p["targets"]) and p["fieldConfig"]["defaults"]["unit"] == "s"]
    assert all("bucket" in p["description"] for p in latency)


def test_no_datasource_uid_is_hard_coded() -> None:
    def walk(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if "datasource" in node and isinstance(node["datasource"], dict):
                yield node["datasource"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    for dashboard in _dashboards_json():
        refs = list(walk(dashboard))
        assert refs
        assert all(r == {"type": "prometheus", "uid": "${datasource}"} or r["type"] == "grafana" for r in refs), refs


def test_panels_tile_without_overlap() -> None:
    for dashboard in _dashboards_json():
        cells: set[tuple[int, int]] = set()
        ids = [p["id"] for p in _panels(dashboard)]
        assert len(ids) == len(set(ids))
        for panel in _panels(dashboard):
            g = panel["gridPos"]
            assert g["x"] + g["w"] <= 24
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, panel["title"]
            cells |= mine


# --- names ----------------------------------------------------------------------------------------------------


def test_queries_name_only_series_the_sdk_emits() -> None:
    emitted = prom.emitted_series() | {"ALERTS"}
    selectors = [(name, selector) for name, selector, _ in _variable_selectors()]
    for where, expr in _queries() + selectors:
        names = _metric_names(expr)
        assert names, where
        assert names <= emitted, (where, names - emitted)


def test_queries_read_both_name_sets() -> None:
    pairs = []
    for field in ("duration", "time_to_first_chunk", "time_per_output_chunk"):
        stable, latest = getattr(sc.STABLE_NAMES, field), getattr(sc.LATEST_EXPERIMENTAL_NAMES, field)
        pairs.append((sc.prometheus_name(stable), sc.prometheus_name(latest)))
    assert sc.STABLE_NAMES.token_usage and sc.LATEST_EXPERIMENTAL_NAMES.input_tokens
    assert sc.LATEST_EXPERIMENTAL_NAMES.output_tokens
    tokens = sc.prometheus_name(sc.STABLE_NAMES.token_usage)
    split = {sc.prometheus_name(sc.LATEST_EXPERIMENTAL_NAMES.input_tokens),
             sc.prometheus_name(sc.LATEST_EXPERIMENTAL_NAMES.output_tokens)}
    for where, expr in _queries() + [(n, s) for n, s, _ in _variable_selectors()]:
        names = {name.rsplit("_", 1)[0] for name in _metric_names(expr)}
        for stable, latest in pairs:
            assert (stable in names) == (latest in names), (where, stable, latest)
        assert (tokens in names) == bool(names & split), where


def test_queries_use_only_labels_the_sdk_emits() -> None:
    allowed = prom.attribute_labels() | ALERT_LABELS
    for where, expr in _queries():
        assert _label_names(expr) <= allowed, (where, _label_names(expr) - allowed)
    for dashboard in _dashboards_json():
        for panel in _panels(dashboard):
            for t in panel.get("targets", []):
                assert set(re.findall(r"\{\{(\w+)\}\}", t["legendFormat"])) <= allowed, panel["title"]
    for name, _, label in _variable_selectors():
        assert label in allowed, name


def test_slo_queries_accept_both_bucket_spellings() -> None:
    slo = [expr for _, expr in _queries() if "le=" in expr]
    assert slo
    assert all(_rules.le_matcher(_rules.RuleConfig().slo_threshold) in expr for expr in slo)


# --- a real Prometheus ----------------------------------------------------------------------------------------


EMBEDDINGS_MODEL = "embed-model"


class _Traffic:
    """Instruments made from one name set (kinds and buckets from _semconv), exported by the SDK's Prometheus
    reader into ``registry``; ``record()`` adds a little of everything."""

    def __init__(self, registry: CollectorRegistry, names: sc.MetricNames, service: str) -> None:
        self.provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)],
                                      resource=Resource.create({"service.name": service}))
        meter = self.provider.get_meter(sc.INSTRUMENTATION_SCOPE)

        def histogram(instrument: sc.Instrument | None) -> Any:
            return None if instrument is None else meter.create_histogram(
                instrument.name, instrument.unit, instrument.description,
                explicit_bucket_boundaries_advisory=instrument.buckets)

        self.duration, self.ttft = histogram(names.duration), histogram(names.time_to_first_chunk)
        # embeddings: in instruments of their own where the name set has them, as otel_llm records them
        self.embeddings_duration = histogram(names.embeddings_duration or names.duration)
        self.embeddings_tokens = histogram(names.embeddings_input_tokens or names.token_usage)
        self.embeddings_typed = names.embeddings_input_tokens is None  # into token usage, by token type
        self.gap, self.tpot = histogram(names.time_per_output_chunk), histogram(names.time_per_output_token)
        self.prompt, self.usage = histogram(names.prompt_length), histogram(names.token_usage)
        self.split = {sc.TOKEN_INPUT: histogram(names.input_tokens), sc.TOKEN_OUTPUT: histogram(names.output_tokens)}
        self.counters = {t: meter.create_counter(i.name, i.unit, i.description) for t, i in (
            (sc.TOKEN_INPUT, names.input_token_counter), (sc.TOKEN_OUTPUT, names.output_token_counter)) if i}
        self.remaining = meter.create_gauge(names.rate_limit_remaining.name, names.rate_limit_remaining.unit)
        self.limit = meter.create_gauge(names.rate_limit_limit.name, names.rate_limit_limit.unit)

    def record(self, requests: int) -> None:
        for i in range(requests // 2):
            identity = {sc.OPERATION_NAME: sc.OP_EMBEDDINGS, sc.PROVIDER_NAME: sc.PROVIDER_OPENAI,
                        sc.REQUEST_MODEL: EMBEDDINGS_MODEL, sc.SERVER_ADDRESS: "api.example", sc.SERVER_PORT: 443}
            attributes = identity | ({sc.ERROR_TYPE: "RateLimitError"} if i % 5 == 0 else {})
            self.embeddings_duration.record(0.05 + i / 100, attributes | {sc.REQUEST_STREAM: False})
            self.embeddings_tokens.record(40 + i, attributes | ({sc.TOKEN_TYPE: sc.TOKEN_INPUT}
                                                                if self.embeddings_typed else {}))
        for model, base in (("model-a", 0.4), ("model-b", 1.5)):
            for i in range(requests):
                error = ("RateLimitError", "APITimeoutError", sc.ERROR_CANCELLED, None, None, None, None)[i % 7]
                chars = (300, 3_000, 20_000)[i % 3]
                identity = {sc.OPERATION_NAME: sc.OP_CHAT, sc.PROVIDER_NAME: sc.PROVIDER_OPENAI,
                            sc.REQUEST_MODEL: model, sc.SERVER_ADDRESS: "api.example", sc.SERVER_PORT: 443}
                attributes: dict[str, Any] = identity | {sc.RESPONSE_MODEL: model}
                if error:
                    attributes[sc.ERROR_TYPE] = error
                timed = attributes | {sc.REQUEST_STREAM: i % 2 == 0, sc.PROMPT_SIZE: sc.prompt_size_class(chars)}
                first = base * (1 + i % 5 / 4)
                self.duration.record(first * 3, timed)
                self.prompt.record(chars, attributes)
                if i % 2 == 0:
                    self.ttft.record(first, timed)
                    self.tpot.record(0.02 + i % 3 / 100, attributes)
                    for k in range(5):
                        self.gap.record(0.01 * (k + 1), attributes)
                for token_type, count in ((sc.TOKEN_INPUT, chars // 4), (sc.TOKEN_OUTPUT, 50 + i)):
                    if self.usage is not None:
                        self.usage.record(count, attributes | {sc.TOKEN_TYPE: token_type})
                    if self.split[token_type] is not None:
                        self.split[token_type].record(count, attributes)
                    if token_type in self.counters:
                        self.counters[token_type].add(count, attributes)
                for resource in (sc.RATE_LIMIT_REQUESTS, sc.RATE_LIMIT_TOKENS):
                    # as otel_llm sets them: the endpoint and model, not one call's outcome
                    headroom = identity | {sc.RATE_LIMIT_RESOURCE: resource}
                    self.remaining.set(500 - i, headroom)
                    self.limit.set(1000, headroom)
                    if model == "model-a":  # a second endpoint of it, with a larger limit and nearly all of it left
                        self.remaining.set(9_990, headroom | {sc.SERVER_ADDRESS: "eu.api.example"})
                        self.limit.set(10_000, headroom | {sc.SERVER_ADDRESS: "eu.api.example"})


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[prom.Prometheus]:
    sets = {"svc-stable": sc.STABLE_NAMES, "svc-latest": sc.LATEST_EXPERIMENTAL_NAMES}
    registries = {job: CollectorRegistry() for job in sets}
    traffic = [_Traffic(registries[job], names, job) for job, names in sets.items()]
    servers = {job: prom.Exposition(registry) for job, registry in registries.items()}
    config = prom.scrape_config({job: s.target for job, s in servers.items()}, rule_files=[RULES])
    try:
        for t in traffic:
            t.record(20)
        with prom.running(config, tmp_path_factory.mktemp("prometheus")) as server:
            ttft = "|".join(f"{name}_count" for name, _ in _dashboards.TTFT)
            server.wait_for(f'count(count by (job) ({{__name__=~"{ttft}"}})) == 2')  # both jobs scraped
            for t in traffic:  # more after the first scrape, so that rates are not zero
                t.record(20)
            # every stream of both batches scraped: 2 models x 10 streams x 2 batches, in each job
            server.wait_for(f'count(sum by (job) ({{__name__=~"{ttft}"}}) == 40) == 2')
            yield server
    finally:
        for t in traffic:
            t.provider.shutdown()
        for s in servers.values():
            s.close()


def test_every_query_runs_and_returns_data(prometheus: prom.Prometheus) -> None:
    empty = []
    for where, expr in _queries():
        result = prometheus.query(_substitute(expr))  # raises PromQLError with Prometheus's message
        # yesterday's window has no data yet, and no alert fires on a fresh server
        if not result and " offset " not in expr and not expr.startswith("ALERTS"):
            empty.append(where)
    assert not empty


def test_every_variable_lists_values_from_both_name_sets(prometheus: prom.Prometheus) -> None:
    for name, selector, label in _variable_selectors():
        found = prometheus.series(_substitute(selector))
        assert {s.get(label) for s in found} - {None, ""}, name
        if label == "job":
            assert {s["job"] for s in found} == {"svc-stable", "svc-latest"}


def test_the_p99_panel_sees_both_name_sets_alike(prometheus: prom.Prometheus) -> None:
    """The same recorded latencies under either name set give the same p99 per model."""
    expr = _dashboards.quantile(0.99, _dashboards.TTFT, ["job", _dashboards.MODEL], window="5m")
    result = prometheus.query(_substitute(expr))
    by_job: dict[str, dict[str, float]] = {}
    for sample in result:
        by_job.setdefault(sample["metric"]["job"], {})[sample["metric"][_dashboards.MODEL]] = float(sample["value"][1])
    assert by_job["svc-stable"] == pytest.approx(by_job["svc-latest"])
    assert set(by_job["svc-stable"]) == {"model-a", "model-b"}


def test_the_operation_panels_count_embeddings_under_both_name_sets_alike(prometheus: prom.Prometheus) -> None:
    """The newer names keep embeddings' duration and tokens apart from inference: the panels' operations, failures
    and input tokens take them in all the same."""
    found = {}
    for name, source, extra in (("operations", _dashboards.DURATION, ""),
                                ("rate limited", _dashboards.DURATION, _dashboards.RATE_LIMITED),
                                ("input tokens", _dashboards.INPUT_TOKENS, "")):
        suffix = "_count" if source is _dashboards.DURATION else "_sum"
        expr = _dashboards.total(source, suffix, ["job", _dashboards.MODEL], extra=extra, window="5m",
                                 function="last_over_time")
        found[name] = {sample["metric"]["job"]: float(sample["value"][1])
                       for sample in prometheus.query(_substitute(expr))
                       if sample["metric"][_dashboards.MODEL] == EMBEDDINGS_MODEL}
    # two batches of 10 embeddings each, every fifth rate limited; 40 + i input tokens each
    assert found == {"operations": {"svc-stable": 20, "svc-latest": 20},
                     "rate limited": {"svc-stable": 4, "svc-latest": 4},
                     "input tokens": {"svc-stable": 2 * sum(40 + i for i in range(10)),
                                      "svc-latest": 2 * sum(40 + i for i in range(10))}}


def test_the_headroom_panel_shows_the_endpoint_with_the_least_left(prometheus: prom.Prometheus) -> None:
    """Each endpoint's remaining over its own limit, the least of a model's: model-a has 48.1% left at one endpoint
    and 99.9% at the other (the least remaining over the largest limit, 4.8%, is neither's)."""
    (expr,) = [expr for where, expr in _queries() if where.startswith("Rate-limit headroom")]
    shown = {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in prometheus.query(_substitute(expr))}
    assert shown == pytest.approx({((_dashboards.MODEL, model), (_dashboards.RATE_LIMIT_RESOURCE, resource)):
                                   (500 - 19) / 1000 for model in ("model-a", "model-b")
                                   for resource in (sc.RATE_LIMIT_REQUESTS, sc.RATE_LIMIT_TOKENS)})


def test_the_real_prometheus_loads_and_evaluates_the_alert_rules(prometheus: prom.Prometheus) -> None:
    prometheus.wait_for("job_provider_model:otel_llm_ttft_slow:ratio_rate5m")
    rules = [rule for group in prometheus.rules() for rule in group["rules"]]
    assert len(rules) == render_rules_count()
    assert all(rule["health"] in ("ok", "unknown") for rule in rules), [r for r in rules if r["health"] == "err"]


def render_rules_count() -> int:
    return sum(len(group.rules) for group in _rules.rule_groups(_rules.RuleConfig()))


# --- the local stack (no Docker here: check what the containers would load) -----------------------------------

GRAFANA = ROOT / "grafana"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = _yaml(GRAFANA / "docker-compose.yml")
    return compose


def _mounts(service: str) -> dict[str, Path]:
    """Container path -> host path of a compose service's bind mounts."""
    mounts = {}
    for volume in _compose()["services"][service].get("volumes", []):
        source, target = volume.split(":")[:2]
        mounts[target] = (GRAFANA / source).resolve()
    return mounts


def _host_path(service: str, container_path: str) -> Path:
    """Where a file a container reads lives in the checkout; fails when no mount provides it."""
    path = os.path.normpath(container_path)
    for target, source in sorted(_mounts(service).items(), key=lambda item: -len(item[0])):
        if path == target or path.startswith(target + "/"):
            return source / os.path.relpath(path, target) if path != target else source
    raise AssertionError(f"{service} reads {container_path} but nothing is mounted there")


def test_every_yaml_file_under_grafana_parses() -> None:
    files = sorted(GRAFANA.rglob("*.yml")) + sorted(GRAFANA.rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        assert list(yaml.safe_load_all(path.read_text(encoding="utf-8"))), path


def test_promtool_accepts_the_stack_prometheus_config() -> None:
    result = prom.run_promtool("check", "config", GRAFANA / "prometheus" / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "otel_llm_rules.yml" in result.stdout + result.stderr  # the rules were found and checked too


def test_compose_mounts_exist_and_images_are_pinned() -> None:
    services = _compose()["services"]
    assert set(services) == {"otel-collector", "prometheus", "tempo", "grafana"}
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), name
        for source in _mounts(name).values():
            assert source.exists(), (name, source)
        for other in service.get("depends_on", []):
            assert other in services


def test_every_config_file_a_container_is_told_to_read_is_mounted() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        for argument in service.get("command", []):
            match = re.search(r"config\.?file=(.+)$|--config=(.+)$", argument)
            if match:
                assert _host_path(name, match[1] or match[2]).is_file(), (name, argument)
    assert _host_path("grafana", "/etc/grafana/provisioning/datasources").is_dir()
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_path("grafana", home).is_file()


def test_prometheus_in_the_stack_stores_exemplars_loads_the_rules_and_scrapes_the_collector() -> None:
    service = _compose()["services"]["prometheus"]
    assert "--enable-feature=exemplar-storage" in service["command"]
    config_path = next(a.split("=", 1)[1] for a in service["command"] if a.startswith("--config.file="))
    config = _yaml(_host_path("prometheus", config_path))
    for rule_file in config["rule_files"]:
        in_container = os.path.join(os.path.dirname(config_path), rule_file)
        assert _host_path("prometheus", in_container) == RULES.resolve()
    collector = _yaml(_host_path("otel-collector", "/etc/otelcol-contrib/config.yaml"))
    port = collector["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    scrape = next(job for job in config["scrape_configs"] if job["job_name"] == "otel-collector")
    assert scrape["static_configs"][0]["targets"] == [f"otel-collector:{port}"]
    assert scrape["honor_labels"] is True  # job = service.name, as the dashboards filter on it


def test_collector_pipelines_wire_otlp_to_prometheus_and_tempo() -> None:
    collector = _yaml(_host_path("otel-collector", "/etc/otelcol-contrib/config.yaml"))
    pipelines = collector["service"]["pipelines"]
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(collector.get(kind) or {}), kind
    assert pipelines["metrics"]["exporters"] == ["prometheus"]
    assert collector["exporters"]["prometheus"]["enable_open_metrics"] is True  # exemplars need OpenMetrics
    host, port = collector["exporters"][pipelines["traces"]["exporters"][0]]["endpoint"].rsplit(":", 1)
    tempo = _yaml(_host_path("tempo", "/etc/tempo/tempo.yml"))
    assert host == "tempo"
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(f":{port}")
    ports = {p.split(":")[0] for p in _compose()["services"]["otel-collector"]["ports"]}
    for protocol in ("grpc", "http"):
        assert collector["receivers"]["otlp"]["protocols"][protocol]["endpoint"].rsplit(":", 1)[1] in ports


def test_grafana_provisioning_links_exemplars_to_tempo_and_loads_the_dashboards() -> None:
    datasources = _yaml(_host_path("grafana", "/etc/grafana/provisioning/datasources/datasources.yml"))
    by_type = {d["type"]: d for d in datasources["datasources"]}
    prometheus, tempo = by_type["prometheus"], by_type["tempo"]
    assert prometheus["url"] == "http://prometheus:9090" and prometheus["isDefault"] is True
    assert tempo["url"] == f"http://tempo:{_yaml(GRAFANA / 'tempo' / 'tempo.yml')['server']['http_listen_port']}"
    links = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert links == [{"name": "trace_id", "datasourceUid": tempo["uid"]}]
    providers = _yaml(_host_path("grafana", "/etc/grafana/provisioning/dashboards/dashboards.yml"))["providers"]
    loaded = _host_path("grafana", providers[0]["options"]["path"])
    assert loaded == DASHBOARDS.resolve()
    assert sorted(p.name for p in loaded.glob("*.json")) == sorted(render_dashboards())


def test_panel_rate_windows_span_four_of_the_sdks_default_pushes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's Collector serves a new value once per push of the SDK: Grafana's $__rate_interval (four times
    the datasource's interval) must hold four pushes at the SDK's default export interval, or a panel's rate
    jumps between a step and none."""
    monkeypatch.delenv("OTEL_METRIC_EXPORT_INTERVAL", raising=False)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=io.StringIO()))
    try:
        push_s = reader._export_interval_millis / 1000
    finally:
        reader.shutdown()
    datasources = _yaml(_host_path("grafana", "/etc/grafana/provisioning/datasources/datasources.yml"))
    (prometheus,) = [d for d in datasources["datasources"] if d["type"] == "prometheus"]
    interval = prometheus["jsonData"]["timeInterval"]
    seconds = int(interval[:-1]) * {"s": 1, "m": 60}[interval[-1]]
    assert seconds >= push_s


def test_an_output_directory_that_cannot_be_made_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "taken").write_text("a file, not a directory")
    with pytest.raises(SystemExit) as exit_info:
        main_dashboards(["-o", str(tmp_path / "taken")])
    assert exit_info.value.code == 2
    assert f"otel-llm dashboards: error: --output-dir {tmp_path / 'taken'}: " in capsys.readouterr().err
