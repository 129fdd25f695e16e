"""boto3 bedrock-runtime calls against a loopback Bedrock (tests/wire_bedrock.py: its JSON and the AWS event-stream
framing), each with the span it must end with. Run by tests/test_client_versions.py inside a venv holding one
boto3/botocore release; prints the JSON report of drive.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any
from urllib.parse import unquote

import wire
import wire_bedrock as wb
from versions.drive import Scenario, Span, main

from otel_llm import _semconv as sc
from otel_llm.providers.bedrock import PROVIDER

CLAUDE = wb.FORMAT["claude-messages"]
MODEL = CLAUDE.model_id
THROTTLED_ONCE = "us.anthropic.throttled-once-v1:0"  # its first attempt gets a ThrottlingException
UNKNOWN_MODEL = "nope"
MESSAGES = [{"role": "user", "content": [{"text": "Say hello"}]}]
TOKENS = ["Hel", "lo", " world"]
USAGE = wb.Tokens(input=12, output=3)


def answer(request: wire.RecordedRequest) -> wire.Reply:
    """bedrock-runtime's model actions, and one call of the bedrock control plane (another AWS service)."""
    path = unquote(request.path)
    if path == "/foundation-models":
        return wire.Reply.json({"modelSummaries": []})
    model, _, action = path.removeprefix("/model/").rpartition("/")
    if model == THROTTLED_ONCE and "attempt=1" in request.headers["amz-sdk-request"].split("; "):
        return wb.throttled()
    if model == UNKNOWN_MODEL:
        return wb.error_reply(400, "ValidationException", "The provided model identifier is invalid.")
    if action == "converse":
        return wb.converse_reply(wb.converse_body("".join(TOKENS), usage=USAGE, latency_ms=40))
    if action == "converse-stream":
        return wb.stream_reply(wb.converse_stream(TOKENS, usage=USAGE, latency_ms=40))
    if action == "invoke":
        return wb.invoke_reply(CLAUDE.body(TOKENS, USAGE), wb.invocation_headers(USAGE, latency_ms=40))
    metrics = wb.invocation_metrics(USAGE, latency_ms=40, first_byte_ms=10)
    return wb.stream_reply(wb.invoke_stream(CLAUDE.stream(TOKENS, USAGE), metrics))


def without_metadata(result: dict[str, Any]) -> dict[str, Any]:
    """A result less its ResponseMetadata, whose Date header differs from call to call."""
    return {key: value for key, value in result.items() if key != "ResponseMetadata"}


def converse(server: wire.LoopbackServer) -> Any:
    return without_metadata(wb.client(server).converse(modelId=MODEL, messages=MESSAGES))


def converse_stream(server: wire.LoopbackServer) -> Any:
    result = wb.client(server).converse_stream(modelId=MODEL, messages=MESSAGES)
    return {**without_metadata(result), "stream": list(result["stream"])}


def converse_stream_closed_early(server: wire.LoopbackServer) -> Any:
    stream = wb.client(server).converse_stream(modelId=MODEL, messages=MESSAGES)["stream"]
    first = list(itertools.islice(stream, 2))
    stream.close()
    return first


def invoke_model(server: wire.LoopbackServer) -> Any:
    result = wb.client(server).invoke_model(modelId=MODEL, body=json.dumps(CLAUDE.request("Say hello")))
    return {**without_metadata(result), "body": result["body"].read()}


def invoke_model_stream(server: wire.LoopbackServer) -> Any:
    client = wb.client(server)
    result = client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(CLAUDE.request("Say hello")))
    return {**without_metadata(result), "body": list(result["body"])}


def converse_retried(server: wire.LoopbackServer) -> Any:
    return without_metadata(wb.client(server, attempts=2).converse(modelId=THROTTLED_ONCE, messages=MESSAGES))


def converse_refused(server: wire.LoopbackServer) -> Any:
    client = wb.client(server)
    try:
        client.converse(modelId=UNKNOWN_MODEL, messages=MESSAGES)
    except client.exceptions.ValidationException as error:
        return {"raised": type(error).__name__, "code": error.response["Error"]["Code"]}
    raise AssertionError("no ValidationException")


def other_service(server: wire.LoopbackServer) -> Any:
    return without_metadata(wb.client(server, service="bedrock").list_foundation_models())


CONVERSE = Span(sc.OP_CHAT, MODEL, sc.PROVIDER_AWS_BEDROCK, stream=False, input_tokens=USAGE.input,
                output_tokens=USAGE.output, finish_reasons=("end_turn",))
INVOKE = dataclasses.replace(CONVERSE, response_model=wb.CLAUDE_MODEL, response_id=wb.CLAUDE_ID)

SCENARIOS = (
    Scenario("converse", converse, CONVERSE),
    Scenario("converse_stream", converse_stream, dataclasses.replace(CONVERSE, stream=True)),
    Scenario("converse_stream closed after 2 events", converse_stream_closed_early,
             dataclasses.replace(CONVERSE, stream=True, input_tokens=None, output_tokens=None, finish_reasons=None,
                                 error=sc.ERROR_CANCELLED)),
    Scenario("invoke_model", invoke_model, INVOKE),
    Scenario("invoke_model_with_response_stream", invoke_model_stream, dataclasses.replace(INVOKE, stream=True)),
    Scenario("converse retried after a ThrottlingException", converse_retried,
             dataclasses.replace(CONVERSE, model=THROTTLED_ONCE, retries=1)),
    Scenario("converse refused with a ValidationException", converse_refused,
             Span(sc.OP_CHAT, UNKNOWN_MODEL, sc.PROVIDER_AWS_BEDROCK, stream=False, error="ValidationException")),
    Scenario("bedrock (control plane) list_foundation_models", other_service, None),
)

if __name__ == "__main__":
    main(PROVIDER, SCENARIOS, answer)
