"""The one line and zero-code, end to end: a fresh process exports real OTLP bytes, decoded with the official
protobufs, to a loopback receiver; and an application's own providers are used, never replaced."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import wire
from conftest import openai_server
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm import _semconv as sc

BIN = Path(sys.executable).parent

APP = textwrap.dedent("""
    import os, sys
    {setup}
    import openai
    client = openai.OpenAI(api_key="sk-test", base_url=os.environ["APP_BASE_URL"], max_retries=0)
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=[{{"role": "user", "content": "hi"}}],
                                            stream=True)
    print("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    {after}
""")


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint on loopback keeping every decoded export request."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[Any]:
        return [span for request in self.traces for rs in request.resource_spans for ss in rs.scope_spans
                for span in ss.spans]

    def metric(self, name: str) -> Any:
        for request in self.metrics:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name == name:
                            return metric
        raise AssertionError(f"{name} was not exported")


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            self.server.traces.append(ExportTraceServiceRequest.FromString(body))
        elif self.path == "/v1/metrics":
            self.server.metrics.append(ExportMetricsServiceRequest.FromString(body))
        elif self.path == "/v1/logs":
            self.server.logs.append(ExportLogsServiceRequest.FromString(body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def launch(command: list[str], setup: str, env: dict[str, str], tmp_path: Path,
           after: str = "") -> tuple[subprocess.CompletedProcess[str], list[wire.RecordedRequest]]:
    """The app run to its end (``after`` its call), and the requests the LLM server got from it."""
    app = tmp_path / "app.py"
    app.write_text(APP.format(setup=setup, after=after))
    with wire.LoopbackServer(openai_server(tokens=["Hi", "!"], usage=wire.Usage(input=3, output=2))) as llm:
        result = run_to_end([*command, str(app)], {**env, "APP_BASE_URL": llm.base_url})
        requests = llm.requests
    return result, requests


def run_to_end(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` run to a clean exit with ``env`` over this environment less its OTEL_ variables."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    environment.update(env)
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


def run_app(command: list[str], setup: str, env: dict[str, str], tmp_path: Path, after: str = "") -> str:
    return launch(command, setup, env, tmp_path, after)[0].stdout


def otlp_env(receiver: Receiver) -> dict[str, str]:
    return {"OTEL_SERVICE_NAME": "checkout", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": "60000"}


def assert_exported(receiver: Receiver) -> None:
    (span,) = receiver.spans()
    attrs = {kv.key: kv.value for kv in span.attributes}
    assert span.name == "chat gpt-4o-mini"
    assert attrs[sc.PROVIDER_NAME].string_value == "openai"
    assert attrs[sc.USAGE_OUTPUT_TOKENS].int_value == 2
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK].double_value > 0
    resource = {kv.key: kv.value.string_value for kv in receiver.traces[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "checkout"
    ttfc = receiver.metric(sc.STABLE_NAMES.time_to_first_chunk.name)
    (point,) = ttfc.histogram.data_points
    assert point.count == 1
    assert tuple(point.explicit_bounds) == sc.LATENCY_BUCKETS
    assert point.exemplars[0].span_id == span.span_id  # the slow bucket links to its trace


def test_one_line_sets_up_otlp_export_from_the_environment(receiver: Receiver, tmp_path: Path) -> None:
    out = run_app([sys.executable], "import otel_llm; otel_llm.instrument()", otlp_env(receiver), tmp_path)
    assert out.strip() == "Hi!"
    assert_exported(receiver)


def test_zero_code_with_opentelemetry_instrument(receiver: Receiver, tmp_path: Path) -> None:
    out = run_app([str(BIN / "opentelemetry-instrument"), sys.executable], "", otlp_env(receiver), tmp_path)
    assert out.strip() == "Hi!"
    assert_exported(receiver)


def test_applications_own_providers_are_kept(receiver: Receiver, tmp_path: Path) -> None:
    setup = textwrap.dedent("""
        from opentelemetry import trace, metrics
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, ConsoleSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        mine = TracerProvider()
        console = ConsoleSpanExporter(formatter=lambda s: "SPAN " + s.name + chr(10))
        mine.add_span_processor(SimpleSpanProcessor(console))
        trace.set_tracer_provider(mine)
        metrics.set_meter_provider(MeterProvider())
        import otel_llm
        otel_llm.instrument()
        assert trace.get_tracer_provider() is mine
    """)
    out = run_app([sys.executable], setup, otlp_env(receiver), tmp_path)
    assert "SPAN chat gpt-4o-mini" in out
    assert receiver.traces == [] and receiver.metrics == []  # nothing sent behind the application's back


def test_a_provider_passed_is_a_set_up_of_the_applications_own(receiver: Receiver, tmp_path: Path) -> None:
    setup = textwrap.dedent("""
        from opentelemetry import metrics
        from opentelemetry.sdk.trace import TracerProvider
        import otel_llm
        otel_llm.instrument(tracer_provider=TracerProvider())
        print(type(metrics.get_meter_provider()).__name__)
    """)
    out = run_app([sys.executable], setup, otlp_env(receiver), tmp_path)
    assert out.split() == ["_ProxyMeterProvider", "Hi!"]
    assert receiver.traces == [] and receiver.metrics == []


def test_content_events_go_out_over_otlp_in_structured_form(receiver: Receiver, tmp_path: Path) -> None:
    """On events the conventions require the messages structured (JSON strings are for spans): arrays and maps in
    the OTLP log record, not a string."""
    env = {**otlp_env(receiver), "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"}
    assert run_app([sys.executable], "import otel_llm; otel_llm.instrument()", env, tmp_path).strip() == "Hi!"
    (record,) = [record for request in receiver.logs for rl in request.resource_logs for sl in rl.scope_logs
                 for record in sl.log_records]
    assert record.event_name == sc.EVENT_OPERATION_DETAILS
    attrs = {kv.key: kv.value for kv in record.attributes}
    (message,) = attrs[sc.OUTPUT_MESSAGES].array_value.values
    fields = {kv.key: kv.value for kv in message.kvlist_value.values}
    assert fields["role"].string_value == "assistant" and fields["finish_reason"].string_value == "stop"
    (part,) = fields["parts"].array_value.values
    assert {kv.key: kv.value.string_value for kv in part.kvlist_value.values} == {"type": "text", "content": "Hi!"}
    (asked,) = attrs[sc.INPUT_MESSAGES].array_value.values
    assert {kv.key for kv in asked.kvlist_value.values} == {"role", "parts"}
    (span,) = receiver.spans()
    assert record.span_id == span.span_id and sc.OUTPUT_MESSAGES not in {kv.key for kv in span.attributes}


def test_content_events_are_not_exported_behind_an_applications_own_set_up(receiver: Receiver, tmp_path: Path) -> None:
    setup = textwrap.dedent("""
        from opentelemetry import trace, metrics
        from opentelemetry._logs import get_logger_provider
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.metrics import MeterProvider
        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())
        import otel_llm
        otel_llm.instrument()
        print(type(get_logger_provider()).__name__)
    """)
    env = {**otlp_env(receiver), "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"}
    out = run_app([sys.executable], setup, env, tmp_path)
    assert out.split() == ["ProxyLoggerProvider", "Hi!"]
    assert receiver.logs == [] and receiver.traces == [] and receiver.metrics == []


def test_an_application_that_set_up_tracing_only_keeps_it_that_way(receiver: Receiver, tmp_path: Path) -> None:
    """Its tracer provider is used; no meter provider is set up behind its back (it would push to the default
    OTLP endpoint and hold the exit while that fails): the metrics go to the API's, a no-op until one is set."""
    setup = textwrap.dedent("""
        from opentelemetry import trace, metrics
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, ConsoleSpanExporter
        mine = TracerProvider()
        console = ConsoleSpanExporter(formatter=lambda s: "SPAN " + s.name + chr(10))
        mine.add_span_processor(SimpleSpanProcessor(console))
        trace.set_tracer_provider(mine)
        import otel_llm
        otel_llm.instrument()
        print(type(metrics.get_meter_provider()).__name__)
    """)
    out = run_app([sys.executable], setup, otlp_env(receiver), tmp_path)
    assert out.split("\n")[:3] == ["_ProxyMeterProvider", "SPAN chat gpt-4o-mini", "Hi!"]
    assert receiver.traces == [] and receiver.metrics == []


