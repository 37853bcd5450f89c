"""One request's pick by a recipe: its feasible candidates, a feature row per candidate on its
machine (a profiled machine's own descriptors where the model has them), the anchor's and the hand
rule's sizes among them, and the chooser's pick. The service (predictor.model, `pick_many` for many
lengths of a kind at once) and the registered MLflow model (training/mlflow_model.py, `pick`) pick
through the same code, so they answer alike."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks, landed, max_chunk, rule_candidate
from chunkpilot.contract import ChunkRequest, Hardware, descriptor_of
from chunkpilot.features import build
from chunkpilot.lineup import Baseline, applied
from estimator.memory import MIB, within_budget
from estimator.recipe import Choice, Recipe


class Infeasible(ValueError):
    """A request the model cannot answer; the message says why (422), `reason` names the kind
    (counted by reason in /metrics)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.reason)


def resolve_hardware(table: dict, hardware: Hardware, dtype: str, threads: int) -> dict:
    """Descriptor fields for the features: a profiled machine's own measurement at exactly this
    dtype and thread count (what the model was trained on) wins; otherwise the request's fields,
    over the profiled machine's nearest setting, if any. `table`: hardware_id -> {"static": {...},
    "descriptors": {"dtype/threads": {...}}}, as training logs it with the model."""
    found: dict = {}
    given = hardware.model_dump(exclude={"hardware_id"}, exclude_none=True)
    machine = table.get(hardware.hardware_id) if hardware.hardware_id is not None else None
    if machine is None and not hardware.described:
        raise Infeasible(
            f"hardware.hardware_id {hardware.hardware_id!r} was not profiled (known: "
            f"{', '.join(table) or 'none'}); give its descriptors instead",
            "unknown_hardware",
        )
    if machine is not None:
        measured = {descriptor_of(k): v for k, v in machine["descriptors"].items()}
        same_dtype = [k for k in measured if k[0] == dtype] or list(measured)
        nearest = min(same_dtype, key=lambda k: (abs(k[1] - threads), k))
        found = {**machine["static"], **measured[nearest]}
        if nearest == (dtype, threads):
            return {**given, **found}
    return {**found, **{k: v for k, v in given.items() if v or k not in found}}


def candidates(request: ChunkRequest, n: int | None = None) -> list[int]:
    """The request's sizes (or the defaults) that fit its prompt (or one of `n` tokens) and layout,
    cut to them."""
    n, att = n or request.context_length, request.attention
    asked = tuple(request.candidates or DEFAULT_CHUNKS)
    chosen, _ = feasible_chunks(asked, n, att.window, att.layout)
    if not chosen:
        limit = max_chunk(n, att.window, att.layout)
        why = f"the context ({n})" if limit == n else f"the ring window ({att.window}) and the context ({n})"
        sizes = ", ".join(str(size) for size in asked)  # "full" sits among the numbers
        raise Infeasible(f"candidates: every candidate ({sizes}) is larger than {why}", "no_feasible_candidate")
    return chosen


def rule_size(request: ChunkRequest, chunks: list[int], n: int | None = None) -> int:
    """The hand rule's size among `chunks` (for a prompt of `n` tokens, else the request's)."""
    att = request.attention
    return rule_candidate(chunks, n or request.context_length, att.window, att.layout)


def anchor_size(anchor: Baseline, request: ChunkRequest, chunks: list[int], n: int | None = None) -> int:
    """The anchor's size among `chunks` (for a prompt of `n` tokens, else the request's)."""
    att = request.attention
    return landed(chunks, applied(anchor.spec, n or request.context_length, att.window, att.layout))


def feature_rows(table: dict, request: ChunkRequest, chunks: list[int]) -> np.ndarray:
    """[chunks, FEATURES]: the request on its machine (resolve_hardware), one row per size."""
    hw = resolve_hardware(table, request.hardware, request.dtype, request.threads)
    return build({**request.row(hw), "chunk_size": chunks})


# a decision as one row of the registered MLflow model's output: column -> MLflow type
ROW = {
    "chunk_size": "long",
    "predicted_ttft_ms": "double",
    "rule_chunk_size": "long",
    "anchor_chunk_size": "long",
    "anchor": "string",
    "deferred": "boolean",
    "predicted_peak_mb": "double",  # NaN: the model has no memory side
}


def request_anchor(recipe: Recipe, request: ChunkRequest) -> Baseline:
    """The anchor of the request's machine, backend and kernel."""
    return recipe.anchor(request.hardware.hardware_id, request.backend, request.attn_impl)


