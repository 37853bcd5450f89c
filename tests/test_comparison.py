"""The policy evaluator: one measurement per distinct chunk size per round, shared by every policy
that chose it; regrets against the minimum of the same data; savings from each round's ratio of
the two sizes, with bootstrap intervals, and rounds that stop on time or precision, never on sign."""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import pytest

from chunkpilot.contract import AttentionConfig, ChunkRequest
from engine.policy import FixedPolicy, FullPolicy, RulePolicy
from engine.workload import Workload
from evaluation.comparison import PromptResult, evaluate, format_evaluation, raced_out, still_compared
from judge.savings import Saving, bootstrap_savings, hindsight


def test_same_choice_same_time_no_negative_regret_and_rounds_only_of_what_is_still_compared(engines):
    engine = engines("llama-tiny")
    policies = {"rule": RulePolicy(), "one shot": FullPolicy(), "fixed 32": FixedPolicy(32, capped=True)}
    cases = [Workload(96), Workload(160, AttentionConfig(64, "ring", 4)), Workload(32)]
    lines: list[str] = []
    result = evaluate(
        engine,
        policies,
        cases,
        [("fixed 32", "rule")],
        full_rounds=1,
        min_rounds=2,
        max_rounds=4,
        precision=0,  # never narrow enough: only the deadline, already passed, ends it after `min_rounds`
        deadline=time.monotonic(),
        log=lines.append,
    )
    assert (result.rounds, result.full_rounds) == (2, 1)
    assert lines[-1] == "no time for round 3: stopped after 2" and len(lines) == 4  # the warm-up's, 2 rounds
    short, ring, tiny = result.prompts
    # 96 tokens: the rule (512, cut to the prompt) and one shot both run the whole prompt at once
    assert short.choices["rule"] == short.choices["one shot"] == 96
    assert short.median(short.choices["rule"]) == short.median(short.choices["one shot"])
    assert "one shot" not in ring.choices  # a 160-token chunk does not fit a 64-token ring
    assert ring.choices["rule"] == 64 and ring.choices["fixed 32"] == 32
    # 32 tokens: every policy runs it in one chunk, so after the full round there is nothing to compare
    assert set(tiny.choices.values()) == {32} and all(len(t) == result.full_rounds for t in tiny.times.values())
    for p in (short, ring):
        assert set(p.times) >= set(p.choices.values())  # every choice is among the measured sizes
        # the policies differ, so their sizes are timed every round, and the best (so far) in each
        # round after the full ones (timing noise can move the best between rounds: so that one was
        # timed in the full round and in the rounds it was the best)
        assert all(len(p.times[c]) == result.rounds for c in p.choices.values())
        assert result.full_rounds <= len(p.times[p.best]) <= result.rounds
        # any other size: the full round, plus the rounds in which it was the best so far (timing
        # noise can move the best between rounds, so one other size at most per later round)
        others = [t for c, t in p.times.items() if c not in {*p.choices.values(), p.best}]
        assert sum(len(t) - result.full_rounds for t in others) <= result.rounds - result.full_rounds
    assert all(0 <= p.size_regret(p.best) <= p.regret(n) for p in result.prompts for n in p.choices)
    (saving,) = result.savings
    assert saving.low <= saving.saving <= saving.high
    table = format_evaluation(result)
    assert "fixed 32 vs rule:" in table and "95% CI" in table and "n/a" in table


class ScriptedEngine:
    """A fake engine (unit test): each chunk size's TTFT from a table, the same every run."""

    def __init__(self, ms: dict[int, float]):
        self.ms = ms
        self.runs: list[int] = []

    def request(self, context_length: int, attention) -> ChunkRequest:
        return ChunkRequest(
            context_length=context_length,
            model="llama-tiny",
            attention=attention,
            hardware={"hardware_id": "0123456789ab"},
        )

    def run(self, workload: Workload, policy: FixedPolicy) -> SimpleNamespace:
        self.runs.append(policy.size)
        return SimpleNamespace(ttft_ms=self.ms[policy.size])


def test_warm_up_full_rounds_then_only_the_compared_sizes_until_the_interval_is_narrow():
    ms = {64: 90.0, 128: 40.0, 256: 10.0, 384: 11.0, 512: 12.0, 768: 14.0, 1024: 20.0, 1536: 25.0, 2048: 30.0}
    engine = ScriptedEngine(ms)
    policies = {"a": FixedPolicy(256), "b": FixedPolicy(1024)}
    result = evaluate(engine, policies, [Workload(2048)], [("a", "b")], full_rounds=2, min_rounds=5, max_rounds=20)
    (p,) = result.prompts
    # the warm-up runs every size once; over 2x the fastest (10 ms) is out unless a policy chose it (1024)
    assert engine.runs[: len(ms)] == sorted(ms) and set(p.times) == {256, 384, 512, 768, 1024}
    # the full rounds race what is left: 768 is over 1.25x the best, 384 and 512 stay for both rounds
    assert {c: len(t) for c, t in p.times.items()} == {256: 5, 384: 2, 512: 2, 768: 1, 1024: 5}
    # then only the policies' sizes (256 is also the best), until the interval is narrow: at `min_rounds`
    assert (result.rounds, result.full_rounds) == (5, 2)
    (saving,) = result.savings
    assert (saving.saving, saving.low, saving.high) == (0.5, 0.5, 0.5)


