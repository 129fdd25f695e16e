"""The reference example (examples/fastapi_stream): served by uvicorn on loopback with the simulator behind both
backends, read as a stream the way a browser's EventSource reads it."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlencode

import pytest
import uvicorn
from conftest import Captured, attributes
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from examples.fastapi_stream.app import create_app
from otel_llm import _semconv as sc
from otel_llm.simulator import EngineConfig, Simulator

TPOT_S = 0.004
# Every answer is 12 tokens, 4 ms apart, with no heavy tail.
CONFIG = EngineConfig(prefill_base_s=0.01, tpot_base_s=TPOT_S, output_tokens_median=12, output_tokens_sigma=0.0,
                      tail_probability=0.0)


@dataclass
class Service:
    port: int
    simulator: Simulator
    otel: Captured


@dataclass
class Event:
    name: str
    data: dict[str, str]
    arrived_ns: int


@pytest.fixture
def service() -> Iterator[Service]:
    with serving(CONFIG) as running:
        yield running


@contextmanager
def serving(config: EngineConfig) -> Iterator[Service]:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Simulator(config, seed=3) as simulator:
        app = create_app(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]),
                         simulator=simulator)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, name="example-server", daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            yield Service(port, simulator, Captured(exporter, reader, tracer_provider))
        finally:
            server.should_exit = True
            thread.join(10)
            otel_llm.uninstrument()


def read_events(port: int, path: str) -> tuple[http.client.HTTPResponse, int, list[Event]]:
    """(response, when the request was sent, the SSE events each stamped when its blank line arrived)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sent_ns = time.perf_counter_ns()
    connection.request("GET", path, headers={"accept": "text/event-stream"})
    response = connection.getresponse()
    events, fields = [], {}
    while line := response.readline():  # returns each line as soon as its chunk arrives
        if line == b"\n":
            events.append(Event(fields["event"], json.loads(fields["data"]), time.perf_counter_ns()))
            fields = {}
        else:
            name, _, value = line.decode().rstrip("\n").partition(": ")
            fields[name] = value
    connection.close()
    return response, sent_ns, events


@pytest.mark.parametrize(("backend", "provider"), [("openai", "openai"), ("bedrock", "aws.bedrock")])
def test_chat_streams_one_event_per_token_as_they_come_and_records_one_span(
    service: Service, backend: str, provider: str
) -> None:
    query = urlencode({"prompt": "Why is the sky blue?", "backend": backend})
    response, sent_ns, events = read_events(service.port, f"/chat?{query}")

    assert response.status == 200
    assert response.getheader("content-type", "").startswith("text/event-stream")
    *tokens, done = events
    (record,) = service.simulator.truth()
    assert [event.name for event in tokens] == ["token"] * record.output_tokens == ["token"] * 12
    assert all(event.data["text"] for event in tokens)
    assert (done.name, done.data) == ("done", {})
    # incremental: the tokens reach the user spread over the decode time, not as one blob at the end
    spread_s = (tokens[-1].arrived_ns - tokens[0].arrived_ns) / 1e9
    assert spread_s >= 0.5 * (len(tokens) - 1) * TPOT_S
    assert len({event.arrived_ns for event in tokens}) == len(tokens)

    span = service.otel.span()
    attrs = attributes(span)
    assert attrs[sc.PROVIDER_NAME] == provider
    assert attrs[sc.USAGE_OUTPUT_TOKENS] == record.output_tokens
    # the server's truth <= what otel_llm measured inside the service <= what the service's user saw
    span_ttft, user_ttft = attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK], (tokens[0].arrived_ns - sent_ns) / 1e9
    assert record.ttft_s is not None
    assert record.ttft_s < span_ttft < user_ttft
    (ttfc,) = service.otel.points(sc.STABLE_NAMES.time_to_first_chunk.name)
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(span_ttft)


def test_page_renders_tokens_with_eventsource(service: Service) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    connection.request("GET", "/")
    response = connection.getresponse()
    page = response.read().decode()
    connection.close()

    assert response.status == 200
    assert response.getheader("content-type", "").startswith("text/html")
    assert 'new EventSource("/chat?"' in page
    assert 'addEventListener("token"' in page and 'addEventListener("done"' in page


@pytest.mark.parametrize("backend", ["openai", "bedrock"])
def test_a_user_who_leaves_mid_stream_closes_the_llm_stream_at_once(backend: str) -> None:
    """The answer takes 2 s; the user leaves after three tokens. The LLM stream under the response is closed then
    (the server sees its client go: 499, a few tokens), and its span ends as cancelled, not when a garbage
    collection comes by: on the Bedrock backend, read in Starlette's thread pool, it used to."""
    slow = EngineConfig(prefill_base_s=0.01, tpot_base_s=0.01, output_tokens_median=200, output_tokens_sigma=0.0,
                        tail_probability=0.0)
    with serving(slow) as running:
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
        connection.request("GET", f"/chat?{urlencode({'prompt': 'Tell me a story', 'backend': backend})}")
        response = connection.getresponse()
        tokens = 0
        while tokens < 3:
            tokens += response.readline().startswith(b"event: token")
        connection.sock.shutdown(socket.SHUT_RDWR)  # the user closes the tab
        connection.close()
        deadline = time.monotonic() + 1.5  # less than the answer's 2 s
        while not (running.otel.spans() and running.simulator.truth()) and time.monotonic() < deadline:
            time.sleep(0.02)  # the server learns of it at its next write
        running.otel.assert_finished(sc.ERROR_CANCELLED)
        (record,) = running.simulator.truth()
        assert record.status == 499 and record.output_tokens < 50
