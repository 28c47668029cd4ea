"""SGLang's HTTP API as the simulated server answers it: health, model and server info, cache flush,
native `/generate` and the OpenAI completions and chat endpoints, streamed or whole, with uvicorn's
access lines and `--api-key` checks."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from autotune.measure.arrival import ARRIVAL_HEADER, ScheduledArrival
from autotune.sim.logfmt import ERROR
from autotune.sim.predictability import predictability
from autotune.sim.server.launch import Launch, LaunchPart
from autotune.sim.server.serving import (
    BadRequest,
    ClientRequest,
    Serving,
    count_text_tokens,
    fake_token_text,
)
from autotune.sim.server_args import CudaGraphConfig

SLOW_HEALTH_S = 2.0
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling-params default
OPENAI_COMPLETION_MAX_TOKENS = 16  # the OpenAI completions default
SHUTDOWN_TIMEOUT_S = 1.0


SIM_KEY = web.AppKey("sim", object)


class _UvicornAccessLogger(AbstractAccessLogger):
    """Access lines in uvicorn's format, as SGLang's log shows them."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        server = request.app[SIM_KEY] if isinstance(request, web.Request) else None
        if not isinstance(server, HttpApi):
            return
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "-"
        try:
            phrase = HTTPStatus(response.status).phrase
        except ValueError:
            phrase = ""
        line = f"{request.method} {request.path_qs} HTTP/{request.version.major}.{request.version.minor}"
        server.log.uvicorn(f'{client} - "{line}" {response.status} {phrase}')