def test_saving_reads_each_round_s_ratio_so_drift_between_rounds_cancels():
    """Made-up round times (not measurements): the host's speed halves and doubles between rounds,
    and within each round size 1 takes half of size 2."""
    slow = [20.0, 40.0, 30.0, 60.0, 24.0]
    times = {1: [t / 2 for t in slow], 2: slow}
    prompts = [PromptResult(Workload(100), {"fast": 1, "slow": 2, "same": 2}, {}, times)]
    fast, same = bootstrap_savings(prompts, [("fast", "slow"), ("same", "slow")])
    assert (fast.saving, fast.low, fast.high) == (0.5, 0.5, 0.5)
    assert (same.saving, same.low, same.high) == (0.0, 0.0, 0.0)


def test_saving_is_a_share_of_the_reference_s_total_ttft_with_an_interval_around_it():
    """Made-up round times (not measurements): a 100 ms prompt where `a` saves about half, and a
    300 ms one where both chose the same size, so the total saving is about 50% of 100 / 400."""
    short = {1: [50.0, 52.5, 49.0, 51.0, 50.5], 2: [100.0, 95.0, 105.0, 102.5, 97.5]}
    long = {3: [300.0, 310.0, 290.0, 305.0, 295.0]}
    prompts = [
        PromptResult(Workload(100), {"a": 1, "b": 2}, {}, short),
        PromptResult(Workload(300), {"a": 3, "b": 3}, {}, long),
    ]
    (saving,) = bootstrap_savings(prompts, [("a", "b")])
    assert saving.saving == pytest.approx(0.5 * 100 / 400)  # the median round's ratio is 50 / 100
    assert 0.1 < saving.low < saving.saving < saving.high < 0.15


def test_hindsight_picks_per_prompt_the_size_that_saved_most_in_the_rounds_it_shares_with_the_reference():
    """Made-up round times (not measurements), the reference `rule` deciding in 2 ms the first time.
    First prompt: 256 halves the rule's 1024 in the two full rounds it was timed. Second: the rule's
    own size is the fastest. Third: 512 has the lower median over its own rounds, but it ran only in
    the first two, where the rule's size was faster still: in hindsight the rule's size, saving 0."""
    first = {256: [50.0, 60.0], 1024: [100.0, 120.0, 100.0, 100.0, 100.0]}
    second = {512: [100.0, 101.0, 99.0], 2048: [130.0, 131.0, 129.0]}
    third = {512: [90.0, 90.0], 1024: [80.0, 80.0, 100.0, 100.0, 100.0]}
    prompts = [
        PromptResult(Workload(n), {"rule": rule}, {}, times, first_decision_ms={"rule": 2.0})
        for n, rule, times in ((2048, 1024, first), (4096, 512, second), (3000, 1024, third))
    ]
    # 512 has the lower median, but in the two rounds it ran the rule's size was faster still: the
    # regret reads those rounds, as the saving does
    assert prompts[2].best == 1024 and prompts[2].size_regret(512) == pytest.approx(90 / 80 - 1)
    bound = hindsight(prompts, "rule")
    # half of the first prompt's 100 ms, nothing of the others' 100 each: 50 ms of 300
    assert (bound.policy, bound.prompts) == ("best in hindsight", 3)
    assert (bound.saving, bound.low, bound.high) == pytest.approx((1 / 6, 1 / 6, 1 / 6))
    # net cold: the reference pays its first decision on each prompt, the pick nothing
    cold = [1 - median([50 / 102, 60 / 122]), 1 - median([100 / 102, 101 / 103, 99 / 101])]
    cold.append(1 - median([80 / 82, 80 / 82, 100 / 102, 100 / 102, 100 / 102]))
    assert bound.cold == pytest.approx(sum(cold) / 3)
    assert hindsight(prompts, "nobody") is None


def test_settled_means_narrow_whichever_side_of_zero():
    """Stopping as soon as an interval leaves 0 would pick the rounds that say so: not a 95% interval."""
    narrow, wide = (0.0, -0.005, 0.005), (0.0, -0.05, 0.05)
    assert Saving("a", "b", 1, *narrow, *narrow, *narrow).settled(0.02)
    assert not Saving("a", "b", 1, *(0.30, 0.20, 0.40) * 3).settled(0.02)
    assert not Saving("a", "b", 1, *(0.01, -0.05, 0.07) * 3).settled(0.02)
    assert not Saving("a", "b", 1, *narrow, *narrow, *wide).settled(0.02)  # the cold one is wide
    assert not Saving("a", "b", 1, *narrow, *wide, *narrow).settled(0.02)  # the warm one is wide


