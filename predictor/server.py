"""The service on uvicorn with a graceful stop, as KServe does it: the first SIGTERM (or SIGINT)
turns /readyz to 503 at once, so a load balancer stops sending; `drain_delay_s` later uvicorn
stops accepting, lets in-flight requests finish within `drain_timeout_s`, and the lifespan flushes
what is queued for the tracking server. A second signal stops at once."""

from __future__ import annotations

import logging
import threading
from types import FrameType

import uvicorn

from .app import create_app
from .service import ServiceState
from .settings import Settings


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServiceState, delay_s: float) -> None:
        super().__init__(config)
        self.state, self.delay_s = state, delay_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.state.draining:  # a second signal: no more waiting
            return super().handle_exit(sig, frame)
        self.state.draining = True
        threading.Timer(self.delay_s, super().handle_exit, (sig, frame)).start()


def serve(settings: Settings, port: int, log_level: str = "info") -> None:
    # our loggers (chunkpilot's modules) beside uvicorn's own, in its format; no access log: a line
    # per decision would cost more than the decision
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=settings.drain_timeout_s,
    )
    DrainingServer(config, app.state.service, settings.drain_delay_s).run()
