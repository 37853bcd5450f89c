"""A saving of policy A over policy B: a share of B's total TTFT over the prompts both ran. On each
prompt, one minus the median over rounds of A's time over B's in the same round (timed moments
apart, so what the host does to both largely cancels), weighted by B's median TTFT on the prompt;
its 95% interval a bootstrap over each prompt's rounds. Three figures, each in the same ratio and
bootstrap: gross (the prefills alone); warm (each policy charged its steady decision, the median
of those timed round by round: what a request of a kind already seen pays); cold (each policy
charged its first decision, nothing cached, plus what else its first request of a kind costs: a
decision table built on the cores the engine runs on, `PromptResult.cold_extra_ms`).

`hindsight` is the same saving for the size of each prompt that saved the most over the reference
in the rounds both ran, picked after the race at no decision cost: what a policy that always knew
the fastest of the raced sizes would save. It is picked on the rounds it is scored on, so it errs
high: no policy choosing among those sizes before the prefill can expect to save more, gross, over
the same reference on these prompts (a size left out of the race, or a schedule, is not in it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .intervals import resampled_rounds

RESAMPLES = 2000
HINDSIGHT = "best in hindsight"  # the policy name of the hindsight bound (module docstring)


class Raced(Protocol):
    """One prompt of a race as the judge reads it (evaluation.comparison.PromptResult)."""

    choices: dict[str, int]  # policy -> the size it chose
    times: dict[int, list[float]]  # size -> TTFT ms per round

    def median(self, size: int) -> float: ...
    def steady_ms(self, policy: str) -> float: ...
    def cold_ms(self, policy: str) -> float: ...


@dataclass(frozen=True)
class Saving:
    """The share of the reference's total TTFT that the policy saves, over the prompts both ran, with
    its 95% interval (module docstring)."""

    policy: str
    reference: str
    prompts: int  # the prompts both policies ran
    saving: float  # gross
    low: float
    high: float
    warm: float  # each policy charged its steady decision on every round
    warm_low: float
    warm_high: float
    cold: float  # each policy charged its first decision and its first request's other costs
    cold_low: float
    cold_high: float

    def settled(self, precision: float) -> bool:
        """Narrower than `precision`, gross, warm and cold: whichever side of 0 they lie, so
        stopping on it keeps the 95%."""
        return max(self.high - self.low, self.warm_high - self.warm_low, self.cold_high - self.cold_low) < precision


def shared_rounds(a: list[float], b: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """[R] two sizes' times in the rounds both ran, the same round moments apart: every size's times
    are rounds 1 to its last (a size left out of the race is not timed again), so they share the first R."""
    rounds = min(len(a), len(b))
    return np.asarray(a[:rounds]), np.asarray(b[:rounds])


def bootstrap_savings(prompts: list[Raced], pairs: list[tuple[str, str]], seed: int = 0) -> list[Saving]:
    """Each saving from the per-round ratios of the two policies' sizes (module docstring). The
    bootstrap resamples each prompt's rounds, with the same draws for every pair."""
    out = []
    for policy, reference in pairs:
        both = [(k, p) for k, p in enumerate(prompts) if policy in p.choices and reference in p.choices]
        if not both:
            continue
        weights = np.array([p.median(p.choices[reference]) for _, p in both])  # [P] the reference's TTFT
        point, boot = np.zeros((3, len(both))), np.zeros((3, RESAMPLES, len(both)))  # gross, warm, cold
        for j, (k, p) in enumerate(both):
            ours, theirs = shared_rounds(p.times[p.choices[policy]], p.times[p.choices[reference]])  # [R]
            draws = resampled_rounds(len(ours), RESAMPLES, np.random.default_rng([seed, k]))  # [B, R]
            charges = [
                (0.0, 0.0),
                (p.steady_ms(policy), p.steady_ms(reference)),
                (p.cold_ms(policy), p.cold_ms(reference)),
            ]
            for i, (a, b) in enumerate(charges):
                ratio = (ours + a) / (theirs + b)
                point[i, j], boot[i, :, j] = 1 - np.median(ratio), 1 - np.median(ratio[draws], axis=1)
        share = weights / weights.sum()  # [P]
        figures = []
        for i in range(3):
            low, high = np.quantile(boot[i] @ share, [0.025, 0.975])
            figures += [float(point[i] @ share), float(low), float(high)]
        out.append(Saving(policy, reference, len(both), *figures))
    return out


@dataclass(frozen=True)
class _Hindsight:
    """A raced prompt with one policy more: the size picked after the race, deciding free."""

    prompt: Raced
    picked: int | None  # None: the reference did not run this prompt

    @property
    def choices(self) -> dict[str, int]:
        return self.prompt.choices if self.picked is None else {**self.prompt.choices, HINDSIGHT: self.picked}

    @property
    def times(self) -> dict[int, list[float]]:
        return self.prompt.times

    def median(self, size: int) -> float:
        return self.prompt.median(size)

    def steady_ms(self, policy: str) -> float:
        return 0.0 if policy == HINDSIGHT else self.prompt.steady_ms(policy)

    def cold_ms(self, policy: str) -> float:
        return 0.0 if policy == HINDSIGHT else self.prompt.cold_ms(policy)


def _best_against(p: Raced, reference: int) -> int:
    """The size of `p` whose rounds save the most over size `reference`'s in the rounds both ran: the
    best as the saving reads it (the lowest median over a size's own rounds can favour one timed
    only in the first, faster rounds); `reference` itself saves 0."""

    def ratio(size: int) -> float:
        ours, theirs = shared_rounds(p.times[size], p.times[reference])
        return float(np.median(ours / theirs)) if len(ours) else np.inf

    return min(p.times, key=lambda size: (ratio(size), size != reference))


def hindsight(prompts: list[Raced], reference: str, seed: int = 0) -> Saving | None:
    """What the size picked in hindsight on each prompt saves over `reference` (module docstring: an
    upper bound, never below 0 gross); None where the reference ran no prompt. Its warm and cold
    figures charge the reference its own decisions and the pick none."""
    # every prompt in its place: the bootstrap draws each prompt's rounds as it did for the policies
    picked = [
        _Hindsight(p, _best_against(p, p.choices[reference]) if reference in p.choices else None) for p in prompts
    ]
    found = bootstrap_savings(picked, [(HINDSIGHT, reference)], seed)
    return found[0] if found else None
