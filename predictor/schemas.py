"""The service's bodies beyond the one request (chunkpilot.contract.ChunkRequest): the batch and
the answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from chunkpilot.contract import ChunkRequest, Contract


class BatchRequest(Contract):
    requests: list[ChunkRequest] = Field(min_length=1, max_length=256)


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


class BatchResponse(BaseModel):
    responses: list[ChunkResponse]
