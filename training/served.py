"""Recipes judged as they serve: fitted on a fold's training configs, saved, read back with
estimator.recipe.load_recipe (the service's call) and asked about each held-out config with the
rule's candidate, exactly as predictor/model.py asks. Recipes that share a cost model share its fit."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from chunkpilot.chunks import landed, length_cell, segments
from chunkpilot.contract import window_column
from chunkpilot.features import INPUT_COLUMNS, build
from chunkpilot.lineup import applied
from estimator.cost_models import PerChunk
from estimator.recipe import Recipe, load_recipe, make_recipe

from .baselines import HeldOutChoices
from .data import Table


def _choose_at(recipe: Recipe, r: pd.DataFrame, members: np.ndarray, length: int) -> tuple[int, bool]:
    """(the index chosen among the config's measured sizes, deferred) with the config `r` (its rows,
    `members` their predictions) asked about at `length`, its `full` row read as that length, the
    anchor of its machine, backend and kernel as the service finds it."""
    first, n = r.iloc[0], int(r.iloc[0].context_length)
    lengths = [length if full else size for size, full in zip(r.chunk_size, r.is_full, strict=True)]
    if length != n:
        config = {c: first[c] for c in INPUT_COLUMNS}
        members = recipe.members(build({**config, "context_length": length, "chunk_size": lengths}))
    spec = recipe.anchor(first.hardware_id, first.backend, first.attn_impl).spec
    anchor = lengths.index(landed(lengths, applied(spec, length, window_column(first.window), first.layout)))
    if not recipe.knows(first.hardware_id, first.backend, first.attn_impl):
        return anchor, True
    choice = recipe.chooser.pick(members, anchor)
    return choice.index, choice.deferred


def choose_groups(recipe: Recipe, test: Table, table: bool = True) -> HeldOutChoices:
    """The recipe's choice for every config of `test` among its measured sizes (the one measured as
    the whole prompt being `full`), as the service answers from its decision table (predictor.table):
    the decision of the length's segment of its cell (its cell's ends, halved where they disagree
    down to segments whose ends agree), read from the segment's nearer end; `table=False`: always
    at the exact length (what the table must agree with)."""
    members = recipe.members(test.x)  # [K, rows]: a row's prediction does not depend on its batch
    chunks, deferred = {}, set()
    for g, r in test.rows.groupby("group", sort=False):
        m, n, window = members[:, r.index.to_numpy()], int(r.iloc[0].context_length), window_column(r.iloc[0].window)
        first, last = length_cell(n, tuple(sorted(r.chunk_size[~r.is_full].tolist())), window) if table else (n, n)

        def decide(lengths: list[int], r: pd.DataFrame = r, m: np.ndarray = m) -> list[tuple[int, bool]]:
            return [_choose_at(recipe, r, m, length) for length in lengths]

        (found,) = segments(decide, lambda a, b: a[1][0] == b[1][0], [(first, last)], at=n)
        index, was_deferred = found.nearer(n)[1]
        chunks[g] = r.chunk_size.tolist()[index]
        if was_deferred:
            deferred.add(g)
    return HeldOutChoices(chunks, np.exp(members.mean(0)), deferred)


class Served:
    """A loaded recipe as a training policy (fit happened before it was saved)."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe, self.name = recipe, recipe.name

    def choose(self, test: Table) -> HeldOutChoices:
        return choose_groups(self.recipe, test)


def fit_recipes(names: list[str], lgbm: dict, train: Table, folder: Path) -> dict[str, Recipe]:
    """Each named recipe fitted on `train`, saved under `folder`/name and loaded back; one fit per
    kind of cost model (the per-chunk model's per-candidate twin counts as that kind's), one of the
    anchors for all."""
    configs = train.anchor_configs
    fitted: dict[str, Recipe] = {}
    out = {}
    for name in names:
        recipe = make_recipe(name, lgbm)
        kind = recipe.cost.kind
        if kind not in fitted:
            fitted[kind] = recipe.fit(train.measured, configs)
            if isinstance(recipe.cost, PerChunk):  # its twin is the per-candidate model of the same rows and params
                twin = Recipe(name, recipe.cost.untimed, anchors=recipe.anchors, memory=recipe.memory)
                fitted.setdefault(recipe.cost.untimed.kind, twin)
        done = fitted[kind]
        out[name] = load_recipe(
            Recipe(name, done.cost, recipe.chooser, anchors=done.anchors, memory=done.memory).save(folder / name)
        )
    return out


def served_fit(names: list[str], lgbm: dict):
    """cross_validate's `fit` for recipes: trained, saved and loaded back, as they would serve."""

    def fit(train: Table) -> dict[str, Served]:
        with tempfile.TemporaryDirectory(prefix="chunkpilot-recipe-") as tmp:
            return {name: Served(r) for name, r in fit_recipes(names, lgbm, train, Path(tmp)).items()}

    return fit
