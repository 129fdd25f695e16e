"""The real Prometheus on loopback for tests, and what it sees from the SDK.

``promtool()`` / ``prometheus_binary()`` find Debian's binaries or fail the test with how to install them (CI installs
them; a missing binary must not turn into a silent skip). ``running(config, workdir)`` starts ``prometheus`` on a
free 127.0.0.1 port and stops it afterwards; ``Exposition`` serves a ``prometheus_client`` registry (for example one
fed by the SDK's ``PrometheusMetricReader``) for it to scrape. ``emitted_series()`` is every series name the SDK
can produce, derived from ``otel_llm._semconv``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import start_http_server

from otel_llm import _semconv as sc

_INSTALL_HINT = (
    "not found on PATH: install Debian's prometheus package (`apt-get install prometheus`, as scripts/setup does) "
    "which provides promtool and the prometheus server"
)


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} {_INSTALL_HINT}", pytrace=False)
    return path


def promtool() -> str:
    return _binary("promtool")


def prometheus_binary() -> str:
    return _binary("prometheus")


def run_promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd,
                          check=False)


def start_promtool(*args: str | Path) -> subprocess.Popen[str]:
    """``promtool`` running in the background, stdout and stderr together (for runs started side by side)."""
    return subprocess.Popen([promtool(), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- what the SDK emits --------------------------------------------------------------------------------------


def instrument_kinds() -> dict[str, tuple[sc.Instrument, str]]:
    """Every instrument of both name sets by name, with its kind: histogram, counter or gauge."""
    found: dict[str, tuple[sc.Instrument, str]] = {}
    for names in (sc.STABLE_NAMES, sc.LATEST_EXPERIMENTAL_NAMES):
        for field in fields(names):
            instrument = getattr(names, field.name)
            if instrument is None:
                continue
            kind = "histogram" if instrument.buckets else "counter" if field.name.endswith("_counter") else "gauge"
            found[instrument.name] = (instrument, kind)
    return found


def series_names(instrument: sc.Instrument, kind: str) -> tuple[str, ...]:
    family = sc.prometheus_name(instrument)
    if kind == "histogram":
        return (f"{family}_bucket", f"{family}_sum", f"{family}_count")
    if kind == "counter":
        return (f"{family}_total",)
    return (family,)


def emitted_series() -> frozenset[str]:
    """Every series name Prometheus can see from otel_llm, under either name set."""
    kinds = instrument_kinds().values()
    return frozenset(name for instrument, kind in kinds for name in series_names(instrument, kind))


def attribute_labels() -> frozenset[str]:
    """Label names the SDK's attributes become, plus the ones Prometheus and exporters add."""
    namespaces = ("gen_ai.", "otel_llm.", "server.", "error.")
    keys = [value for name, value in vars(sc).items()
            if name.isupper() and isinstance(value, str) and value.startswith(namespaces) and not value.endswith(".")]
    return frozenset({sc.prometheus_name(k) for k in keys} | {"job", "instance", "le", "__name__"})


# --- serving an exposition ------------------------------------------------------------------------------------


class Exposition:
    """Serves ``registry`` at ``http://{target}/metrics`` on loopback until closed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        self.target = f"127.0.0.1:{self._server.server_port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def scrape_config(jobs: Mapping[str, str], *, interval: str = "1s", rule_files: Sequence[Path] = ()) -> dict[str, Any]:
    """A Prometheus config scraping ``{job: "host:port"}`` every ``interval``."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]} for job, target in jobs.items()
        ],
    }
    if rule_files:
        config["rule_files"] = [str(path) for path in rule_files]
    return config


# --- the server -----------------------------------------------------------------------------------------------


class PromQLError(AssertionError):
    """Prometheus refused a query; the message carries its error."""


class Prometheus:
    """A running ``prometheus`` and its HTTP API."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def _get(self, path: str, params: Sequence[tuple[str, str]] = ()) -> Any:
        query = urllib.parse.urlencode(list(params))
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise PromQLError(f"{path} {dict(params)}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the result list (vector) or ``[scalar]``. PromQLError when Prometheus refuses it."""
        params = [("query", expr)] + ([("time", repr(at))] if at is not None else [])
        data = self._get("/api/v1/query", params)
        result = data["result"]
        return result if isinstance(result, list) and data["resultType"] != "scalar" else [result]

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        params = [("query", expr), ("start", repr(start)), ("end", repr(end)), ("step", step)]
        result: list[dict[str, Any]] = self._get("/api/v1/query_range", params)["result"]
        return result

    def series(self, match: str) -> list[dict[str, str]]:
        result: list[dict[str, str]] = self._get("/api/v1/series", [("match[]", match)])
        return result

    def targets_up(self) -> bool:
        return all(t["health"] == "up" for t in self._get("/api/v1/targets")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self._get("/api/v1/rules")["groups"]
        return groups

    def wait_for(self, expr: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns something; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"no data for {expr} after {timeout}s; log: {self.log}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _start(config_file: Path, workdir: Path, extra_args: Sequence[str]) -> Prometheus:
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *extra_args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"prometheus not ready after 30s: {log.read_text()[-2000:]}")


@contextmanager
def running(
    config: Mapping[str, Any] | Path, workdir: Path, *, extra_args: Sequence[str] = ()
) -> Iterator[Prometheus]:
    """Start ``prometheus`` with ``config`` (a mapping or a file) on a free loopback port; stop it on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    if isinstance(config, Path):
        config_file = config
    else:
        config_file = workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    for attempt in range(3):  # the free port can be taken between the probe and prometheus binding it
        try:
            server = _start(config_file, workdir, extra_args)
            break
        except RuntimeError:
            if attempt == 2:
                raise
    try:
        yield server
    finally:
        server.stop()
