"""The built-in simulator, driven by the real openai client: wire format, latency model, rate limits, ground truth."""

from __future__ import annotations

import asyncio
import bisect
import datetime
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from itertools import pairwise
from typing import Any

import anthropic
import boto3
import openai
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import Captured, Instrument, attributes

from otel_llm import _readout
from otel_llm import _semconv as sc
from otel_llm.simulator import DEFAULT_MODEL, EngineConfig, Quantiles, Simulator, TruthRecord, percentile, summarize

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?" * 4}]
# Fast and without a heavy tail unless a test asks for one.
QUICK = EngineConfig(
    capacity=8,
    prefill_base_s=0.004,
    prefill_per_token_s=0.0,
    tpot_base_s=0.002,
    batch_slowdown=0.1,
    output_tokens_median=12,
    tail_probability=0.0,
)


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(QUICK, seed=1) as simulator:
        yield simulator


def async_client(sim: Simulator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.base_url, api_key="sim", max_retries=0)


def sync_client(sim: Simulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key="sim", max_retries=0)


async def stream_timed(client: openai.AsyncOpenAI, max_tokens: int) -> tuple[str, list[int]]:
    """(completion id, perf_counter_ns of each content chunk's arrival)."""
    stream = await client.chat.completions.create(
        model=DEFAULT_MODEL, messages=MESSAGES, stream=True, max_tokens=max_tokens
    )
    completion_id, content_ns = "", []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            content_ns.append(time.perf_counter_ns())
        completion_id = chunk.id
    return completion_id, content_ns


async def run_load(sim: Simulator, concurrency: int, requests: int, max_tokens: int) -> None:
    """`requests` streamed requests, `concurrency` in flight at a time."""
    async with async_client(sim) as client:
        pending = iter(range(requests))

        async def worker() -> None:
            for _ in pending:
                await stream_timed(client, max_tokens)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


# Wire format


async def test_stream_starts_role_only_and_sends_one_chunk_per_token(sim: Simulator) -> None:
    async with async_client(sim) as client:
        stream = await client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, stream=True, max_tokens=7)
        chunks = [chunk async for chunk in stream]

    first, *tokens, finish = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert len(tokens) == 7
    assert all(chunk.choices[0].delta.content for chunk in tokens)
    assert finish.choices[0].finish_reason == "length"
    assert finish.choices[0].delta.content is None
    assert all(chunk.usage is None for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1


async def test_stream_ends_with_usage_chunk_when_asked(sim: Simulator) -> None:
    async with async_client(sim) as client:
        stream = await client.chat.completions.create(
            model=DEFAULT_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]

    *content, finish, usage = chunks
    (record,) = sim.truth()
    assert finish.choices[0].finish_reason == "stop"
    assert usage.choices == []
    assert usage.usage is not None
    assert usage.usage.completion_tokens == record.output_tokens == len(content) - 1
    assert (
        usage.usage.prompt_tokens
        == record.prompt_tokens
        == math.ceil(len("Be brief." + "Why is the sky blue?" * 4) / 4)
    )
    assert usage.usage.total_tokens == record.prompt_tokens + record.output_tokens


def test_plain_json_has_content_and_usage(sim: Simulator) -> None:
    with sync_client(sim) as client:
        completion = client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_completion_tokens=9)
        models = [model.id for model in client.models.list()]

    (record,) = sim.truth()
    assert completion.id == record.request_id
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (record.prompt_tokens, 9)
    assert (record.stream, record.status, record.token_ns) == (False, 200, ())
    assert models == [DEFAULT_MODEL]


def test_sync_stream_matches_truth(sim: Simulator) -> None:
    with sync_client(sim) as client:
        stream = client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, stream=True, max_tokens=5)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)

    (record,) = sim.truth()
    assert text
    assert (record.stream, record.status, record.output_tokens, len(record.token_ns)) == (True, 200, 5, 5)


