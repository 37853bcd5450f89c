"""Recipes judged as they serve: fitted on a fold's training configs, saved, read back with
estimator.recipe.load_recipe (the service's call) and asked about each held-out config by
`Recipe.decide` with the config's measured sizes as candidates, from the recipe's own decision
table, exactly as the service asks. Recipes that share a cost model share its fit."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from chunkpilot.contract import ChunkRequest
from estimator.cost_models import PerChunk
from estimator.recipe import Recipe, load_recipe, make_recipe
from judge.metrics import HeldOutChoices

from .data import Table


def request_of(rows: pd.DataFrame) -> ChunkRequest:
    """A config's measured rows as the request that asks about it, its measured sizes the
    candidates (the one measured as the whole prompt: `full`)."""
    sizes = ["full" if full else int(c) for c, full in zip(rows.chunk_size, rows.is_full, strict=True)]
    return ChunkRequest.from_row(rows.iloc[0].to_dict()).model_copy(update={"candidates": sizes})


def choose_groups(recipe: Recipe, test: Table, table: bool = True) -> HeldOutChoices:
    """The recipe's choice for every config of `test` among its measured sizes, asked as the service
    asks (`Recipe.decide`): from its decision table, the segment of the config's length (its cell
    built now); `table=False`: at the exact length (what the table must agree with)."""
    chunks, deferred = {}, set()
    for g, r in test.rows.groupby("group", sort=False):
        decision = recipe.decide(request_of(r), tabled=table)
        chunks[g] = decision.chunk_size  # the prompt's length: the row measured as one shot
        if decision.deferred:
            deferred.add(g)
    members = recipe.members(test.x)  # [K, rows]: what each measured row was predicted
    return HeldOutChoices(chunks, np.exp(members.mean(0)), deferred)


class Served:
    """A loaded recipe as a training policy (fit happened before it was saved)."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe, self.name = recipe, recipe.name

    def choose(self, test: Table) -> HeldOutChoices:
        return choose_groups(self.recipe, test)


def fit_recipes(
    names: list[str], lgbm: dict, train: Table, folder: Path, hardware: dict | None = None
) -> dict[str, Recipe]:
    """Each named recipe fitted on `train`, saved under `folder`/name and loaded back; one fit per
    kind of cost model (the per-chunk model's per-candidate twin counts as that kind's), one of the
    anchors for all; `hardware` the machines' table its requests resolve against (None: none, each
    request's own descriptors: cross-validation asks with each held-out row's)."""
    configs = train.anchor_configs
    fitted: dict[str, Recipe] = {}
    out = {}
    for name in names:
        recipe = make_recipe(name, lgbm)
        kind = recipe.cost.kind
        if kind not in fitted:
            fitted[kind] = recipe.fit(train.measured, configs, hardware)
            if isinstance(recipe.cost, PerChunk):  # its twin is the per-candidate model of the same rows and params
                twin = replace(recipe, cost=recipe.cost.untimed)
                fitted.setdefault(recipe.cost.untimed.kind, twin)
        done = fitted[kind]
        saved = replace(done, name=name, chooser=recipe.chooser).save(folder / name)
        out[name] = load_recipe(saved)
        out[name].hardware = hardware or {}  # saved beside it by the registry (store.registry.HARDWARE_FILE)
    return out


def served_fit(names: list[str], lgbm: dict):
    """cross_validate's `fit` for recipes: trained, saved and loaded back, as they would serve."""

    def fit(train: Table) -> dict[str, Served]:
        with tempfile.TemporaryDirectory(prefix="chunkpilot-recipe-") as tmp:
            return {name: Served(r) for name, r in fit_recipes(names, lgbm, train, Path(tmp)).items()}

    return fit
