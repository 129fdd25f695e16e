"""A FastAPI service that streams an LLM completion to its users as server-sent events, instrumented by otel_llm.

    GET /chat?prompt=...&backend=openai|bedrock   text/event-stream: a `token` event per token, then `done`
    GET /                                          a page that renders the tokens as they arrive

Backends: the openai client (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``OPENAI_MODEL``) and boto3 bedrock-runtime's
``invoke_model_with_response_stream`` with a Claude messages body (credentials and region as boto3 finds them,
``BEDROCK_MODEL_ID``). A backend without credentials is served by otel_llm's built-in simulator, started in process.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import boto3
import openai
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.types import Receive, Scope, Send

import otel_llm
from otel_llm.simulator import DEFAULT_MODEL, Simulator

_log = logging.getLogger(__name__)
_PAGE = Path(__file__).with_name("index.html").read_text()
# Claude requires max_tokens; the OpenAI request leaves the length to the model
_BEDROCK_MAX_TOKENS = 1024


@dataclass(frozen=True)
class Backends:
    openai: openai.AsyncOpenAI
    openai_model: str
    bedrock: Any  # a boto3 bedrock-runtime client
    bedrock_model: str


def connect(openai_simulator: Simulator | None, bedrock_simulator: Simulator | None) -> Backends:
    """Clients for both backends: each on its simulator when given one, else on the real service."""
    if openai_simulator is not None:
        chat = openai.AsyncOpenAI(base_url=openai_simulator.base_url, api_key="simulator")
        chat_model = DEFAULT_MODEL
    else:
        chat, chat_model = openai.AsyncOpenAI(), os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
    if bedrock_simulator is not None:
        bedrock = boto3.client("bedrock-runtime", endpoint_url=bedrock_simulator.endpoint_url, region_name="us-east-1",
                               aws_access_key_id="simulator", aws_secret_access_key="simulator")
        bedrock_model = DEFAULT_MODEL
    else:
        bedrock = boto3.client("bedrock-runtime")
        bedrock_model = os.environ.get("BEDROCK_MODEL_ID", "us.anthropic.claude-3-5-haiku-20241022-v1:0")
    return Backends(chat, chat_model, bedrock, bedrock_model)


def create_app(
    *, tracer_provider: Any = None, meter_provider: Any = None, simulator: Simulator | None = None
) -> FastAPI:
    """The service. Providers not given come from the global ones or the ``OTEL_*`` variables (see otel_llm).

    A running `simulator` (the caller's) serves both backends; without one, the app starts its own for the backends
    that have no credentials.
    """
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = simulator is None
        sim = simulator or Simulator()
        simulate_openai = not own or not os.environ.get("OPENAI_API_KEY")
        simulate_bedrock = not own or boto3.Session().get_credentials() is None
        if own and (simulate_openai or simulate_bedrock):
            sim.start()
        app.state.backends = connect(sim if simulate_openai else None, sim if simulate_bedrock else None)
        try:
            yield
        finally:
            await app.state.backends.openai.close()
            if own:
                sim.stop()  # harmless when it never started

    app = FastAPI(title="otel_llm streaming example", lifespan=lifespan)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return _PAGE

    @app.get("/chat")
    async def chat(prompt: str, backend: Literal["openai", "bedrock"] = "openai") -> StreamingResponse:
        backends: Backends = app.state.backends
        if backend == "openai":
            tokens = _openai_tokens(backends.openai, backends.openai_model, prompt)
        else:
            tokens = _in_threadpool(_bedrock_tokens(backends.bedrock, backends.bedrock_model, prompt))
        return _ClosingStreamingResponse(_events(tokens), media_type="text/event-stream",
                                         headers={"cache-control": "no-cache"})

    return app


async def _openai_tokens(client: openai.AsyncOpenAI, model: str, prompt: str) -> AsyncGenerator[str, None]:
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], stream=True
    )
    async with stream:
        async for chunk in stream:
            if chunk.choices and (text := chunk.choices[0].delta.content):
                yield text


def _bedrock_tokens(client: Any, model_id: str, prompt: str) -> Iterator[str]:
    """boto3 has no async API: Starlette runs this generator in its thread pool."""
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": _BEDROCK_MAX_TOKENS,
            "messages": [{"role": "user", "content": prompt}]}
    stream = client.invoke_model_with_response_stream(modelId=model_id, body=json.dumps(body))["body"]
    try:
        for event in stream:
            chunk = json.loads(event["chunk"]["bytes"])
            if chunk["type"] == "content_block_delta" and chunk["delta"]["type"] == "text_delta":
                yield chunk["delta"]["text"]
    finally:
        stream.close()  # the user may leave mid-stream


async def _in_threadpool(tokens: Iterator[str]) -> AsyncGenerator[str, None]:
    """A sync generator's items, each read in Starlette's thread pool; closed there too, however the reading ends."""
    try:
        async for text in iterate_in_threadpool(tokens):
            yield text
    finally:
        await run_in_threadpool(tokens.close)


async def _events(tokens: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    try:
        async for text in tokens:
            yield _event("token", {"text": text})
    except Exception as exc:  # the 200 is already sent: tell the page, and the log
        _log.exception("the completion failed mid-stream")
        yield _event("error", {"message": f"{type(exc).__name__}: {exc}"})
        return
    finally:
        # a user who left cancelled us: the LLM stream under us is closed all the same, at once
        with anyio.CancelScope(shield=True):
            await tokens.aclose()
    yield _event("done", {})


class _ClosingStreamingResponse(StreamingResponse):
    """Closes its body however the response ends. A user who leaves mid-stream cancels the response where it waits,
    which may be on sending an event rather than in the body: Starlette then leaves the body, and the LLM stream
    under it, to the garbage collector, which closes them seconds or minutes later (or never), while the model
    writes a whole answer for nobody and its span runs on."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            body = self.body_iterator
            if isinstance(body, AsyncGenerator):
                with anyio.CancelScope(shield=True):
                    await body.aclose()


def _event(name: str, data: dict[str, str]) -> str:
    """One SSE event; JSON keeps newlines inside a token from ending the event."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"