class HttpApi(LaunchPart):
    """The HTTP server of one launch: its routes answer from the launch's settings and `serving`."""

    def __init__(self, launch: Launch, serving: Serving) -> None:
        super().__init__(launch)
        self.serving = serving
        self.scale = self.options.time_scale
        self._runner: web.AppRunner | None = None

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._api_key_middleware])
        app[SIM_KEY] = self
        app.add_routes(
            [
                web.get("/health", self.handle_health),
                web.get("/health_generate", self.handle_health),
                web.get("/get_model_info", self.handle_model_info),
                web.get("/model_info", self.handle_model_info),
                web.get("/get_server_info", self.handle_get_server_info),
                web.get("/server_info", self.handle_server_info),
                web.post("/flush_cache", self.handle_flush_cache),
                web.get("/flush_cache", self.handle_flush_cache),
                web.post("/generate", self.handle_generate),
                web.get("/v1/models", self.handle_models),
                web.post("/v1/completions", self.handle_completions),
                web.post("/v1/chat/completions", self.handle_chat_completions),
            ]
        )
        return app

    @web.middleware
    async def _api_key_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # As SGLang 0.5.17 srt/utils/auth.py decide_request_auth: with --api-key every path but /health*
        # and /metrics* needs `Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"}.
        key = self.ns.api_key
        if key and not request.path.startswith(("/health", "/metrics")):
            if request.headers.get("Authorization") != f"Bearer {key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def start(self) -> None:
        runner = web.AppRunner(
            self._build_app(), access_log_class=_UvicornAccessLogger, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        self._runner = runner
        self.log.uvicorn(f"Started server process [{os.getpid()}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        try:
            await web.TCPSite(runner, self.ns.host, self.ns.port).start()
        except OSError as exc:
            self.log.uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"('{self.ns.host}', {self.ns.port}): {(exc.strerror or str(exc)).lower()}",
                ERROR,
            )
            sys.stderr.flush()
            os._exit(1)  # uvicorn exits with 1 when it cannot bind
        self.log.uvicorn(f"Uvicorn running on http://{self.ns.host}:{self.ns.port} (Press CTRL+C to quit)")

    async def stop(self) -> None:
        if self._runner is None:
            return
        self.log.uvicorn("Shutting down")
        self.log.uvicorn("Waiting for application shutdown.")
        self.log.uvicorn("Application shutdown complete.")
        runner, self._runner = self._runner, None
        await runner.cleanup()
        self.log.uvicorn(f"Finished server process [{os.getpid()}]")

    def base_url(self) -> str:
        host = self.ns.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"  # a wildcard bind is reached through loopback, as SGLang's warm-up does
        return f"http://[{host}]:{self.ns.port}" if ":" in host else f"http://{host}:{self.ns.port}"

    # -- handlers -----------------------------------------------------------------------------------------
    async def handle_health(self, request: web.Request) -> web.Response:
        if not self.serving.ready:
            return web.Response(status=503)
        if "slow_health" in self.options.faults:
            await asyncio.sleep(SLOW_HEALTH_S)
        if not self.serving.engine.has_work:
            # Idle: SGLang proves health by generating one token; busy, the running batch proves it.
            health = self.serving.submit(1, 1, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", probe=True)
            await self.serving.collect(health)
        return web.Response(status=200)

    async def handle_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.ns.model_path,
                "tokenizer_path": self.args["tokenizer_path"],
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": None,
                "architectures": [self.node.model.architecture],
            }
        )

    async def handle_get_server_info(self, request: web.Request) -> web.Response:
        # http_server.py:771-778: the old name still answers, with a warning per call.
        self.log.warning(
            "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead."
        )
        return await self.handle_server_info(request)

    async def handle_server_info(self, request: web.Request) -> web.Response:
        stats = self.serving.engine.stats
        state: dict[str, Any] = {
            "last_gen_throughput": self.serving.last_gen_throughput or stats["last_gen_throughput"],
            "memory_usage": {
                "weight": round(self.plan.weights_gb, 2),
                "kvcache": round(max(self.plan.kv_gb, 0.0), 2),
                "token_capacity": self.plan.kv_tokens,
                "graph": round(self.plan.graph_gb, 2),
            },
        }
        if self.node.spec is not None:
            state["avg_spec_accept_length"] = stats["avg_accept_length"]
        dp_states = 1 if not self.ns.enable_dp_attention else max(self.ns.dp_size, 1)
        info = {
            **{k: asdict(v) if isinstance(v, CudaGraphConfig) else v for k, v in self.args.items()},
            "max_total_num_tokens": self.plan.kv_tokens,
            "max_req_input_len": min(self.plan.context_len, self.plan.kv_tokens) - 1,
            "internal_states": [dict(state) for _ in range(dp_states)],
            "version": self.options.version.name,
            "time_scale": self.scale,
            "simulator": {
                "hardware": self.node.hw.name,
                "model": self.node.model.name,
                "seed": self.options.seed,
                "noise": self.options.noise.describe(),
            },
        }
        return web.json_response(info)

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        stats = self.serving.engine.stats
        if self.serving.engine.has_work:
            self.log.warning(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {int(stats['queued'])}, #running-req: {int(stats['running'])}",
                self.ranks.first,
            )
            status = 400
        else:
            if self.serving.engine.cache is not None:
                self.serving.engine.cache.clear()
            self.ranks.rank0("Cache flushed successfully!")
            status = 200
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n",
            status=status,
        )

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.args["served_model_name"],
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": self.args["served_model_name"],
                        "parent": None,
                        "max_model_len": self.plan.context_len,
                    }
                ],
            }
        )

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, _generate_job, _native_error)
        if isinstance(admitted, web.Response):
            return admitted
        body, job = admitted
        if body.get("stream"):
            return await self._stream_generate(request, job)
        ids = await self.serving.collect(job)
        meta = self.serving.meta_info(job, len(ids), finished=True)
        if job.abort_message is not None:
            return web.json_response({"error": {"message": job.abort_message}}, status=400)
        return web.json_response({"text": _text(ids), "output_ids": ids, "meta_info": meta})

    async def _stream_generate(self, request: web.Request, job: ClientRequest) -> web.StreamResponse:
        response = await _open_event_stream(request)
        ids: list[int] = []
        try:
            async for chunk in self.serving.chunks(job):
                ids.extend(chunk.new_ids)
                payload = {
                    "text": _text(ids),
                    "output_ids": list(ids),  # cumulative, as real non-incremental streaming sends (B13)
                    "meta_info": self.serving.meta_info(job, len(ids), chunk.finished),
                }
                await _send_event(response, payload)
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:
            self.serving.abandon(job)
        return response

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, _completion_job, _openai_error)
        if isinstance(admitted, web.Response):
            return admitted
        body, job = admitted
        base = {"id": f"cmpl-{job.rid}", "object": "text_completion", "created": int(time.time())}
        base["model"] = self._model_name(body)
        if body.get("stream"):
            return await self._stream_openai(request, job, body, base, lambda text: {"text": text})
        return await self._complete_openai(job, base, lambda text: {"text": text})

    async def handle_chat_completions(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, _chat_job, _openai_error)
        if isinstance(admitted, web.Response):
            return admitted
        body, job = admitted
        base = {"id": job.rid, "object": "chat.completion", "created": int(time.time())}
        base["model"] = self._model_name(body)
        if body.get("stream"):
            base["object"] = "chat.completion.chunk"
            opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            return await self._stream_openai(
                request, job, body, base, lambda text: {"delta": {"content": text}}, opening
            )
        message = {"role": "assistant", "reasoning_content": None, "tool_calls": None}
        return await self._complete_openai(job, base, lambda text: {"message": {**message, "content": text}})

    async def _complete_openai(
        self, job: ClientRequest, base: dict[str, Any], content: Callable[[str], dict[str, Any]]
    ) -> web.Response:
        ids = await self.serving.collect(job)
        if job.abort_message is not None:
            return _openai_error(job.abort_message)
        choice = {"index": 0, **content(_text(ids)), "logprobs": None, "finish_reason": "length"}
        choice["matched_stop"] = None
        return web.json_response({**base, "choices": [choice], "usage": _usage(job.prompt_tokens, len(ids))})

    async def _stream_openai(
        self,
        request: web.Request,
        job: ClientRequest,
        body: dict[str, Any],
        base: dict[str, Any],
        content: Callable[[str], dict[str, Any]],
        opening: dict[str, Any] | None = None,
    ) -> web.StreamResponse:
        """OpenAI's streaming shape: one chunk per delivery, an optional usage chunk, then [DONE]."""
        response = await _open_event_stream(request)
        total = 0
        try:
            if opening is not None:
                await _send_event(response, {**base, "choices": [opening]})
            async for chunk in self.serving.chunks(job):
                total += len(chunk.new_ids)
                finish = ("abort" if job.abort_message is not None else "length") if chunk.finished else None
                choice = {
                    "index": 0,
                    **content(_text(chunk.new_ids)),
                    "logprobs": None,
                    "finish_reason": finish,
                }
                choice["matched_stop"] = None
                await _send_event(response, {**base, "choices": [choice], "usage": None})
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                await _send_event(
                    response, {**base, "choices": [], "usage": _usage(job.prompt_tokens, total)}
                )
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:
            self.serving.abandon(job)
        return response

    async def _admit(
        self,
        request: web.Request,
        job_of: Callable[[dict[str, Any], Submit], ClientRequest],
        refuse: Callable[[str], web.Response],
    ) -> tuple[dict[str, Any], ClientRequest] | web.Response:
        """Read `request`'s JSON body and submit it as `job_of` says (raising BadRequest for bad input),
        counted as arriving from before its body is read, at its place in the client's arrival schedule
        when it has one (`_arrival`); a bad request is answered with `refuse(message)` and leaves that
        schedule."""
        with self.serving.arriving() as received:
            arrival = None
            try:
                arrival = _arrival(request)
                body = await _json_body(request)
                return body, job_of(body, partial(self.serving.submit, received=received, arrival=arrival))
            except BadRequest as exc:
                if arrival is not None:
                    self.serving.refused(arrival)
                return refuse(str(exc))

    def _model_name(self, body: dict[str, Any]) -> str:
        name = body.get("model")
        return name if isinstance(name, str) and name else str(self.args["served_model_name"])