def test_unknown_model_and_wrong_key_are_rejected_like_openai() -> None:
    with Simulator(QUICK, api_key="right") as sim:
        wrong_key = openai.OpenAI(base_url=sim.base_url, api_key="wrong", max_retries=0)
        with wrong_key, pytest.raises(openai.AuthenticationError) as unauthorized:
            wrong_key.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES)
        right_key = openai.OpenAI(base_url=sim.base_url, api_key="right", max_retries=0)
        with right_key, pytest.raises(openai.NotFoundError) as not_found:
            right_key.chat.completions.create(model="no-such-model", messages=MESSAGES)

    assert unauthorized.value.code == "invalid_api_key"
    assert not_found.value.code == "model_not_found"
    assert sim.truth() == []


async def test_stream_closed_early_is_recorded_as_499() -> None:
    with Simulator(EngineConfig(tpot_base_s=0.005)) as sim:
        async with async_client(sim) as client:
            stream = await client.chat.completions.create(
                model=DEFAULT_MODEL, messages=MESSAGES, stream=True, max_tokens=50
            )
            for _ in range(4):  # the role chunk and three tokens
                await anext(stream)
            await stream.close()
            deadline = time.perf_counter() + 2
            while not sim.truth() and time.perf_counter() < deadline:
                await asyncio.sleep(0.01)  # the server notices at its next write

    (record,) = sim.truth()
    assert record.status == 499
    assert 3 <= record.output_tokens == len(record.token_ns) < 50


# Ground truth against what the client sees


async def timing_errors(sim: Simulator, requests: int) -> tuple[list[float], list[float]]:
    """Client-minus-truth TTFT per request and |client - truth| per chunk gap, for requests made one at a time.

    The client clock starts when openai hands the request to httpx2: the 1-1.6 ms openai spends building it is
    client time the server cannot see."""
    sent_ns: list[int] = []

    async def note_send(request: object) -> None:
        sent_ns.append(time.perf_counter_ns())

    http_client = openai.DefaultAsyncHttpx2Client(event_hooks={"request": [note_send]})
    async with openai.AsyncOpenAI(
        base_url=sim.base_url, api_key="sim", max_retries=0, http_client=http_client
    ) as client:
        await stream_timed(client, 2)  # connection and client caches warm
        sim.reset_truth()
        observed = [await stream_timed(client, 15) for _ in range(requests)]

    truth = {record.request_id: record for record in sim.truth()}
    ttft_errors, gap_errors = [], []
    for (completion_id, content_ns), request_sent_ns in zip(observed, sent_ns[1:], strict=True):
        record = truth[completion_id]
        assert len(content_ns) == len(record.token_ns) == 15
        assert record.ttft_s is not None
        ttft_errors.append((content_ns[0] - request_sent_ns) / 1e9 - record.ttft_s)
        client_gaps = [(later - earlier) / 1e9 for earlier, later in pairwise(content_ns)]
        gap_errors += [abs(seen - true) for seen, true in zip(client_gaps, record.gaps_s, strict=True)]
    return ttft_errors, gap_errors


@pytest.mark.timing  # the client's clock against the server's, within milliseconds
async def test_client_timings_match_ground_truth() -> None:
    """On an idle machine 90% of TTFTs agree within 1.5 ms and 99% of chunk gaps within 0.4 ms. On a busy shared
    2-core machine every handoff between the client and server threads may wait for a CPU, which adds milliseconds
    to TTFT (two handoffs) but hardly to gaps (both ends wait alike). So, on the typical request and chunk of the best
    of three rounds: gaps within 2 ms, TTFT within 5 ms. Nagle (40 ms) or buffered tokens (5 ms each) fail every
    round; a busy moment fails one."""
    config = EngineConfig(prefill_base_s=0.004, tpot_base_s=0.005, tail_probability=0.0)
    typical = []
    with Simulator(config) as sim:
        for _ in range(3):
            ttft_errors, gap_errors = await timing_errors(sim, 6)
            assert all(error > 0 for error in ttft_errors)  # sent before the server got it, seen after it was written
            typical.append((percentile(ttft_errors, 50), percentile(gap_errors, 75)))
            if typical[-1][0] < 0.005 and typical[-1][1] < 0.002:
                break
    assert any(ttft < 0.005 and gap < 0.002 for ttft, gap in typical), typical


