"""The decision core: the chooser's do-no-harm, the recipe judged offline is the recipe served
(the same choice on every held-out config), and this machine's correction learning from prefills."""

from __future__ import annotations

import math

import numpy as np
import pytest

from chunkpilot.contract import ChunkRequest
from chunkpilot.correction import CLIP, Correction, Learnt
from estimator.cost_models import PerChunk, expand
from estimator.recipe import DEFAULT, Chooser, load_recipe
from training.baselines import rank_level
from training.data import hardware_table, load_table
from training.served import choose_groups, fit_recipes


def picked(chooser: Chooser, members: np.ndarray, **kwargs) -> tuple[int, bool]:
    """(the index the chooser picks, whether do-no-harm deferred to the anchor)."""
    choice = chooser.pick(members, **kwargs)
    return choice.index, choice.deferred


def test_the_chooser_takes_the_argmin_when_the_members_agree_on_the_saving():
    members = np.log([[100.0, 90.0, 120.0], [101.0, 91.0, 119.0], [99.0, 89.0, 121.0]])  # [K, candidates]
    assert picked(Chooser(z=1.0), members, anchor=0) == (1, False)


def test_do_no_harm_keeps_the_anchor_when_the_saving_is_inside_the_members_spread():
    members = np.log([[100.0, 80.0], [100.0, 115.0], [100.0, 95.0]])  # mean saving 3%, members disagree
    assert picked(Chooser(z=1.0), members, anchor=0) == (0, True)
    assert picked(Chooser(z=0.0), members, anchor=0) == (1, False)  # z = 0: the plain argmin
    assert picked(Chooser(z=1.0), members, anchor=None) == (1, False)  # no anchor among the candidates


def test_do_no_harm_weighs_the_saving_against_the_noise_the_correction_brings():
    members = np.log([[100.0, 90.0], [100.5, 90.0], [99.5, 90.0]])  # the members agree: 10% saved
    assert picked(Chooser(z=1.0), members, anchor=0) == (1, False)
    unsure = np.array([[0.0, 0.01], [0.01, 0.0]])  # the correction's variance of the difference: +-10%
    assert picked(Chooser(z=1.0), members, anchor=0, noise=unsure) == (0, True)


def test_the_argmin_keeps_the_anchor_only_where_the_correction_s_noise_covers_the_saving():
    """z 0 weighs no spread of the members, but a saving inside Z standard deviations of what the
    correction's few prefills bring is not served on them; where it learnt nothing, the argmin."""
    members = np.log([[100.0, 90.0], [100.5, 90.0], [99.5, 90.0]])  # 10% saved
    assert picked(Chooser(z=0.0), members, anchor=0) == (1, False)
    assert picked(Chooser(z=0.0), members, anchor=0, noise=np.zeros((2, 2))) == (1, False)
    unsure = np.array([[0.0, 0.01], [0.01, 0.0]])  # +-10%: a 10% saving is inside 2 standard deviations
    assert picked(Chooser(z=0.0), members, anchor=0, noise=unsure) == (0, True)
    learnt = unsure / 16  # +-2.5%: outside
    assert picked(Chooser(z=0.0), members, anchor=0, noise=learnt) == (1, False)
    tie = np.log([[100.0, 100.0], [101.0, 101.0]])  # the anchor (the second) ties the first: the argmin's
    assert picked(Chooser(z=0.0), tie, anchor=1) == (0, False)


def test_the_anchor_decides_for_a_machine_or_a_model_shape_the_model_never_saw():
    """The strongest simple baseline of a machine, backend and kernel is fitted from its own rows;
    a machine the rows do not hold (or a request that names none) gets the strongest of every
    machine's rows of its backend and kernel, or where no machine ran them its backend's own default,
    and the model does not decide for it, nor for a model shape none of its rows ran, until its
    correction has learnt from prefills of that shape."""
    from estimator.cost_models import PerChunk
    from estimator.decide import feature_rows
    from estimator.recipe import Recipe, shapes_of
    from judge.lineup import MeasuredConfig, anchor_key, fit_anchors

    def on(machine: str | None, model: str = "llama-tiny") -> ChunkRequest:  # named, or described only
        described = {"matmul_gflops": 250.0, "bandwidth_gbs": 40.0, "call_overhead_ms": 0.9, "cores": 2}
        return ChunkRequest(context_length=3000, model=model, hardware={"hardware_id": machine, **described})

    trained = feature_rows({}, on(None), [512])  # [1, FEATURES] the shape the rows ran
    one_shot_wins = MeasuredConfig([512, 1024, 3000], [120.0, 110.0, 100.0], 3000, None, "shift")
    anchors = fit_anchors({anchor_key("m1", "chunkpilot", "split"): [one_shot_wins]})
    recipe = Recipe("r", PerChunk(), anchors=anchors, shapes=shapes_of(trained))
    assert recipe.anchor("m1", "chunkpilot", "split").spec == "full"
    assert recipe.anchor("m2", "chunkpilot", "split").spec == "full"  # every machine's rows: m1's
    assert recipe.anchor("m2", "llama.cpp", "masked").spec == "512"  # llama.cpp's own n_ubatch
    assert recipe.anchor(None, "transformers", "masked").spec == "full"  # generate's own: no chunking
    assert recipe.knows(on("m1"))
    assert not recipe.knows(on("m2"))
    assert not recipe.knows(on(None))
    assert not recipe.knows(on("m1", "qwen2-gqa"))  # a shape no row ran: a guess
    recipe.correction = Correction(learnt=Learnt(prefills=3))  # this machine, learnt from its own prefills
    assert recipe.knows(on(None))
    assert not recipe.knows(on(None, "qwen2-gqa"))  # but none of that shape
    unseen = feature_rows({}, on(None, "qwen2-gqa"), [512])
    recipe.correction.learn(unseen, np.ones(1), np.zeros(1))  # one prefill of the new shape on this machine
    assert recipe.knows(on(None, "qwen2-gqa"))


