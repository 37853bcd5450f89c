"""Which alias a newly trained version gets: the promotion gate (the champion's recipe re-measured on
the new run's held-out slices, the new version champion only if strictly better), a challenger that
learnt from the engine's own prefills waiting until it beats the champion on prefills neither has
seen (`settle`), and registering the verdict. Storage itself is chunkpilot/registry.py's."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from .registry import CHALLENGER, CHAMPION, MODEL_NAME, RECIPE, WAITS, record_retrain


@dataclass(frozen=True)
class Verdict:
    alias: str  # champion or challenger
    reason: str
    champion_version: str | None  # the champion it was compared with
    champion_regret: float | None
    waits: bool = False  # a challenger that learnt from telemetry: `settle` may promote it later


def judge(
    new_regret: float, champion: tuple[str, float] | None, telemetry: tuple[float, float] | None = None
) -> Verdict:
    """`champion` is (version, its mean regret re-measured on this run's slices) or None;
    `telemetry`, (new, champion) mean regret on the engine's recent prefills, when the data has them:
    the challenger must beat the champion on the slices and not lose on those."""
    if champion is None:
        return Verdict(CHAMPION, "no champion yet", None, None)
    version, regret = champion
    same = "on the same held-out slices"
    if telemetry is not None and telemetry[0] > telemetry[1]:
        return Verdict(
            CHALLENGER,
            f"mean regret {telemetry[0]:.4f} on this machine's recent prefills is worse than "
            f"champion v{version}'s {telemetry[1]:.4f}; champion kept",
            version,
            regret,
        )
    if new_regret < regret:
        return Verdict(
            CHAMPION, f"mean regret {new_regret:.4f} beats champion v{version}'s {regret:.4f} {same}", version, regret
        )
    return Verdict(
        CHALLENGER,
        f"mean regret {new_regret:.4f} does not beat champion v{version}'s {regret:.4f} {same}; champion kept",
        version,
        regret,
    )


def gate(
    client,
    new: dict[str, float],
    recipe: dict,
    rows: tuple[int, int],
    remeasure: Callable[[dict], dict[str, float]],
    features: str,
) -> Verdict:
    """The promotion gate for a freshly trained model; `recipe` its name and params (the RECIPE run
    param), `rows` (profiled rows, telemetry prefills) of its data. Another recipe is scored against
    the champion's recipe re-measured on this run's slices by `remeasure` (mean regret per slice and
    `all`). The champion's own recipe (training is deterministic) retrained on more profiled rows is
    promoted: profiles are measured the careful way and it has seen more of the machines it serves.
    Retrained on more telemetry, single and noisy prefills, it becomes the challenger: `settle`
    promotes it once it has beaten the champion on this machine's prefills that came after it. A
    champion trained on other `features`, or registered before recipes (an older ChunkPilot), cannot
    serve and is replaced."""
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    except MlflowException:
        return judge(new["all"], None)
    run = client.get_run(version.run_id).data.params
    if run.get("features") != features or RECIPE not in run:
        return Verdict(
            CHAMPION,
            f"champion v{version.version} was trained by an older ChunkPilot (other features "
            "or no recipe) and cannot serve this one's requests",
            version.version,
            None,
        )
    theirs = json.loads(run[RECIPE])
    if theirs == recipe:
        more = rows[0] - int(run.get("profiled_rows", run.get("rows", 0)))
        telemetry = rows[1] - int(run.get("telemetry_prefills", 0))
        if telemetry > 0:
            return Verdict(
                CHALLENGER,
                f"champion v{version.version}'s recipe retrained on {telemetry} more prefills "
                "of telemetry: the challenger until it beats the champion on prefills it has not seen",
                version.version,
                new["all"],
                waits=True,
            )
        if more > 0:
            return Verdict(
                CHAMPION,
                f"champion v{version.version}'s recipe retrained on {more} more profiled rows "
                f"(held-out mean regret {new['all']:.4f} on these slices either way)",
                version.version,
                new["all"],
            )
    old = new if theirs == recipe else remeasure(theirs)
    telemetry = (new["telemetry"], old["telemetry"]) if "telemetry" in new else None
    return judge(new["all"], (version.version, old["all"]), telemetry)


MIN_BUCKETS = 3  # configs with both models' choices measured before a challenger is judged on telemetry


def settle(client, compare: Callable[[str, str, float], tuple[float, float, int]], features: str) -> str | None:
    """Judge a waiting challenger (a version newer than the champion) against the champion on this
    machine's prefills that finished after the challenger was registered, which neither model has
    seen: `compare(challenger, champion, since_ms)` gives their mean regrets and the number of
    configs measured at both choices. Strictly better on at least MIN_BUCKETS configs: it becomes
    champion. Returns what happened (None: no challenger waiting)."""
    from mlflow.exceptions import MlflowException

    try:
        champion = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
        challenger = client.get_model_version_by_alias(MODEL_NAME, CHALLENGER)
    except MlflowException:
        return None
    if int(challenger.version) <= int(champion.version) or challenger.tags.get(WAITS) != "true":
        return None
    if {client.get_run(v.run_id).data.params.get("features") for v in (champion, challenger)} != {features}:
        return None  # trained on other features than this ChunkPilot builds: the gate replaces them
    theirs, ours, buckets = compare(str(challenger.version), str(champion.version), challenger.creation_timestamp)
    name, held = f"challenger v{challenger.version}", f"champion v{champion.version}"
    if buckets < MIN_BUCKETS:
        return (
            f"{name} not judged yet: {buckets} configs of the prefills since it was registered measure both "
            f"models' choices (needs {MIN_BUCKETS})"
        )
    verdict = f"mean regret {theirs:.4f} vs {held}'s {ours:.4f} on {buckets} configs of prefills neither had seen"
    if theirs >= ours:
        return f"{name} not promoted: {verdict}"
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, challenger.version)
    client.delete_registered_model_alias(MODEL_NAME, CHALLENGER)
    client.set_model_version_tag(MODEL_NAME, challenger.version, "promotion", f"promoted from challenger: {verdict}")
    return f"{name} promoted: {verdict}"


def register(client, version: str, verdict: Verdict, new_regret: float, settled: str | None = None) -> None:
    """Move the verdict's alias to the freshly logged `version` and record why (after what `settle`
    did to the challenger before it, if anything)."""
    client.set_registered_model_alias(MODEL_NAME, verdict.alias, version)
    client.set_model_version_tag(MODEL_NAME, version, "mean_regret", f"{new_regret:.6f}")
    client.set_model_version_tag(MODEL_NAME, version, "promotion", verdict.reason)
    client.set_model_version_tag(MODEL_NAME, version, WAITS, str(verdict.waits).lower())
    record_retrain(
        client, f"v{version} {verdict.alias}: {verdict.reason}" + (f" (before it: {settled})" if settled else "")
    )
