"""The served recipe: the champion's cost model and chooser (estimator.recipe, loaded by the same
function as training's cross-validation), the hardware it was trained on, and the answer for one
request around its decision (estimator.pick: the MLflow model's too): the top candidates,
exploring's gains, a schedule, the decision table and the budget.
This machine's correction learns from each accepted outcome (chunkpilot.correction) without a
retrain. No torch, no transformers, no pandas in the hot path.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chunkpilot import plausibility
from chunkpilot.chunks import max_chunk
from chunkpilot.contract import Anchor, Candidate, ChunkRequest, ChunkResponse, ConfigError, Outcome
from chunkpilot.correction import Correction
from chunkpilot.features import base_log_ms
from chunkpilot.lineup import Baseline
from estimator.cost_models import PerChunk
from estimator.pick import (
    Infeasible,
    Picked,
    anchor_size,
    candidates,
    feature_rows,
    pick_many,
    request_anchor,
    resolve_hardware,
    rule_size,
)
from estimator.recipe import Recipe, load_recipe
from store import registry

from .answer import Answer, Gain
from .schedule import best_schedule
from .settings import BUDGET
from .table import DecisionTable

log = logging.getLogger(__name__)
TOP = 5  # candidates returned with their predictions
TABLE_ENV = "CHUNKPILOT_DECISION_TABLE"  # "0": no decision tables (the tests' servers)
COMPILE_ENV = "CHUNKPILOT_COMPILED_FORESTS"  # "0": LightGBM's own predictor only (the tests' servers)
# the members share their training data and its biases, so their spread understates how wrong a
# predicted gap can be (the held-out TTFT error of docs/training.md): exploring weighs a gap with at
# least this sd
GAP_SD_FLOOR = 0.03


def untabled(request: ChunkRequest) -> bool:
    """What a decision table does not hold: a schedule (priced per length), a memory budget (the
    table holds the unconstrained decision); the recipe decides these at their length."""
    return request.schedule or request.memory_budget_mb is not None


def expected_gain(gap: float, sd: float) -> float:
    """E[max(0, -D)] for D ~ N(gap, sd): what measuring a candidate predicted `gap` log ms slower
    than the choice is expected to save, in log ms (the expected improvement of Bayesian optimisation)."""
    if sd <= 0:
        return max(0.0, -gap)
    z = gap / sd
    return sd * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) - gap * 0.5 * math.erfc(z / math.sqrt(2))


@dataclass
class Predictor:
    version: str
    recipe: Recipe
    hardware: dict  # hardware_id -> {"static": {...}, "descriptors": {"dtype/threads": {...}}}
    info: dict = field(default_factory=dict)  # shown by GET /v1/model
    waits: bool = False  # a challenger waiting to be judged on prefills it has not seen (promotion.settle)
    budget: float = BUDGET  # the share of a TTFT a decision on the request path may cost
    tabled: bool = True  # build decision tables (off: every decision is the recipe's, at its length)
    compiled: bool = False  # compile the cost model's forests in the background (load_predictor: by default)

    table: DecisionTable = field(init=False, repr=False)
    decision_ms: float = field(init=False, default=0.0)  # what the recipe's own decision costs here (EWMA)
    compile_s: float | None = field(init=False, default=None)  # how long compiling took; None: not (yet)
    forests: threading.Thread | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.recipe.cost, PerChunk) and self.recipe.correction is None:
            self.recipe.correction = Correction()
        self.table = DecisionTable(self.exact_answers, self.tabled)
        if self.compiled:  # until it is done, LightGBM's predictor answers: the same numbers, slower
            self.forests = threading.Thread(target=self._compile, name="compile-forests", daemon=True)
            self.forests.start()

    @property
    def forest_state(self) -> str:
        """The forests: "compiled", "compiling" (LightGBM's predictor answers meanwhile), "failed" or "off"."""
        if self.forests is None:
            return "off"
        if self.compile_s is not None:
            return "compiled"
        return "compiling" if self.forests.is_alive() else "failed"

    def _compile(self) -> None:
        start = time.perf_counter()
        try:
            self.recipe.cost.compile()
        except Exception as exc:  # noqa: BLE001 - a compiler's failure costs speed, never an answer
            log.warning("compiling the cost model's forests failed (%s): LightGBM's predictor answers", exc)
            return
        self.compile_s = time.perf_counter() - start

    def answer(self, request: ChunkRequest) -> Answer:
        """The decision table's answer (predictor.table); where its segment is not built yet the
        recipe decides at this length if that is worth its cost (`affordable`), else the anchor (the
        strongest simple baseline here) answers. A schedule is priced for its own length, always by
        the recipe."""
        if untabled(request):
            return self.exact_answer(request)
        found = self.table.lookup(request, queue=False)
        if found is not None:
            return found
        answer = self.exact_answer(request) if self.affordable(request) else self.anchor_answer(request)
        self.table.want(request)  # queued once answered: its build never shares the cores with this decision
        return answer

    def tabled_answer(self, request: ChunkRequest, queue: bool = True) -> Answer | None:
        """The table's answer if its segment is built: a lookup, microseconds (None: the cell is
        queued unless `queue` is off, or the request asks what a table does not hold: a schedule,
        a memory budget)."""
        return None if untabled(request) else self.table.lookup(request, queue)

    def estimate_ms(self, request: ChunkRequest, chunk: int) -> float:
        """The analytic TTFT of one size (features.base_log_ms): what the budget weighs a decision against."""
        return float(np.exp(base_log_ms(feature_rows(self.hardware, request, [chunk])))[0])

    def affordable(self, request: ChunkRequest) -> bool:
        """Whether deciding now costs at most `budget` of the TTFT the anchor's size would take (a
        budget of 1, the whole TTFT: always, whatever the analytic estimate says)."""
        if self.budget >= 1:
            return True
        chunks = candidates(request)
        return self.decision_ms <= self.budget * self.estimate_ms(request, self.anchored(request, chunks)[1])

    def anchored(self, request: ChunkRequest, chunks: list[int]) -> tuple[Baseline, int]:
        """The request's anchor and its size among `chunks`."""
        anchor = request_anchor(self.recipe, request)
        return anchor, anchor_size(anchor, request, chunks)

    def anchor_answer(self, request: ChunkRequest) -> Answer:
        """The anchor's size, priced by the analytic estimate: no model call."""
        chunks = candidates(request)
        anchor, size = self.anchored(request, chunks)
        rule = rule_size(request, chunks)
        candidate = Candidate(chunk_size=size, predicted_ttft_ms=self.estimate_ms(request, size))
        response = ChunkResponse(
            chunk_size=size,
            predicted_ttft_ms=candidate.predicted_ttft_ms,
            top=[candidate],
            rule=Candidate(chunk_size=rule, predicted_ttft_ms=self.estimate_ms(request, rule)),
            anchor=Anchor(**candidate.model_dump(), name=anchor.name, spec=anchor.spec),
            model_version=self.version,
            source="anchor",
        )
        return Answer(response)

    def close(self) -> None:
        self.table.close()

    def exact_answer(self, request: ChunkRequest) -> Answer:
        """The recipe's decision at exactly this length (what the table holds), timed; Infeasible
        when it has none."""
        start = time.perf_counter()
        (picked,) = pick_many(self.recipe, self.hardware, request, [request.context_length])
        if isinstance(picked, Infeasible):
            raise picked
        answer = self._answer(request, request.context_length, picked)
        ms = (time.perf_counter() - start) * 1e3
        self.decision_ms = ms if not self.decision_ms else 0.9 * self.decision_ms + 0.1 * ms
        return answer

    def exact_answers(self, request: ChunkRequest, lengths: list[int]) -> list[Answer | None]:
        """The recipe's decisions for the request's kind at each of `lengths` (None where no
        candidate fits), priced in one batch: how a decision table is built."""
        picks = pick_many(self.recipe, self.hardware, request, lengths)
        return [
            None if isinstance(p, Infeasible) else self._answer(request, n, p)
            for n, p in zip(lengths, picks, strict=True)
        ]

    def _answer(self, request: ChunkRequest, n: int, picked: Picked) -> Answer:
        """A pick for a prompt of `n` tokens of the request's kind, as the service answers it (built
        unvalidated: every value is the model's own, and a table holds thousands of them)."""
        chunks, choice, ms = picked.chunks, picked.choice, picked.ms
        best = choice.index
        allowed = picked.fits or [True] * len(chunks)
        # a dozen floats: no numpy call; with a memory budget, only the sizes within it
        order = sorted((i for i in range(len(chunks)) if allowed[i]), key=ms.__getitem__)
        peaks = picked.peak_mb or [None] * len(chunks)
        candidate = [
            Candidate.model_construct(chunk_size=c, predicted_ttft_ms=m, predicted_peak_mb=p)
            for c, m, p in zip(chunks, ms, peaks, strict=True)
        ]
        gaps = (choice.log_ms - choice.log_ms[best]).tolist()
        gains = tuple(
            Gain(
                "full" if chunks[i] == n else chunks[i],
                ms[i] / ms[best],
                expected_gain(gaps[i], max(float(choice.gain_sd[i]), GAP_SD_FLOOR)),
            )
            for i in order
            if i != best
        )
        schedule = None
        if request.schedule and isinstance(self.recipe.cost, PerChunk):
            att = request.attention
            limit = max_chunk(n, att.window, att.layout)
            if picked.fits is not None:  # a budget: no chunk above the largest size that fits it
                limit = min(limit, max(chunks[i] for i in order))
            ranked = [chunks[best], *(chunks[i] for i in order if i != best)]  # the choice first
            planned = best_schedule(self.recipe.chunk_ms, picked.x[0], n, ranked, limit)
            schedule = None if planned is None else planned[0]
        anchored = candidate[picked.anchored]
        anchor = Anchor.model_construct(
            chunk_size=anchored.chunk_size,
            predicted_ttft_ms=anchored.predicted_ttft_ms,
            predicted_peak_mb=anchored.predicted_peak_mb,
            name=picked.anchor.name,
            spec=picked.anchor.spec,
        )
        response = ChunkResponse.model_construct(
            chunk_size=chunks[best],
            predicted_ttft_ms=ms[best],
            top=[candidate[i] for i in order[:TOP]],
            rule=candidate[picked.rule],
            anchor=anchor,
            model_version=self.version,
            source="model",
            schedule=schedule,
            deferred=choice.deferred,
            explored=False,
            span=None,
            candidates=candidate,
            memory_margin=picked.margin,
        )
        return Answer(response, gains)

    def check(self, outcome: Outcome) -> Outcome:
        """`outcome` if its chunk times are possible on its machine as this model knows it (a profiled
        machine's own measurement over what the client claims), else ConfigError naming chunk_ms."""
        request = outcome.request
        machine = resolve_hardware(self.hardware, request.hardware, request.dtype, request.threads)
        return plausibility.check(outcome, machine)

    def learn(self, outcomes: list[Outcome]) -> int:
        """This machine's correction updated with each outcome's chunk times; returns how many taught it."""
        correction = self.recipe.correction
        if correction is None:
            return 0
        for o in outcomes:
            x = feature_rows(self.hardware, o.request, [o.chunk_size])
            correction.learn(*self.recipe.residuals(x, o.chunk_ms))
        self.info["learnt_from_prefills"] = correction.prefills
        if outcomes:
            self.table.learnt()
        return len(outcomes)


def smoke_request(hardware: dict) -> ChunkRequest:
    """A request every loaded model must answer before it serves."""
    hardware_id = next(iter(hardware), None)
    described = (
        {"hardware_id": hardware_id}
        if hardware_id
        else {"matmul_gflops": 100.0, "bandwidth_gbs": 10.0, "call_overhead_ms": 1.0, "cores": 2}
    )
    return ChunkRequest(context_length=2048, model="llama-tiny", attention={"window": 512}, hardware=described)


def load_predictor(
    tracking_uri: str,
    name: str,
    alias: str,
    budget: float = BUDGET,
    tabled: bool | None = None,
    compiled: bool | None = None,
) -> Predictor:
    """The registered recipe behind `name@alias` plus its hardware table, checked on a smoke request
    before it may serve (its downloaded files are gone once it is loaded)."""
    with registry.fetch(tracking_uri, name, alias) as stored:
        try:
            recipe = load_recipe(stored.recipe_dir)
        except ValueError as exc:
            raise ValueError(f"{name} v{stored.version}: {exc}") from None
    info = {
        "name": name,
        "alias": alias,
        "version": stored.version,
        "run_id": stored.run_id,
        "trained_on_rows": stored.rows,
        "recipe": recipe.name,
        **recipe.params,
        "schedules": isinstance(recipe.cost, PerChunk),
        "held_out": stored.metrics,
        "anchors": {key: tuple(anchor) for key, anchor in recipe.anchors.items()},
    }
    if tabled is None:  # the service's and the in-process engine's switch alike
        tabled = os.environ.get(TABLE_ENV, "1") != "0"
    if compiled is None:
        compiled = os.environ.get(COMPILE_ENV, "1") != "0"
    predictor = Predictor(stored.version, recipe, stored.hardware, info, stored.waits, budget, tabled, compiled)
    predictor.exact_answer(smoke_request(stored.hardware))
    return predictor


@dataclass
class Past:
    """What the telemetry partition holds, as the service accepted it, and what it could not read."""

    outcomes: list[Outcome] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "<file>: why", one per unreadable file or refused row


def past_outcomes(telemetry: Path) -> Past:
    """The outcomes kept in the telemetry partition. A file that does not read as the schema, or a row
    the contract or the plausibility check refuses, is skipped and named: one bad file (a disk
    error, a stray write) never stops a start-up."""
    from store.dataset import TMP_PREFIX, DataError, outcome_of, read_file  # pandas: at load only

    past = Past()
    for path in sorted(Path(telemetry).rglob("*.parquet")):
        if path.name.startswith(TMP_PREFIX):
            continue
        try:
            rows = read_file(path)
        except DataError as exc:
            past.skipped.append(f"{path.name}: {exc.message}")
            continue
        for row in rows.to_dict("records"):
            try:
                past.outcomes.append(plausibility.check(outcome_of(row)))
            except ConfigError as exc:
                past.skipped.append(f"{path.name}: {exc}")
    return past