def test_same_seed_same_draws_other_seed_other_draws() -> None:
    config = EngineConfig(
        prefill_base_s=0.0, tpot_base_s=0.0002, output_tokens_median=20, tail_probability=0.5, tail_prefill_multiplier=1
    )

    def run(seed: int) -> list[tuple[object, ...]]:
        with Simulator(config, seed=seed) as sim, sync_client(sim) as client:
            texts = [
                client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES).choices[0].message.content
                for _ in range(6)
            ]
            records = sim.truth()
        return [(r.request_id, r.output_tokens, r.slow, text) for r, text in zip(records, texts, strict=True)]

    first = run(5)
    assert run(5) == first
    assert run(6) != first
    assert len({output_tokens for _, output_tokens, _, _ in first}) > 1


# The latency model


@pytest.mark.timing  # the client's clock against the server's, within milliseconds
async def test_concurrency_raises_throughput_ttft_and_tpot() -> None:
    # Steps of 5 ms, not QUICK's 2: client and server share one process and its GIL, and 16 clients reading a token
    # every 3.4 ms kept a core busy here, stretching the steps the model is checked against (5.9 ms for 3.4)
    config = replace(QUICK, tpot_base_s=0.005)
    with Simulator(config, seed=2) as sim:
        await run_load(sim, 1, 12, 20)
        alone = summarize(sim.truth())
        sim.reset_truth()
        await run_load(sim, 16, 48, 20)
        crowded = summarize(sim.truth())

    assert crowded.output_tokens_per_s > 2 * alone.output_tokens_per_s
    assert crowded.ttft.p50 > alone.ttft.p50
    assert crowded.tpot.p50 > alone.tpot.p50
    assert crowded.queue_wait.p95 > 0.01  # 16 in flight for 8 slots
    # The model: alone, ttft = prefill_base_s and tpot = tpot_base_s; 8 slots busy make tpot = base * (1 + 0.1 * 7).
    assert config.prefill_base_s <= alone.ttft.p50 < config.prefill_base_s + 0.005
    assert alone.tpot.p50 == pytest.approx(config.tpot_base_s, abs=0.001)
    assert crowded.tpot.p50 == pytest.approx(config.tpot_base_s * config.slowdown(8), rel=0.2)


async def test_sixty_four_streams_run_at_once() -> None:
    config = EngineConfig(capacity=64, prefill_base_s=0.001, tpot_base_s=0.005, batch_slowdown=0.02)
    with Simulator(config) as sim:
        await run_load(sim, 64, 64, 40)
        records = sim.truth()

    assert [(r.status, r.output_tokens) for r in records] == [(200, 40)] * 64
    last_arrival = max(r.received_ns for r in records)
    assert all(r.finished_ns > last_arrival for r in records)  # all 64 were streaming at the same moment


async def test_heavy_tail_separates_p99_from_p50() -> None:
    config = EngineConfig(
        capacity=16, prefill_base_s=0.01, tpot_base_s=0.001, tail_probability=0.05, tail_prefill_multiplier=20
    )
    with Simulator(config, seed=4) as sim:
        await run_load(sim, 10, 100, 2)
        records = sim.truth()

    ttft = summarize(records).ttft
    assert ttft.count == 100
    assert sum(r.slow for r in records) >= 2  # seed 4 draws 4 slow requests in 100
    assert ttft.p99 > 5 * ttft.p50


# Rate limits