def test_a_set_up_that_fails_leaves_nothing_behind_and_a_later_one_works(receiver: Receiver, tmp_path: Path) -> None:
    """A value the SDK refuses, met once tracing is made: the failure is logged, no provider of ours is left
    global (the application could still set its own) and no export thread runs; once the value is mended, a later
    instrument() sets up both signals."""
    setup = textwrap.dedent("""
        import os, threading
        from opentelemetry import trace, metrics
        import otel_llm
        os.environ["OTEL_METRICS_EXEMPLAR_FILTER"] = "bogus"
        otel_llm.instrument()
        print(type(trace.get_tracer_provider()).__name__, type(metrics.get_meter_provider()).__name__,
              [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()])
        os.environ["OTEL_METRICS_EXEMPLAR_FILTER"] = "trace_based"
        otel_llm.instrument()
    """)
    result, _ = launch([sys.executable], setup, otlp_env(receiver), tmp_path)
    assert result.stdout.split("\n")[:2] == ["ProxyTracerProvider _ProxyMeterProvider []", "Hi!"]
    assert "cannot set up its telemetry" in result.stderr and "Unknown exemplar filter 'bogus'" in result.stderr
    # the SDK's word on shutting down a reader no provider took is no news to the application: ours says it all
    assert "until it is registered" not in result.stderr
    assert_exported(receiver)