# -- request helpers ---------------------------------------------------------------------------------------
Submit = Callable[..., ClientRequest]  # Serving.submit, the request's arrival given


def _generate_job(body: dict[str, Any], submit: Submit) -> ClientRequest:
    """SGLang's native /generate request."""
    prompt_tokens = _prompt_tokens(body.get("text"), body.get("input_ids"))
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object.")
    max_new = _non_negative_int(params.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS, "max_new_tokens")
    rid = body.get("rid")
    text = body.get("text")
    return submit(
        prompt_tokens,
        max_new,
        rid=str(rid) if rid is not None else None,
        predictability=predictability(text.split()) if isinstance(text, str) else 0.0,
        tokens=prompt_ids(text, body.get("input_ids")),
    )


def _completion_job(body: dict[str, Any], submit: Submit) -> ClientRequest:
    """An OpenAI /v1/completions request."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        prompt_tokens = _prompt_tokens(None, prompt)
    elif isinstance(prompt, str):
        prompt_tokens = _prompt_tokens(prompt, None)
    else:
        raise BadRequest("prompt must be a string or a list of token ids (batches are not simulated).")
    return submit(
        prompt_tokens,
        _non_negative_int(body.get("max_tokens"), OPENAI_COMPLETION_MAX_TOKENS, "max_tokens"),
        tokens=prompt_ids(prompt if isinstance(prompt, str) else None, prompt),
    )


def _chat_job(body: dict[str, Any], submit: Submit) -> ClientRequest:
    """An OpenAI /v1/chat/completions request."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list.")
    # Each message costs its words plus the chat template's few role and separator tokens.
    prompt_tokens = sum(4 + count_text_tokens(_message_text(m)) for m in messages) + 2
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return submit(prompt_tokens, _non_negative_int(limit, DEFAULT_MAX_NEW_TOKENS, "max_tokens"))


