"""The decision: a recipe is a cost model (estimator.cost_models) and a chooser, with its own
parameters, saved as one folder and read back by `load_recipe`, the one function both training's
cross-validation and the service call: what is judged is exactly what is served.

The chooser takes the argmin of the members' mean predicted TTFT; with "do no harm" (a recipe's
`z` above 0), the anchor's size stays when the predicted saving over it is within a margin (6%)
plus `z` (2) standard deviations of the members' disagreement about that saving, widened by the
noise this machine's correction brings into the two sizes' predictions (chunkpilot.correction).
A recipe with z 0 is the argmin, which keeps the anchor only where the correction's noise alone
covers the saving. The anchor is the strongest simple
baseline of the request's machine, backend and kernel on the training rows (judge.lineup:
one shot, the backend's default, the machine's best single size, the rules, fixed 1024), fitted
with the cost model and saved with it: where the model cannot know better (a machine, backend or
model shape it never saw: `Recipe.knows`), it makes the strongest baseline's choice, never a
weaker one's.

DEFAULT names the recipe `chunkpilot train` registers; the training table shows why (docs/training.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chunkpilot import chunk_features
from chunkpilot.contract import SHAPE_COLUMNS, ChunkRequest, Decision
from chunkpilot.correction import Correction
from chunkpilot.features import FEATURES, base_log_ms
from estimator.cost_models import Adjust, Analytic, CostModel, Measured, PerCandidate, PerChunk, expand, load_cost_model
from estimator.decide import Infeasible, decide_many
from estimator.memory import MemoryModel
from estimator.table import DecisionTable, untabled
from judge.lineup import Baseline, MeasuredConfig, anchor_for, anchor_key, fit_anchors

# what a recipe is trained on: the plan's features and the per-chunk cost model's. A recipe saved
# with another list (an older ChunkPilot) is refused here and replaced by the promotion gate
FEATURE_SET = [*FEATURES, *(f"chunk.{name}" for name in chunk_features.NAMES)]

RECIPE_FILE = "recipe.json"
# what a saved recipe's folder holds; 2: the per-chunk model with its per-candidate twin; 3: anchors;
# 4: the memory model (estimator.memory), null where no row measured its peak; 5: its terms of
# PyTorch's allocator peak (harness 9) and its per-backend fits; 6: its terms at the chunk and phase
# holding the peak (llama.cpp's larger graph phase, a term more); 7: a window's copy behind its sinks;
# 8: split's mask of a shift chunk in one call, its blocks and a ring's reordered copy (two terms more);
# 9: the model shapes it was trained on; 10: a plan's first chunk on the plain causal path costs half its
# square (chunkpilot.features.build: the same feature names, other values)
FORMAT = 10
# the run params a registered champion must share with this ChunkPilot to serve it (the promotion gate)
COMPATIBLE = {"features": ",".join(FEATURE_SET), "recipe_format": str(FORMAT)}


_SHAPE = [FEATURES.index(name) for name in SHAPE_COLUMNS]
Shape = tuple[float, ...]  # a model's SHAPE_COLUMNS, as its feature rows hold them


def shapes_of(x: np.ndarray) -> set[Shape]:
    """The model shapes of feature rows `x` [rows, FEATURES]."""
    return {tuple(row) for row in x[:, _SHAPE].tolist()}


def shape_of(request: ChunkRequest) -> Shape:
    """The request's model shape as its feature rows hold it (floats), read without building one."""
    shape = request.shape
    return tuple(float(getattr(shape, name)) for name in SHAPE_COLUMNS)


# do-no-harm's z and margin, chosen from a grid of z 0 to 3 and margins of 3% to 10% on the held-out
# folds of `chunkpilot train` (so the choice saw the folds it is judged on): z 2 and 6% against z 1
# and 3%, mean regret 2.4% against 3.1% on unseen lengths, 3.3% against 4.2% on unseen shapes, 4.4%
# against 4.7% on unseen architectures, 5.7% against 5.8% on unseen windows (the training records of
# results/runs.jsonl at 2b49db5 and after); z 3 with 10% was better on lengths only. Since FORMAT 10
# the argmin (z 0) had the lower mean regret over all held-out configs and on unseen windows while
# one shot anchored windowed prompts on dense kernels; with the simple rule anchoring them
# (judge.lineup.strongest), z 2 and 6% were lower again on lengths, windows and all (docs/training.md)
Z, MARGIN = 2.0, 0.06


