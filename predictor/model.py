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
import timeit
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from chunkpilot import plausibility
from chunkpilot.chunks import rule_candidate
from chunkpilot.contract import Anchor, Candidate, ChunkRequest, ConfigError, Decision, Outcome
from chunkpilot.correction import Correction
from chunkpilot.features import base_log_ms, floor_ms
from estimator.cost_models import PerChunk
from estimator.decide import anchor_size, candidates, feature_rows, resolve_hardware
from estimator.recipe import Recipe, load_recipe
from estimator.table import untabled
from judge.lineup import Baseline
from store import registry

from .settings import BUDGET

log = logging.getLogger(__name__)
TABLE_ENV = "CHUNKPILOT_DECISION_TABLE"  # "0": no decision tables (the tests' servers)
# an anchor answer's reason where the recipe does not know the request's kind (Recipe.knows)
UNKNOWN_KIND = "the model has not measured this model shape, machine, backend or kernel: the anchor decides"
COMPILE_ENV = "CHUNKPILOT_COMPILED_FORESTS"  # "0": LightGBM's own predictor only (the tests' servers)


class Anchored(NamedTuple):
    """A request's anchor (the strongest simple baseline of its machine, backend and kernel), its size
    and the hand rule's with their analytic TTFTs, and whether the recipe knows the request's kind."""

    anchor: Baseline
    size: int
    ms: float
    rule: int
    rule_ms: float
    known: bool  # Recipe.knows: else the anchor's size is the recipe's own decision

    def decision(self, version: str) -> Decision:
        """The anchor's size as the answer, no model call; where the recipe does not know the kind,
        `reason` says why and it is `deferred`, as the recipe's decision there is."""
        candidate = Candidate(chunk_size=self.size, predicted_ttft_ms=self.ms)
        return Decision(
            chunk_size=self.size,
            predicted_ttft_ms=self.ms,
            deferred=not self.known,
            top=[candidate],
            rule=Candidate(chunk_size=self.rule, predicted_ttft_ms=self.rule_ms),
            anchor=Anchor(**candidate.model_dump(), name=self.anchor.name, spec=self.anchor.spec),
            model_version=version,
            source="anchor",
            reason=None if self.known else UNKNOWN_KIND,
        )


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
        try:
            self.decision_ms = self._measured(smoke_request(self.recipe.hardware))
        except Exception as exc:  # noqa: BLE001 - the budget keeps its older measure, the forests still answer
            log.warning("measuring a decision on the compiled forests failed (%s)", exc)

    def _measured(self, request: ChunkRequest, times: int = 3) -> float:
        """What a decision costs now, in ms: the fastest of `times` (the budget weighs what a decision
        costs, not what a busy moment made of one), after one untimed decision that pays first calls.
        The compiled forests decide several times faster than LightGBM's predictor, which priced the
        load's smoke request: the budget is measured again on them."""
        self.recipe.decide(request)
        return min(timeit.repeat(lambda: self.recipe.decide(request), repeat=times, number=1)) * 1e3

    def answer(self, request: ChunkRequest) -> Decision:
        """The recipe's decision table's answer (estimator.table). Where its cell is not built yet, it is built
        now, in this request, if the recipe knows the kind (`Recipe.knows`) and deciding is worth its
        cost (`affordable`: weighed first against the prompt's floor, features.floor_ms, which needs no
        feature row, then against the anchor's size); else the anchor (the strongest simple baseline
        here) answers, from one feature row per size, and the cell builds behind. Built now, a cell
        costs one batched call of the recipe for its two ends (halved where they disagree), about a
        decision at the exact length, which would leave its cell to build behind, on the cores the
        engine prefills on. On a kind the recipe does not know (a model shape, machine or backend it
        never saw) the anchor's size is the recipe's own decision: answered at once, its cell built
        behind without the forests (estimator.decide.decide_many). A schedule or a memory budget is
        priced for its own length, always by the recipe."""
        if untabled(request):
            return self.exact_answer(request)
        found = self.recipe.table.lookup(request, queue=False)
        if found is not None:
            return found
        if self.recipe.knows(request) and self.affordable(self.floor_ms(request)):
            # affordable whatever size the anchor takes (its TTFT is above the floor): no rows of its own
            return self._decided(request, tabled=self.tabled)
        anchored = self.anchored(request)
        if anchored.known and self.affordable(anchored.ms):
            return self._decided(request, tabled=self.tabled)
        answer = anchored.decision(self.version)
        self.recipe.table.want(request)  # queued once answered: its build never shares the cores with this decision
        return answer

    def tabled_answer(self, request: ChunkRequest, queue: bool = True) -> Decision | None:
        """The table's answer if its segment is built: a lookup, microseconds (None: the cell is
        queued unless `queue` is off, or the request asks what a table does not hold: a schedule,
        a memory budget)."""
        return None if untabled(request) else self.recipe.table.lookup(request, queue)

    def affordable(self, anchor_ms: float) -> bool:
        """Whether deciding now costs at most `budget` of the TTFT the anchor's size would take
        (`anchor_ms`, the analytic estimate; a budget of 1, the whole TTFT: always)."""
        return self.budget >= 1 or self.decision_ms <= self.budget * anchor_ms

    def floor_ms(self, request: ChunkRequest) -> float:
        """The least analytic TTFT of any size for the request on its machine (features.floor_ms)."""
        machine = resolve_hardware(self.recipe.hardware, request.hardware, request.dtype, request.threads)
        return floor_ms(request.row(machine))

    def anchored(self, request: ChunkRequest) -> Anchored:
        """The request's anchor, its size and the hand rule's, priced by the analytic estimate
        (features.base_log_ms) from one feature row each, and whether the recipe knows its kind."""
        chunks = candidates(request)
        anchor = self.recipe.anchor(request.hardware.hardware_id, request.backend, request.attn_impl)
        size = anchor_size(anchor, request, chunks)
        att = request.attention
        rule = rule_candidate(chunks, request.context_length, att.window, att.layout)
        x = feature_rows(self.recipe.hardware, request, [size, rule])  # [2, FEATURES]
        known = self.recipe.knows(request)
        at_size, at_rule = np.exp(base_log_ms(x)).tolist()
        return Anchored(anchor, size, at_size, rule, at_rule, known)

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
    predictor.exact_answer(smoke_request(stored.hardware))  # what a decision costs until the forests are compiled
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