def _native_error(message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=400)


def _arrival(request: web.Request) -> ScheduledArrival | None:
    """The request's place in its client's arrival schedule, None when it has none (SGLang reads no such
    header; only autotune's client sends it)."""
    value = request.headers.get(ARRIVAL_HEADER)
    if value is None:
        return None
    try:
        return ScheduledArrival.parse(value)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def prompt_ids(text: object, input_ids: object) -> list[int] | None:
    """The prompt's token ids as the fake tokenizer reads it (a text's words, numbered by their hash within
    this process), so that the prefix cache matches equal leading words or ids; None when it has neither."""
    if isinstance(input_ids, list) and all(isinstance(i, int) for i in input_ids):
        return input_ids
    if isinstance(text, str):
        return [hash(word) for word in text.split()] or [0]
    return None


def _prompt_tokens(text: object, input_ids: object) -> int:
    if (text is None) == (input_ids is None):
        raise BadRequest("Either text or input_ids should be provided.")
    if isinstance(text, str):
        return count_text_tokens(text)
    if isinstance(input_ids, list) and input_ids and all(isinstance(i, int) for i in input_ids):
        return len(input_ids)
    raise BadRequest(
        "text must be a string and input_ids a non-empty list of ints (batches are not simulated)."
    )


def _non_negative_int(value: object, default: int, name: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{name} must be a non-negative integer, got {value!r}.")
    return value


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        raise BadRequest("Each message must be an object with a role and content.")
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _text(ids: list[int]) -> str:
    return "".join(fake_token_text(i) for i in ids)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None,
    }


def _openai_error(message: str) -> web.Response:
    payload = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return web.json_response(payload, status=400)


async def _open_event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def _send_event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())
