"""The registered recipe as an MLflow model that stands alone (pyfunc, logged from this file as
code, never a pickle, with the packages it imports as `code_paths`): `mlflow.pyfunc.load_model` or
`mlflow models serve -m models:/chunk-size-predictor@champion` answer a request as the service
does, by the same `Recipe.decide` at the request's exact length (what the service's decision
table holds). It carries the bottom package, which imports no torch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlflow.models
import mlflow.pyfunc
import pandas as pd
from mlflow.exceptions import MlflowException
from pydantic import ValidationError

from chunkpilot.contract import ChunkRequest, ConfigError
from estimator.decide import Infeasible, row_of
from estimator.recipe import load_recipe
from store.registry import HARDWARE_FILE, RECIPE

NESTED = ("model", "attention", "hardware", "candidates")  # objects or lists: a row may give them as JSON text


def row_request(row: int, record: dict) -> ChunkRequest:
    """One row of the input as the contract's request; a bad one raises naming the row and the field."""
    given = {k: v for k, v in record.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
    for name in NESTED:
        if isinstance(given.get(name), str) and given[name].lstrip()[:1] in ("{", "["):
            try:
                given[name] = json.loads(given[name])
            except ValueError as exc:
                raise ConfigError(f"row {row}.{name}", f"is not valid JSON: {exc}") from None
    try:
        return ChunkRequest.model_validate(given)
    except ValidationError as exc:
        raise ConfigError.of(exc, f"row {row}") from None


class RecipeModel(mlflow.pyfunc.PythonModel):
    """predict: one request per row (the fields of the service's POST /v1/chunk-size as columns)
    -> one decision per row (estimator.decide.ROW's columns)."""

    def load_context(self, context) -> None:
        self.recipe = load_recipe(Path(context.artifacts[RECIPE]))
        self.recipe.hardware = json.loads(Path(context.artifacts[HARDWARE_FILE]).read_text())

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        try:
            rows = [
                row_of(self.recipe.decide(row_request(i, record)))
                for i, record in enumerate(model_input.to_dict("records"))
            ]
        except (ConfigError, Infeasible) as exc:  # a 400 naming the field, not a traceback
            raise MlflowException.invalid_parameter_value(str(exc)) from None
        return pd.DataFrame(rows)


mlflow.models.set_model(RecipeModel())
