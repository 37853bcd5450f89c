"""The lineup's strongest baseline, the anchor: the lowest mean regret on a machine's rows, and
among equals on a dense kernel the simple rule before one shot (the two differ only under a window
shorter than the prompt, which such rows do not hold)."""

from __future__ import annotations

from judge.lineup import MeasuredConfig, applied, fit_anchors, lineup, strongest


def no_window(n: int) -> MeasuredConfig:
    """Made-up TTFTs (not measurements): one shot the fastest of three sizes."""
    return MeasuredConfig(
        sizes=[512, 1024, n], ttft_ms=[130.0, 115.0, 100.0], context_length=n, window=None, layout="none"
    )


def test_on_rows_without_a_window_one_shot_and_the_simple_rule_tie_and_a_dense_kernel_anchors_the_simple_rule():
    rows = [no_window(2048), no_window(4096)]
    baselines = lineup("transformers")
    assert strongest(baselines, rows).spec == "full"  # the first of equals: one shot
    assert strongest(baselines, rows, dense=True).spec == "simple-rule"
    # the same size without a window; under a shorter one, the hand rule's instead of every pair
    assert applied("simple-rule", 4096, None, "none") == applied("full", 4096, None, "none") == 4096
    assert applied("simple-rule", 8192, 1024, "shift") == 1024


def test_the_anchors_of_a_dense_kernel_take_the_simple_rule_among_equals_and_a_lower_regret_still_wins():
    rows = [no_window(2048), no_window(4096)]
    anchors = fit_anchors({"m/transformers/masked": rows, "m/chunkpilot/split": rows})
    assert anchors["m/transformers/masked"].spec == anchors["*/transformers/masked"].spec == "simple-rule"
    assert anchors["m/chunkpilot/split"].spec == "full"  # split attends only what each query sees
    slower = [MeasuredConfig([512, 1024, 2048], [130.0, 90.0, 100.0], 2048, None, "none")]  # 1024 the fastest
    assert fit_anchors({"m/transformers/masked": slower})["m/transformers/masked"].spec == "1024"