def test_token_budget_answers_429_with_retry_after_and_rate_limit_headers() -> None:
    config = EngineConfig(prefill_base_s=0.0, tpot_base_s=0.0001, tokens_per_minute=300, requests_per_minute=1000)
    with Simulator(config) as sim, sync_client(sim) as client:
        cost = math.ceil(len("Be brief." + "Why is the sky blue?" * 4) / 4) + 100
        ok = client.chat.completions.with_raw_response.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=100)
        client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=100)
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, stream=True, max_tokens=100)
        records = sim.truth()

    assert ok.headers["x-ratelimit-limit-tokens"] == "300"
    assert ok.headers["x-ratelimit-remaining-tokens"] == str(300 - cost)
    assert ok.headers["x-ratelimit-limit-requests"] == "1000"
    assert ok.headers["x-ratelimit-remaining-requests"] == "999"
    error = limited.value
    assert (error.status_code, error.code, error.type) == (429, "rate_limit_exceeded", "tokens")
    headers = error.response.headers
    wait_s = (cost - (300 - 2 * cost)) / (300 / 60)  # the bucket refills 5 tokens a second
    assert float(headers["retry-after-ms"]) / 1000 == pytest.approx(wait_s, abs=0.05)
    assert headers["retry-after"] == str(math.ceil(float(headers["retry-after-ms"]) / 1000))
    assert int(headers["x-ratelimit-remaining-tokens"]) == 300 - 2 * cost
    assert headers["x-ratelimit-reset-tokens"].endswith("s")
    assert {"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"} <= set(
        headers
    )
    assert [r.status for r in records] == [200, 200, 429]


def test_request_budget_answers_429() -> None:
    config = EngineConfig(prefill_base_s=0.0, tpot_base_s=0.0001, requests_per_minute=2, tokens_per_minute=None)
    with Simulator(config) as sim, sync_client(sim) as client:
        for _ in range(2):
            client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=1)
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=1)

    headers = limited.value.response.headers
    assert limited.value.type == "requests"
    assert headers["retry-after"] == "30"  # 2 a minute: one request back every 30 s
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in headers


def spans_beside_truth(
    otel: Captured, sim: Simulator, call: Callable[[], object]
) -> list[tuple[Mapping[str, Any], TruthRecord]]:
    """`call` once to warm the client and its connection, then three times: each span's attributes beside the
    truth record of its request."""
    call()
    sim.reset_truth()
    for _ in range(3):
        call()
    spans, records = otel.spans()[1:], sim.truth()
    assert len(spans) == len(records) == 3
    return [(attributes(span), record) for span, record in zip(spans, records, strict=True)]


def ttft_error(attrs: Mapping[str, Any], record: TruthRecord) -> float:
    """The span's TTFT minus the truth's."""
    assert record.ttft_s is not None
    return float(attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK]) - record.ttft_s


# Anthropic Messages API through the real anthropic client

CLAUDE_MESSAGES: Any = [{"role": "user", "content": [{"type": "text", "text": MESSAGES[1]["content"]}]}]
SYSTEM = MESSAGES[0]["content"]


def anthropic_client(sim: Simulator, api_key: str = "sim") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.endpoint_url, api_key=api_key, max_retries=0)


def test_messages_stream_sends_anthropics_events_one_delta_per_token(sim: Simulator) -> None:
    with anthropic_client(sim) as client:
        with client.messages.with_streaming_response.create(
            model=DEFAULT_MODEL, system=SYSTEM, messages=CLAUDE_MESSAGES, max_tokens=100, stream=True
        ) as response:
            names = [line.removeprefix("event: ") for line in response.iter_lines() if line.startswith("event: ")]
            headers = response.headers
        events = list(client.messages.create(
            model=DEFAULT_MODEL, system=SYSTEM, messages=CLAUDE_MESSAGES, max_tokens=100, stream=True
        ))
        raw_record, record = sim.truth()

    deltas_sent = ["content_block_delta"] * raw_record.output_tokens
    assert names == ["message_start", "content_block_start", "ping", *deltas_sent, "content_block_stop",
                     "message_delta", "message_stop"]
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["request-id"] == "req_" + raw_record.request_id.removeprefix("msg_")
    assert headers["anthropic-ratelimit-requests-limit"] == "10000"
    start, block_start, *deltas, block_stop, message_delta, stop = events  # the client drops the ping
    assert start.type == "message_start" and block_start.type == "content_block_start"
    assert start.message.id == record.request_id
    prompt_chars = len(SYSTEM + MESSAGES[1]["content"])
    assert start.message.usage.input_tokens == record.prompt_tokens == math.ceil(prompt_chars / 4)
    assert all(delta.type == "content_block_delta" and delta.delta.type == "text_delta" for delta in deltas)
    assert len(deltas) == record.output_tokens == len(record.token_ns)
    assert (block_stop.type, message_delta.type, stop.type) == ("content_block_stop", "message_delta", "message_stop")
    assert message_delta.delta.stop_reason == "end_turn"
    assert message_delta.usage.output_tokens == record.output_tokens
    assert (record.stream, record.status) == (True, 200)