def test_rank_level_combines_the_levels_and_the_ranker_by_rank():
    # levels rank (2, 0, 1), ranker (higher is better) ranks (1, 2, 0): sums 3, 2, 1 -> candidate 2
    assert rank_level(np.array([3.0, 1.0, 2.0]), np.array([0.5, 0.1, 0.9])) == 2
    assert rank_level(np.array([1.0, 2.0]), np.array([0.1, 0.9])) == 0  # a tie goes to the lower level


@pytest.fixture(scope="module")
def fold(small_dataset, tmp_path_factory):
    """The default recipe fitted on half the configs, saved, and the other half to judge."""
    table = load_table(small_dataset)
    groups = table.configs.group.to_numpy()
    train, test = table.subset(groups[::2]), table.subset(groups[1::2])
    folder = tmp_path_factory.mktemp("recipe")
    recipe = fit_recipes([DEFAULT], {}, train, folder)[DEFAULT]
    return table, test, recipe, folder / DEFAULT


def test_the_recipe_judged_offline_is_the_recipe_served(fold):
    """Cross-validation's choice (dataset rows) and the service's answer (a request, its hardware
    resolved, its features built) are the same chunk on every held-out config."""
    from predictor.model import Predictor

    table, test, recipe, folder = fold
    offline = choose_groups(recipe, test, table=False).chunks  # the table's agreement: tests/test_table.py
    recipe = load_recipe(folder)
    recipe.hardware = hardware_table(table.rows)
    served = Predictor("1", recipe)
    for g, rows in test.rows.groupby("group"):
        sizes = ["full" if full else size for size, full in zip(rows.chunk_size, rows.is_full, strict=True)]
        request = ChunkRequest.from_row(rows.iloc[0].to_dict()).model_copy(update={"candidates": sizes})
        assert served.exact_answer(request).chunk_size == offline[g], g


def test_a_model_shape_no_training_row_ran_gets_the_anchors_size_on_a_machine_the_model_knows(fold, monkeypatch):
    """Held out by model shape, the model's guesses lose to the strongest baseline (docs/training.md):
    a request of a shape none of its rows ran is answered with the anchor's size, saying it deferred,
    without asking the forests (most of a decision's time): every candidate priced by the analytic
    estimate, no gap worth exploring, and no schedule (the anchor's uniform plan runs, and teaches)."""
    from chunkpilot.features import base_log_ms
    from estimator.decide import feature_rows, gains_of

    _, test, recipe, _ = fold
    assert "llama-110m" not in set(test.rows.model)  # the small dataset's shapes are two tiny ones
    asked = ChunkRequest.from_row(test.rows.iloc[0].to_dict())
    new_model = ChunkRequest.model_validate({**asked.model_dump(), "model": "llama-110m"})

    def never(x: np.ndarray) -> np.ndarray:  # a spy, not a fake: a call would be the failure
        raise AssertionError("the forests were asked about a kind the model does not know")

    with monkeypatch.context() as m:
        m.setattr(recipe, "members", never)
        m.setattr(recipe, "chunk_ms", never)
        unseen = recipe.decide(new_model)
        assert recipe.decide(new_model.model_copy(update={"schedule": True})).schedule is None
    assert unseen.deferred and unseen.chunk_size == unseen.anchor.chunk_size
    sizes = [c.chunk_size for c in unseen.candidates]
    analytic = np.exp(base_log_ms(feature_rows(recipe.hardware, new_model, sizes)))
    assert [c.predicted_ttft_ms for c in unseen.candidates] == pytest.approx(analytic.tolist(), rel=1e-3)
    assert all(c.predicted_peak_mb > 0 for c in unseen.candidates)  # the memory side is analytic: it still answers
    assert gains_of(unseen) == ()
    assert recipe.knows(asked)  # its own shape, on its own machine: the model decides


def test_an_old_or_foreign_recipe_folder_is_refused_with_the_reason(fold, tmp_path):
    with pytest.raises(ValueError, match="not a ChunkPilot recipe"):
        load_recipe(tmp_path)
    _, _, _, folder = fold
    (tmp_path / "recipe.json").write_text((folder / "recipe.json").read_text().replace('"chunk_size"', '"other"'))
    with pytest.raises(ValueError, match="retrain it"):
        load_recipe(tmp_path)


