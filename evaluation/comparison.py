"""Policies compared on prompts so that the comparison can tell them apart.

Each policy is asked once per prompt for its chunk size. Then every distinct size of the prompt
(every feasible size, each policy's choice among them) is measured once per round, rounds
interleaved over the prompts with the order rotated, after a warm-up round. A policy's TTFT on a
prompt is the median over rounds of the size it chose: two policies that choose the same size get
the same number, and the measured best is the minimum of those same medians, so no regret is
negative.

The search for the best is raced: after each round, a size no policy chose whose fastest time so
far is more than `drop_above` over the prompt's best median cannot be the best within the
run-to-run noise (about 10%) and is no longer measured; after the warm-up, whose times are not
kept, so is one that took over twice the prompt's fastest (one shot on a long prompt under a
window, 64-token chunks of 9,000 tokens: the costliest sizes, at once). After `full_rounds` such
rounds the best is known well enough, and the rounds that follow time only what is still compared:
the policies' sizes and the best so far, on the prompts where the policies differ. Rounds then
cost a fraction of a full one, so the savings get many more of them in the same minutes.

Savings of one policy over another, gross and net of decisions, with their 95% intervals, are
evaluation.savings. After `min_rounds`, rounds are added until every interval is narrower than
`precision`, the `deadline` leaves no room for another round, or `max_rounds` pass: never on what
a result says, so the interval keeps its 95%.

Every policy pays for its own decision. Its first decision on a prompt (nothing cached: what a
request of a new length pays) is timed when it is asked, and each round times one more (the steady
state: whatever it caches, it may use). The net saving adds each policy's first decision to every
one of its rounds (the conservative charge: every request pays an uncached decision), in the same
ratio and bootstrap as the gross one; both are printed, with the decisions' times.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from chunkpilot.contract import ConfigError, RequestFeatures
from engine.engine import Engine
from engine.measure import interleaved
from engine.policy import ChunkPolicy
from engine.workload import Workload

from .rounds import every_size
from .rounds import steps as size_steps
from .savings import Saving, bootstrap_savings

WARM_DROP = 2.0  # after the warm-up, a size no policy chose that took over this times the fastest is out


@dataclass
class PromptResult:
    case: Workload
    choices: dict[str, int]  # policy -> chunk size (absent: the policy cannot run this prompt)
    sources: dict[str, str]  # policy -> where its decision came from
    times: dict[int, list[float]] = field(default_factory=dict)  # chunk size -> TTFT ms per round
    first_decision_ms: dict[str, float] = field(default_factory=dict)  # policy -> its first decision, uncached
    decision_ms: dict[str, list[float]] = field(default_factory=dict)  # policy -> one more decision per round

    def median(self, chunk: int) -> float:
        return statistics.median(self.times[chunk])

    @property
    def best(self) -> int:
        return min(self.times, key=self.median)


@dataclass
class Evaluation:
    policies: list[str]
    prompts: list[PromptResult]
    savings: list[Saving]
    rounds: int  # rounds of the sizes still compared (the others: `full_rounds`, or until raced out)
    full_rounds: int  # rounds that timed every size still in the race (module docstring)
    drop_above: float  # the race's margin (module docstring)


def _decided(policy: ChunkPolicy, engine: Engine, case: Workload) -> tuple[int, str, float] | None:
    """(the policy's size for the prompt, where it came from, the decision's ms), or None."""
    request = engine.request(case.context_length, case.attention)
    try:
        began = time.perf_counter()
        decision = policy.decide(request)
        took = (time.perf_counter() - began) * 1e3
        case.attention.check_chunk(decision.chunk_size)
    except ConfigError:  # e.g. one shot on a ring shorter than the prompt
        return None
    return min(decision.chunk_size, case.context_length), decision.source, took


def _decision_ms(policy: ChunkPolicy, request: RequestFeatures) -> float:
    began = time.perf_counter()
    policy.decide(request)
    return (time.perf_counter() - began) * 1e3


def raced_out(p: PromptResult, drop_above: float) -> set[int]:
    """The sizes no policy chose that are out of the race for the best (module docstring)."""
    bar = (1 + drop_above) * p.median(p.best)
    return {c for c, t in p.times.items() if c not in p.choices.values() and min(t) > bar}


def still_compared(p: PromptResult) -> set[int]:
    """The sizes timed after the full rounds: the policies' sizes and the best so far, where the
    policies differ (where they agree, their savings are 0 and their regrets equal whatever is timed)."""
    chosen = set(p.choices.values())
    return chosen | {p.best} if len(chosen) > 1 else set()


def evaluate(
    engine: Engine,
    policies: dict[str, ChunkPolicy],
    cases: list[Workload],
    pairs: list[tuple[str, str]],
    full_rounds: int = 3,
    min_rounds: int = 5,
    max_rounds: int = 20,
    precision: float = 0.02,
    drop_above: float = 0.25,
    deadline: float | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Evaluation:
    """Measure `cases` as the module says; `pairs` are the (policy, reference) savings to settle;
    `deadline` (time.monotonic()) bars a round past `min_rounds` that would likely end after it."""
    min_rounds = min(min_rounds, max_rounds)  # fewer allowed rounds still end with their savings

    prompts = []
    for case in cases:
        picked = {name: _decided(policy, engine, case) for name, policy in policies.items()}
        picked = {name: c for name, c in picked.items() if c is not None}
        result = PromptResult(
            case,
            {n: c for n, (c, _, _) in picked.items()},
            {n: s for n, (_, s, _) in picked.items()},
            first_decision_ms={n: ms for n, (_, _, ms) in picked.items()},
            decision_ms={n: [] for n in picked},
        )
        result.times = {c: [] for c in sorted({*every_size(case), *result.choices.values()})}
        prompts.append(result)
    steps = [size_steps(engine, p.case, list(p.times)) for p in prompts]  # per prompt: its sizes
    for p, sizes in zip(prompts, steps, strict=True):
        warm = {c: t for c, (t,) in interleaved(sizes, 1, warmup=0).items()}  # the warm-up: raced, not kept
        for c in [c for c, t in warm.items() if t > WARM_DROP * min(warm.values()) and c not in p.choices.values()]:
            del sizes[c], p.times[c]
    log(f"warm-up: {sum(map(len, steps))} sizes still measured")
    savings: list[Saving] = []
    rounds, took = 0, 0.0  # rounds done; seconds the latest took
    while rounds < max_rounds:
        if rounds >= min_rounds and deadline is not None and time.monotonic() + took > deadline:
            log(f"no time for round {rounds + 1}: stopped after {rounds}")
            break
        rounds += 1
        began = time.monotonic()
        for p, sizes in zip(prompts, steps, strict=True):  # each prompt's sizes rotated: drift hits them alike
            if not sizes:  # nothing left to compare on this prompt
                continue
            request = engine.request(p.case.context_length, p.case.attention)
            for name in p.choices:  # the steady state: one more decision a round, timed the same way
                p.decision_ms[name].append(_decision_ms(policies[name], request))
            for c, times in interleaved(sizes, 1, warmup=0, start=rounds).items():
                p.times[c] += times
            dropped = raced_out(p, drop_above) if rounds < full_rounds else p.times.keys() - still_compared(p)
            for c in dropped & sizes.keys():
                del sizes[c]
        took = time.monotonic() - began
        still = f" ({sum(map(len, steps))} sizes still measured)"
        if rounds < min_rounds:
            log(f"round {rounds}/{min_rounds}+ measured in {took:.0f} s{still}")
            continue
        savings = bootstrap_savings(prompts, pairs)
        log(
            f"round {rounds} ({took:.0f} s): "
            + "; ".join(
                f"{s.policy} vs {s.reference} {s.saving:+.1%} [{s.low:+.1%}, {s.high:+.1%}] "
                f"(net {s.net:+.1%} [{s.net_low:+.1%}, {s.net_high:+.1%}])"
                for s in savings
            )
            + still
        )
        if all(s.settled(precision) for s in savings) or not any(steps):
            break
    return Evaluation(list(policies), prompts, savings, rounds, min(rounds, full_rounds), drop_above)


def format_evaluation(ev: Evaluation) -> str:
    width = 22
    lines = [f"{'prompt':<28}" + "".join(f"{p:>{width}}" for p in ev.policies) + f"{'measured best':>{width}}   rounds"]
    for p in ev.prompts:
        best = p.median(p.best)
        cells = [
            f"{p.choices[n]:>5} {p.median(p.choices[n]):>7.0f}ms {p.median(p.choices[n]) / best - 1:>5.0%}"
            if n in p.choices
            else "n/a"
            for n in ev.policies
        ]
        lines.append(
            f"{p.case.label:<28}"
            + "".join(f"{c:>{width}}" for c in cells)
            + f"{p.best:>5} {best:>7.0f}ms      {max(map(len, p.times.values())):>8}"
        )
    common = [p for p in ev.prompts if all(n in p.choices for n in ev.policies)]
    totals = [sum(p.median(p.choices[n]) for p in common) for n in ev.policies] + [
        sum(p.median(p.best) for p in common)
    ]
    lines.append(f"{f'total TTFT ({len(common)} prompts)':<28}" + "".join(f"{t:>{width - 3}.0f}ms " for t in totals))
    regrets = [
        statistics.fmean(p.median(p.choices[n]) / p.median(p.best) - 1 for p in ev.prompts if n in p.choices)
        for n in ev.policies
    ]
    lines.append(f"{'mean regret vs best':<28}" + "".join(f"{r:>{width - 1}.1%} " for r in regrets))
    sources = sorted({p.sources[n] for p in ev.prompts for n in ev.policies if n in p.sources and n == "auto"})
    lines.append(
        f"cells: chunk size, median TTFT over the prompt's rounds, regret against the measured best (the "
        f"fastest size of the same measurements; sizes over {WARM_DROP:g}x the fastest in the warm-up or "
        f"{1 + ev.drop_above:g}x the best since left the race early; "
        f"after {ev.full_rounds} rounds of every size left, only the policies' sizes and the best were timed, on the "
        "prompts where they differ)" + (f"; auto decided from: {', '.join(sources)}" if sources else "")
    )
    first = [_median([p.first_decision_ms[n] for p in ev.prompts if n in p.choices]) for n in ev.policies]
    steady = [_median([ms for p in ev.prompts for ms in p.decision_ms.get(n, ())]) for n in ev.policies]
    cells = [f"{f:.3f} / {s:.3f}" for f, s in zip(first, steady, strict=True)]
    lines.append(f"{'decision ms, first / steady':<28}" + "".join(f"{c:>{width}}" for c in cells))
    for s in ev.savings:
        lines.append(
            f"{s.policy} vs {s.reference}: {s.saving:+.1%} of total TTFT saved ({s.prompts} prompts), "
            f"95% CI [{s.low:+.1%}, {s.high:+.1%}] -> {_verdict(s.low, s.high)}; net of each policy's first "
            f"decision {s.net:+.1%} [{s.net_low:+.1%}, {s.net_high:+.1%}] -> {_verdict(s.net_low, s.net_high)}"
        )
    lines.append(
        "(saved: per prompt, 1 - the median over rounds of the two sizes' ratio in the same round (net: each "
        "policy's first, uncached decision added to each of its rounds), weighted by the "
        "reference's TTFT; 95% CI: a bootstrap over each prompt's rounds; the saving on this machine and these "
        "prompts lies inside it with 95% confidence, and an interval that holds 0 means the two cannot be told apart)"
    )
    return "\n".join(lines)


def _verdict(low: float, high: float) -> str:
    return "saves time" if low > 0 else "costs time" if high < 0 else "no difference this measurement can see"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