async def test_messages_stream_helper_text_equals_the_plain_answer_of_the_same_draw() -> None:
    """The k-th request draws the same text whether streamed or not, so a plain answer from a twin simulator is the
    text the stream generated; max_tokens caps the drawn length."""
    config = EngineConfig(prefill_base_s=0.0, tpot_base_s=0.0005, output_tokens_median=12, output_tokens_sigma=0.0)
    with Simulator(config, seed=3) as sim:
        with anthropic_client(sim) as client:
            message = client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=100)
            capped = client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5)
        plain_record, capped_record = sim.truth()
    with Simulator(config, seed=3) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.endpoint_url, api_key="sim", max_retries=0)
        async with client, client.messages.stream(
            model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=100
        ) as stream:
            pieces = [text async for text in stream.text_stream]
            text = await stream.get_final_text()
            final = await stream.get_final_message()
        (stream_record,) = sim.truth()

    assert message.content[0].type == "text"
    assert text == "".join(pieces) == message.content[0].text
    assert len(pieces) == stream_record.output_tokens == 12
    assert message.id == plain_record.request_id == stream_record.request_id
    assert (message.stop_reason, final.stop_reason) == ("end_turn", "end_turn")
    assert message.usage.input_tokens == plain_record.prompt_tokens
    assert message.usage.output_tokens == final.usage.output_tokens == 12
    assert (capped.stop_reason, capped.usage.output_tokens, capped_record.output_tokens) == ("max_tokens", 5, 5)
    assert (plain_record.stream, plain_record.token_ns) == (False, ())


def test_messages_over_budget_is_a_rate_limit_error_with_anthropics_headers() -> None:
    config = EngineConfig(prefill_base_s=0.0, tpot_base_s=0.0001, requests_per_minute=2, tokens_per_minute=1000)
    with Simulator(config) as sim, anthropic_client(sim) as client:
        ok = client.messages.with_raw_response.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5)
        client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5)
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5, stream=True)
        records = sim.truth()

    assert ok.headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert ok.headers["anthropic-ratelimit-tokens-limit"] == "1000"
    error = limited.value
    assert error.status_code == 429
    assert isinstance(error.body, dict) and error.body["error"]["type"] == "rate_limit_error"
    headers = error.response.headers
    assert error.body["request_id"] == headers["request-id"]
    assert headers["retry-after"] == "30"  # 2 a minute: one request back every 30 s
    assert headers["anthropic-ratelimit-requests-limit"] == "2"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    reset = datetime.datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"])
    assert 59 <= (reset - datetime.datetime.now(datetime.UTC)).total_seconds() <= 61  # both requests back in 60 s
    assert {"anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"} <= set(headers)
    assert [r.status for r in records] == [200, 200, 429]


def x_api_key_client(sim: Simulator, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.endpoint_url, api_key=None, default_headers={"x-api-key": key},
                               max_retries=0)


def test_messages_errors_are_anthropics_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with Simulator(QUICK, api_key="right") as sim:
        with anthropic_client(sim, "wrong") as client, pytest.raises(anthropic.AuthenticationError) as unauthorized:
            client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5)
        with anthropic_client(sim, "right") as client:  # anthropic 2.x sends the key as a bearer token
            with pytest.raises(anthropic.NotFoundError) as not_found:
                client.messages.create(model="claude-v9", messages=CLAUDE_MESSAGES, max_tokens=5)
            with pytest.raises(anthropic.BadRequestError) as bad:
                client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=0)
            client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5)
        # the API's own header, as older clients and curl send it
        with x_api_key_client(sim, "right") as client:
            client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5)
        with x_api_key_client(sim, "wrong") as client, pytest.raises(anthropic.AuthenticationError):
            client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=5)

    errors = [error.value.body for error in (unauthorized, not_found, bad)]
    assert [body["error"]["type"] for body in errors if isinstance(body, dict)] == [
        "authentication_error", "not_found_error", "invalid_request_error"
    ]
    assert [r.status for r in sim.truth()] == [200, 200]  # refusals before the draw leave no record


