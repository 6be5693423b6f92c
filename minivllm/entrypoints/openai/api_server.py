"""The FastAPI app of ``minivllm serve`` and the function that runs it under uvicorn.

Upstream counterpart: ``vllm/entrypoints/openai/api_server.py`` (``build_app``,
``init_app_state``, ``run_server``) and the route modules it attaches
(``.../completion/api_router.py``, ``.../chat_completion/api_router.py``,
``.../models/api_router.py``, ``vllm/entrypoints/serve/instrumentator/``...).

One process serves HTTP: uvicorn's event loop runs the routes and ``AsyncLLM``, whose
engine core (scheduler, model, KV cache) runs in a second process. A route parses the
body into a ``protocol`` object (FastAPI: a bad field is a 400 before any code here
runs), hands it to its ``serving_*`` object, and returns what that gives back: an error
object, a full response, or an async generator of server-sent events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import logging
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

import minivllm
from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.openai.live import attach_live_view
from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from minivllm.entrypoints.openai.server_utils import (
    AuthenticationMiddleware,
    documented,
    error_json,
    exception_handler,
    http_exception_handler,
    validation_exception_handler,
)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minivllm.entrypoints.openai.serving_models import OpenAIServingModels
from minivllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from minivllm.entrypoints.utils import with_cancellation

logger = logging.getLogger(__name__)

router = APIRouter()


def to_response(result: Any) -> Response:
    """A serving method's result as an HTTP response.

    An ``ErrorResponse`` carries its status; an async generator is a stream of
    server-sent events; anything else is a protocol object sent as JSON.
    """
    if isinstance(result, ErrorResponse):
        return error_json(result)
    if inspect.isasyncgen(result):
        return StreamingResponse(result, media_type="text/event-stream")
    return JSONResponse(result.model_dump())


@router.post("/v1/completions", responses=documented(CompletionResponse, stream=True))
@with_cancellation
async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
    """OpenAI's completions API."""
    serving: OpenAIServingCompletion = raw_request.app.state.openai_serving_completion
    return to_response(await serving.create_completion(request))


@router.post("/v1/chat/completions", responses=documented(ChatCompletionResponse, stream=True))
@with_cancellation
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
    """OpenAI's chat completions API."""
    serving: OpenAIServingChat = raw_request.app.state.openai_serving_chat
    return to_response(await serving.create_chat_completion(request))


@router.get("/v1/models", responses=documented(ModelList))
async def show_available_models(raw_request: Request) -> Response:
    """The served model names."""
    models: OpenAIServingModels = raw_request.app.state.openai_serving_models
    return to_response(await models.show_available_models())


@router.post("/tokenize", responses=documented(TokenizeResponse))
async def tokenize(request: TokenizeRequest, raw_request: Request) -> Response:
    """A prompt's (or a chat's) token ids, with the tokenizer the engine uses."""
    serving: OpenAIServingTokenization = raw_request.app.state.openai_serving_tokenization
    return to_response(await serving.create_tokenize(request))


@router.post("/detokenize", responses=documented(DetokenizeResponse))
async def detokenize(request: DetokenizeRequest, raw_request: Request) -> Response:
    """The text of token ids."""
    serving: OpenAIServingTokenization = raw_request.app.state.openai_serving_tokenization
    return to_response(await serving.create_detokenize(request))


@router.get(
    "/health", response_class=Response, responses={503: {"description": "the engine core is dead"}}
)
async def health(raw_request: Request) -> Response:
    """200 while the engine core is alive, 503 once it is dead (no body, as upstream)."""
    try:
        await raw_request.app.state.engine_client.check_health()
    except EngineDeadError:
        return Response(status_code=HTTPStatus.SERVICE_UNAVAILABLE)
    return Response(status_code=HTTPStatus.OK)


@router.get("/version")
async def show_version() -> Response:
    """The minivllm version."""
    return JSONResponse({"version": minivllm.__version__})


