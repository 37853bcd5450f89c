"""Which alias a newly trained version gets: the promotion gate (the champion's recipe re-measured on
the new run's held-out slices, the new version champion only if strictly better), a challenger that
learnt from the engine's own prefills waiting until it beats the champion on prefills neither has
seen (`settle`), and registering the verdict. Storage itself is store/registry.py's."""

from __future__ import annotations

import fcntl
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from chunkpilot.cache import user_cache_dir
from store.registry import CHALLENGER, CHAMPION, MODEL_NAME, RECIPE, WAITS, record_retrain

TELEMETRY_THROUGH = "telemetry_through"  # the run param: when the latest prefill it trained on finished


class AliasMoved(RuntimeError):
    """The champion alias moved between judging and registering: another promoter got there first."""


def lock_path(tracking_uri: str) -> Path:
    """Where the store's promotion lock lives: beside a SQLite store's file, else in this user's cache."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///") + ".promotion.lock")
    return user_cache_dir() / f"promotion-{hashlib.sha1(tracking_uri.encode()).hexdigest()[:12]}.lock"


@contextmanager
def one_promoter(tracking_uri: str) -> Iterator[None]:
    """Hold the store's promotion lock: settle, gate and register run as one, so a second `retrain`
    on the same store waits and then judges against what the first registered (MLflow's aliases have
    no compare-and-set of their own). An advisory file lock: it serialises every promoter on this
    machine; promoters on several machines sharing one server still meet `register`'s check."""
    path = lock_path(tracking_uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another promotion on {tracking_uri} to finish", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def current_champion(client) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version)
    except MlflowException:
        return None


class ProfiledFirst(NamedTuple):
    """What training needs to promote the new profiled rows before the new telemetry is judged."""

    profiled: int  # profiled rows more than the champion's
    telemetry: int  # the champion's telemetry prefills
    through: str  # when the latest of them finished (ISO; "": none)


@dataclass(frozen=True)
class Verdict:
    alias: str  # champion or challenger
    reason: str
    champion_version: str | None  # the champion it was compared with
    champion_regret: float | None
    waits: bool = False  # a challenger that learnt from telemetry: `settle` may promote it later
    # the champion's recipe retrained on more telemetry and more profiled rows: training promotes
    # the recipe on the new profiled rows with only the champion's telemetry first (training.train)
    profiled_first: ProfiledFirst | None = None


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
    compatible: dict[str, str],
) -> Verdict:
    """The promotion gate for a freshly trained model; `recipe` its name and params (the RECIPE run
    param), `rows` (profiled rows, telemetry prefills) of its data. Another recipe is scored against
    the champion's recipe re-measured on this run's slices by `remeasure` (mean regret per slice and
    `all`). The champion's own recipe (training is deterministic) retrained on more profiled rows is
    promoted: profiles are measured the careful way and it has seen more of the machines it serves.
    Retrained on more telemetry, single and noisy prefills, it becomes the challenger: `settle`
    promotes it once it has beaten the champion on this machine's prefills that came after it. On
    both, the verdict names what training needs (`profiled_first`) to promote the recipe on the new
    profiled rows with only the champion's telemetry first, the whole data then waiting. A
    champion whose run params differ from `compatible` (other features, another recipe format) or
    that was registered before recipes (an older ChunkPilot) cannot serve and is replaced."""
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    except MlflowException:
        return judge(new["all"], None)
    run = client.get_run(version.run_id).data.params
    if any(run.get(name) != value for name, value in compatible.items()) or RECIPE not in run:
        return Verdict(
            CHAMPION,
            f"champion v{version.version} was trained by an older ChunkPilot (other features, another "
            "recipe format or no recipe) and cannot serve this one's requests",
            version.version,
            None,
        )
    theirs = json.loads(run[RECIPE])
    if theirs == recipe:
        had, through = int(run.get("telemetry_prefills", 0)), run.get(TELEMETRY_THROUGH)
        more, telemetry = rows[0] - int(run.get("profiled_rows", run.get("rows", 0))), rows[1] - had
        if telemetry > 0:
            # the profiled rows wait with the telemetry unless training can promote them with the
            # champion's own telemetry first (`profiled_first`): say so, or a backend just profiled seems ignored
            also = f" and {more} more profiled rows, which serve once it is promoted" if more > 0 else ""
            known = had == 0 or bool(through)  # which prefills the champion had (params of older runs don't say)
            return Verdict(
                CHALLENGER,
                f"champion v{version.version}'s recipe retrained on {telemetry} more prefills "
                f"of telemetry{also}: the challenger until it beats the champion on prefills it has not seen",
                version.version,
                new["all"],
                waits=True,
                profiled_first=ProfiledFirst(more, had, through or "") if more > 0 and known else None,
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


def settle(
    client, compare: Callable[[str, str, float], tuple[float, float, int]], compatible: dict[str, str]
) -> str | None:
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
    for v in (champion, challenger):
        params = client.get_run(v.run_id).data.params
        if any(params.get(name) != value for name, value in compatible.items()):
            return None  # trained by another ChunkPilot (features, recipe format): the gate replaces them
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
    if current_champion(client) != str(champion.version):
        raise AliasMoved(f"champion moved from v{champion.version} while {name} was judged: not promoted")
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, challenger.version)
    still = client.get_model_version_by_alias(MODEL_NAME, CHALLENGER)
    if str(still.version) == str(challenger.version):  # a newer challenger registered meanwhile stays
        client.delete_registered_model_alias(MODEL_NAME, CHALLENGER)
    client.set_model_version_tag(MODEL_NAME, challenger.version, "promotion", f"promoted from challenger: {verdict}")
    return f"{name} promoted: {verdict}"


def register(client, version: str, verdict: Verdict, new_regret: float | None, settled: str | None = None) -> None:
    """Move the verdict's alias to the freshly logged `version` and record why (after what `settle`
    did to the challenger before it, if anything); `new_regret` its held-out mean regret (None: not
    held out on its own). Refused (AliasMoved) when the champion is no longer the one the verdict
    was judged against: the version stays registered, with no alias."""
    current, judged = current_champion(client), verdict.champion_version
    if current != (None if judged is None else str(judged)):
        reason = f"champion is v{current}, not v{judged} that v{version} was judged against: no alias moved"
        client.set_model_version_tag(MODEL_NAME, version, "promotion", reason)
        raise AliasMoved(reason)
    client.set_registered_model_alias(MODEL_NAME, verdict.alias, version)
    if new_regret is not None:
        client.set_model_version_tag(MODEL_NAME, version, "mean_regret", f"{new_regret:.6f}")
    client.set_model_version_tag(MODEL_NAME, version, "promotion", verdict.reason)
    client.set_model_version_tag(MODEL_NAME, version, WAITS, str(verdict.waits).lower())
    record_retrain(
        client, f"v{version} {verdict.alias}: {verdict.reason}" + (f" (before it: {settled})" if settled else "")
    )