@pytest.mark.timing  # the client's clock against the server's, within milliseconds
def test_instrumented_messages_stream_ttft_is_close_to_the_truth(instrument: Instrument) -> None:
    """otel_llm's clock starts before the anthropic client builds the request, the truth's when the request head has
    arrived, so the span's TTFT exceeds the truth by that client work: a few ms at most on a busy machine."""
    otel = instrument()
    config = EngineConfig(prefill_base_s=0.02, tpot_base_s=0.002, output_tokens_median=8, tail_probability=0.0)
    with Simulator(config) as sim, anthropic_client(sim) as client:

        def stream() -> None:
            for _ in client.messages.create(model=DEFAULT_MODEL, messages=CLAUDE_MESSAGES, max_tokens=8, stream=True):
                pass

        measured = spans_beside_truth(otel, sim, stream)

    errors = [ttft_error(attrs, record) for attrs, record in measured]
    for attrs, record in measured:
        assert attrs[sc.USAGE_OUTPUT_TOKENS] == record.output_tokens
        assert attrs[sc.USAGE_INPUT_TOKENS] == record.prompt_tokens
        assert attrs[sc.RATE_LIMIT_LIMIT_PREFIX + sc.RATE_LIMIT_REQUESTS] == 10_000
        # the bucket refills one request every 6 ms and is full again before each: it lacks only this one
        assert attrs[sc.RATE_LIMIT_REMAINING_PREFIX + sc.RATE_LIMIT_REQUESTS] == 10_000 - 1
    assert all(error > 0 for error in errors), errors
    assert percentile(errors, 50) < 0.01, errors


# Bedrock: the Claude messages body through real boto3 (signing, event-stream parsing)

_BOTO = boto3.session.Session()  # one session: each new one loads the service model again (~100 ms)


def bedrock_client(sim: Simulator) -> Any:
    return _BOTO.client(
        "bedrock-runtime", endpoint_url=sim.endpoint_url, region_name="us-east-1", aws_access_key_id="test",
        aws_secret_access_key="test", config=Config(retries={"total_max_attempts": 1}),
    )


def claude_body(max_tokens: int) -> str:
    """MESSAGES as a Claude body: the system prompt on its own, the user's text as a content block."""
    user = [{"type": "text", "text": MESSAGES[1]["content"]}]
    return json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": max_tokens,
                       "system": MESSAGES[0]["content"], "messages": [{"role": "user", "content": user}]})


def stream_claude(client: Any, max_tokens: int = 100) -> list[dict[str, Any]]:
    response = client.invoke_model_with_response_stream(modelId=DEFAULT_MODEL, body=claude_body(max_tokens))
    return [json.loads(event["chunk"]["bytes"]) for event in response["body"]]


def test_bedrock_stream_sends_claude_events_one_delta_per_token_with_bedrocks_metrics(sim: Simulator) -> None:
    events = stream_claude(bedrock_client(sim))

    (record,) = sim.truth()
    start, block_start, *deltas, block_stop, message_delta, stop = events
    assert start["type"] == "message_start" and block_start["type"] == "content_block_start"
    assert start["message"]["id"] == record.request_id
    prompt_chars = len("Be brief." + "Why is the sky blue?" * 4)
    assert start["message"]["usage"]["input_tokens"] == record.prompt_tokens == math.ceil(prompt_chars / 4)
    assert [delta["type"] for delta in deltas] == ["content_block_delta"] * record.output_tokens
    assert all(delta["delta"]["text"] for delta in deltas)
    assert block_stop["type"] == "content_block_stop"
    assert message_delta["delta"]["stop_reason"] == "end_turn"
    assert message_delta["usage"]["output_tokens"] == record.output_tokens
    assert stop["type"] == "message_stop"
    assert record.ttft_s is not None
    assert stop["amazon-bedrock-invocationMetrics"] == {
        "inputTokenCount": record.prompt_tokens,
        "outputTokenCount": record.output_tokens,
        "invocationLatency": stop["amazon-bedrock-invocationMetrics"]["invocationLatency"],
        "firstByteLatency": round(record.ttft_s * 1000),
    }
    assert (record.stream, record.status, len(record.token_ns)) == (True, 200, record.output_tokens)