def test_the_cold_saving_charges_the_first_decision_and_its_costs_the_warm_one_the_steady_decision():
    """Made-up round times (not measurements): the same size, so no gross saving, but `a` took 10 ms
    to decide the first time and its first request built a 10-ms table on the engine's cores, then
    decided in 1 ms a round, on a 100-ms prefill, and `b` nothing: cold, `a` costs 20%; warm, 1%."""
    times = {256: [100.0, 100.0, 100.0], 512: [120.0, 121.0, 119.0]}
    p = PromptResult(
        Workload(2048),
        {"a": 256, "b": 256},
        {},
        times,
        first_decision_ms={"a": 10.0, "b": 0.0},
        decision_ms={"a": [1.0, 1.0, 1.0], "b": [0.0, 0.0, 0.0]},
        cold_extra_ms={"a": 10.0},
    )
    (saving,) = bootstrap_savings([p], [("a", "b")])
    assert saving.saving == 0.0 and saving.cold == pytest.approx(-0.20) and saving.warm == pytest.approx(-0.01)
    assert saving.cold_low == pytest.approx(-0.20) and saving.cold_high == pytest.approx(-0.20)


def test_only_prompts_where_the_policies_differ_are_still_compared():
    """Made-up round times (not measurements)."""
    times = {256: [10.0, 10.2], 512: [11.0, 11.5], 1024: [12.0, 12.5]}
    differ = PromptResult(Workload(2048), {"auto": 512, "rule": 1024}, {}, times)
    agree = PromptResult(Workload(2048), {"auto": 512, "rule": 512}, {}, times)
    assert still_compared(differ) == {256, 512, 1024}  # both choices and the best
    assert still_compared(agree) == set()  # the same size: a saving of 0, the same regret


def test_race_drops_only_hopeless_sizes_that_no_policy_chose():
    """Made-up round times (not measurements): the best median is 10 ms."""
    times = {64: [30.0, 31.0], 128: [12.4, 13.0], 256: [10.0, 10.2], 512: [14.0, 13.0], 1024: [40.0, 41.0]}
    p = PromptResult(Workload(2048), {"rule": 1024, "auto": 256}, {}, times)
    # 64 and 512 are over 1.25x the best at their fastest; 128 is not; 1024 stays, a policy chose it
    assert raced_out(p, 0.25) == {64, 512}
    assert raced_out(p, 0.5) == {64}
    # the interval reads only the policies' sizes: a size raced out after 2 rounds does not cut it short
    p.times[256] += [10.1, 9.9]
    p.times[1024] += [39.0, 40.5]
    (saving,) = bootstrap_savings([p], [("auto", "rule")])
    assert saving.low > 0.7


def test_race_prompts_never_hold_a_length_or_window_the_model_was_profiled_or_taught_on():
    """The demo's prompts, drawn per seed: never a length or a window of the demo's profile grid,
    its learning workload or the data's rows of the model, the window inside the prompt; each seed
    its own prompts, and the same seed the same ones."""
    from chunkpilot.paths import SPECS_DIR
    from cli.demo import seen
    from evaluation.prompts import draw_prompts
    from profiler.spec import Spec

    root = Path(__file__).resolve().parents[1]
    known = seen("llama-tiny", Spec.from_file(root / SPECS_DIR / "demo.yaml"), root / "data" / "ttft")
    assert {512, 1024, 2048} <= known.windows and 8192 in known.lengths  # the grid's own
    drawn = set()
    for seed in range(300):
        prompts = draw_prompts(seed, known)
        for w in prompts:
            window = w.attention.window
            assert w.context_length not in known.lengths and window not in known.windows, (seed, w.label)
            assert window is None or 2 * window <= w.context_length
        drawn.add(tuple(w.label for w in prompts))
    assert len(drawn) == 300
    assert draw_prompts(7, known) == draw_prompts(7, known)


def test_a_race_s_prompt_kinds_of_one_attention_set_up_never_share_lengths():
    """Each race draws one prompt of each kind: two kinds of one set-up whose lengths overlap could
    draw two prompts of one kind (it happened: 3,909 and 3,910 tokens in one llama.cpp race)."""
    from chunkpilot.contract import BACKENDS
    from evaluation.prompts import DEMO_KINDS, Kind, overlapping, race_kinds

    assert overlapping(DEMO_KINDS) == []
    for backend in BACKENDS:
        assert overlapping(race_kinds(backend)) == [], backend
    assert overlapping([Kind((700, 2500)), Kind((2000, 4000))]) == [(Kind((700, 2500)), Kind((2000, 4000)))]
    assert overlapping([Kind((700, 2000)), Kind((2000, 4000)), Kind((700, 4000), (256, 512))]) == []
