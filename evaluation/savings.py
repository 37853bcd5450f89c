"""A saving of policy A over policy B: a share of B's total TTFT over the prompts both ran. On each
prompt, one minus the median over rounds of A's time over B's in the same round (timed moments
apart, so what the host does to both largely cancels), weighted by B's median TTFT on the prompt;
its 95% interval a bootstrap over each prompt's rounds. The net saving adds each policy's first
(uncached) decision to every one of its rounds, in the same ratio and bootstrap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.measure import resampled_rounds

if TYPE_CHECKING:
    from .comparison import PromptResult

RESAMPLES = 2000


@dataclass(frozen=True)
class Saving:
    """The share of the reference's total TTFT that the policy saves, over the prompts both ran, with
    its 95% interval (module docstring)."""

    policy: str
    reference: str
    prompts: int  # the prompts both policies ran
    saving: float
    low: float
    high: float
    net: float  # the same, each policy charged its first (uncached) decision on every round
    net_low: float
    net_high: float

    def settled(self, precision: float) -> bool:
        """Narrower than `precision`, gross and net: whichever side of 0 they lie, so stopping on it
        keeps the 95%."""
        return max(self.high - self.low, self.net_high - self.net_low) < precision


def bootstrap_savings(prompts: list[PromptResult], pairs: list[tuple[str, str]], seed: int = 0) -> list[Saving]:
    """Each saving from the per-round ratios of the two policies' sizes (module docstring). The
    bootstrap resamples each prompt's rounds, with the same draws for every pair."""
    out = []
    for policy, reference in pairs:
        both = [(k, p) for k, p in enumerate(prompts) if policy in p.choices and reference in p.choices]
        if not both:
            continue
        weights = np.array([p.median(p.choices[reference]) for _, p in both])  # [P] the reference's TTFT
        point, boot = np.zeros(len(both)), np.zeros((RESAMPLES, len(both)))  # per-prompt savings; [B, P]
        net_point, net_boot = np.zeros(len(both)), np.zeros((RESAMPLES, len(both)))
        for j, (k, p) in enumerate(both):
            # [R] the same round, moments apart (every policy's size on a prompt is timed in the same rounds)
            ours, theirs = np.asarray(p.times[p.choices[policy]]), np.asarray(p.times[p.choices[reference]])
            draws = resampled_rounds(len(ours), RESAMPLES, np.random.default_rng([seed, k]))  # [B, R]
            charged = (ours + p.first_decision_ms.get(policy, 0.0)) / (theirs + p.first_decision_ms.get(reference, 0.0))
            for ratio, at, spread in ((ours / theirs, point, boot), (charged, net_point, net_boot)):
                at[j], spread[:, j] = 1 - np.median(ratio), 1 - np.median(ratio[draws], axis=1)
        share = weights / weights.sum()  # [P]
        low, high = np.quantile(boot @ share, [0.025, 0.975])
        net_low, net_high = np.quantile(net_boot @ share, [0.025, 0.975])
        out.append(
            Saving(
                policy,
                reference,
                len(both),
                float(point @ share),
                float(low),
                float(high),
                float(net_point @ share),
                float(net_low),
                float(net_high),
            )
        )
    return out
