"""The registered model `chunk-size-predictor` and its promotion gate: `champion` moves to a new
version only if it beats the current champion's mean regret on the same held-out slices."""

from __future__ import annotations

import json
from dataclasses import dataclass

MODEL_NAME = "chunk-size-predictor"
LEGACY = {"rule_margin": 0.0, "rank_with_ranker": False}  # what a recipe logged before these keys existed did


@dataclass(frozen=True)
class Verdict:
    alias: str  # champion or challenger
    reason: str
    champion_version: str | None  # the champion it was compared with
    champion_regret: float | None


def current_champion(client) -> tuple[str, dict] | None:
    """(version, training params) of the champion, or None when there is none."""
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(MODEL_NAME, "champion")
    except MlflowException:
        return None
    params = json.loads(client.get_run(version.run_id).data.params.get("lgbm_params", "{}"))
    return version.version, {**LEGACY, **params}


def judge(new_regret: float, champion: tuple[str, float] | None) -> Verdict:
    """`champion` is (version, its mean regret re-measured on this run's slices) or None."""
    if champion is None:
        return Verdict("champion", "no champion yet", None, None)
    version, regret = champion
    if new_regret < regret:
        return Verdict("champion", f"mean regret {new_regret:.4f} beats champion v{version}'s {regret:.4f} "
                       "on the same held-out slices", version, regret)
    return Verdict("challenger", f"mean regret {new_regret:.4f} does not beat champion v{version}'s {regret:.4f} "
                   "on the same held-out slices; champion kept", version, regret)
