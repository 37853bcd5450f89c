"""Policies compared on prompts so that the comparison can tell them apart.

Each policy is asked once per prompt for its chunk size. Then every distinct size of the prompt
(every feasible size, each policy's choice among them) is measured once per round, rounds
interleaved over the prompts with the order rotated, after a warm-up round. A policy's TTFT on a
prompt is the median over rounds of the size it chose: two policies that choose the same size get
the same number. Its regret is read round by round, as the savings are: how much slower its size
ran than the size that beat it most, the median over the rounds both ran of the two times' ratio
(0 where none beat it); the measured best is the size beaten least. A host whose speed moves
between rounds (a shared VM's, for minutes at a time) cannot then make a size look best for the
rounds it happened to be timed in.

The search for the best is raced: after each round, a size no policy chose whose fastest time so
far is more than `drop_above` over the prompt's best median cannot be the best within the
run-to-run noise (about 10%) and is no longer measured; after the warm-up, whose times are not
kept, so is one that took over twice the prompt's fastest (one shot on a long prompt under a
window, 64-token chunks of 9,000 tokens: the costliest sizes, at once). After `full_rounds` such
rounds the best is known well enough, and the rounds that follow time only what is still compared:
the policies' sizes and the best so far, on the prompts where the policies differ. Rounds then
cost a fraction of a full one, so the savings get many more of them in the same minutes.

Savings of one policy over another, gross and net of decisions, with their 95% intervals, are
judge.savings. After `min_rounds`, rounds are added until every interval is narrower than
`precision`, the `deadline` leaves no room for another round, or `max_rounds` pass: never on what
a result says, so the interval keeps its 95%.

Every policy pays for its own decision. Its first decision on a prompt (nothing cached: what a
request of a new kind pays) is timed when it is asked, and each round times one more (the steady
state: whatever it caches, it may use). The savings are printed gross, warm (each policy charged
its steady decision) and cold (its first decision and whatever else its first request of the kind
costs, such as a decision table built on the engine's cores: `after_first` says), with the
decisions' times (judge.savings). The strongest baseline is the policy other than `auto`
with the lowest total TTFT over the prompts they all ran; `auto` is printed against it first, then
the best size of each prompt, picked in hindsight, against it: the most any policy could have
saved here (judge.savings.hindsight).
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from chunkpilot.contract import ChunkRequest, ConfigError
from engine.engine import Engine
from engine.measure import interleaved
from engine.policy import ChunkPolicy
from engine.workload import Workload
from judge.savings import HINDSIGHT, Saving, bootstrap_savings, hindsight, shared_rounds

from .rounds import every_size
from .rounds import steps as size_steps

WARM_DROP = 2.0  # after the warm-up, a size no policy chose that took over this times the fastest is out


@dataclass
class PromptResult:
    case: Workload
    choices: dict[str, int]  # policy -> chunk size (absent: the policy cannot run this prompt)
    sources: dict[str, str]  # policy -> where its decision came from
    times: dict[int, list[float]] = field(default_factory=dict)  # chunk size -> TTFT ms per round
    first_decision_ms: dict[str, float] = field(default_factory=dict)  # policy -> its first decision, uncached
    decision_ms: dict[str, list[float]] = field(default_factory=dict)  # policy -> one more decision per round
    # policy -> what else its first request of this kind costs (a decision table built on the engine's cores)
    cold_extra_ms: dict[str, float] = field(default_factory=dict)

    def median(self, chunk: int) -> float:
        return statistics.median(self.times[chunk])

    def steady_ms(self, policy: str) -> float:
        """The policy's steady decision here: the median of those timed round by round."""
        timed = self.decision_ms.get(policy)
        return statistics.median(timed) if timed else self.first_decision_ms.get(policy, 0.0)

    def cold_ms(self, policy: str) -> float:
        """What the policy's first request of this kind pays besides the prefill."""
        return self.first_decision_ms.get(policy, 0.0) + self.cold_extra_ms.get(policy, 0.0)

    @property
    def best(self) -> int:
        """The measured best: the size the others beat least, round by round (a tie: the lower median)."""
        return min(self.times, key=lambda c: (self.size_regret(c), self.median(c)))

    def regret(self, policy: str) -> float:
        """The policy's regret here: its size's (`size_regret`)."""
        return self.size_regret(self.choices[policy])

    def size_regret(self, chunk: int) -> float:
        """How much slower `chunk` ran than the size that beat it most: the largest median, over the
        rounds both ran, of its time over another size's in the same round, less one (0: none beat
        it). Read round by round, as the savings are (judge.savings), so that a host whose speed
        moves between rounds cannot make a size look faster for the rounds it happened to be timed
        in, as each size's own median would."""
        ours = self.times[chunk]
        ratios = (
            float(np.median(np.divide(*shared_rounds(ours, theirs))))
            for c, theirs in self.times.items()
            if c != chunk and min(len(ours), len(theirs))
        )
        return max(max(ratios, default=1.0) - 1.0, 0.0)


