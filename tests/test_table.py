"""The decision table: lengths share a cell only where nothing the decision depends on changes, the
table's choice is the recipe's own on every config of the shipped data (what is judged is what is
served), and the service answers from it, from the recipe or from the hand rule as its budget says."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunkpilot.chunks import DEFAULT_CHUNKS, feasible_chunks, length_cell, rule_candidate
from chunkpilot.contract import ChunkRequest
from chunkpilot.recipe import make_recipe
from training.data import load_table
from training.served import choose_groups

SIZES = tuple(c for c in DEFAULT_CHUNKS if c != "full")
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(("window", "layout"), [(None, "shift"), (1000, "ring"), (700, "shift")])
def test_every_length_of_a_cell_has_the_same_candidates_and_rule(window, layout):
    for n in range(1, 20_000):
        first, last = length_cell(n, SIZES, window)
        assert first <= n <= last
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


@pytest.mark.slow
def test_the_tables_choice_is_the_recipes_on_every_held_out_config_of_the_shipped_data():
    """Each half of the shipped configs held out in turn: the decision table's choice (cells decided
    at both ends) equals the recipe's choice at the exact length on every one of them."""
    table = load_table(DATA)
    groups = table.configs.group.to_numpy()
    compared = 0
    for k in (0, 1):
        train, test = table.subset(groups[k::2]), table.subset(groups[1 - k :: 2])
        recipe = make_recipe().fit(train.measured)
        exact, tabled = choose_groups(recipe, test, table=False), choose_groups(recipe, test)
        assert tabled.chunks == exact.chunks
        compared += len(exact.chunks)
    assert compared == len(groups)


def test_the_service_answers_from_the_table_once_built_else_the_recipe_or_the_rule(trained_store):
    from predictor.model import load_predictor

    predictor = load_predictor(trained_store, "chunk-size-predictor", "champion", tabled=True)
    machine = {"matmul_gflops": 100.0, "bandwidth_gbs": 10.0, "call_overhead_ms": 0.05, "cores": 2}
    ask = ChunkRequest(context_length=3000, model="llama-tiny", hardware=machine)
    first = predictor.decide(ask)  # a new kind: the recipe decides now, the table builds behind
    assert first.source == "model"
    assert predictor.table.wait(120)
    for n in (3001, 2950, 4500, 12_345, 700):
        request = ask.model_copy(update={"context_length": n})
        answer, exact = predictor.decide(request), predictor.decide_at(request)
        assert answer.source in {"table", "model"}  # "model": a cell whose ends chose differently
        assert answer.chunk_size == exact.chunk_size, n
        assert answer.predicted_ttft_ms == pytest.approx(exact.predicted_ttft_ms, rel=0.05)
    sources = [predictor.decide(ask.model_copy(update={"context_length": n})).source for n in range(2000, 2100)]
    assert sources.count("table") > 90
    # a decision that would cost more than its share of the TTFT: a new kind is answered by the rule
    predictor.decision_ms = 1e6
    other = predictor.decide(ask.model_copy(update={"threads": 2}))
    assert (other.source, other.chunk_size) == ("rule", 768)
    predictor.close()
