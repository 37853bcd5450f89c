"""The service's routes: decisions, model info, health, and the admin reload (its own router,
mounted only when a token is set). Dependencies are `Annotated` aliases, as in the FastAPI docs."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from chunkpilot.contract import ChunkRequest, Decision

from .schemas import BatchRequest, BatchResponse, Feedback, FeedbackResult, ModelInfo, Readiness, ReloadResult
from .service import ServiceState
from .settings import LOOPBACK


async def service_state(request: Request) -> ServiceState:
    return request.app.state.service


async def ready_state(state: Annotated[ServiceState, Depends(service_state)]) -> ServiceState:
    """The app's state, or 503 with the reason while no model is loaded (async: FastAPI would run a
    plain function in its thread pool, a thread hop per request)."""
    if state.predictor is None:
        state.metrics.rejections.labels("not_ready").inc()
        raise HTTPException(503, detail=f"not ready: {state.not_ready}")
    return state


State = Annotated[ServiceState, Depends(service_state)]
Ready = Annotated[ServiceState, Depends(ready_state)]


async def trusted(state: State, authorization: Annotated[str | None, Header()] = None) -> None:
    """The admin token when one is set; without one only a loopback-bound service trusts callers."""
    token = state.settings.admin_token
    if token is None:
        if state.settings.host not in LOOPBACK:
            raise HTTPException(403, detail="bound beyond loopback: set CHUNKPILOT_ADMIN_TOKEN to accept this")
        return
    expected = f"Bearer {token.get_secret_value()}".encode()
    if authorization is None or not secrets.compare_digest(authorization.encode(), expected):
        raise HTTPException(401, detail="a valid bearer token is required")


Trusted = Annotated[None, Depends(trusted)]
router = APIRouter()
admin = APIRouter()


@router.post("/v1/chunk-size", response_model=Decision, responses={422: {}, 503: {}})
async def chunk_size(body: ChunkRequest, service: Ready) -> Response:
    # a table lookup costs microseconds: on the loop, no thread hop; a decision taken now costs
    # milliseconds, in the thread pool, so that the loop keeps answering /livez
    decision = service.decide_at_once(body)
    if decision is None:
        decision = await run_in_threadpool(service.decide, body)
    # our own model, serialised once: FastAPI would check it against response_model again first
    return Response(decision.model_dump_json(), media_type="application/json")


@router.post("/v1/chunk-size/batch", response_model=BatchResponse, responses={422: {}, 503: {}})
async def chunk_size_batch(body: BatchRequest, service: Ready) -> BatchResponse:
    return BatchResponse(responses=await run_in_threadpool(lambda: [service.decide(r) for r in body.requests]))


@router.get("/v1/model", responses={503: {}})
async def model_info(service: Ready) -> ModelInfo:
    predictor = service.predictor
    return ModelInfo(
        **predictor.info,
        decision_table=predictor.recipe.table.summary(),
        forests=predictor.forest_state,
        forests_compile_s=predictor.compile_s,
    )


@router.get("/livez")
async def livez() -> dict:
    return {"status": "alive"}


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(state: State) -> Readiness | JSONResponse:
    if state.draining or state.predictor is None:
        reason = "shutting down: finishing in-flight requests" if state.draining else state.not_ready
        return JSONResponse(Readiness(ready=False, reason=reason).model_dump(), status_code=503)
    return Readiness(
        ready=True,
        version=state.predictor.version,
        challenger=state.challenger.version if state.challenger else None,
        last_reload_error=state.last_error,
        last_retrain=state.last_retrain,
        skipped_telemetry=state.skipped_telemetry[:20],
    )


@router.post("/v1/feedback", responses={401: {}, 403: {}})
async def feedback(body: Feedback, state: State, _: Trusted) -> FeedbackResult:
    """The engine's outcomes: each checked on its own (ServiceState.feedback), the accepted appended
    to the telemetry partition; off the event loop, as a batch is up to 1,000 outcomes."""
    return await run_in_threadpool(state.feedback, body.outcomes)


@admin.post("/admin/reload", responses={401: {}})
def reload(state: State, _: Trusted) -> ReloadResult:
    outcome = state.load(force=True)
    version = state.predictor.version if state.predictor else None
    return ReloadResult(outcome=outcome, version=version, last_reload_error=state.last_error)
