"""The served recipe: the champion's estimator (estimator.recipe, loaded by the same function as
training's cross-validation, with the machines it was trained on), its decision table built cell by
cell as lengths are asked, and the service's part around it: the decision budget (the anchor
answers while a kind's first cell builds behind, where deciding now would cost too much of the TTFT) and this machine's
correction, learnt from each accepted outcome (chunkpilot.correction) without a retrain. No torch,
no transformers, no pandas in the hot path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chunkpilot import plausibility
from chunkpilot.chunks import rule_candidate
from chunkpilot.contract import Anchor, Candidate, ChunkRequest, ConfigError, Decision, Outcome
from chunkpilot.correction import Correction
from chunkpilot.features import base_log_ms
from estimator.cost_models import PerChunk
from estimator.decide import anchor_size, candidates, feature_rows, resolve_hardware
from estimator.recipe import Recipe, load_recipe
from estimator.table import untabled
from judge.lineup import Baseline
from store import registry

from .settings import BUDGET

log = logging.getLogger(__name__)
TABLE_ENV = "CHUNKPILOT_DECISION_TABLE"  # "0": no decision tables (the tests' servers)
COMPILE_ENV = "CHUNKPILOT_COMPILED_FORESTS"  # "0": LightGBM's own predictor only (the tests' servers)


@dataclass
class Predictor:
    version: str
    recipe: Recipe  # with the machines it was trained on (Recipe.hardware)
    info: dict = field(default_factory=dict)  # shown by GET /v1/model
    waits: bool = False  # a challenger waiting to be judged on prefills it has not seen (promotion.settle)
    budget: float = BUDGET  # the share of a TTFT a decision on the request path may cost
    tabled: bool = True  # build decision tables (off: every decision is the recipe's, at its length)
    compiled: bool = False  # compile the cost model's forests in the background (load_predictor: by default)

    decision_ms: float = field(init=False, default=0.0)  # what the recipe's own decision costs here (EWMA)
    compile_s: float | None = field(init=False, default=None)  # how long compiling took; None: not (yet)
    forests: threading.Thread | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.recipe.cost, PerChunk) and self.recipe.correction is None:
            self.recipe.correction = Correction()
        self.recipe.version, self.recipe.table.builds = self.version, self.tabled
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

    def answer(self, request: ChunkRequest) -> Decision:
        """The recipe's decision table's answer (estimator.table); where its cell is not built yet it
        is built now, in this request, if deciding is worth its cost (`affordable`), else the anchor
        (the strongest simple baseline here) answers and the cell builds behind. Built now, a cell
        costs one batched call of the recipe for its two ends (halved where they disagree), about a
        decision at the exact length, which would leave its cell to build behind, on the cores the
        engine prefills on. A schedule is priced for its own length, always by the recipe."""
        if untabled(request):
            return self.exact_answer(request)
        found = self.recipe.table.lookup(request, queue=False)
        if found is not None:
            return found
        if not self.affordable(request):
            answer = self.anchor_answer(request)
            self.recipe.table.want(request)  # queued once answered: its build never shares the cores with this decision
            return answer
        return self._decided(request, tabled=self.tabled)

    def tabled_answer(self, request: ChunkRequest, queue: bool = True) -> Decision | None:
        """The table's answer if its segment is built: a lookup, microseconds (None: the cell is
        queued unless `queue` is off, or the request asks what a table does not hold: a schedule,
        a memory budget)."""
        return None if untabled(request) else self.recipe.table.lookup(request, queue)

    def estimate_ms(self, request: ChunkRequest, chunks: list[int]) -> list[float]:
        """The analytic TTFT of each size (features.base_log_ms), one feature build for them all:
        what the budget weighs a decision against, and what the anchor's answer is priced by."""
        return np.exp(base_log_ms(feature_rows(self.recipe.hardware, request, chunks))).tolist()

    def affordable(self, request: ChunkRequest) -> bool:
        """Whether deciding now costs at most `budget` of the TTFT the anchor's size would take (a
        budget of 1, the whole TTFT: always, whatever the analytic estimate says)."""
        if self.budget >= 1:
            return True
        chunks = candidates(request)
        (anchor_ms,) = self.estimate_ms(request, [self.anchored(request, chunks)[1]])
        return self.decision_ms <= self.budget * anchor_ms

    def anchored(self, request: ChunkRequest, chunks: list[int]) -> tuple[Baseline, int]:
        """The request's anchor and its size among `chunks`."""
        anchor = self.recipe.anchor(request.hardware.hardware_id, request.backend, request.attn_impl)
        return anchor, anchor_size(anchor, request, chunks)

    def anchor_answer(self, request: ChunkRequest) -> Decision:
        """The anchor's size, priced by the analytic estimate: no model call."""
        chunks = candidates(request)
        anchor, size = self.anchored(request, chunks)
        att = request.attention
        rule = rule_candidate(chunks, request.context_length, att.window, att.layout)
        at_size, at_rule = self.estimate_ms(request, [size, rule])
        candidate = Candidate(chunk_size=size, predicted_ttft_ms=at_size)
        return Decision(
            chunk_size=size,
            predicted_ttft_ms=at_size,
            top=[candidate],
            rule=Candidate(chunk_size=rule, predicted_ttft_ms=at_rule),
            anchor=Anchor(**candidate.model_dump(), name=anchor.name, spec=anchor.spec),
            model_version=self.version,
            source="anchor",
        )

    def close(self) -> None:
        self.recipe.table.close()

    def exact_answer(self, request: ChunkRequest) -> Decision:
        """The recipe's decision at exactly this length (what the table holds), timed; Infeasible
        when it has none."""
        return self._decided(request, tabled=False)

    def _decided(self, request: ChunkRequest, tabled: bool) -> Decision:
        """The recipe's decision (`tabled`: its cell built now and the table's answer), its time kept
        as what deciding now costs here (the budget weighs it)."""
        start = time.perf_counter()
        decision = self.recipe.decide(request, tabled=tabled)
        ms = (time.perf_counter() - start) * 1e3
        self.decision_ms = ms if not self.decision_ms else 0.9 * self.decision_ms + 0.1 * ms
        return decision

    def check(self, outcome: Outcome) -> Outcome:
        """`outcome` if its chunk times are possible on its machine as this model knows it (a profiled
        machine's own measurement over what the client claims), else ConfigError naming chunk_ms."""
        request = outcome.request
        machine = resolve_hardware(self.recipe.hardware, request.hardware, request.dtype, request.threads)
        return plausibility.check(outcome, machine)

    def learn(self, outcomes: list[Outcome]) -> int:
        """This machine's correction updated with each outcome's chunk times; returns how many taught it."""
        correction = self.recipe.correction
        if correction is None:
            return 0
        for o in outcomes:
            x = feature_rows(self.recipe.hardware, o.request, [o.chunk_size])
            correction.learn(*self.recipe.residuals(x, o.chunk_ms))
        self.info["learnt_from_prefills"] = correction.prefills
        if outcomes:
            self.recipe.table.learnt()
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
    recipe.hardware = stored.hardware
    predictor = Predictor(stored.version, recipe, info, stored.waits, budget, tabled, compiled)
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
