"""What we record agrees with what the caller observed, over a real socket, within 1 ms.

A loopback server pauses known times before the headers, the first token and between tokens. The test notes, on
the same monotonic clock, when it issued the call and when each chunk reached it; our TTFT, chunk gaps and duration
must match those observations (not merely the scheduled pauses, which the OS may stretch).

A first request warms the connection and the SDK's per-attribute-set aggregations (created on first record, about
a millisecond once per process and series); the second one is measured. Histogram sums then include both."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time

import openai
import pytest
import wire
from conftest import Captured, attributes

from otel_llm import _semconv as sc

TOKENS = ["one", " two", " three", " four", " five"]
USAGE = wire.Usage(input=20, output=5)
# role chunk after 80 ms of headers + 40 ms; then gaps picked well inside their buckets (see CHUNK_BUCKETS); the
# finishing chunk 20 ms after the last token (a duration that ended at the last token would be 20 ms short)
HEADERS_DELAY = 0.08
DELAYS = [0.04, 0.0, 0.0225, 0.045, 0.072, 0.0285, 0.02]
MS = 1e-3
pytestmark = pytest.mark.usefixtures("steady_clock")


def reply(request: wire.RecordedRequest) -> wire.Reply:
    return wire.Reply.stream(wire.chat_stream(TOKENS, usage=USAGE), headers_delay=HEADERS_DELAY, delays=DELAYS)


Observation = tuple[int, list[tuple[int, str | None]], int]  # issued, (arrival, content) per chunk, ended


def observe_sync(base_url: str) -> list[Observation]:
    client = openai.OpenAI(api_key="k", base_url=base_url, max_retries=0)
    return [observe_one_sync(client), observe_one_sync(client)]


def observe_one_sync(client: openai.OpenAI) -> Observation:
    issued = time.perf_counter_ns()
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "count"}], stream=True)
    arrivals = []
    for chunk in stream:
        arrivals.append((time.perf_counter_ns(), chunk.choices[0].delta.content))
    return issued, arrivals, time.perf_counter_ns()


def observe_async(base_url: str) -> list[Observation]:
    async def one(client: openai.AsyncOpenAI) -> Observation:
        issued = time.perf_counter_ns()
        stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "count"}],
                                                      stream=True)
        arrivals = []
        async for chunk in stream:
            arrivals.append((time.perf_counter_ns(), chunk.choices[0].delta.content))
        return issued, arrivals, time.perf_counter_ns()

    async def main() -> list[Observation]:
        client = openai.AsyncOpenAI(api_key="k", base_url=base_url, max_retries=0)
        return [await one(client), await one(client)]

    return asyncio.run(main())


@pytest.mark.parametrize("observe", [observe_sync, observe_async], ids=["sync", "async"])
def test_ttft_gaps_and_duration_match_the_callers_observation(otel: Captured, observe: object) -> None:
    with wire.LoopbackServer(reply) as server:
        warm_up, (issued, arrivals, ended) = observe(server.base_url)  # type: ignore[operator]

    content = [t for t, text in arrivals if text]
    assert len(content) == len(TOKENS)
    observed_ttft = (content[0] - issued) / 1e9
    observed_gaps = gaps_of(arrivals)
    observed_duration = (ended - issued) / 1e9

    attrs = attributes(otel.spans()[-1])
    assert attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(observed_ttft, abs=1 * MS)
    assert attrs[sc.MAX_CHUNK_GAP] == pytest.approx(max(observed_gaps), abs=1 * MS)
    assert attrs[sc.TIME_PER_OUTPUT_TOKEN] == pytest.approx(sum(observed_gaps) / (len(TOKENS) - 1), abs=1 * MS)
    # sanity: the role-only chunk did not count, so TTFT spans the headers, the role chunk and the first pause
    assert observed_ttft >= HEADERS_DELAY + DELAYS[0] + DELAYS[1]

    first, second = otel.spans()
    first_ttft = attributes(first)[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    ttfc = otel.point(sc.STABLE_NAMES.time_to_first_chunk.name)
    assert ttfc.count == 2 and ttfc.sum - first_ttft == pytest.approx(observed_ttft, abs=1 * MS)
    assert second.end_time is not None and second.start_time is not None
    # the duration is TTFT and the tail after the first token, each within 1 ms of the caller's view of it (each
    # part's margin is our own work at that end, which the caller's clock includes and the duration does not)
    recorded_duration = (second.end_time - second.start_time) / 1e9
    recorded_tail = recorded_duration - attrs[sc.RESPONSE_TIME_TO_FIRST_CHUNK]
    assert recorded_tail == pytest.approx((ended - content[0]) / 1e9, abs=1 * MS)
    assert recorded_duration <= observed_duration
    duration = otel.point(sc.STABLE_NAMES.duration.name)
    assert duration.count == 2 and duration.sum > recorded_duration

    gaps = otel.point(sc.STABLE_NAMES.time_per_output_chunk.name)
    all_gaps = gaps_of(warm_up[1]) + observed_gaps
    assert gaps.count == len(all_gaps)
    assert gaps.sum == pytest.approx(sum(all_gaps), abs=1 * MS)
    expected_buckets = [0] * (len(sc.CHUNK_BUCKETS) + 1)
    for gap in all_gaps:
        expected_buckets[bisect.bisect_left(sc.CHUNK_BUCKETS, gap)] += 1
    assert list(gaps.bucket_counts) == expected_buckets


def gaps_of(arrivals: list[tuple[int, str | None]]) -> list[float]:
    content = [t for t, text in arrivals if text]
    return [(b - a) / 1e9 for a, b in itertools.pairwise(content)]