@pytest.mark.parametrize("variables, named", [
    ({"OTEL_METRIC_EXPORT_INTERVAL": "0"}, "OTEL_METRIC_EXPORT_*: interval value 0.0 is invalid"),
    ({"OTEL_BSP_SCHEDULE_DELAY": "-1"}, "OTEL_BSP_*: schedule_delay_millis must be positive."),
    ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"},
     "OTEL_BSP_*: max_export_batch_size must be less than or equal to max_queue_size."),
], ids=["a zero metric interval", "a negative span delay", "a batch past the queue"])
def test_a_batch_or_export_setting_the_sdk_refuses_is_named_and_the_defaults_used(
        receiver: Receiver, tmp_path: Path, variables: dict[str, str], named: str) -> None:
    """As the SDK does itself for a value that is no number: the application is instrumented all the same."""
    env = {**otlp_env(receiver), **variables}
    result, _ = launch([sys.executable], "import otel_llm; otel_llm.instrument()", env, tmp_path)
    assert named in result.stderr and "using the defaults" in result.stderr
    assert "cannot set up its telemetry" not in result.stderr
    assert_exported(receiver)


@pytest.mark.parametrize("port", ["abc", "99999"])
def test_a_scrape_endpoint_that_cannot_be_served_costs_only_itself(receiver: Receiver, tmp_path: Path,
                                                                  port: str) -> None:
    """A port that is no number, or past 65535: the scrape endpoint is named in a warning and left out; the OTLP
    export and the instrumentation go on."""
    env = {**otlp_env(receiver), "OTEL_METRICS_EXPORTER": "prometheus,otlp", "OTEL_EXPORTER_PROMETHEUS_PORT": port}
    result, _ = launch([sys.executable], "import otel_llm; otel_llm.instrument()", env, tmp_path)
    assert f"cannot serve Prometheus metrics on localhost:{port}; no scrape endpoint" in result.stderr
    assert "cannot set up its telemetry" not in result.stderr
    assert_exported(receiver)


