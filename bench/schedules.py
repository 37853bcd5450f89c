"""Do chunk schedules beat one chunk size here? For each prompt, first every feasible uniform size is
measured (interleaved, rotated, after a warm-up) to find the best; then, interleaved in one run,
that best uniform size, the schedule the champion's per-chunk cost model predicts (what `auto
--schedule` runs), and a small measured search of two-phase schedules around the best size (the
first half of the prompt in one size, the rest in another: Sarathi-Serve's decreasing chunks and
their opposites). Ratios are medians over rounds against the best uniform size, with bootstrap 95%
intervals over the rounds; each distinct chunk plan is measured once a round, so a schedule equal to
the best size shares its times (ratio 1 exactly, marked "=best"). Needs a champion with a per-chunk
model: run `chunkpilot train` first.

    .venv/bin/python bench/schedules.py [--model llama-tiny] [--rounds 5]
"""

from __future__ import annotations

import functools

import numpy as np
from preamble import model_and_rounds

from auto.client import make_auto
from chunkpilot.chunks import uniform
from chunkpilot.contract import AttentionConfig
from engine.engine import Engine
from engine.measure import interleaved
from engine.policy import ChunkPolicy, SchedulePolicy
from engine.workload import Workload
from evaluation.rounds import time_sizes
from judge.intervals import median_ratio
from store.tracking import tracking_uri

# (tokens, window, layout): with and without windows
PROMPTS = [(4000, None, "shift"), (8000, None, "shift"), (6000, 1024, "shift"), (8000, 2048, "ring")]


def ttft(engine: Engine, workload: Workload, policy: ChunkPolicy) -> float:
    return engine.run(workload, policy).ttft_ms


def two_phase(n: int, best: int, limit: int) -> dict[str, tuple[int, ...]]:
    """Schedules around the best size: the first half in `a`, the rest in `b` (sizes that fit)."""
    out = {}
    for a, b in ((2 * best, best), (best, best // 2), (2 * best, best // 2), (best // 2, best), (best, 2 * best)):
        if 64 <= min(a, b) and max(a, b) <= limit and a <= n // 2:  # the first half holds a chunk of `a`
            first = [a] * (n // 2 // a)
            rest = n - sum(first)
            out[f"{a}->{b}"] = (*first, *[b] * (rest // b), *([rest % b] if rest % b else []))
    return out


def main() -> None:
    args, engine = model_and_rounds(__doc__)
    auto = make_auto(engine.hardware(), tracking=tracking_uri(), schedule=True)
    if not auto.predictor.info["schedules"]:
        raise SystemExit("the champion has no per-chunk cost model: retrain on data with per-chunk times")
    rng = np.random.default_rng(0)
    rows = []
    for n, window, layout in PROMPTS:
        attention = AttentionConfig(window=window, layout=layout)
        workload = Workload(n, attention)
        run = functools.partial(ttft, engine, workload)
        scan = time_sizes(engine, workload, 3)  # every feasible size, interleaved
        sizes = list(scan)
        best = min(sizes, key=lambda c: np.median(scan[c]))
        predicted = auto.decide(engine.request(n, attention)).schedule
        searches = two_phase(n, best, max(sizes))
        plans = {"best uniform": tuple(uniform(n, best)), "predicted": tuple(predicted), **searches}
        # each distinct plan measured once a round; a name that picked the same plan gets the same times
        measured = interleaved(
            {p: functools.partial(run, SchedulePolicy(list(p))) for p in set(plans.values())}, args.rounds
        )
        times = {name: measured[plan] for name, plan in plans.items()}
        searched = min(searches, key=lambda k: np.median(times[k]), default=None)
        rows.append((n, window, layout, best, predicted, searched, times))
        print(f"measured {n} tokens w{window} {layout}", flush=True)

    print(f"\n{args.model}; TTFT ratio to the best uniform size (median over {args.rounds} rounds, 95% CI)")
    print(
        f"{'tokens':>7}{'window':>12}{'best':>6}{'best ms':>9}  {'predicted schedule':<34}{'ratio':>22}"
        f"  {'best searched':<14}{'ratio':>22}"
    )
    for n, window, layout, best, predicted, searched, times in rows:
        shown = ",".join(map(str, predicted[:6])) + (",..." if len(predicted) > 6 else "") + f" ({len(predicted)})"
        shown += " =best" if tuple(predicted) == tuple(uniform(n, best)) else ""  # one measurement: ratio 1 exactly
        p = median_ratio(times["predicted"], times["best uniform"], rng)
        where = f"{window} {layout}" if window else "-"
        line = (
            f"{n:>7}{where:>12}{best:>6}{np.median(times['best uniform']):>9.0f}  {shown:<34}"
            f"{p[0]:>8.3f} [{p[1]:.3f}, {p[2]:.3f}]"
        )
        if searched:
            s = median_ratio(times[searched], times["best uniform"], rng)
            line += f"  {searched:<14}{s[0]:>8.3f} [{s[1]:.3f}, {s[2]:.3f}]"
        print(line)
    print("(a ratio below 1 whose interval stays below 1: the schedule beat the best single size here)")


if __name__ == "__main__":
    main()
