"""Recipes judged as they serve: fitted on a fold's training configs, saved, read back with
chunkpilot.recipe.load_recipe (the service's call) and asked about each held-out config with the
rule's candidate, exactly as predictor/model.py asks. Recipes that share a cost model share its fit."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from chunkpilot.chunks import rule_candidate
from chunkpilot.recipe import Recipe, load_recipe, make_recipe

from .baselines import HeldOutChoices
from .data import Table


def choose_groups(recipe: Recipe, test: Table) -> HeldOutChoices:
    """The recipe's choice for every config of `test` among its measured sizes."""
    members = recipe.members(test.x)  # [K, rows]: a row's prediction does not depend on its batch
    chunks, deferred = {}, set()
    for g, r in test.rows.groupby("group", sort=False):
        i, sizes, first = r.index.to_numpy(), r.chunk_size.tolist(), r.iloc[0]
        rule = rule_candidate(sizes, int(first.context_length), int(first.window) or None, first.layout)
        choice = recipe.choose(members[:, i], sizes.index(rule))
        chunks[g] = sizes[choice.index]
        if choice.deferred:
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
    kind of cost model."""
    fitted = {}
    out = {}
    for name in names:
        recipe = make_recipe(name, lgbm)
        kind = recipe.cost.kind
        if kind not in fitted:
            fitted[kind] = recipe.fit(train.measured).cost
        out[name] = load_recipe(Recipe(name, fitted[kind], recipe.chooser).save(folder / name))
    return out


def served_fit(names: list[str], lgbm: dict):
    """cross_validate's `fit` for recipes: trained, saved and loaded back, as they would serve."""

    def fit(train: Table) -> dict[str, Served]:
        with tempfile.TemporaryDirectory(prefix="chunkpilot-recipe-") as tmp:
            return {name: Served(r) for name, r in fit_recipes(names, lgbm, train, Path(tmp)).items()}

    return fit
