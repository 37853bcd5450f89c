"""The service's routes: decisions, model info, health, and the admin reload (its own router,
mounted only when a token is set). Dependencies are `Annotated` aliases, as in the FastAPI docs."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse

from chunkpilot.contract import ChunkRequest

from .model import Answer
from .schemas import BatchRequest, BatchResponse, ChunkResponse
from .service import ServiceState


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
router = APIRouter()
admin = APIRouter()


def _response(decision: Answer, source: str) -> ChunkResponse:
    return ChunkResponse(
        chunk_size=decision.chunk_size,
        predicted_ttft_ms=decision.predicted_ttft_ms,
        top=decision.top,
        rule=decision.rule,
        model_version=decision.model_version,
        source=source,
    )


@router.post("/v1/chunk-size", response_model=ChunkResponse, responses={422: {}, 503: {}})
async def chunk_size(body: ChunkRequest, service: Ready) -> ChunkResponse:
    return _response(*service.decide(body))


@router.post("/v1/chunk-size/batch", response_model=BatchResponse, responses={422: {}, 503: {}})
async def chunk_size_batch(body: BatchRequest, service: Ready) -> BatchResponse:
    return BatchResponse(responses=[_response(*service.decide(r)) for r in body.requests])


@router.get("/v1/model", responses={503: {}})
async def model_info(service: Ready) -> dict:
    return {**service.predictor.info, "cache_entries": len(service.cache.entries)}


@router.get("/livez")
async def livez() -> dict:
    return {"status": "alive"}


@router.get("/readyz", responses={503: {}})
async def readyz(state: State) -> JSONResponse:
    if state.predictor is None:
        return JSONResponse({"ready": False, "reason": state.not_ready}, status_code=503)
    return JSONResponse({"ready": True, "version": state.predictor.version, "last_reload_error": state.last_error})


@admin.post("/admin/reload", responses={401: {}})
def reload(state: State, authorization: Annotated[str | None, Header()] = None) -> dict:
    expected = f"Bearer {state.settings.admin_token.get_secret_value()}".encode()
    if authorization is None or not secrets.compare_digest(authorization.encode(), expected):
        raise HTTPException(401, detail="a valid bearer token is required")
    outcome = state.load(force=True)
    return {
        "outcome": outcome,
        "version": state.predictor.version if state.predictor else None,
        "last_reload_error": state.last_error,
    }
