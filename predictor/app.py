"""The FastAPI app: the champion loaded once in the lifespan, the routes (predictor/routes.py) with
decisions in the thread pool (they take milliseconds), Prometheus metrics, refusals counted by
reason, and two gates in front: a body limit and the Host names it answers to."""

from __future__ import annotations

import gc
import logging
import os
import threading
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator, metrics

from chunkpilot.version import installed_version
from estimator.decide import Infeasible

from . import routes
from .service import ServiceMetrics, ServiceState
from .settings import LOOPBACK, Settings

log = logging.getLogger(__name__)
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


def startup_line(settings: Settings, state: ServiceState) -> str:
    """One line that says what this process serves, from where, to whom, and where outcomes go."""
    served = f"v{state.predictor.version}" if state.predictor is not None else f"nothing yet ({state.not_ready})"
    return (
        f"chunkpilot {installed_version()} serving {settings.model_name}@{settings.model_alias} {served} "
        f"from {redacted(settings.tracking_uri)} on {settings.host}; telemetry into {settings.telemetry_dir.resolve()}"
    )


def redacted(uri: str) -> str:
    """A store's URI without its password (postgresql://user:secret@host/db)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


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


def host_name(header: bytes) -> str:
    """The Host header less its port: `[::1]:8000` -> `::1`, `example.org:80` -> `example.org`."""
    value = header.decode("latin-1").strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class TrustedHost:
    """Refuse (400) a request whose Host is not a name this service answers to: loopback, the bind
    address, or `allowed`. A page in a browser that rebinds its own domain to 127.0.0.1 then
    reaches no route, and a service bound beyond loopback answers only the names it was given."""

    def __init__(self, app, allowed: frozenset[str], refused) -> None:
        self.app, self.allowed, self.refused = app, allowed, refused

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            name = host_name(dict(scope["headers"]).get(b"host", b""))
            if name not in self.allowed:
                self.refused()
                allowed = ", ".join(sorted(self.allowed))
                detail = (
                    f"Host {name!r} is not this service's (allowed: {allowed}; add names in CHUNKPILOT_ALLOWED_HOSTS)"
                )
                return await JSONResponse({"detail": detail}, status_code=400)(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    registry = CollectorRegistry()
    state = ServiceState(settings, ServiceMetrics(registry))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(settings.store_timeout_s)
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(settings.store_retries)
        await run_in_threadpool(state.load)
        log.info(startup_line(settings, state))
        gc.freeze()  # what loading left behind is permanent: later collections skip it (fewer pauses)
        stop = threading.Event()
        if settings.poll_interval_s > 0:  # also how a service that started without a model becomes ready
            threading.Thread(target=state.poll_forever, args=(stop,), daemon=True, name="alias-poll").start()
        publishing = threading.Thread(target=state.publish_forever, args=(stop,), daemon=True, name="publish")
        if settings.publish_telemetry:
            publishing.start()
        yield
        stop.set()
        if publishing.is_alive():
            publishing.join(timeout=10)  # what is queued goes to the server before the process ends

    app = FastAPI(title="ChunkPilot predictor", version="1", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    hosts = LOOPBACK | {settings.host.lower(), *(name.lower() for name in settings.allowed_hosts)}
    app.add_middleware(TrustedHost, allowed=hosts, refused=state.metrics.rejections.labels("host").inc)
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

    app.include_router(routes.router)
    if settings.admin_token is not None:  # without a token the admin route does not exist
        app.include_router(routes.admin)
    instrumentator.expose(app, include_in_schema=False)  # after the API: routes match in order
    app.state.service = state
    return app