@dataclass(frozen=True)
class Choice:
    """What the chooser picks among one config's candidates, and how sure the members are of it."""

    index: int  # among the candidates
    deferred: bool  # the anchor's size: do-no-harm took it, or the kind is one the model does not know
    log_ms: np.ndarray  # [candidates] the members' mean (deferred unknowing: the analytic estimate)
    # [candidates] the members' standard deviation of (candidate - choice); None: the members were not
    # asked (a kind the model does not know)
    gain_sd: np.ndarray | None

    @property
    def priced(self) -> bool:
        """Whether the members priced the candidates: else no gap is worth exploring and no chunk
        worth scheduling (the anchor's uniform plan runs, and teaches the correction)."""
        return self.gain_sd is not None


@dataclass(frozen=True)
class Chooser:
    z: float = Z  # do no harm within z standard deviations of the predicted saving; 0: the argmin
    # and within this share of the anchor's TTFT: the members share their training data's biases, so
    # their agreement overstates a small saving (live, sizes predicted 2-5% faster than one shot lost
    # 5-12% to it)
    margin: float = MARGIN

    def pick(
        self, members: np.ndarray, anchor: int | None, noise: np.ndarray | None = None, fits: np.ndarray | None = None
    ) -> Choice:
        """The choice among the candidates from `members` [K, candidates] log ms; `anchor` is the
        anchor's index among them; `noise` [candidates, candidates] the variance the correction adds
        to each difference; `fits` [candidates] those allowed (a memory budget; the anchor among them)."""
        mean = _mean(members)
        index, deferred = int(np.argmin(mean if fits is None else np.where(fits, mean, np.inf))), False
        if anchor is not None and index != anchor:
            saving = members[:, anchor] - members[:, index]  # [K] each member's own predicted saving
            added = 0.0 if noise is None else noise[anchor, index]
            # the argmin (z 0) still keeps the anchor where the correction's noise alone, at Z standard
            # deviations, covers the saving: a size learnt from a few noisy prefills is not served on
            # them (docs/telemetry.md); with nothing learnt, it is the plain argmin, as judged offline
            if self.z > 0:
                doubt = np.log1p(self.margin) + self.z * np.sqrt(saving.var() + added)
            else:  # nothing learnt, no doubt: a tie stays the argmin's
                doubt = Z * np.sqrt(added) if added > 0 else -np.inf
            if saving.mean() <= doubt:
                index, deferred = anchor, True
        gain_var = _var(members - members[:, [index]]) + (0.0 if noise is None else noise[:, index])
        return Choice(index, deferred, mean, np.sqrt(gain_var))


# over the members (axis 0) as np.mean and np.var compute them, without their Python-level
# bookkeeping (tens of microseconds of a first decision's few hundred)
def _mean(a: np.ndarray) -> np.ndarray:
    return np.add.reduce(a, axis=0) / len(a)


def _var(a: np.ndarray) -> np.ndarray:
    d = a - _mean(a)
    return np.add.reduce(d * d, axis=0) / len(a)