@dataclass
class Evaluation:
    policies: list[str]
    prompts: list[PromptResult]
    savings: list[Saving]
    rounds: int  # rounds of the sizes still compared (the others: `full_rounds`, or until raced out)
    full_rounds: int  # rounds that timed every size still in the race (module docstring)
    drop_above: float  # the race's margin (module docstring)

    def common(self, names: list[str]) -> list[PromptResult]:
        """The prompts every one of `names` ran."""
        return [p for p in self.prompts if all(n in p.choices for n in names)]

    def mean_regret(self, policy: str) -> float:
        """The policy's mean regret over the prompts it ran."""
        return statistics.fmean(p.regret(policy) for p in self.prompts if policy in p.choices)

    @functools.cached_property
    def hindsight(self) -> Saving | None:
        """The best in hindsight against the strongest baseline (judge.savings.hindsight), once."""
        return hindsight(self.prompts, self.strongest())

    def strongest(self, of: str = "auto") -> str:
        """The policy other than `of` with the lowest total TTFT over the prompts they all ran."""
        others = [n for n in self.policies if n != of]
        common = self.common(others)
        return min(others, key=lambda n: (sum(p.median(p.choices[n]) for p in common), others.index(n)))


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


def _decision_ms(policy: ChunkPolicy, request: ChunkRequest) -> float:
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
    after_first: Callable[[list[PromptResult]], None] | None = None,
) -> Evaluation:
    """Measure `cases` as the module says; `pairs` are the (policy, reference) savings to settle;
    `deadline` (time.monotonic()) bars a round past `min_rounds` that would likely end after it;
    `after_first` is told the prompts once every policy has decided on each, before anything is
    timed (to wait for what those first decisions set going, and charge it as `cold_extra_ms`)."""
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
    if after_first is not None:
        after_first(prompts)
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
                f"(cold {s.cold:+.1%} [{s.cold_low:+.1%}, {s.cold_high:+.1%}])"
                for s in savings
            )
            + still
        )
        if all(s.settled(precision) for s in savings) or not any(steps):
            break
    return Evaluation(list(policies), prompts, savings, rounds, min(rounds, full_rounds), drop_above)


def column(name: str) -> str:
    """A policy's column heading: the shortest of its names (a baseline of two specs has two)."""
    return min(name.split(" = "), key=len)


