"""The service's bodies beyond the one request and its answer (chunkpilot.contract: ChunkRequest,
ChunkResponse, which the engine parses too): the batch and the feedback."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from chunkpilot.contract import ChunkRequest, ChunkResponse, Contract


class BatchRequest(Contract):
    requests: list[ChunkRequest] = Field(min_length=1, max_length=256)


class Feedback(Contract):
    """A batch of the engine's outcomes (chunkpilot.contract.Outcome), each checked on its own."""

    outcomes: list[dict[str, Any]] = Field(min_length=1, max_length=1000)


class FeedbackResult(BaseModel):
    accepted: int
    rejected: dict[str, int]  # by the field an outcome broke


class BatchResponse(BaseModel):
    responses: list[ChunkResponse]
