"""The service's bodies beyond the one request and its answer (chunkpilot.contract: ChunkRequest,
Decision, which the engine parses too): the batch, the feedback, the model's description and
the readiness. Every field says what it is: the OpenAPI page at /docs shows it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from chunkpilot.contract import ChunkRequest, Contract, Decision


class BatchRequest(Contract):
    requests: list[ChunkRequest] = Field(min_length=1, max_length=256, description="1-256 requests, answered in order")


class Feedback(Contract):
    """A batch of the engine's outcomes (chunkpilot.contract.Outcome), each checked on its own."""

    outcomes: list[dict[str, Any]] = Field(
        min_length=1, max_length=1000, description="up to 1,000 outcomes (chunkpilot.contract.Outcome's fields)"
    )


class FeedbackResult(BaseModel):
    accepted: int = Field(description="outcomes kept: appended to the telemetry partition")
    rejected: dict[str, int] = Field(description="outcomes refused, counted by the field each one broke")


class BatchResponse(BaseModel):
    responses: list[Decision] = Field(description="one answer per request, in the requests' order")


class TableSummary(BaseModel):
    builds: bool = Field(description="whether decision tables are built (off: every decision is the recipe's)")
    kinds: int = Field(description="kinds of request seen (model, attention, machine, backend, ...)")
    kinds_built: int = Field(description="kinds with no cell of lengths waiting to be built")
    segments: int = Field(description="length segments held, each with one answer")
    last_build_s: float | None = Field(description="the latest build's seconds; null: none yet")
    build_s_total: float = Field(
        0.0,
        description="every background build's CPU seconds since start: what the tables cost the cores besides "
        "the requests that asked (a cell built in a request is in its own time)",
    )


class ModelInfo(BaseModel):
    """GET /v1/model: the registered version serving and what it was trained and judged on."""

    name: str = Field(description="the registered model's name in MLflow")
    alias: str = Field(description="the alias it was loaded by (champion)")
    version: str = Field(description="its registered version")
    run_id: str = Field(description="the MLflow run that logged it")
    trained_on_rows: int = Field(description="measured rows it was fitted on")
    recipe: str = Field(description="the recipe: cost model and chooser (estimator.recipe.RECIPES)")
    cost: str = Field(description="the cost model's kind")
    lgbm: dict[str, Any] = Field(description="LightGBM parameters over the cost model's defaults")
    members: int = Field(description="ensemble members whose spread is the uncertainty")
    z: float = Field(description="do-no-harm threshold, standard deviations of the predicted saving (0: argmin)")
    schedules: bool = Field(description="whether it can price schedules (the per-chunk cost model)")
    held_out: dict[str, float] = Field(description="cross-validated metrics on held-out configs (its run's)")
    anchors: dict[str, tuple[str, str]] = Field(
        default_factory=dict,
        description="machine/backend/kernel (* for any machine) -> the strongest simple baseline there, "
        "(name, `--chunk-size` spec): do-no-harm's anchor and an engine's fallback",
    )
    learnt_from_prefills: int = Field(0, description="prefills this machine's correction learnt from since loading")
    decision_table: TableSummary = Field(description="the decision tables' state")
    forests: Literal["compiled", "compiling", "failed", "off"] = Field(
        "off",
        description="the cost model's forests as native code (compiled once per machine and model, then "
        "cached): while compiling, or off or failed, LightGBM's own predictor answers, the same numbers slower",
    )
    forests_compile_s: float | None = Field(None, description="how long compiling (or reading the cache) took")


class Readiness(BaseModel):
    """GET /readyz: 200 while a model serves, 503 with the reason otherwise."""

    ready: bool = Field(description="whether decisions are answered")
    reason: str | None = Field(None, description="why not, when not ready")
    version: str | None = Field(None, description="the champion version serving")
    challenger: str | None = Field(None, description="a challenger whose picks exploring measures, if any")
    last_reload_error: str | None = Field(None, description="the last failed load, even while an older model serves")
    last_retrain: str | None = Field(None, description="what the latest (re)training did or why it failed")
    skipped_telemetry: list[str] = Field(
        default_factory=list, description="the first 20 telemetry files or rows the last load skipped, each with why"
    )


class ReloadResult(BaseModel):
    """POST /admin/reload: what the forced reload did."""

    outcome: str = Field(description="what the load did: `serving version N`, or why it failed")
    version: str | None = Field(description="the version serving after it; null: none")
    last_reload_error: str | None = Field(description="the last failed load, if any")
