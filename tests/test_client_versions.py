"""Older client releases than the rest of the suite runs, each in a venv of its own: openai at the floor and at the
last 2.x, boto3/botocore at the first release with Converse, and openai just below the floor. Each venv runs the
scenarios of tests/versions/ with the real client on a loopback server, before instrument(), instrumented and after
uninstrument(), and prints what it saw; these tests judge that report.

The venvs are kept in .venv-clients/ and rebuilt when what they should hold changes. otel_llm is the work tree (on
PYTHONPATH), the rest comes from PyPI: without it these tests fail, they do not skip."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from versions import bedrock_scenarios, openai_scenarios
from versions.drive import INSTRUMENT_ONLY, Scenario

from otel_llm import _semconv as sc
from otel_llm.providers import ADAPTERS

REPO = Path(__file__).resolve().parent.parent
VENVS = REPO / ".venv-clients"
# otel_llm's own dependencies, as this venv has them
DEPENDENCIES = tuple(f"{name}=={importlib.metadata.version(name)}"
                     for name in ("opentelemetry-sdk", "opentelemetry-instrumentation", "wrapt"))
# a venv, then a drive of a few seconds each; two at a time on CI's two cores
WORKERS = 2
DRIVE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Client:
    """A client release in a venv of its own, and the module of scenarios run there."""

    requirements: tuple[str, ...]
    scenarios: ModuleType
    arguments: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.requirements[0].replace("==", "-")


FLOOR = Client(("openai==1.92.0",), openai_scenarios)
LAST_2X = Client(("openai==2.54.0",), openai_scenarios)
FIRST_CONVERSE = Client(("boto3==1.34.116", "botocore==1.34.116"), bedrock_scenarios)
BELOW_FLOOR = Client(("openai==1.91.0",), openai_scenarios, (INSTRUMENT_ONLY,))
SUPPORTED = (FLOOR, LAST_2X, FIRST_CONVERSE)

Reports = dict[Client, Future[dict[str, Any]]]

pytestmark = pytest.mark.timeout(180)  # the first test of each client waits for its venv


@pytest.fixture(scope="session")
def reports() -> Iterator[Reports]:
    """Each client's report, made in the background: tests wait for their own client's only."""
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    yield {client: pool.submit(_report, client) for client in (*SUPPORTED, BELOW_FLOOR)}
    pool.shutdown(cancel_futures=True)  # a run stopped early builds nothing more


def _report(client: Client) -> dict[str, Any]:
    python = _venv(client)
    script = Path(inspect.getfile(client.scenarios))
    environment = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    environment |= {"PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "tests"))), "OTEL_LLM_STRICT": "1"}
    drive = subprocess.run([python, script, *client.arguments], env=environment, capture_output=True, text=True,
                           timeout=DRIVE_TIMEOUT_S)
    if drive.returncode:
        raise AssertionError(f"{script.name} failed under {client.name}:\n{drive.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(drive.stdout)
    return report


def _venv(client: Client) -> Path:
    """A venv made by this interpreter holding otel_llm's dependencies and the client; kept while it is what it
    should be. otel_llm itself is not installed: the work tree is what is tested."""
    home = VENVS / client.name
    python = home / "bin" / "python"
    stamp, wanted = home / "installed.txt", "\n".join((sys.version, *DEPENDENCIES, *client.requirements))
    if stamp.is_file() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", home], check=True)
    # this interpreter's pip installs into the venv (none to bootstrap there); the drive compiles what it imports
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile",
                          "--timeout", "15", "--retries", "2", *DEPENDENCIES, *client.requirements],
                         capture_output=True, text=True)
    if pip.returncode:
        raise AssertionError(f"cannot install {' '.join(client.requirements)} into {home}: these tests need PyPI. "
                             f"pip said:\n{pip.stderr[-3000:]}")
    stamp.write_text(wanted)
    return python


def _cases(*, operations_only: bool = False) -> pytest.MarkDecorator:
    """Parametrize by (client, scenario), named e.g. "openai-1.92.0: chat.create stream"."""
    cases = [(client, scenario) for client in SUPPORTED for scenario in client.scenarios.SCENARIOS
             if scenario.span is not None or not operations_only]
    return pytest.mark.parametrize(("client", "scenario"), cases,
                                   ids=[f"{client.name}: {scenario.name}" for client, scenario in cases])


def _phases(reports: Reports, client: Client, scenario: Scenario) -> dict[str, dict[str, Any]]:
    """What the caller and the exporters saw before instrument(), instrumented and after uninstrument()."""
    observed: dict[str, dict[str, Any]] = reports[client].result()["scenarios"][scenario.name]
    return observed


# --- per client -------------------------------------------------------------------------------------------------


# targets in the places a client release has them: the Responses and chat parsers, in openai.lib since 3.x
MOVED = ({"openai.lib._response_resources:parse_response", "openai.resources.responses.responses:parse_response"},
         {"openai.lib._chat_completion_resources:_parse_chat_completion",
          "openai.resources.chat.completions.completions:_parse_chat_completion"})
# targets in resources a client gained in a later release: client.beta.responses (openai 3.x), responses.compact,
# client.decisions
GAINED = ("openai.resources.beta.responses.responses:", "openai.resources.responses.responses:Responses.compact",
          "openai.resources.responses.responses:AsyncResponses.compact", "openai.resources.decisions:")


@pytest.mark.parametrize("client", SUPPORTED, ids=lambda client: client.name)
def test_instrument_patches_every_target_quietly(reports: Reports, client: Client) -> None:
    report = reports[client].result()
    assert report["instrument_warnings"] == []
    patched = {name: (target["present"], target["patched"]) for name, target in report["targets"].items()}
    # a function the client moved between releases: one of its places is there, and patched
    for places in MOVED:
        if places <= patched.keys():
            assert sorted(patched.pop(place) for place in places) == [(False, False)] * (len(places) - 1) + [
                (True, True)], places
    # one a release does not have yet is quietly left out; where it has it, patched
    for name in [name for name in patched if name.startswith(GAINED)]:
        present, done = patched.pop(name)
        assert done is present, name
    # every other target in the client is there and patched; one in another instrumentation's module
    # (OpenTelemetry's botocore instrumentation, which these venvs do not install) only where it is installed
    assert patched == {name: (True, True) if present or not name.startswith("opentelemetry.instrumentation.")
                       else (False, False) for name, (present, _) in patched.items()}


@pytest.mark.parametrize("client", SUPPORTED, ids=lambda client: client.name)
def test_uninstrument_restores_every_original(reports: Reports, client: Client) -> None:
    report = reports[client].result()
    assert report["uninstrument_warnings"] == []
    restored = {name: target["restored"] for name, target in report["targets"].items()}
    assert restored == {name: True for name in report["targets"]}


def test_a_release_below_the_floor_is_warned_of_and_left_alone(reports: Reports) -> None:
    assert ADAPTERS["openai"].min_version == (1, 92), "BELOW_FLOOR must be the last release below the floor"
    report = reports[BELOW_FLOOR].result()
    assert report["instrument_warnings"] == [
        "otel_llm: openai 1.91.0 is outside the versions otel_llm supports (>=1.92, <4); not instrumenting it"]
    assert [name for name, target in report["targets"].items() if target["patched"]] == []


# --- per scenario -----------------------------------------------------------------------------------------------


@_cases()
def test_the_caller_sees_what_it_sees_uninstrumented(reports: Reports, client: Client, scenario: Scenario) -> None:
    """Same results, chunks and errors: no usage chunk we asked for leaks, nothing is wrapped or reordered."""
    phases = _phases(reports, client, scenario)
    baseline, instrumented, uninstrumented = phases["baseline"], phases["instrumented"], phases["uninstrumented"]
    assert baseline["error"] is None
    assert (instrumented["error"], instrumented["caller"]) == (None, baseline["caller"])
    assert (uninstrumented["error"], uninstrumented["caller"]) == (None, baseline["caller"])


@_cases()
def test_telemetry_only_while_instrumented_and_only_of_operations(
        reports: Reports, client: Client, scenario: Scenario) -> None:
    phases = _phases(reports, client, scenario)
    recorded = {name: bool(phase["spans"] or phase["points"]) for name, phase in phases.items()}
    assert recorded == {"baseline": False, "instrumented": scenario.span is not None, "uninstrumented": False}


@_cases()
def test_no_otel_llm_warnings(reports: Reports, client: Client, scenario: Scenario) -> None:
    phases = _phases(reports, client, scenario)
    assert {name: phase["warnings"] for name, phase in phases.items()} == {name: [] for name in phases}


@_cases(operations_only=True)
def test_one_client_span_with_the_design_attributes(reports: Reports, client: Client, scenario: Scenario) -> None:
    assert scenario.span is not None
    spans = _phases(reports, client, scenario)["instrumented"]["spans"]
    assert [span["name"] for span in spans] == [scenario.span.name]
    [span] = spans
    assert (span["kind"], span["status"]) == ("CLIENT", "ERROR" if scenario.span.error else "UNSET")
    expected = scenario.span.attributes(reports[client].result()["port"])
    assert {key: span["attributes"].get(key) for key in expected} == expected
    time_to_first_chunk = span["attributes"].get(sc.RESPONSE_TIME_TO_FIRST_CHUNK)
    assert (time_to_first_chunk > 0) if scenario.span.stream else (time_to_first_chunk is None)


@_cases(operations_only=True)
def test_histogram_points(reports: Reports, client: Client, scenario: Scenario) -> None:
    assert scenario.span is not None
    points = _phases(reports, client, scenario)["instrumented"]["points"]
    expected = scenario.span.points()
    assert {name: points.get(name, 0) for name in expected} == expected