def test_bedrock_max_tokens_caps_the_drawn_length_and_invoke_answers_a_claude_message() -> None:
    config = EngineConfig(prefill_base_s=0.0, tpot_base_s=0.0005, output_tokens_median=12, output_tokens_sigma=0.0)
    with Simulator(config) as sim:
        client = bedrock_client(sim)
        capped = stream_claude(client, max_tokens=3)
        plain = client.invoke_model(modelId=DEFAULT_MODEL, body=claude_body(100))
        message = json.loads(plain["body"].read())
        _, plain_record = sim.truth()

    assert [event["delta"].get("stop_reason") for event in capped if event["type"] == "message_delta"] == ["max_tokens"]
    assert sum(event["type"] == "content_block_delta" for event in capped) == 3
    assert message["id"] == plain_record.request_id
    assert (message["stop_reason"], message["usage"]["output_tokens"]) == ("end_turn", 12)
    assert message["content"][0]["text"]
    headers = plain["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-amzn-bedrock-input-token-count"] == str(plain_record.prompt_tokens)
    assert headers["x-amzn-bedrock-output-token-count"] == "12"
    assert (plain_record.stream, plain_record.token_ns) == (False, ())


def test_bedrock_errors_are_bedrocks_own() -> None:
    config = EngineConfig(prefill_base_s=0.0, tpot_base_s=0.0001, requests_per_minute=1, tokens_per_minute=None)
    with Simulator(config) as sim:
        client = bedrock_client(sim)
        with pytest.raises(ClientError) as unknown_model:
            client.invoke_model(modelId="anthropic.claude-v9", body=claude_body(5))
        with pytest.raises(ClientError) as no_max_tokens:
            client.invoke_model(modelId=DEFAULT_MODEL, body=json.dumps({"anthropic_version": "bedrock-2023-05-31",
                                                                         "messages": MESSAGES[1:]}))
        stream_claude(client, max_tokens=5)
        with pytest.raises(ClientError) as throttled:
            stream_claude(client, max_tokens=5)
        records = sim.truth()

    assert unknown_model.value.response["Error"]["Code"] == "ValidationException"
    assert no_max_tokens.value.response["Error"]["Code"] == "ValidationException"
    assert throttled.value.response["Error"]["Code"] == "ThrottlingException"
    assert throttled.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert [r.status for r in records] == [200, 429]


@pytest.mark.timing  # the client's clock against the server's, within milliseconds
def test_instrumented_bedrock_stream_ttft_is_close_to_the_truth(instrument: Instrument) -> None:
    """otel_llm's clock starts before botocore builds and signs the request, the truth's when the request head has
    arrived: the span's TTFT exceeds the truth by that client work, about 1.5 ms idle, a few ms on a busy machine.
    Bedrock's own first-byte figure, recorded beside ours, is the truth in whole ms."""
    otel = instrument()
    config = EngineConfig(prefill_base_s=0.02, tpot_base_s=0.002, output_tokens_median=8, tail_probability=0.0)
    with Simulator(config) as sim:
        client = bedrock_client(sim)
        measured = spans_beside_truth(otel, sim, lambda: stream_claude(client, 8))  # warms botocore's lazy loading

    errors = [ttft_error(attrs, record) for attrs, record in measured]
    for attrs, record in measured:
        assert record.ttft_s is not None
        assert attrs[sc.PROVIDER_TIME_TO_FIRST_BYTE] == round(record.ttft_s * 1000) / 1000
        assert attrs[sc.USAGE_OUTPUT_TOKENS] == record.output_tokens
    assert all(error > 0 for error in errors), errors
    assert percentile(errors, 50) < 0.01, errors


