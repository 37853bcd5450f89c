"""The decision table: lengths share a cell only where nothing the decision depends on changes, a
cell whose ends disagree is halved until the flip is found, the table's choice is the recipe's own
on every config of the shipped data (what is judged is what is served), and the service answers from
it, from the recipe or from the anchor as its budget says."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks, length_cell, rule_candidate, segments
from chunkpilot.contract import ChunkRequest
from estimator.decide import gains_of
from estimator.recipe import make_recipe
from training.data import load_table
from training.served import choose_groups

SIZES = tuple(c for c in DEFAULT_CHUNKS if c != "full")
DATA = Path(__file__).resolve().parents[1] / "data" / "ttft" / "cpu-shipped"  # the bundled engine's shipped rows


@pytest.mark.parametrize(("window", "layout"), [(None, "shift"), (1000, "ring"), (700, "shift")])
def test_cells_tile_the_lengths_and_share_their_candidates_and_rule(window, layout):
    previous = (0, 0)
    for n in range(1, 20_000):
        first, last = length_cell(n, SIZES, window)
        assert first <= n <= last
        assert (first, last) == previous or first == previous[1] + 1 == n  # the same cell, or the next
        previous = (first, last)
        labels = {}
        for m in (first, n, last):
            feasible, _ = feasible_chunks(DEFAULT_CHUNKS, m, window, layout)
            as_label = ["full" if c == m else c for c in feasible]  # the whole prompt, whatever its length
            rule = rule_candidate(feasible, m, window, layout)
            labels[m] = (as_label, "full" if rule == m else rule)
        assert len({repr(v) for v in labels.values()}) == 1, (n, first, last, labels)


def test_edges_and_the_hand_rules_own_lengths_are_cells_of_their_own():
    for n in (*SIZES, 512, 1536, 5120, 100, 1000):
        assert length_cell(n, SIZES, 1000) == (n, n)
    first, last = length_cell(5000, SIZES, None)
    assert last / first < 1.012  # a cell spans at most 1/64 of an octave


def test_a_cell_whose_ends_disagree_is_halved_until_each_flip_is_found():
    """A stand-in decision (unit test): 512 up to 1,037 tokens, 384 from there to 1,070, 256 after."""
    asked = []

    def decide(n: int) -> int:
        return 512 if n < 1038 else 384 if n < 1071 else 256

    def decide_many(lengths: list[int]) -> list[int]:
        asked.append(lengths)
        return [decide(n) for n in lengths]

    def same(low: tuple[int, int], high: tuple[int, int]) -> bool:
        return low[1] == high[1]

    found = segments(decide_many, same, [(1025, 1100)])
    assert sum(map(len, asked)) <= 2 + 2 * 7  # the ends, then two flips, each found in log2(76) halvings
    assert len(asked) <= 1 + 8  # one batch for the ends, one per round of halving (log2 of 75, rounded up, + 1)
    assert [n for s in found for n in range(s.first, s.last + 1)] == list(range(1025, 1101))  # each length once
    assert all(s.low[1] == s.high[1] == decide(n) for s in found for n in range(s.first, s.last + 1))


def test_a_cell_with_a_length_that_has_no_decision_is_left_out_and_the_others_kept():
    """A stand-in decision (unit test): none at 1,050 (a prediction not finite, say), a midpoint of
    the first cell's halving: that cell is left out whole (the request path gives the error), the
    next cell is built, and the table's builder thread lives on."""

    def decide_many(lengths: list[int]) -> list[int | None]:
        return [None if n == 1050 else 512 if n < 1040 else 256 for n in lengths]

    found = segments(decide_many, lambda a, b: a[1] == b[1], [(1025, 1075), (1076, 1100)])
    assert [(s.first, s.last) for s in found] == [(1076, 1100)]


@pytest.mark.slow
def test_the_tables_choice_is_the_recipes_on_every_held_out_config_of_the_shipped_data():
    """Each half of the shipped configs held out in turn: the decision table's choice (its length's
    segment, read from the nearer end) equals the recipe's choice at the exact length on every one."""
    table = load_table(DATA)
    groups = table.configs.group.to_numpy()
    compared = 0
    for k in (0, 1):
        train, test = table.subset(groups[k::2]), table.subset(groups[1 - k :: 2])
        recipe = make_recipe().fit(train.measured, train.anchor_configs)
        exact, tabled = choose_groups(recipe, test, table=False), choose_groups(recipe, test)
        assert tabled.chunks == exact.chunks
        compared += len(exact.chunks)
    assert compared == len(groups)