@dataclass(frozen=True)
class Picked:
    chunks: list[int]  # the feasible candidates
    rule: int  # the hand rule's index among them
    anchor: Baseline  # the strongest simple baseline here
    anchored: int  # its index among them (cut to the memory budget, if one is asked)
    x: np.ndarray  # [candidates, FEATURES]
    choice: Choice
    ms: list[float]  # [candidates] predicted TTFT
    peak_mb: list[float] | None = None  # [candidates] predicted peak memory (None: no memory model)
    fits: list[bool] | None = None  # [candidates] within the request's memory budget (None: none asked)
    margin: float | None = None  # the memory model's safety margin for this backend and kernel

    @property
    def size(self) -> int:
        """The chosen chunk size."""
        return self.chunks[self.choice.index]

    def row(self) -> dict:
        """The decision as the MLflow model answers it (ROW's columns)."""
        i, rule, anchored = self.choice.index, self.chunks[self.rule], self.chunks[self.anchored]
        peak = math.nan if self.peak_mb is None else self.peak_mb[i]
        values = (self.chunks[i], self.ms[i], rule, anchored, self.anchor.name, self.choice.deferred, peak)
        return dict(zip(ROW, values, strict=True))


def pick_many(recipe: Recipe, table: dict, request: ChunkRequest, lengths: list[int]) -> list[Picked | Infeasible]:
    """The recipe's decisions for `request` at each of `lengths` (Infeasible where it has none): one
    feature build and one call of the cost model for them all (a decision table's cells at once),
    each length's choice exactly what `pick` makes at it (a row's prediction does not depend on its
    batch)."""
    hw = resolve_hardware(table, request.hardware, request.dtype, request.threads)
    anchor = request_anchor(recipe, request)
    known = recipe.knows(request.hardware.hardware_id, request.backend, request.attn_impl)
    budget, memory = request.memory_budget_mb, recipe.memory
    if budget is not None and memory is None:
        raise Infeasible(
            "memory_budget_mb: this model has no memory side (no training row measured prefill_memory_bytes); "
            "retrain it on rows of harness 8 or later, or leave the budget out",
            "no_memory_model",
        )
    plans: list[tuple[int, list[int]] | Infeasible] = []
    for n in lengths:
        try:
            plans.append((n, candidates(request, n)))
        except Infeasible as exc:
            plans.append(exc)
    feasible = [p for p in plans if not isinstance(p, Infeasible)]
    if not feasible:
        return plans  # type: ignore[return-value]
    counts = [len(chunks) for _, chunks in feasible]
    x = build(
        {
            **request.row(hw),
            "context_length": np.repeat([n for n, _ in feasible], counts),
            "chunk_size": np.concatenate([chunks for _, chunks in feasible]),
        }
    )
    members = recipe.members(x)  # [K, rows]
    peak_mb = None if memory is None else memory.predict_bytes(x) / MIB  # [rows]
    margin = None if memory is None else float(memory.margin_of(x[:1])[0])  # one request, one kind: one margin
    starts = np.cumsum([0, *counts]).tolist()
    out: list[Picked | Infeasible] = []
    j = 0  # the next feasible plan's place among the feasible
    for plan in plans:
        if isinstance(plan, Infeasible):
            out.append(plan)
            continue
        n, chunks = plan
        rows, j = slice(starts[j], starts[j + 1]), j + 1
        anchored = chunks.index(anchor_size(anchor, request, chunks, n))
        peaks = None if peak_mb is None else peak_mb[rows]
        fits = None
        if budget is not None:
            fits = within_budget(peaks, margin, budget)
            if not fits.any():
                out.append(over_budget(budget, margin, chunks, peaks))
                continue
            anchored = within(fits, anchored)
        choice = recipe.choose(members[:, rows], x[rows], anchored, known, fits)
        ms = np.exp(choice.log_ms).tolist()
        if not all(map(math.isfinite, ms)):
            out.append(Infeasible("the model predicted a non-finite TTFT for this request", "non_finite"))
            continue
        rule = chunks.index(rule_size(request, chunks, n))
        out.append(
            Picked(
                chunks,
                rule,
                anchor,
                anchored,
                x[rows],
                choice,
                ms,
                None if peaks is None else peaks.tolist(),
                None if fits is None else fits.tolist(),
                margin,
            )
        )
    return out


def within(fits: np.ndarray, index: int) -> int:
    """The candidate `index` cut to the budget: the largest that fits at or below it (candidates are
    sorted by size, and memory grows with the chunk), else the smallest that fits."""
    below = np.flatnonzero(fits[: index + 1])
    return int(below[-1]) if len(below) else int(np.flatnonzero(fits)[0])


def over_budget(budget: float, margin: float, chunks: list[int], peaks: np.ndarray) -> Infeasible:
    """The refusal when no candidate's predicted peak fits the budget: it names the field and what
    the smallest would need."""
    i = int(np.argmin(peaks))
    need = math.ceil(peaks[i] * (1 + margin) * 10) / 10  # rounded up: that budget fits
    return Infeasible(
        f"memory_budget_mb: no candidate fits {budget:g} MB; the smallest predicted peak is {peaks[i]:.1f} MB "
        f"(chunk {chunks[i]}), {need:.1f} MB with the {margin:.0%} safety margin: a budget of at least that",
        "over_memory_budget",
    )


def pick(recipe: Recipe, table: dict, request: ChunkRequest) -> Picked:
    """The recipe's decision for `request` at exactly its length (Infeasible when it has none)."""
    (picked,) = pick_many(recipe, table, request, [request.context_length])
    if isinstance(picked, Infeasible):
        raise picked
    return picked
