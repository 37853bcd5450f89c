"""The registered recipe as an MLflow model (pyfunc, logged from this file as code rather than as a
pickle): its artifact is the recipe's folder, read by chunkpilot.recipe.load_recipe, the same
function the service and the cross-validation call. The registry and the UI show it as one model."""

from __future__ import annotations

from pathlib import Path

import mlflow.models
import mlflow.pyfunc
import numpy as np
import pandas as pd

from chunkpilot.recipe import load_recipe
from chunkpilot.registry import RECIPE


class RecipeModel(mlflow.pyfunc.PythonModel):
    """predict: a frame of feature rows (columns chunkpilot.features.FEATURES, one row per candidate)
    -> each candidate's predicted TTFT in ms."""

    def load_context(self, context) -> None:
        self.recipe = load_recipe(Path(context.artifacts[RECIPE]))

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        return np.exp(self.recipe.members(model_input.to_numpy(dtype=float)).mean(0))


mlflow.models.set_model(RecipeModel())