def format_evaluation(ev: Evaluation) -> str:
    width = max(22, *(len(column(n)) + 2 for n in ev.policies))
    lines = [
        f"{'prompt':<28}"
        + "".join(f"{column(p):>{width}}" for p in ev.policies)
        + f"{'measured best':>{width}}   rounds"
    ]
    for p in ev.prompts:
        best = p.best  # every pair of sizes read round by round: once a prompt
        cells = [
            f"{p.choices[n]:>5} {p.median(p.choices[n]):>7.0f}ms {p.regret(n):>5.0%}" if n in p.choices else "n/a"
            for n in ev.policies
        ]
        lines.append(
            f"{p.case.label:<28}"
            + "".join(f"{c:>{width}}" for c in cells)
            + f"{best:>5} {p.median(best):>7.0f}ms      {max(map(len, p.times.values())):>8}"
        )
    common = ev.common(ev.policies)
    totals = [sum(p.median(p.choices[n]) for p in common) for n in ev.policies] + [
        sum(p.median(p.best) for p in common)
    ]
    lines.append(f"{f'total TTFT ({len(common)} prompts)':<28}" + "".join(f"{t:>{width - 3}.0f}ms " for t in totals))
    regrets = "".join(f"{ev.mean_regret(n):>{width - 1}.1%} " for n in ev.policies)
    lines.append(f"{'mean regret vs best':<28}" + regrets)
    sources = sorted({p.sources[n] for p in ev.prompts for n in ev.policies if n in p.sources and n == "auto"})
    lines.append(
        f"cells: chunk size, median TTFT over the prompt's rounds, regret (how much slower than the size that beat "
        f"it most, the median of their ratio in the rounds both ran; the measured best: the size beaten least; "
        f"sizes over {WARM_DROP:g}x the fastest in the warm-up or "
        f"{1 + ev.drop_above:g}x the best since left the race early; "
        f"after {ev.full_rounds} rounds of every size left, only the policies' sizes and the best were timed, on the "
        "prompts where they differ); a policy that cannot run a prompt (one shot on a ring shorter than it) shows n/a"
        + (f"; auto decided from: {', '.join(sources)}" if sources else "")
    )
    first = [_median([p.cold_ms(n) for p in ev.prompts if n in p.choices]) for n in ev.policies]
    steady = [_median([p.steady_ms(n) for p in ev.prompts if n in p.choices]) for n in ev.policies]
    cells = [f"{f:.3f} / {s:.3f}" for f, s in zip(first, steady, strict=True)]
    lines.append(f"{'decision ms, cold / warm':<28}" + "".join(f"{c:>{width}}" for c in cells))
    strongest = ev.strongest() if "auto" in ev.policies and len(ev.policies) > 1 else None
    ordered = sorted(ev.savings, key=lambda s: s.reference != strongest)
    for s in ordered:
        mark = " (the strongest baseline here)" if s.reference == strongest else ""
        lines.append(
            f"{s.policy} vs {s.reference}{mark}: {s.saving:+.1%} of total TTFT saved ({s.prompts} prompts), "
            f"95% CI [{s.low:+.1%}, {s.high:+.1%}] -> {_verdict(s.low, s.high)}; net warm {s.warm:+.1%} "
            f"[{s.warm_low:+.1%}, {s.warm_high:+.1%}]; net cold {s.cold:+.1%} [{s.cold_low:+.1%}, {s.cold_high:+.1%}] "
            f"-> {_verdict(s.cold_low, s.cold_high)}"
        )
    bound = ev.hindsight if strongest else None
    if bound is not None:
        lines.append(
            f"{HINDSIGHT} vs {strongest}: {bound.saving:+.1%} ({bound.prompts} prompts) [{bound.low:+.1%}, "
            f"{bound.high:+.1%}] gross, net cold {bound.cold:+.1%} [{bound.cold_low:+.1%}, {bound.cold_high:+.1%}]: "
            "the most a policy choosing among the raced sizes could have saved on these prompts "
            f"(on each, the size that saved the most over {column(strongest)} "
            "in the rounds both ran, picked after the race at no decision cost, on the rounds it is scored on: "
            "it errs high)"
        )
    lines.append(
        "(saved: per prompt, 1 - the median over rounds of the two sizes' ratio in the same round, weighted by the "
        "reference's TTFT; net warm: each policy's steady decision added to each of its rounds; net cold: its first "
        "decision of the kind, nothing cached, and what that first request set going on the engine's cores (a "
        "decision table's build); 95% CI: a bootstrap over each prompt's rounds; an interval that holds 0 means the "
        "two cannot be told apart here)"
    )
    return "\n".join(lines)


def _verdict(low: float, high: float) -> str:
    return "saves time" if low > 0 else "costs time" if high < 0 else "no difference this measurement can see"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