# Lifecycle


async def test_stop_is_prompt_and_leaves_no_thread(caplog: pytest.LogCaptureFixture) -> None:
    sim = Simulator(EngineConfig(capacity=1, tpot_base_s=0.01)).start()
    assert [t for t in threading.enumerate() if t.name == "otel-llm-simulator"]
    async with async_client(sim) as client:
        streams = [
            await client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, stream=True) for _ in range(3)
        ]
        await anext(streams[0])
        await anext(streams[0])  # one decoding, two queued for the only slot
        started = time.perf_counter()
        await asyncio.to_thread(sim.stop)
        assert time.perf_counter() - started < 0.5
        for stream in streams:
            with pytest.raises(openai.APIConnectionError):
                async for _ in stream:
                    pass

    assert not [t for t in threading.enumerate() if t.name == "otel-llm-simulator"]
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    sim.stop()  # a second stop is harmless


def test_port_in_use_fails_start() -> None:
    with Simulator(QUICK) as running, pytest.raises(OSError):
        Simulator(QUICK, port=running.port).start()


# Statistics


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    assert Quantiles.of([]).count == 0 and math.isnan(Quantiles.of([]).p99)


def test_truth_quantiles_are_by_nearest_rank() -> None:
    # of 16 requests with one slow, p95 and p99 are the slowest (interpolating between ranks would give a p95 a
    # quarter of the way from the 15th)
    sample = [0.02 + i / 1000 for i in range(15)] + [0.35]
    quantiles = Quantiles.of(reversed(sample))
    assert (quantiles.count, quantiles.p50, quantiles.p95, quantiles.p99) == (16, sample[7], 0.35, 0.35)
    assert percentile(sample, 95) == pytest.approx(sample[14] + 0.25 * (0.35 - sample[14]))
    assert Quantiles.of([7.0]) == Quantiles(1, 7.0, 7.0, 7.0)


@pytest.mark.parametrize("size", [1, 2, 7, 16, 40, 100, 1000])
def test_a_histogram_quantile_falls_in_the_bucket_of_the_truths(size: int) -> None:
    """What the demo's two columns rest on: Prometheus's histogram_quantile over our buckets answers from the bucket
    that holds the truth's value, for samples of any size (the gap is then at most one bucket)."""
    bounds = sc.LATENCY_BUCKETS
    draws = random.Random(size)
    for _ in range(50):
        sample = [draws.lognormvariate(math.log(0.3), 1.0) for _ in range(size)]
        counts = [0] * (len(bounds) + 1)
        for value in sample:
            counts[bisect.bisect_left(bounds, value)] += 1
        histogram = _readout.Buckets(tuple(bounds), tuple(counts), sum(sample))
        truth = Quantiles.of(sample)
        for q, exact in ((0.5, truth.p50), (0.95, truth.p95), (0.99, truth.p99)):
            bucket = bisect.bisect_left(bounds, exact)
            if bucket == len(bounds):
                continue  # above the last bound, histogram_quantile answers with that bound
            low = bounds[bucket - 1] if bucket else 0.0
            assert low <= histogram.quantile(q) <= bounds[bucket], (size, q, exact)


def test_truth_record_derives_ttft_tpot_and_gaps() -> None:
    record = TruthRecord(
        index=0,
        request_id="chatcmpl-x",
        model=DEFAULT_MODEL,
        stream=True,
        status=200,
        received_ns=0,
        queue_wait_ns=0,
        token_ns=(100_000_000, 110_000_000, 130_000_000),
        finished_ns=131_000_000,
        prompt_tokens=3,
        output_tokens=3,
        slow=False,
    )
    assert record.first_token_ns == 100_000_000
    assert record.ttft_s == pytest.approx(0.1)
    assert record.tpot_s == pytest.approx(0.015)
    assert record.gaps_s == pytest.approx([0.01, 0.02])