def test_the_correction_moves_what_this_machine_measured_and_its_kind_only(fold):
    table, test, recipe, _ = fold
    assert isinstance(recipe.cost, PerChunk)
    rows = test.rows
    config = (rows.context_length == 400) & (rows.group == rows.group[rows.context_length == 400].iloc[0])
    measured = test.x[(config & (rows.chunk_size == 64)).to_numpy()]  # [1, FEATURES]
    larger = test.x[(config & (rows.chunk_size == 128)).to_numpy()]  # the same prompt in chunks of 128
    other_kind = test.x[(rows.model != rows.model[config].iloc[0]).to_numpy()][:1]  # another model shape

    def chunks(x: np.ndarray) -> float:  # the mean log ms of its plan's chunks, corrected
        _, q, h = expand(x)
        return float(np.log(recipe.chunk_ms(x[[0] * len(q)], q, h)).mean())

    plans = {name: recipe.members(x).mean() for name, x in (("measured", measured), ("other", other_kind))}
    before = {"measured": chunks(measured), "larger": chunks(larger)}
    _, q, h = expand(measured)
    predicted = np.exp(recipe.cost.chunk_log_ms(measured[[0] * len(q)], q, h).mean(0))
    recipe.correction = Correction()
    try:
        for _ in range(20):  # twenty prefills, each chunk 1.25x as slow as predicted (within the clip)
            recipe.correction.learn(*recipe.residuals(measured, (1.25 * predicted).tolist()))
        # the chunks it measured: (a first decode step and the tokenizer, not chunk times, move less)
        assert math.log(1.2) < chunks(measured) - before["measured"] <= math.log(1.25)
        assert 0 < recipe.members(measured).mean() - plans["measured"] <= math.log(1.25)
        assert recipe.members(other_kind).mean() == pytest.approx(plans["other"])  # another kind: untouched
        # never measured here, it moves with the machine's level (and less than the size it measured)
        assert math.log(1.1) < chunks(larger) - before["larger"] <= math.log(1.25)
        for _ in range(20):  # twenty more at 100x: each chunk's residual is clipped, the shift stays bounded
            recipe.correction.learn(*recipe.residuals(measured, (100 * predicted).tolist()))
        assert chunks(measured) - before["measured"] <= CLIP
    finally:
        recipe.correction = None


def test_the_correction_states_the_noise_it_brings_into_a_choice(fold):
    _, test, recipe, _ = fold
    rows = test.rows
    config = (rows.context_length == 400) & (rows.group == rows.group[rows.context_length == 400].iloc[0])
    plans = test.x[(config & rows.chunk_size.isin([64, 128])).to_numpy()]  # [2, FEATURES] sizes 64, 128
    other_kind = test.x[(rows.model != rows.model[config].iloc[0]).to_numpy()][:2]
    measured = plans[:1]
    _, q, h = expand(measured)
    predicted = np.exp(recipe.cost.chunk_log_ms(measured[[0] * len(q)], q, h).mean(0))
    correction = Correction()
    assert not correction.difference_variance(plans).any()  # nothing learnt: the members alone
    rng = np.random.default_rng(0)
    spread = []
    for count in (1, 20):
        while correction.prefills < count:  # prefills of 64-token chunks, +-10% apart
            correction.learn(*recipe.residuals(measured, (predicted * rng.uniform(0.9, 1.1)).tolist()))
        spread.append(correction.difference_variance(plans)[0, 1])
    assert spread[0] > spread[1] > 0  # more prefills of 64, less of their noise in 64 against 128
    unlearnt = test.x[(config & (rows.chunk_size > 64)).to_numpy()]  # sizes no chunk of it had
    assert len(unlearnt) >= 2 and not correction.difference_variance(unlearnt).any()
    assert correction.difference_variance(plans)[0, 0] == 0  # a size against itself
    assert not correction.difference_variance(other_kind).any()  # a kind it never measured


def test_the_default_candidates_on_a_ring_shorter_than_the_prompt_end_at_its_window():
    """One shot cannot run on a ring shorter than the prompt; its window, where every baseline is cut
    to, stands in for it among the defaults. Sizes a client names are taken as named."""
    from chunkpilot.contract import AttentionConfig
    from estimator.decide import candidates

    ring = ChunkRequest(
        context_length=4956,
        model="llama-tiny",
        attention=AttentionConfig(window=192, layout="ring", sinks=4),
        hardware={"hardware_id": "0123456789ab"},
    )
    assert candidates(ring) == [64, 128, 192]
    assert candidates(ring, 100) == [64, 100]  # a prompt within the window: the whole prompt
    assert candidates(ring.model_copy(update={"candidates": [64, 128, 1024]})) == [64, 128]
    shift = ring.model_copy(update={"attention": AttentionConfig(window=192, layout="shift")})
    assert candidates(shift)[-1] == 4956