def test_the_service_answers_from_the_table_once_built_else_the_recipe_or_the_anchor(trained_store):
    from predictor.model import load_predictor

    predictor = load_predictor(trained_store, "chunk-size-predictor", "champion", tabled=True)
    machine = {"hardware_id": next(iter(predictor.recipe.hardware))}  # a machine the model knows: its own decisions
    ask = ChunkRequest(context_length=3000, model="llama-tiny", hardware=machine)
    predictor.budget = 1.0  # deciding now is always worth it (not this host's clock)
    first = predictor.answer(ask)  # a new kind: its cell built now, in this request, and answered from
    assert first.source == "table" and first.span[0] <= 3000 <= first.span[1]
    assert predictor.answer(ask) == first
    # a length of a cell not built yet: built now (only what is asked is built)
    lengths = [3001, 2950, 4500, 12_345, 700, *range(2000, 2100)]
    assert predictor.answer(ask.model_copy(update={"context_length": 12_345})).source == "table"
    for n in lengths:
        predictor.answer(ask.model_copy(update={"context_length": n}))
    assert predictor.recipe.table.wait(120)
    for n in (3001, 2950, 4500, 12_345, 700):
        request = ask.model_copy(update={"context_length": n})
        answer, exact = predictor.answer(request), predictor.exact_answer(request)
        assert answer.source == "table" and answer.span[0] <= n <= answer.span[1]
        assert answer.chunk_size == exact.chunk_size, n
        assert answer.predicted_ttft_ms == pytest.approx(exact.predicted_ttft_ms, rel=0.05)
        # every candidate, its peak memory interpolated between the segment's ends
        peaks = {c.chunk_size: c.predicted_peak_mb for c in exact.candidates}
        assert {c.chunk_size: c.predicted_peak_mb for c in answer.candidates} == pytest.approx(peaks, rel=0.02)
        assert answer.memory_margin == exact.memory_margin
        # exploring's gains: every other candidate, the whole prompt as this length's (the segment end's moved)
        assert sorted(g.chunk_size for g in gains_of(answer)) == sorted(g.chunk_size for g in gains_of(exact))
    # every length of a built cell, flips included: the recipe's own choice, but where the recipe's
    # choice flips back inside a segment whose ends agree: there its two sizes are a near tie
    same = 0
    for n in range(2000, 2100):
        request = ask.model_copy(update={"context_length": n})
        answer, exact = predictor.answer(request), predictor.exact_answer(request)
        same += answer.chunk_size == exact.chunk_size
        predicted = {c.chunk_size: c.predicted_ttft_ms for c in exact.top}
        assert predicted.get(answer.chunk_size, math.inf) <= 1.005 * exact.predicted_ttft_ms, n
    assert same >= 95
    # a decision that would cost more than its share of the TTFT: a new kind is answered by the anchor,
    # the strongest simple baseline of its machine, backend and kernel, and its cell builds behind
    predictor.budget = 0.0
    other = ask.model_copy(update={"threads": 2})
    answer = predictor.answer(other)
    assert (answer.source, answer.span) == ("anchor", None) and answer.chunk_size == answer.anchor.chunk_size
    assert predictor.recipe.table.wait(120) and predictor.answer(other).source == "table"
    predictor.close()


def test_a_background_build_is_charged_its_cpu_not_the_time_it_waited():
    """A stand-in decision that sleeps (unit test): the builder thread's wall time counts the
    wait, the table's charge to the cores (`build_s_total`, what the demo charges auto's first
    prefill of a kind) only the CPU it used."""
    import time

    from estimator.table import DecisionTable

    class Sleeper:
        def decide_many(self, request: ChunkRequest, lengths: list[int]) -> list[None]:
            time.sleep(0.2)  # waiting, as a build does for the GIL while requests are answered
            return [None] * len(lengths)  # no decision: the cell is left out, the build still charged

    sleeper = Sleeper()
    table = DecisionTable(sleeper.decide_many)
    table.want(ChunkRequest(context_length=3000, model="llama-tiny", hardware={"hardware_id": "m"}))
    assert table.wait(10)
    assert table.built_s[-1] >= 0.2 and table.build_s_total < 0.1
    table.close()