def test_a_failed_set_up_frees_its_scrape_endpoint_for_the_next(receiver: Receiver, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    setup = textwrap.dedent(f"""
        import os, urllib.request
        import otel_llm
        os.environ["OTEL_METRICS_EXEMPLAR_FILTER"] = "bogus"
        otel_llm.instrument()
        os.environ["OTEL_METRICS_EXEMPLAR_FILTER"] = "trace_based"
        otel_llm.instrument()
        def scrape():
            body = urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read().decode()
            print("scraped", "gen_ai_client_operation_duration_seconds_count" in body)
    """)
    env = {**otlp_env(receiver), "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
           "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}
    result, _ = launch([sys.executable], setup, env, tmp_path, after="scrape()")
    assert result.stdout.split() == ["Hi!", "scraped", "True"]
    assert "cannot serve Prometheus metrics" not in result.stderr


def test_an_unsupported_otlp_protocol_is_named_once_and_http_protobuf_used(receiver: Receiver,
                                                                             tmp_path: Path) -> None:
    env = {**otlp_env(receiver), "OTEL_EXPORTER_OTLP_PROTOCOL": "gprc"}
    result, _ = launch([sys.executable], "import otel_llm; otel_llm.instrument()", env, tmp_path)
    assert result.stderr.count("OTEL_EXPORTER_OTLP_PROTOCOL=gprc is not supported here") == 1, result.stderr
    assert_exported(receiver)


def test_the_sdks_own_exporter_names_are_understood(receiver: Receiver, tmp_path: Path) -> None:
    """otlp_proto_http pins the protocol whatever OTEL_EXPORTER_OTLP_PROTOCOL says; prometheus serves a scrape
    endpoint on OTEL_EXPORTER_PROMETHEUS_PORT; a list names several exporters, as the SDK reads it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scrape = textwrap.dedent(f"""
        import urllib.request
        import otel_llm; otel_llm.instrument()
        def scrape():
            body = urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read().decode()
            print("scraped", "gen_ai_client_operation_duration_seconds_count" in body)
    """)
    env = {**otlp_env(receiver), "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "otlp_proto_http",
           "OTEL_METRICS_EXPORTER": "prometheus, otlp_proto_http", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
           "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}
    out = run_app([sys.executable], scrape, env, tmp_path, after="scrape()")  # once the app is done with its call
    assert out.split() == ["Hi!", "scraped", "True"]
    (span,) = receiver.spans()
    assert span.name == "chat gpt-4o-mini"
    assert receiver.metric(sc.STABLE_NAMES.duration.name).histogram.data_points[0].count == 1


def test_with_the_sdk_disabled_requests_go_out_as_the_application_made_them(receiver: Receiver,
                                                                              tmp_path: Path) -> None:
    """OTEL_SDK_DISABLED: nothing would be recorded, so nothing is patched: no usage request either."""
    env = {**otlp_env(receiver), "OTEL_SDK_DISABLED": "true"}
    result, requests = launch([sys.executable], "import otel_llm; otel_llm.instrument()", env, tmp_path)
    assert result.stdout.strip() == "Hi!" and result.stderr == ""
    assert [request.json for request in requests] == [
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": True}]
    assert receiver.traces == [] and receiver.metrics == []


TWIN = """
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor


class Instrumentor(BaseInstrumentor):
    def instrumentation_dependencies(self):
        return ()

    def _instrument(self, **kwargs):
        pass

    def _uninstrument(self, **kwargs):
        pass
"""


BEDROCK_APP = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import wire, wire_bedrock as wb
    messages = [{{"role": "user", "content": [{{"text": "hi"}}]}}]
    with wire.LoopbackServer() as server:
        client = wb.client(server)
        server.push(wb.converse_reply(wb.converse_body("Hi", usage=wb.Tokens(input=3, output=1), latency_ms=5)))
        print(client.converse(modelId="m", messages=messages)["output"]["message"]["content"][0]["text"])
        server.push(wb.stream_reply(wb.converse_stream(["Hi", "!"], usage=wb.Tokens(input=3, output=2))))
        print(len(list(client.converse_stream(modelId="m", messages=messages)["stream"])))
        server.push(wire.Reply.json({{"inputTokens": 7}}))
        print(client.count_tokens(modelId="m", input={{"converse": {{"messages": messages}}}})["inputTokens"])
""")


def test_zero_code_beside_opentelemetrys_botocore_instrumentation_records_bedrock_once(
        receiver: Receiver, tmp_path: Path) -> None:
    """opentelemetry-instrument loads OpenTelemetry's botocore instrumentation after us (opentelemetry-bootstrap
    installs it beside boto3): Bedrock's inference calls are ours alone, one span and one series each; every other
    call keeps its botocore span."""
    app = tmp_path / "bedrock_app.py"
    app.write_text(BEDROCK_APP.format(tests=str(Path(__file__).parent)))
    result = run_to_end([str(BIN / "opentelemetry-instrument"), sys.executable, str(app)], otlp_env(receiver))
    assert result.stdout.split() == ["Hi", "6", "7"]  # converse_stream: start, 2 deltas, block stop, stop, metadata
    assert sorted(span.name for span in receiver.spans()) == ["Bedrock Runtime.CountTokens", "chat m", "chat m"]
    gen_ai = {(sm.scope.name, metric.name) for request in receiver.metrics for rm in request.resource_metrics
              for sm in rm.scope_metrics for metric in sm.metrics if metric.name.startswith("gen_ai.")}
    assert gen_ai and {scope for scope, _ in gen_ai} == {sc.INSTRUMENTATION_SCOPE}, gen_ai


@pytest.mark.parametrize("disabled", ["", "openai"], ids=["both-loaded", "other-disabled"])
def test_zero_code_names_another_instrumentation_of_the_same_calls(receiver: Receiver, tmp_path: Path,
                                                                   disabled: str) -> None:
    """opentelemetry-instrument loads every installed instrumentation: one that records the same LLM calls (here
    an installed distribution registering as "openai", as OpenTelemetry's openai-v2 does) doubles every span and
    metric, and the application is told how to keep one."""
    site = tmp_path / "site"
    (site / "twin_llm_instrumentation-1.0.dist-info").mkdir(parents=True)
    (site / "twin_llm_instrumentation-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: twin-llm-instrumentation\nVersion: 1.0\n")
    (site / "twin_llm_instrumentation-1.0.dist-info" / "entry_points.txt").write_text(
        "[opentelemetry_instrumentor]\nopenai = twin_llm:Instrumentor\n")
    (site / "twin_llm.py").write_text(TWIN)
    env = {**otlp_env(receiver), "PYTHONPATH": str(site), "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": disabled}
    result, _ = launch([str(BIN / "opentelemetry-instrument"), sys.executable], "", env, tmp_path)
    warning = ("otel_llm: opentelemetry-instrument also loads openai (twin-llm-instrumentation), which records the "
               "same LLM calls: each would be recorded twice. Keep one: OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=openai")
    assert (warning in result.stderr) is (not disabled), result.stderr
    assert_exported(receiver)
