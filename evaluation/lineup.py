"""The lineup (judge.lineup) as live policies on this machine: `auto` beside one shot, the
backend's default, this machine's best single size (chosen from its own profile rows only, the way
a user would after one sweep), the hand rule, the simple rule and fixed 1024; and the cold cost of
`auto`'s first requests (a decision table built on the cores the engine runs on)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from engine.engine import Engine
from engine.policy import BaselinePolicy, ChunkPolicy
from judge.lineup import Spec, anchor_key, best_single_size, lineup
from store.dataset import DataError, anchor_configs, read_dataset

from .comparison import PromptResult


def machine_best(data: Path, engine: Engine) -> Spec | None:
    """This machine's best single size for the engine's backend and kernel, from its sweep under
    `data` (store.dataset.anchor_configs: what the recipe's anchor is chosen from too; None: it has
    none)."""
    try:
        rows = read_dataset(data)
    except DataError:  # no rows at all
        return None
    hardware_id = engine.hardware().hardware_id
    key = anchor_key(hardware_id, engine.backend, engine.config.attn_impl)
    configs = anchor_configs(rows[rows.hardware_id == hardware_id]).get(key)
    return best_single_size(configs) if configs else None


def baseline_policies(backend: str, best: Spec | None) -> dict[str, ChunkPolicy]:
    """The lineup as policies, one shot only where it can take the prompt in one chunk."""
    return {b.name: BaselinePolicy(b, strict=True) for b in lineup(backend, best)}


def charge_table_builds(
    kind_of: Callable[[PromptResult], str], tables: Callable[[], tuple[int, int, float]], timeout_s: float = 600.0
) -> Callable[[list[PromptResult]], None]:
    """An `after_first` for evaluate: wait until every kind the tables know is built (`tables`:
    (kinds, kinds built, every background build's CPU seconds)), then charge the seconds per kind to
    auto's first prompt of each kind (`kind_of`): the builds ran on the cores the engine runs on (a
    cell built in the request that asked is in that first decision's own time)."""

    def after_first(prompts: list[PromptResult]) -> None:
        firsts: dict[str, PromptResult] = {}
        for p in prompts:
            if "auto" in p.choices:
                firsts.setdefault(kind_of(p), p)
        end = time.monotonic() + timeout_s
        while (state := tables())[1] < state[0] and time.monotonic() < end:
            time.sleep(0.05)
        per_kind_ms = 1e3 * state[2] / max(state[1], 1)
        for p in firsts.values():
            p.cold_extra_ms["auto"] = per_kind_ms

    return after_first