@dataclass
class Recipe:
    """An estimator as scikit-learn's are: `fit` on measured rows, `decide` a request (its decision
    table's answer, or at exactly its length). The object cross-validation judges is the object
    the service and the MLflow model serve."""

    name: str
    cost: CostModel
    chooser: Chooser = field(default_factory=Chooser)
    correction: Correction | None = None  # this machine's, learnt from its prefills (per-chunk only)
    anchors: dict[str, Baseline] = field(default_factory=dict)  # judge.lineup.anchor_key -> its anchor
    memory: MemoryModel | None = None  # each candidate's peak memory (None: no row measured it)
    shapes: set[Shape] = field(default_factory=set)  # the model shapes of its training rows
    # the machines it was trained on: hardware_id -> {"static": {...}, "descriptors": {"dtype/threads":
    # {...}}}, resolving a request's hardware_id to their own measured descriptors (saved beside the
    # recipe by the registry, store.registry.HARDWARE_FILE; none: each request's own descriptors)
    hardware: dict = field(default_factory=dict)
    version: str | None = None  # the registered model version it serves as (its decisions say so)
    table: DecisionTable = field(init=False, repr=False, compare=False)  # its decisions by segment of lengths

    def __post_init__(self) -> None:
        self.table = DecisionTable(self.decide_many)

    @property
    def params(self) -> dict:
        """What makes the recipe: two recipes with equal params train to the same model."""
        return {"cost": self.cost.kind, "lgbm": self.cost.params, "members": self.cost.size, "z": self.chooser.z}

    def fit(self, data: Measured, configs: dict[str, list[MeasuredConfig]], hardware: dict | None = None) -> Recipe:
        """The cost model fitted on `data`; the anchors on `configs` (anchor key -> its configs); the
        memory model on the rows that measured their peak (two configs at least); `hardware` the
        machines' table (training.data.hardware_table) its requests resolve against."""
        self.hardware = hardware or {}
        self.cost.fit(data)
        self.anchors = fit_anchors(configs)
        self.shapes = shapes_of(data.x)
        measured = None if data.memory_bytes is None else data.memory_bytes > 0
        if measured is not None and len(np.unique(data.configs[measured])) >= 2:
            self.memory = MemoryModel().fit(data.x[measured], data.memory_bytes[measured], data.configs[measured])
        return self

    def decide(self, request: ChunkRequest, tabled: bool = False) -> Decision:
        """The recipe's decision for `request`: at exactly its length, or (`tabled`) its decision
        table's, from the segment of lengths its length falls in (its cell built now where it is not
        yet). Infeasible (estimator.decide) when it has none."""
        if tabled and not untabled(request):
            found = self.table.build_now(request)  # a lookup where its cell is built
            if found is not None:
                return found
        (decided,) = decide_many(self, request, [request.context_length])
        if isinstance(decided, Infeasible):
            raise decided
        return decided

    def decide_many(self, request: ChunkRequest, lengths: list[int]) -> list[Decision | Infeasible]:
        """The recipe's decisions for the request's kind at each of `lengths`, priced in one batch
        (how a decision table's cells are built): estimator.decide.decide_many."""
        return decide_many(self, request, lengths)

    def anchor(self, hardware_id: str | None, backend: str, attn_impl: str) -> Baseline:
        """The anchor of a request on this machine, backend and kernel (judge.lineup.anchor_for)."""
        return anchor_for(self.anchors, hardware_id, backend, attn_impl)

    def knows(self, request: ChunkRequest) -> bool:
        """Whether the cost model has seen the request's machine run its backend and kernel, and its
        model shape: in its training rows, or (the service's machine) in the prefills its correction
        learnt from. Where it has not, its predictions are a guess (held out by machine, backend,
        model shape or architecture, the training table shows them worse than the strongest simple
        baseline), and the anchor decides."""
        learnt = self.correction is not None and self.correction.prefills > 0
        hardware_id = request.hardware.hardware_id
        seen = hardware_id is not None and anchor_key(hardware_id, request.backend, request.attn_impl) in self.anchors
        shape = shape_of(request)
        return (seen or learnt) and (shape in self.shapes or (learnt and self.correction.learnt_shape(shape)))

    def _adjust(self) -> Adjust | None:
        return None if self.correction is None or not self.correction.prefills else self.correction.offsets

    def chunk_ms(self, config: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
        """[chunks] each chunk's predicted ms (members' mean, corrected): what schedules are priced by."""
        if not isinstance(self.cost, PerChunk):
            raise ValueError(f"the {self.cost.kind} model has no per-chunk costs")
        adjust = self._adjust()
        log_ms = self.cost.chunk_log_ms(config, q, h).mean(0)
        return np.exp(log_ms if adjust is None else log_ms + adjust(config, q, h))

    def members(self, x: np.ndarray) -> np.ndarray:
        """[K, rows] log ms of every row's uniform plan, this machine's correction applied."""
        return self.cost.members(x, self._adjust())

    def pick(self, members: np.ndarray, x: np.ndarray, anchor: int, fits: np.ndarray | None = None) -> Choice:
        """One config's candidates, `x` [candidates, FEATURES], their members [K, candidates] (a
        batch's share: estimator.decide.decide_many), the anchor's index among them, and which
        candidates fit a memory budget, on a kind the model `knows`. Without a learnt correction or a
        budget it is exactly `chooser.pick`."""
        noise = None if self._adjust() is None else self.correction.difference_variance(x)
        return self.chooser.pick(members, anchor, noise, fits)

    @staticmethod
    def defer(x: np.ndarray, anchor: int) -> Choice:
        """The anchor's size on a kind the model does not `know`, whatever its members would say, so
        they are not asked: the candidates `x` [candidates, FEATURES] are priced by the analytic
        estimate alone (a new model's first requests decided in a fraction of a model decision)."""
        log_ms = base_log_ms(x)
        return Choice(anchor, True, log_ms, None)

    def residuals(self, x: np.ndarray, chunk_ms: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One measured prefill of the uniform plan `x` [1, FEATURES]: (its chunks' config rows, query
        tokens, log residuals against the cost model without correction), for Correction.learn."""
        if not isinstance(self.cost, PerChunk):
            raise ValueError(f"the {self.cost.kind} model has no per-chunk costs to correct")
        owner, q, h = expand(x)
        predicted = self.cost.chunk_log_ms(x[owner], q, h).mean(0)
        return x[owner], q, np.log(np.asarray(chunk_ms, dtype=float)) - predicted

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        saved = {
            "format": FORMAT,
            "name": self.name,
            "cost": self.cost.save(folder),
            "chooser": {"z": self.chooser.z, "margin": self.chooser.margin},
            "features": FEATURE_SET,
            "anchors": {key: list(anchor) for key, anchor in self.anchors.items()},
            "memory": None if self.memory is None else self.memory.save(),
            "shapes": sorted(self.shapes),
        }
        (folder / RECIPE_FILE).write_text(json.dumps(saved, indent=1, sort_keys=True))
        return folder


def load_recipe(folder: Path) -> Recipe:
    """A saved recipe as it serves (ValueError naming what is wrong when it cannot)."""
    path = Path(folder) / RECIPE_FILE
    if not path.is_file():
        raise ValueError(f"{folder} holds no {RECIPE_FILE}: not a ChunkPilot recipe (an older model?)")
    saved = json.loads(path.read_text())
    if saved.get("format", 1) != FORMAT:
        raise ValueError(
            f"recipe {saved.get('name')!r} was saved in format {saved.get('format', 1)}, this ChunkPilot reads "
            f"format {FORMAT}: retrain it (chunkpilot train)"
        )
    if saved.get("features") != FEATURE_SET:
        raise ValueError(
            f"recipe {saved.get('name')!r} was trained on other features ({len(saved.get('features', []))}) "
            f"than this ChunkPilot builds ({len(FEATURE_SET)}): retrain it (chunkpilot train)"
        )
    anchors = {key: Baseline(*anchor) for key, anchor in saved["anchors"].items()}
    memory = None if saved["memory"] is None else MemoryModel.load(saved["memory"])
    cost = load_cost_model(Path(folder), saved["cost"])
    shapes = {tuple(shape) for shape in saved["shapes"]}
    return Recipe(saved["name"], cost, Chooser(**saved["chooser"]), None, anchors, memory, shapes)


# the recipes training judges side by side; DEFAULT is the one registered (see the table in docs/training.md)
RECIPES: dict[str, tuple[type[PerChunk] | type[PerCandidate] | type[Analytic], float]] = {
    "per-chunk": (PerChunk, Z),
    "per-chunk-argmin": (PerChunk, 0.0),
    "per-candidate": (PerCandidate, Z),
    "per-candidate-argmin": (PerCandidate, 0.0),
    "analytic-fit": (Analytic, 0.0),  # one member: no spread to weigh a saving against
}
DEFAULT = "per-chunk"


def make_recipe(name: str = DEFAULT, lgbm: dict | None = None) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"recipe {name!r} is not one of {', '.join(RECIPES)}")
    kind, z = RECIPES[name]
    return Recipe(name, kind(dict(lgbm or {})), Chooser(z))
