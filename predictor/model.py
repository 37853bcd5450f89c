"""The served model: the champion's LightGBM Booster, the hardware it was trained on, and the
decision for one request (feature rows for every feasible candidate -> predicted TTFT -> argmin).
No torch, no transformers, no pandas: this runs in the service's hot path."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

import lightgbm as lgb

from chunkpilot import registry
from chunkpilot.choice import pick
from chunkpilot.contract import DEFAULT_CHUNKS, ChunkRequest, Hardware, feasible_chunks, fit_chunk, hand_rule, max_chunk
from chunkpilot.features import FEATURES, base_log_ms, build

from .schedule import best_schedule
from .schemas import Candidate

TOP = 5  # candidates returned with their predictions


class Infeasible(ValueError):
    """A request the model cannot answer; the message says why (422), `reason` names the kind
    (counted by reason in /metrics)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    """The service's answer to one request; the engine turns it into its own `Decision`."""

    chunk_size: int
    predicted_ttft_ms: float
    top: list[Candidate]
    rule: Candidate
    model_version: str
    explored: bool = False  # a candidate other than the model's pick, on purpose (predictor/explore.py)
    schedule: list[int] | None = None  # chunk sizes in order, when asked and a per-chunk model is served


def resolve_hardware(table: dict, hardware: Hardware, dtype: str, threads: int) -> dict:
    """Descriptor fields for the features: a profiled machine's own measurement at exactly this
    dtype and thread count (what the model was trained on) wins; otherwise the request's fields,
    over the profiled machine's nearest setting, if any."""
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
        measured = {tuple(k.split("/")): v for k, v in machine["descriptors"].items()}
        same_dtype = [k for k in measured if k[0] == dtype] or list(measured)
        nearest = min(same_dtype, key=lambda k: (abs(int(k[1]) - threads), k))
        found = {**machine["static"], **measured[nearest]}
        if nearest == (dtype, str(threads)):
            return {**given, **found}
    return {**found, **{k: v for k, v in given.items() if v or k not in found}}


@dataclass
class Predictor:
    version: str
    booster: lgb.Booster
    hardware: dict  # hardware_id -> {"static": {...}, "descriptors": {"dtype/threads": {...}}}
    info: dict = field(default_factory=dict)  # shown by GET /v1/model
    ranker: lgb.Booster | None = None  # its order within the config combined with the levels
    rule_margin: float = 0.0  # the rule's size unless the pick is predicted to save more (training's recipe)
    waits: bool = False  # a challenger waiting to be judged on prefills it has not seen (registry.settle)
    chunk_cost: lgb.Booster | None = None  # the per-chunk cost model: schedules, when asked

    @property
    def uncertainty(self) -> float:
        """The model's relative TTFT error on held-out configs (its MAPE; 10% when not logged)."""
        return self.info.get("held_out", {}).get("mape", 0.1)

    def candidates(self, request: ChunkRequest) -> list[int]:
        n, att = request.context_length, request.attention
        asked = tuple(request.candidates or DEFAULT_CHUNKS)
        chosen, _ = feasible_chunks(asked, n, att.window, att.layout)
        if not chosen:
            limit = max_chunk(n, att.window, att.layout)
            why = f"the context ({n})" if limit == n else f"the ring window ({att.window}) and the context ({n})"
            sizes = ", ".join(str(size) for size in asked)  # "full" sits among the numbers
            raise Infeasible(f"candidates: every candidate ({sizes}) is larger than {why}", "no_feasible_candidate")
        return chosen

    def decide(self, request: ChunkRequest) -> Answer:
        n, att = request.context_length, request.attention
        chunks = self.candidates(request)
        rule = fit_chunk(hand_rule(n), n, att.window, att.layout)
        sizes = chunks + ([rule] if rule not in chunks else [])
        hw = resolve_hardware(self.hardware, request.hardware, request.dtype, request.threads)
        x = build({**request.row(hw), "chunk_size": sizes})  # one config, one row per candidate
        # one thread: a dozen rows gain nothing from OpenMP, whose spinning stalls on a busy machine
        log_ms = (self.booster.predict(x, num_threads=1) + base_log_ms(x)).tolist()
        ms = [math.exp(v) for v in log_ms]
        if not all(map(math.isfinite, ms)):
            raise Infeasible("the model predicted a non-finite TTFT for this request", "non_finite")
        order = sorted(range(len(chunks)), key=ms.__getitem__)  # a dozen floats: no numpy call
        score = None if self.ranker is None else self.ranker.predict(x[: len(chunks)], num_threads=1).tolist()
        best, _ = pick(log_ms[: len(chunks)], score, chunks.index(rule) if rule in chunks else None, self.rule_margin)
        rule_ms = ms[sizes.index(rule)]
        schedule = None
        if request.schedule and self.chunk_cost is not None:
            limit = max_chunk(n, att.window, att.layout)
            ranked = [chunks[best], *(chunks[i] for i in order if i != best)]  # the pick first
            planned = best_schedule(self.chunk_cost, x[0], n, ranked, limit)
            schedule = None if planned is None else planned[0]
        return Answer(
            chunk_size=chunks[best],
            predicted_ttft_ms=ms[best],
            top=[Candidate(chunk_size=chunks[i], predicted_ttft_ms=ms[i]) for i in order[:TOP]],
            rule=Candidate(chunk_size=rule, predicted_ttft_ms=rule_ms),
            model_version=self.version,
            schedule=schedule,
        )


class AnswerCache:
    """A small LRU over requests (their canonical JSON): repeated shapes of traffic skip the model."""

    def __init__(self, size: int) -> None:
        self.size, self.entries = size, OrderedDict()

    def get(self, key: str) -> Answer | None:
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        return None

    def put(self, key: str, decision: Answer) -> None:
        self.entries[key] = decision
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)


def smoke_request(hardware: dict) -> ChunkRequest:
    """A request every loaded model must answer before it serves."""
    hardware_id = next(iter(hardware), None)
    described = (
        {"hardware_id": hardware_id}
        if hardware_id
        else {"matmul_gflops": 100.0, "bandwidth_gbs": 10.0, "call_overhead_ms": 1.0, "cores": 2}
    )
    return ChunkRequest(context_length=2048, model="llama-tiny", attention={"window": 512}, hardware=described)


def load_predictor(tracking_uri: str, name: str, alias: str) -> Predictor:
    """The registered model behind `name@alias` as Boosters plus its hardware table, checked on a
    smoke request before it may serve."""
    stored = registry.fetch(tracking_uri, name, alias)
    ranker = None if stored.ranker_file is None else lgb.Booster(model_file=str(stored.ranker_file))
    rule_margin = float(stored.recipe["rule_margin"])
    info = {
        "name": name,
        "alias": alias,
        "version": stored.version,
        "run_id": stored.run_id,
        "trained_on_rows": stored.rows,
        "rule_margin": rule_margin,
        "ranker": ranker is not None,
        "held_out": stored.metrics,
    }
    booster = lgb.Booster(model_file=str(stored.model_file))
    if booster.num_feature() != len(FEATURES):
        raise ValueError(f"{name} v{stored.version} was trained on {booster.num_feature()} features; this ChunkPilot "
                         f"builds {len(FEATURES)}: retrain it (chunkpilot train)")  # fmt: skip
    chunk_cost = None if stored.chunk_cost_file is None else lgb.Booster(model_file=str(stored.chunk_cost_file))
    info["schedules"] = chunk_cost is not None
    predictor = Predictor(stored.version, booster, stored.hardware, info, ranker, rule_margin, stored.waits, chunk_cost)
    predictor.decide(smoke_request(stored.hardware))
    return predictor
