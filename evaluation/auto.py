"""`auto` for an engine: this machine's descriptors at the engine's dtype, threads and device, asked
of the service at `service` or of the champion of the MLflow store `tracking` loaded here."""

from __future__ import annotations

from engine.engine import Engine
from engine.hardware import local_hardware
from engine.policy import DECISION_TIMEOUT_S
from engine.predictor_client import AutoPolicy, InProcessPolicy, make_auto
from engine.telemetry import Reporter


def auto_for(
    engine: Engine,
    *,
    service: str | None = None,
    tracking: str | None = None,
    timeout_s: float = DECISION_TIMEOUT_S,
    reporter: Reporter | None = None,
    schedule: bool = False,
) -> AutoPolicy | InProcessPolicy:
    hardware = local_hardware(engine.config.dtype, engine.runtime.threads, engine.config.device)
    return make_auto(
        hardware, service=service, tracking=tracking, timeout_s=timeout_s, reporter=reporter, schedule=schedule
    )
