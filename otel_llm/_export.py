"""Export set-up for applications that configured no OpenTelemetry providers: OTLP from the standard ``OTEL_*``
variables. An application that set its own global providers keeps them untouched; one that set only a tracer
provider, or only a meter provider, has chosen for the other signal too (tracing only, say): it is not set up."""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry import metrics, trace
from opentelemetry._logs import get_logger_provider, set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from otel_llm._safety import reraise_if_signalled

_log = logging.getLogger("otel_llm")
_Made = TypeVar("_Made")


def nothing_configured() -> bool:
    """Whether the application has set neither global provider (the API's placeholders are still in place)."""
    return (isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
            and type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider")


# the specification's defaults of the batch processors and the periodic reader
_BATCH_DEFAULTS = {"max_queue_size": 2048, "schedule_delay_millis": 5000, "max_export_batch_size": 512,
                   "export_timeout_millis": 30000}
_READER_DEFAULTS = {"export_interval_millis": 60000, "export_timeout_millis": 30000}


def _or_defaults(make: Callable[..., _Made], variables: str, defaults: dict[str, int]) -> _Made:
    """``make()`` with its settings from the ``OTEL_*`` variables, as the SDK reads them. Those it reads but then
    refuses (a zero or negative interval, a batch larger than its queue) are named in a warning and the defaults
    used, as the SDK does itself for a value that is no number."""
    try:
        return make()
    except ValueError as error:
        _log.warning("otel_llm: %s: %s; using the defaults", variables, error)
        return make(**defaults)


class Providers:
    """The providers instrument() works with. When the application set none, they are made here from the
    ``OTEL_*`` variables, and become the global ones only once every one of them is made (``install``): a set-up
    that fails on the way (a bad value the SDK refuses) leaves no global provider behind, nor a running export
    (``discard``), so the application can still set its own, and a later instrument() can try again."""

    def __init__(self, set_up: bool, with_logs: bool) -> None:
        self.made: list[Any] = []
        self.tracer_provider: Any = trace.get_tracer_provider()
        self.meter_provider: Any = metrics.get_meter_provider()
        self.logger_provider: Any = get_logger_provider() if with_logs else None
        if not set_up:
            if with_logs and type(self.logger_provider).__name__ == "ProxyLoggerProvider":
                _log.warning("otel_llm: content events go to the API's logger provider, which drops them until "
                             "the application sets one")
            return
        try:
            self.tracer_provider = self._made(TracerProvider(resource=Resource.create()))
            for exporter in span_exporters():
                self.tracer_provider.add_span_processor(
                    _or_defaults(functools.partial(BatchSpanProcessor, exporter), "OTEL_BSP_*", _BATCH_DEFAULTS))
            readers = []
            for name, protocol in _choices("METRICS"):
                if name == "prometheus":
                    readers += [self._made(reader) for reader in self._prometheus_reader()]
                else:
                    reader = _or_defaults(functools.partial(PeriodicExportingMetricReader,
                                                            _metric_exporter(name, protocol)),
                                          "OTEL_METRIC_EXPORT_*", _READER_DEFAULTS)
                    readers.append(self._made(reader))
            meter_provider = MeterProvider(resource=Resource.create(), metric_readers=readers)
            self.made = [made for made in self.made if made not in readers]  # the provider shuts them down now
            self.meter_provider = self._made(meter_provider)
            if with_logs and type(self.logger_provider).__name__ == "ProxyLoggerProvider":
                self.logger_provider = self._made(LoggerProvider(resource=Resource.create()))
                for exporter, protocol in _choices("LOGS"):
                    log_exporter = ConsoleLogRecordExporter() if exporter == "console" else _otlp_log_exporter(
                        protocol)
                    self.logger_provider.add_log_record_processor(_or_defaults(
                        functools.partial(BatchLogRecordProcessor, log_exporter), "OTEL_BLRP_*",
                        {**_BATCH_DEFAULTS, "schedule_delay_millis": 1000}))
        except BaseException:
            self.discard()
            raise

    def _made(self, provider: Any) -> Any:
        self.made.append(provider)
        return provider

    def install(self) -> None:
        """The providers made here become the global ones."""
        for provider in self.made:
            if isinstance(provider, TracerProvider):
                trace.set_tracer_provider(provider)
            elif isinstance(provider, MeterProvider):
                metrics.set_meter_provider(provider)
            elif isinstance(provider, LoggerProvider):
                set_logger_provider(provider)

    def _prometheus_reader(self) -> list[Any]:
        """A scrape endpoint, as the SDK's own configuration makes one (OTEL_EXPORTER_PROMETHEUS_HOST / _PORT); its
        HTTP server is shut down with the rest should the set-up fail, so a later one can serve on that port."""
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server
        except ImportError:
            _log.warning("otel_llm: OTEL_METRICS_EXPORTER=prometheus needs `pip install otel-llm[prometheus]`; "
                         "no scrape endpoint")
            return []
        host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST") or "localhost"
        port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT") or "9464"
        try:
            server, _ = start_http_server(port=int(port), addr=host)
        except (OSError, ValueError, OverflowError):  # a port above 65535 overflows in the socket's bind
            _log.warning("otel_llm: cannot serve Prometheus metrics on %s:%s; no scrape endpoint", host, port,
                         exc_info=True)
            return []
        self._made(_ScrapeEndpoint(server))
        return [PrometheusMetricReader()]

    def discard(self) -> None:
        """Shut down what was made here (providers, readers that no provider took, a scrape endpoint: threads and a
        port), as the set-up did not complete. A reader no provider took says, shut down, that it cannot collect:
        true, and no news to the application, which hears of the failed set-up from us."""
        sdk_log = logging.getLogger(PeriodicExportingMetricReader.__module__)
        sdk_log.addFilter(_never_registered)
        try:
            for provider in self.made:
                try:
                    provider.shutdown()
                except Exception:
                    reraise_if_signalled()
                    _log.debug("otel_llm: shutting down a provider of a failed set-up", exc_info=True)
        finally:
            sdk_log.removeFilter(_never_registered)
        self.made.clear()


def _never_registered(record: logging.LogRecord) -> bool:
    return "until it is registered" not in record.getMessage()


def span_exporters() -> list[Any]:
    """The span exporters OTEL_TRACES_EXPORTER names."""
    return [ConsoleSpanExporter() if name == "console" else _otlp("trace_exporter", "OTLPSpanExporter", protocol)
            for name, protocol in _choices("TRACES")]


def metric_exporters() -> list[Any]:
    """The push exporters OTEL_METRICS_EXPORTER names (a prometheus scrape endpoint is not one)."""
    return [_metric_exporter(name, protocol) for name, protocol in _choices("METRICS") if name != "prometheus"]


def _metric_exporter(name: str, protocol: str) -> Any:
    return ConsoleMetricExporter() if name == "console" else _otlp("metric_exporter", "OTLPMetricExporter", protocol)


def _otlp_log_exporter(protocol: str) -> Any:
    return _otlp("_log_exporter", "OTLPLogExporter", protocol)


def _otlp(module: str, name: str, protocol: str) -> Any:
    """The OTLP exporter of one signal over ``protocol``: gRPC if asked for and installed, else http/protobuf."""
    if protocol == "grpc":
        try:
            grpc = importlib.import_module(f"opentelemetry.exporter.otlp.proto.grpc.{module}")
        except ImportError:
            _log.warning("otel_llm: OTLP over gRPC needs `pip install otel-llm[grpc]`; %s over http/protobuf",
                         name.removeprefix("OTLP").removesuffix("Exporter").lower() + "s")
        else:
            return getattr(grpc, name)()
    return getattr(importlib.import_module(f"opentelemetry.exporter.otlp.proto.http.{module}"), name)()


class _ScrapeEndpoint:
    """The HTTP server of a Prometheus scrape endpoint, as something a failed set-up shuts down."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def sdk_enabled() -> bool:
    """``OTEL_SDK_DISABLED`` turns every SDK provider into one that records nothing."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"


# the Python SDK's own exporter names that pin the OTLP protocol (its opentelemetry_*_exporter entry points)
_OTLP_NAMES = {"otlp_proto_grpc": "grpc", "otlp_proto_http": "http/protobuf"}
_KNOWN = {"otlp", "console", "prometheus"}
_PROTOCOLS = {"grpc", "http/protobuf"}


@functools.cache  # once, not once per signal
def _unsupported_protocol(variable: str, protocol: str) -> None:
    _log.warning("otel_llm: %s=%s is not supported here (grpc or http/protobuf); using http/protobuf", variable,
                 protocol)


def _choices(signal: str) -> list[tuple[str, str]]:
    """(exporter, OTLP protocol) for each exporter OTEL_{signal}_EXPORTER names, comma-separated as the SDK reads
    it; none for ``none``. A name not known here is taken for otlp, with a warning."""
    names = [name.strip().lower() for name in os.environ.get(f"OTEL_{signal}_EXPORTER", "otlp").split(",")]
    names = [name for name in dict.fromkeys(names) if name] or ["otlp"]
    if "none" in names:
        return []
    variable = f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"
    if not os.environ.get(variable):
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = (os.environ.get(variable) or "http/protobuf").strip().lower()
    if protocol not in _PROTOCOLS:  # a typo would otherwise send to the other port, and only fail to connect
        _unsupported_protocol(variable, protocol)
        protocol = "http/protobuf"
    chosen = []
    for name in names:
        if name in _OTLP_NAMES:
            chosen.append(("otlp", _OTLP_NAMES[name]))
            continue
        if name not in _KNOWN or (name == "prometheus" and signal != "METRICS"):
            _log.warning("otel_llm: OTEL_%s_EXPORTER=%s is not supported here; using otlp", signal, name)
            name = "otlp"
        chosen.append((name, protocol))
    return list(dict.fromkeys(chosen))
