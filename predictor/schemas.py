"""The service's bodies beyond the one request (chunkpilot.contract.ChunkRequest): the batch and
the answers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from chunkpilot.contract import ChunkRequest, Contract


class BatchRequest(Contract):
    requests: list[ChunkRequest] = Field(min_length=1, max_length=256)


class Feedback(Contract):
    """A batch of the engine's outcomes (chunkpilot.contract.Outcome), each checked on its own."""

    outcomes: list[dict[str, Any]] = Field(min_length=1, max_length=1000)


class FeedbackResult(BaseModel):
    accepted: int
    rejected: dict[str, int]  # by the field an outcome broke


class Candidate(BaseModel):
    chunk_size: int
    predicted_ttft_ms: float


class ChunkResponse(BaseModel):
    chunk_size: int
    predicted_ttft_ms: float
    top: list[Candidate]
    rule: Candidate
    model_version: str
    source: Literal["model", "cache"]
    explored: bool = False  # a candidate other than the model's pick, to learn from (bounded, see /metrics)
    schedule: list[int] | None = None  # when asked: chunk sizes in order, by the per-chunk cost model


class BatchResponse(BaseModel):
    responses: list[ChunkResponse]
