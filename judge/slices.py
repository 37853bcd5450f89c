"""Group-aware held-out slices: whole configs are held out, never single rows, so a model is judged
on configs it has not seen: (a) unseen context lengths, (b) unseen model shapes, (c) unseen
windows, (d) unseen hardware: a machine when the data holds several, else a thread count or a
dtype, (e) with several machines, a model shape and a machine held out together, (f) with
telemetry in the data, the engine's own recent prefills (configs measured at two sizes or more),
(g) with several backends, a backend (what transfers from one engine's costs to another's), and
(h) with several architectures, a family (llama, qwen2, gemma3...: every shape of it at once)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from chunkpilot.paths import TELEMETRY_PREFIX

Fold = tuple[np.ndarray, np.ndarray]  # (training groups, held-out groups)


def _leave_one_out(configs: pd.DataFrame, column: str) -> list[Fold]:
    levels = sorted(configs[column].unique())
    if len(levels) < 2:
        return []
    return [
        (configs.group[configs[column] != level].to_numpy(), configs.group[configs[column] == level].to_numpy())
        for level in levels
    ]


def make_slices(configs: pd.DataFrame, context_folds: int = 3) -> dict[str, list[Fold]]:
    """Slice name -> folds. A slice the data cannot form (one model only, say) is left out."""
    lengths = np.array(sorted(configs.context_length.unique()))
    context = []
    for i in range(min(context_folds, len(lengths))):
        held = np.isin(configs.context_length, lengths[i::context_folds])  # interleaved: every 3rd length
        context.append((configs.group[~held].to_numpy(), configs.group[held].to_numpy()))
    windowed = configs[configs.window > 0]  # "no window" stays in training: it is not a window to generalise to
    window = [
        (np.concatenate([configs.group[configs.window == 0].to_numpy(), train]), test)
        for train, test in _leave_one_out(windowed, "window")
    ]
    machines = _leave_one_out(configs, "hardware_id")
    hardware = machines or [fold for column in ("threads", "dtype") for fold in _leave_one_out(configs, column)]
    slices = {"context": context, "model": _leave_one_out(configs, "model"), "window": window, "hardware": hardware}
    if backends := _leave_one_out(configs, "backend"):
        slices["backend"] = backends
    if families := _leave_one_out(configs, "family"):  # an architecture: every shape of it held out
        slices["family"] = families
    if machines:  # train on neither the shape nor the machine; test on that shape on that machine
        slices["model-machine"] = [
            (
                configs.group[(configs.model != m) & (configs.hardware_id != h)].to_numpy(),
                configs.group[(configs.model == m) & (configs.hardware_id == h)].to_numpy(),
            )
            for m in sorted(configs.model.unique())
            for h in sorted(configs.hardware_id.unique())
        ]
    telemetry = configs.config_key.str.startswith(TELEMETRY_PREFIX).to_numpy()
    if telemetry.any():  # trained on everything but the telemetry, judged on it
        slices["telemetry"] = [(configs.group[~telemetry].to_numpy(), configs.group[telemetry].to_numpy())]
    # a prefill seen at one chunk size only trains the level but cannot judge a choice
    unjudged = configs.group[telemetry & (configs.sizes < 2).to_numpy()].to_numpy()
    slices = {name: [(train, np.setdiff1d(test, unjudged)) for train, test in folds] for name, folds in slices.items()}
    return {name: [f for f in folds if len(f[0]) and len(f[1])] for name, folds in slices.items() if folds}
