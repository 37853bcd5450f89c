"""Request and response bodies of the service: pydantic models whose Field bounds give a 422 that
names the field and the allowed range."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chunkpilot.config import PRESETS, FAMILIES

MAX_CONTEXT = 1 << 20
MAX_CANDIDATES = 64


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShapeFields(Strict):
    """A model given by its shape (the fields of chunkpilot.config.ModelShape)."""

    family: Literal[FAMILIES]  # type: ignore[valid-type]
    num_layers: int = Field(ge=1, le=1024)
    hidden_size: int = Field(ge=1, le=65536)
    num_heads: int = Field(ge=1, le=1024)
    num_kv_heads: int = Field(ge=1, le=1024)
    intermediate_size: int = Field(ge=1, le=1 << 20)
    vocab_size: int = Field(ge=2, le=1 << 22)
    head_dim: int | None = Field(default=None, ge=1, le=4096)
    max_position: int = Field(default=1 << 20, ge=2, le=1 << 24)
    window: int | None = Field(default=None, ge=1, le=MAX_CONTEXT)
    global_every: int | None = Field(default=None, ge=1, le=1024)


class Attention(Strict):
    window: int | None = Field(default=None, ge=1, le=MAX_CONTEXT, description="sliding window; null: full attention")
    layout: Literal["shift", "ring"] = "shift"
    sinks: int = Field(default=0, ge=0, le=4096)

    @model_validator(mode="after")
    def _window_needed(self) -> Attention:
        if self.window is None and (self.sinks or self.layout == "ring"):
            raise ValueError("sinks and the ring layout need a window")
        return self


class Hardware(Strict):
    """A machine already profiled (hardware_id), or its descriptors."""

    hardware_id: str | None = Field(default=None, min_length=1, max_length=64)
    matmul_gflops: float | None = Field(default=None, ge=0.01, le=1e7)
    bandwidth_gbs: float | None = Field(default=None, ge=0.01, le=1e5)
    call_overhead_ms: float | None = Field(default=None, ge=1e-4, le=1e4)
    cores: int | None = Field(default=None, ge=1, le=1 << 16)
    l2_cache_bytes: int = Field(default=0, ge=0, le=1 << 40)
    l3_cache_bytes: int = Field(default=0, ge=0, le=1 << 40)

    @model_validator(mode="after")
    def _id_or_descriptors(self) -> Hardware:
        described = None not in (self.matmul_gflops, self.bandwidth_gbs, self.call_overhead_ms, self.cores)
        if self.hardware_id is None and not described:
            raise ValueError("give hardware_id, or matmul_gflops, bandwidth_gbs, call_overhead_ms and cores")
        return self


class ChunkRequest(Strict):
    context_length: int = Field(ge=1, le=MAX_CONTEXT)
    model: Annotated[str, Field(min_length=1, max_length=64)] | ShapeFields = Field(
        description="a preset name or the model's shape fields")
    attention: Attention = Attention()
    dtype: Literal["float32", "bfloat16"] = "float32"
    threads: int = Field(default=1, ge=1, le=1024)
    attn_impl: Literal["sdpa", "eager"] = "sdpa"
    hardware: Hardware
    candidates: list[Annotated[int, Field(ge=1, le=MAX_CONTEXT)]] | None = Field(
        default=None, min_length=1, max_length=MAX_CANDIDATES, description="chunk sizes to choose from")

    @model_validator(mode="after")
    def _known_preset(self) -> ChunkRequest:
        if isinstance(self.model, str) and self.model not in PRESETS:
            raise ValueError(f"model must be a preset ({', '.join(PRESETS)}) or shape fields")
        return self


class BatchRequest(Strict):
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