def test_a_kind_the_model_does_not_know_is_answered_with_the_anchors_size_at_once_until_its_prefills_teach_it(
    trained_store, known_machine
):
    """A model shape none of the rows ran: the recipe's decision there is the anchor's size, so the
    service answers it from one feature row per size (no forest, no cell built in the request) and
    says why; the cell builds behind and answers the same size. Once the correction has learnt a
    prefill of that shape on this machine, the model decides its cells."""
    from datetime import UTC, datetime

    from chunkpilot.contract import Outcome
    from predictor.model import UNKNOWN_KIND, load_predictor

    predictor = load_predictor(trained_store, "chunk-size-predictor", "champion", tabled=True)
    predictor.budget = 1.0  # deciding now is always worth it: only not knowing sends the anchor
    ask = ChunkRequest(context_length=3000, model="llama-110m", hardware=known_machine)
    first = predictor.answer(ask)
    assert (first.source, first.span, first.deferred, first.reason) == ("anchor", None, True, UNKNOWN_KIND)
    assert first.chunk_size == first.anchor.chunk_size == predictor.exact_answer(ask).chunk_size
    assert predictor.recipe.table.wait(120)
    tabled = predictor.answer(ask)  # its cell, built behind
    assert (tabled.source, tabled.chunk_size, tabled.deferred) == ("table", first.chunk_size, True)
    assert gains_of(tabled) == ()  # nothing worth exploring where the model did not price the candidates
    taught = Outcome(
        request=ask.model_copy(update={"context_length": 1000}),
        chunk_size=256,
        source="service",
        tokenize_ms=1.0,
        prefill_ms=4100.0,
        first_decode_ms=2.0,
        ttft_ms=4103.5,
        chunk_ms=[999.0, 999.5, 1000.0, 1001.5],  # above the floor of what this machine can do
        finished_at=datetime.now(UTC),
    )
    assert predictor.learn([predictor.check(taught)]) == 1
    learnt = predictor.answer(ask.model_copy(update={"context_length": 9000}))  # a cell not built: built now
    assert learnt.source == "table" and len(gains_of(learnt)) > 0  # the model priced its candidates
    predictor.close()


def test_a_cell_built_in_a_request_after_a_learn_leaves_the_kinds_older_cells_due_for_a_rebuild(trained_store):
    """A learn makes a kind's built cells due for a rebuild with the new correction; a cell a
    request builds meanwhile (with the new correction) does not mark the older ones rebuilt."""
    from predictor.model import load_predictor

    predictor = load_predictor(trained_store, "chunk-size-predictor", "champion", tabled=False)  # no builder thread
    table = predictor.recipe.table
    machine = {"hardware_id": next(iter(predictor.recipe.hardware))}
    ask = ChunkRequest(context_length=3000, model="llama-tiny", hardware=machine)
    table.build_now(ask)
    built_with = table.kinds[ask.kind()].generation
    table.learnt()
    table.build_now(ask.model_copy(update={"context_length": 15_000}))
    assert table.kinds[ask.kind()].generation == built_with != table.generation
    predictor.close()


@pytest.mark.slow
def test_warming_up_builds_the_tables_before_the_first_timed_prefill(trained_store, monkeypatch):
    """An engine starting warms `auto` up: the cells of the lengths it will ask are built before any
    prefill is timed, so that no build shares the cores with one, and the answers it got are forgotten."""
    from servers import serve

    from auto.client import AutoPolicy, make_auto
    from chunkpilot.contract import AttentionConfig, ChunkRequest, Hardware
    from predictor.app import create_app
    from predictor.settings import Settings

    monkeypatch.setenv("CHUNKPILOT_DECISION_TABLE", "1")
    machine = Hardware(matmul_gflops=100.0, bandwidth_gbs=10.0, call_overhead_ms=0.05, cores=2)
    ring = AttentionConfig(window=512, layout="ring")
    prompts = [
        ChunkRequest(context_length=n, model="llama-tiny", attention=ring, threads=2, hardware=machine)
        for n in (3000, 6000)
    ]
    later = prompts[0].model_copy(update={"context_length": 4321})
    with serve(create_app(Settings(tracking_uri=trained_store, poll_interval_s=0))) as url:
        auto = AutoPolicy(url, 5.0, machine)
        assert auto.warm_up(prompts, timeout_s=240) == 2  # one kind, both lengths answered from its table
        assert auto.answers.get(prompts[0]) is None  # forgotten: the next decision is the steady state's
        assert auto.warm_up([later], timeout_s=60) == 1  # another length: its cell built once asked
        auto.close()
    local = make_auto(machine, tracking=trained_store)
    assert local.warm_up(prompts, timeout_s=240) == 2
    assert local.predictor.tabled_answer(prompts[1]) is not None
    local.close()
