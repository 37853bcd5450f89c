"""A recipe's decisions for one request: its feasible candidates, a feature row per candidate on
its machine (a profiled machine's own descriptors where the recipe has them), each priced by the
cost model with its predicted peak memory, the anchor's and the hand rule's sizes among them, the
chooser's pick, and the answer as one `Decision` (chunkpilot.contract: the wire's and the engine's
type) with what only the service reads kept private (exploring's gains). `Recipe.decide` and
`Recipe.decide_many` (estimator.recipe) are the doors: the service, its decision table
(estimator.table), the registered MLflow model and training's cross-validation all go through them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks, landed, max_chunk, rule_candidate
from chunkpilot.contract import Anchor, Candidate, ChunkRequest, Decision, Hardware, descriptor_of
from chunkpilot.features import build
from estimator.cost_models import PerChunk
from estimator.memory import MIB, within_budget
from estimator.schedule import best_schedule
from judge.lineup import Baseline, applied

if TYPE_CHECKING:
    from estimator.recipe import Choice, Recipe

TOP = 5  # candidates a decision lists with their predictions, fastest first
# the members share their training data and its biases, so their spread understates how wrong a
# predicted gap can be (the held-out TTFT error of docs/training.md): exploring weighs a gap with at
# least this sd
GAP_SD_FLOOR = 0.03


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
    """The request's sizes (or the defaults) that fit its prompt (or one of `n` tokens) and layout.
    The defaults' whole prompt, on a ring shorter than it, is the largest chunk the ring takes (its
    window): the size every baseline is cut to there, and often the fastest."""
    n, att = n or request.context_length, request.attention
    asked = tuple(request.candidates or DEFAULT_CHUNKS)
    chosen, _ = feasible_chunks(asked, n, att.window, att.layout)
    limit = max_chunk(n, att.window, att.layout)
    if request.candidates is None and limit not in chosen:
        chosen.append(limit)  # larger than every feasible default: still sorted
    if not chosen:
        why = f"the context ({n})" if limit == n else f"the ring window ({att.window}) and the context ({n})"
        sizes = ", ".join(str(size) for size in asked)  # "full" sits among the numbers
        raise Infeasible(f"candidates: every candidate ({sizes}) is larger than {why}", "no_feasible_candidate")
    return chosen


def anchor_size(anchor: Baseline, request: ChunkRequest, chunks: list[int], n: int | None = None) -> int:
    """The anchor's size among `chunks` (for a prompt of `n` tokens, else the request's)."""
    att = request.attention
    return landed(chunks, applied(anchor.spec, n or request.context_length, att.window, att.layout))


def feature_rows(table: dict, request: ChunkRequest, chunks: list[int]) -> np.ndarray:
    """[chunks, FEATURES]: the request on its machine (resolve_hardware), one row per size."""
    hw = resolve_hardware(table, request.hardware, request.dtype, request.threads)
    return build({**request.row(hw), "chunk_size": chunks})


class Gain(NamedTuple):
    """Another candidate and what measuring it is expected to save, both relative to the choice: what
    exploring weighs (predictor/explore.py). Relative, so that a table segment's lengths read its
    end's (estimator.table.answer_at: the whole prompt moved to each one's length). A plain tuple:
    a decision carries a dozen."""

    chunk_size: int  # the prompt's length: the whole prompt
    ratio: float  # its predicted TTFT / the choice's
    gain: float  # the expected saving of measuring it, as a share of the choice's predicted TTFT


def gains_of(decision: Decision) -> tuple[Gain, ...]:
    """What only the service reads of a decision: every other candidate's gain (none: the anchor's)."""
    return decision._gains


def attach_gains(decision: Decision, gains: tuple[Gain, ...]) -> Decision:
    """`decision`, a fresh one, made to carry `gains` (set in place: private, never sent)."""
    decision._gains = gains
    return decision


def expected_gain(gap: float, sd: float) -> float:
    """E[max(0, -D)] for D ~ N(gap, sd): what measuring a candidate predicted `gap` log ms slower
    than the choice is expected to save, in log ms (the expected improvement of Bayesian optimisation)."""
    if sd <= 0:
        return max(0.0, -gap)
    z = gap / sd
    return sd * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) - gap * 0.5 * math.erfc(z / math.sqrt(2))


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


def row_of(decision: Decision) -> dict:
    """A recipe's decision as the MLflow model answers it (ROW's columns)."""
    chosen = next(c for c in decision.candidates if c.chunk_size == decision.chunk_size)
    peak = math.nan if chosen.predicted_peak_mb is None else chosen.predicted_peak_mb
    values = (
        decision.chunk_size,
        decision.predicted_ttft_ms,
        decision.rule.chunk_size,
        decision.anchor.chunk_size,
        decision.anchor.name,
        decision.deferred,
        peak,
    )
    return dict(zip(ROW, values, strict=True))


def decide_many(recipe: Recipe, request: ChunkRequest, lengths: list[int]) -> list[Decision | Infeasible]:
    """The recipe's decisions for `request` at each of `lengths` (Infeasible where it has none): one
    feature build and one call of the cost model for them all (a decision table's cells at once),
    each length's decision exactly what it makes at that length alone (a row's prediction does not
    depend on its batch)."""
    hw = resolve_hardware(recipe.hardware, request.hardware, request.dtype, request.threads)
    anchor = recipe.anchor(request.hardware.hardware_id, request.backend, request.attn_impl)
    budget, memory = request.memory_budget_mb, recipe.memory
    if budget is not None and memory is None:
        raise Infeasible(
            "memory_budget_mb: this model has no memory side (no training row measured prefill_memory_bytes); "
            "retrain it on rows that measured their peak, or leave the budget out",
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
    known = recipe.knows(request)
    # a kind the model does not know: the anchor decides, its forests are not asked (most of a decision's time)
    members = recipe.members(x) if known else None  # [K, rows]
    peak_mb = None if memory is None else memory.predict_bytes(x) / MIB  # [rows]
    margin = None if memory is None else float(memory.margin_of(x[:1])[0])  # one request, one kind: one margin
    starts = np.cumsum([0, *counts]).tolist()
    out: list[Decision | Infeasible] = []
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
        if members is None:
            choice = recipe.defer(x[rows], anchored)
        else:
            choice = recipe.pick(members[:, rows], x[rows], anchored, fits)
        ms = np.exp(choice.log_ms).tolist()
        if not all(map(math.isfinite, ms)):
            out.append(Infeasible("the model predicted a non-finite TTFT for this request", "non_finite"))
            continue
        rule = chunks.index(rule_candidate(chunks, n, request.attention.window, request.attention.layout))
        peak_list = None if peaks is None else peaks.tolist()
        fit_list = None if fits is None else fits.tolist()
        out.append(
            _decision(
                recipe, request, n, chunks, x[rows], choice, ms, rule, anchor, anchored, peak_list, fit_list, margin
            )
        )
    return out


def _decision(
    recipe: Recipe,
    request: ChunkRequest,
    n: int,
    chunks: list[int],
    x: np.ndarray,  # [candidates, FEATURES]
    choice: Choice,
    ms: list[float],  # [candidates] predicted TTFT
    rule: int,  # the hand rule's index among the candidates
    anchor: Baseline,
    anchored: int,  # its index among them (cut to the memory budget, if one is asked)
    peaks: list[float] | None,  # [candidates] predicted peak MB (None: no memory model)
    fits: list[bool] | None,  # [candidates] within the memory budget (None: none asked)
    margin: float | None,  # the memory model's safety margin for this backend and kernel
) -> Decision:
    """The choice for a prompt of `n` tokens of the request's kind as a Decision (built unvalidated:
    every value is the model's own, and a table holds thousands of them)."""
    best = choice.index
    allowed = fits or [True] * len(chunks)
    # a dozen floats: no numpy call; with a memory budget, only the sizes within it
    order = sorted((i for i in range(len(chunks)) if allowed[i]), key=ms.__getitem__)
    peaks = peaks or [None] * len(chunks)
    candidate = [
        Candidate.model_construct(chunk_size=c, predicted_ttft_ms=m, predicted_peak_mb=p)
        for c, m, p in zip(chunks, ms, peaks, strict=True)
    ]
    gains: tuple[Gain, ...] = ()  # nothing to explore where the model did not price the candidates
    if choice.priced:
        gaps = (choice.log_ms - choice.log_ms[best]).tolist()
        gains = tuple(
            Gain(chunks[i], ms[i] / ms[best], expected_gain(gaps[i], max(float(choice.gain_sd[i]), GAP_SD_FLOOR)))
            for i in order
            if i != best
        )
    schedule = None
    if request.schedule and isinstance(recipe.cost, PerChunk) and choice.priced:
        att = request.attention
        limit = max_chunk(n, att.window, att.layout)
        if fits is not None:  # a budget: no chunk above the largest size that fits it
            limit = min(limit, max(chunks[i] for i in order))
        ranked = [chunks[best], *(chunks[i] for i in order if i != best)]  # the choice first
        planned = best_schedule(recipe.chunk_ms, x[0], n, ranked, limit)
        schedule = None if planned is None else tuple(planned[0])
    anchored_candidate = candidate[anchored]
    decision = Decision.model_construct(
        chunk_size=chunks[best],
        source="model",
        schedule=schedule,
        predicted_ttft_ms=ms[best],
        model_version=recipe.version,
        deferred=choice.deferred,
        top=[candidate[i] for i in order[:TOP]],
        rule=candidate[rule],
        anchor=Anchor.model_construct(
            chunk_size=anchored_candidate.chunk_size,
            predicted_ttft_ms=anchored_candidate.predicted_ttft_ms,
            predicted_peak_mb=anchored_candidate.predicted_peak_mb,
            name=anchor.name,
            spec=anchor.spec,
        ),
        candidates=candidate,
        memory_margin=margin,
    )
    return attach_gains(decision, gains)


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
