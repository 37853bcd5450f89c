"""The decision from predictions (predictor/choice.py), shared by training and the service."""

from __future__ import annotations

import math

from chunkpilot.choice import pick


def test_levels_alone_take_the_argmin():
    assert pick([3.0, 1.0, 2.0], None, None, 0.0) == (1, False)


def test_the_ranker_s_order_and_the_levels_are_combined_by_rank():
    # levels rank (2, 0, 1), ranker (higher is better) ranks (1, 2, 0): sums 3, 2, 1 -> candidate 2
    assert pick([3.0, 1.0, 2.0], [0.5, 0.1, 0.9], None, 0.0) == (2, False)
    # a tie in the summed ranks goes to the lower level
    assert pick([1.0, 2.0], [0.1, 0.9], None, 0.0) == (0, False)


def test_the_margin_keeps_the_rule_unless_the_pick_saves_more():
    levels = [math.log(100.0), math.log(104.0)]  # candidate 1 is the rule, predicted 4% slower
    assert pick(levels, None, 1, 0.05) == (1, True)
    assert pick(levels, None, 1, 0.03) == (0, False)
    assert pick(levels, None, 1, 0.0) == (0, False)  # no margin: never
    assert pick(levels, None, None, 0.05) == (0, False)  # the rule is not a candidate
