"""The FastAPI app: the champion loaded once in the lifespan, decisions on the event loop (they
take microseconds), Prometheus metrics, readiness, and an admin reload behind a bearer token."""

from __future__ import annotations

import gc
import os
import secrets
import threading
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator, metrics

from .model import Decision, Infeasible
from .schemas import BatchRequest, BatchResponse, ChunkRequest, ChunkResponse
from .service import ServiceMetrics, ServiceState
from .settings import Settings


LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class BodyLimit:
    """Refuse bodies over `max_bytes` (413), by Content-Length or by counting a streamed body."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = JSONResponse({"detail": f"request body over {self.max_bytes} bytes"}, status_code=413)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await too_large(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await too_large(scope, receive, send)


class _TooLarge(Exception):
    pass


def _response(decision: Decision, source: str) -> ChunkResponse:
    return ChunkResponse(chunk_size=decision.chunk_size, predicted_ttft_ms=decision.predicted_ttft_ms,
                         top=decision.top, rule=decision.rule, model_version=decision.model_version, source=source)


async def ready_state(request: Request) -> ServiceState:
    """The app's state, or 503 with the reason while no model is loaded (async: FastAPI would run a
    plain function in its thread pool, a thread hop per request)."""
    state: ServiceState = request.app.state.service
    if state.predictor is None:
        state.metrics.rejections.labels("not_ready").inc()
        raise HTTPException(503, detail=f"not ready: {state.not_ready}")
    return state


Ready = Annotated[ServiceState, Depends(ready_state)]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    registry = CollectorRegistry()
    state = ServiceState(settings, ServiceMetrics(registry))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(settings.store_timeout_s)
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(settings.store_retries)
        await run_in_threadpool(state.load)
        gc.freeze()  # what loading left behind is permanent: later collections skip it (fewer pauses)
        stop = threading.Event()
        if settings.poll_interval_s > 0:  # also how a service that started without a model becomes ready
            threading.Thread(target=state.poll_forever, args=(stop,), daemon=True, name="alias-poll").start()
        yield
        stop.set()

    app = FastAPI(title="ChunkPilot predictor", version="1", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # request counts and latency only, in buckets for a millisecond service: each metric is work on
    # every request (the instrumentator's default set adds body sizes and a second histogram)
    instrumentator = Instrumentator(registry=registry, excluded_handlers=["/metrics"])
    instrumentator.add(metrics.requests(registry=registry))
    instrumentator.add(metrics.latency(buckets=LATENCY_BUCKETS_S, registry=registry)).instrument(app)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        state.metrics.rejections.labels("invalid_request").inc()
        return await request_validation_exception_handler(request, exc)

    @app.exception_handler(Infeasible)
    async def infeasible(request: Request, exc: Infeasible) -> JSONResponse:
        state.metrics.rejections.labels(exc.reason).inc()
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.post("/v1/chunk-size", response_model=ChunkResponse, responses={422: {}, 503: {}})
    async def chunk_size(body: ChunkRequest, service: Ready) -> ChunkResponse:
        return _response(*service.decide(body))

    @app.post("/v1/chunk-size/batch", response_model=BatchResponse, responses={422: {}, 503: {}})
    async def chunk_size_batch(body: BatchRequest, service: Ready) -> BatchResponse:
        return BatchResponse(responses=[_response(*service.decide(r)) for r in body.requests])

    @app.get("/v1/model", responses={503: {}})
    async def model_info(service: Ready) -> dict:
        return {**service.predictor.info, "cache_entries": len(service.cache.entries)}

    @app.get("/livez")
    async def livez() -> dict:
        return {"status": "alive"}

    @app.get("/readyz", responses={503: {}})
    async def readyz() -> JSONResponse:
        if state.predictor is None:
            return JSONResponse({"ready": False, "reason": state.not_ready}, status_code=503)
        return JSONResponse({"ready": True, "version": state.predictor.version, "last_reload_error": state.last_error})

    if settings.admin_token is not None:  # without a token the admin route does not exist

        @app.post("/admin/reload", responses={401: {}})
        def reload(authorization: Annotated[str | None, Header()] = None) -> dict:
            expected = f"Bearer {settings.admin_token.get_secret_value()}".encode()
            if authorization is None or not secrets.compare_digest(authorization.encode(), expected):
                raise HTTPException(401, detail="a valid bearer token is required")
            outcome = state.load(force=True)
            return {"outcome": outcome, "version": state.predictor.version if state.predictor else None,
                    "last_reload_error": state.last_error}

    instrumentator.expose(app, include_in_schema=False)  # after the API: routes match in order
    app.state.service = state
    return app