def _attach_metrics(app: FastAPI, registry: Any) -> None:
    """``GET /metrics``: the stat logger's Prometheus registry, in the text format."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Freeze the startup heap; stop the engine core when uvicorn shuts down (SIGINT,
    SIGTERM): no orphan process.

    Why freeze: streaming allocates Python objects for every token of every request, so
    the garbage collector runs often, and each full collection would walk every object
    left from startup (torch, transformers, FastAPI: hundreds of thousands), stalling
    every stream meanwhile. ``gc.freeze()`` takes them out of its sight, as upstream's
    ``freeze_gc_heap`` does; they stay alive while the server runs anyway.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        app.state.engine_client.shutdown()


def build_app(
    engine_client: Any,
    args: argparse.Namespace,
    metrics_registry: Any = None,
) -> FastAPI:
    """The FastAPI app serving ``engine_client`` (an ``AsyncLLM``).

    Args:
        engine_client: The engine; the app shuts it down when it stops.
        args: ``api_key`` and ``served_model_name`` are read (either may be None).
        metrics_registry: A ``prometheus_client`` registry to serve at ``GET /metrics``
            (the ``PrometheusStatLogger``'s); None leaves the route out.
    """
    app = FastAPI(title="minivllm", version=minivllm.__version__, lifespan=lifespan)
    app.include_router(router)
    init_app_state(engine_client, app.state, args)
    if metrics_registry is not None:
        _attach_metrics(app, metrics_registry)
    # The live view: the page at / and /v1/live[/stream] (docs/live_view.md).
    attach_live_view(app, engine_client, playground=not getattr(args, "no_playground", False))
    app.add_exception_handler(RequestValidationError, validation_exception_handler)
    app.add_exception_handler(HTTPException, http_exception_handler)
    app.add_exception_handler(Exception, exception_handler)
    if getattr(args, "api_key", None):
        app.add_middleware(AuthenticationMiddleware, tokens=[args.api_key])
    return app


def init_app_state(engine_client: Any, state: Any, args: argparse.Namespace) -> None:
    """One serving object per family of routes, all over the same engine client."""
    model_config = engine_client.vllm_config.model_config
    names = getattr(args, "served_model_name", None) or [engine_client.model_name]
    models = OpenAIServingModels(names, str(model_config.model), model_config.max_model_len)
    state.engine_client = engine_client
    state.openai_serving_models = models
    state.openai_serving_completion = OpenAIServingCompletion(engine_client, models)
    state.openai_serving_chat = OpenAIServingChat(engine_client, models)
    state.openai_serving_tokenization = OpenAIServingTokenization(engine_client, models)


async def run_server_async(args: argparse.Namespace) -> None:
    """Start the engine, build the app, serve until uvicorn is told to stop."""
    import uvicorn

    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.engine.usage import UsageContext
    from minivllm.metrics.loggers import PrometheusStatLogger

    engine_args = EngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    # One name for the responses, /v1/models and the metrics' model_name label.
    args.served_model_name = args.served_model_name or [args.model]
    served_name = args.served_model_name[0]
    prometheus = PrometheusStatLogger(vllm_config, served_name)
    # Built from the configuration resolved above, as upstream's AsyncLLM.from_vllm_config:
    # the metrics and the engine see the same one.
    engine = AsyncLLM(vllm_config, engine_args, stat_loggers=[prometheus], model_name=served_name)
    try:
        app = build_app(engine, args, metrics_registry=prometheus.registry)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.uvicorn_log_level,
            # Streams still open at shutdown get this long before they are cut.
            timeout_graceful_shutdown=5,
        )
        logger.info("serving %s at http://%s:%d/v1", served_name, args.host, args.port)
        await uvicorn.Server(config).serve()
    finally:
        engine.shutdown()  # idempotent; the lifespan did it already unless startup failed


def run_server(args: argparse.Namespace) -> int:
    """``minivllm serve``: run the server in this process until SIGINT or SIGTERM."""
    # uvicorn re-raises the SIGINT it handled once it has shut down: that is the exit.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_server_async(args))
    return 0
