"""The policy evaluator: one measurement per distinct chunk size per round, shared by every policy
that chose it; regrets against the minimum of the same data; savings with bootstrap intervals."""

from __future__ import annotations

import pytest

from engine.comparison import (
    PromptCase,
    PromptResult,
    Saving,
    bootstrap_savings,
    evaluate,
    format_evaluation,
    raced_out,
)
from engine.policy import FixedPolicy, FullPolicy, RulePolicy


def test_same_choice_same_time_no_negative_regret_and_settled_savings(engines):
    engine = engines("llama-tiny")
    policies = {"rule": RulePolicy(), "one shot": FullPolicy(), "fixed 32": FixedPolicy(32, capped=True)}
    cases = [PromptCase(96), PromptCase(160, 64, "ring", 4)]
    lines: list[str] = []
    result = evaluate(engine, policies, cases, [("fixed 32", "rule")], min_rounds=2, max_rounds=3, log=lines.append)
    assert 2 <= result.rounds <= 3 and len(lines) == result.rounds
    short, ring = result.prompts
    # 96 tokens: the rule (512, cut to the prompt) and one shot both run the whole prompt at once
    assert short.choices["rule"] == short.choices["one shot"] == 96
    assert short.median(short.choices["rule"]) == short.median(short.choices["one shot"])
    assert "one shot" not in ring.choices  # a 160-token chunk does not fit a 64-token ring
    assert ring.choices["rule"] == 64 and ring.choices["fixed 32"] == 32
    for p in result.prompts:
        assert set(p.times) >= set(p.choices.values())  # every choice is among the measured sizes
        assert all(len(p.times[c]) == result.rounds for c in p.choices.values())  # each choice every round
        for c, t in p.times.items():  # any other size: every round, or until it left the race for the best
            assert len(t) == result.rounds or (c not in p.choices.values() and p.median(c) > p.median(p.best))
        assert all(p.median(c) >= p.median(p.best) for c in p.choices.values())
    (saving,) = result.savings
    assert saving.low <= saving.saving <= saving.high
    table = format_evaluation(result)
    assert "fixed 32 vs rule:" in table and "95% CI" in table and "n/a" in table


def test_bootstrap_interval_separates_a_real_saving_and_collapses_on_identical_choices():
    """Made-up round times (not measurements): size 1 takes about half of size 2."""
    times = {1: [10.0, 10.5, 9.8, 10.2, 10.1], 2: [20.0, 19.0, 21.0, 20.5, 19.5]}
    prompts = [PromptResult(PromptCase(100), {"fast": 1, "slow": 2, "same": 2}, {}, times)]
    fast, same = bootstrap_savings(prompts, [("fast", "slow"), ("same", "slow")])
    assert fast.saving == pytest.approx(1 - 10.1 / 20.0) and 0.4 < fast.low <= fast.high < 0.6
    assert (same.saving, same.low, same.high) == (0.0, 0.0, 0.0)
    assert fast.settled(0.02) and same.settled(0.02)
    assert not Saving("a", "b", 1, 0.01, -0.05, 0.07).settled(0.02)


def test_race_drops_only_hopeless_sizes_that_no_policy_chose():
    """Made-up round times (not measurements): the best median is 10 ms."""
    times = {64: [30.0, 31.0], 128: [12.4, 13.0], 256: [10.0, 10.2], 512: [14.0, 13.0], 1024: [40.0, 41.0]}
    p = PromptResult(PromptCase(2048), {"rule": 1024, "auto": 256}, {}, times)
    # 64 and 512 are over 1.25x the best at their fastest; 128 is not; 1024 stays, a policy chose it
    assert raced_out(p, 0.25) == {64, 512}
    assert raced_out(p, 0.5) == {64}
    # the interval reads only the policies' sizes: a size raced out after 2 rounds does not cut it short
    p.times[256] += [10.1, 9.9]
    p.times[1024] += [39.0, 40.5]
    (saving,) = bootstrap_savings([p], [("auto", "rule")])
    assert saving.low > 0.7
