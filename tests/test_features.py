"""The feature builder (the serving contract): closed forms equal the explicit loops, and any valid
row gives finite features."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkpilot.contract import BACKENDS
from chunkpilot.features import (
    FEATURES,
    INPUT_COLUMNS,
    MONOTONE,
    base_log_ms,
    build,
    floor_ms,
    keys_sum,
    linear_flops,
    prefill_flops,
)


def keys_sum_loop(n: int, c: int, window: float) -> float:
    total = 0.0
    for start in range(0, n, c):
        q = min(c, n - start)
        total += q * (min(start, window) + q)
    return total


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 20000), c=st.integers(1, 5000), window=st.one_of(st.just(math.inf), st.integers(1, 8192)))
def test_attention_sum_closed_form_equals_the_loop(n, c, window):
    c = min(c, n)
    got = keys_sum(np.array([n], float), np.array([c], float), np.array([window], float))[0]
    assert got == keys_sum_loop(n, c, window)


def row(**change) -> dict:
    base = dict(
        context_length=4096,
        chunk_size=768,
        window=1024,
        layout="shift",
        sinks=4,
        global_tokens=0,
        global_every=0,
        num_layers=12,
        hidden_size=512,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=6144,
        parameters=44_000_000,
        dtype="float32",
        threads=2,
        attn_impl="masked",
        backend="chunkpilot",
        quant=None,
        matmul_gflops=258.0,
        bandwidth_gbs=60.0,
        call_overhead_ms=0.9,
        cores=2,
        l2_cache_bytes=2**21,
        l3_cache_bytes=300 * 2**20,
    )
    return {k: [v] for k, v in {**base, **change}.items()}


def test_one_row_per_input_row_in_feature_order():
    x = build({k: v * 3 for k, v in row().items()})
    assert x.shape == (3, len(FEATURES)) and len(MONOTONE) == len(FEATURES)
    named = dict(zip(FEATURES, x[0], strict=True))
    assert named["num_chunks"] == 6 and named["last_chunk"] == 4096 - 5 * 768 and named["has_window"] == 1


def test_a_prompt_s_own_flops_count_each_query_against_the_keys_its_mask_keeps_whatever_the_chunking():
    layers, heads, hd = 12, 8, 64
    linear = linear_flops(4096, layers, 512, heads, 4, hd, 1536)
    causal = 4096 * 4097 / 2  # query i sees keys 0..i
    windowed = 1024 * 1025 / 2 + (4096 - 1024) * 1025  # causal up to the window, then the window and itself
    full, window = prefill_flops(row(window=0, layout="none", chunk_size=64)), prefill_flops(row(sinks=0))
    assert full[0] == pytest.approx(linear + 4 * heads * hd * layers * causal, rel=1e-12)
    assert window[0] == pytest.approx(linear + 4 * heads * hd * layers * windowed, rel=1e-12)
    assert prefill_flops(row(sinks=0, chunk_size=4096)) == window  # the size the row ran at counts for nothing


def test_a_first_chunk_within_the_window_scores_its_causal_triangle_one_shot_past_it_its_whole_square():
    """PyTorch's plain causal path (no history, no mask) computes a first chunk's triangle; one shot
    under a shorter window needs a mask and scores every pair; eager has no plain path, nor has
    llama.cpp without flash attention, which scores every cached key for each batch."""
    layers, heads, hd = 12, 8, 64
    n, c, w = 4096, 768, 1024

    def attention(**change) -> float:
        return build(row(sinks=0, **change))[0, FEATURES.index("attention_gflop")] * 1e9 / (4 * heads * hd * layers)

    rectangle = keys_sum(n, c, w)  # every chunk's queries x the keys it holds, the first's c x c
    assert attention() == pytest.approx(rectangle - c * (c - 1) / 2, rel=1e-12)
    assert attention(attn_impl="eager") == pytest.approx(rectangle, rel=1e-12)
    assert attention(backend="llama.cpp") == pytest.approx(rectangle, rel=1e-12)
    assert attention(backend="llama.cpp", attn_impl="flash") == attention()
    assert attention(chunk_size=n) == pytest.approx(n * n, rel=1e-12)  # one shot past the window: no plain path
    no_window = attention(window=0, layout="none", chunk_size=n)
    assert no_window == pytest.approx(n * (n + 1) / 2, rel=1e-12)  # one shot without one: the triangle


def test_window_only_on_local_layers_of_interleaved_models():
    full = build(row(window=0, layout="none"))[0, FEATURES.index("attention_gflop")]
    all_local = build(row())[0, FEATURES.index("attention_gflop")]
    interleaved = build(row(global_every=6))[0, FEATURES.index("attention_gflop")]
    assert all_local < interleaved < full
    assert build(row(global_every=6))[0, FEATURES.index("local_fraction")] == 10 / 12


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 32768),
    c=st.integers(1, 8192),
    window=st.integers(0, 8192),
    sinks=st.integers(0, 64),
    layout=st.sampled_from(["shift", "ring"]),
    every=st.integers(0, 12),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    attn=st.sampled_from(["masked", "eager", "flash"]),
    threads=st.integers(1, 64),
    backend=st.sampled_from(BACKENDS),
    quant=st.sampled_from([None, "f32", "f16", "bf16", "q8_0", "q4_k_m"]),
)
def test_any_valid_row_gives_finite_features(n, c, window, sinks, layout, every, dtype, attn, threads, backend, quant):
    x = build(
        row(
            context_length=n,
            chunk_size=c,
            window=window,
            layout=layout if window else "none",
            sinks=sinks if window else 0,
            global_every=every,
            dtype=dtype,
            attn_impl=attn,
            threads=threads,
            backend=backend,
            quant=quant,
        )
    )
    assert np.isfinite(x).all() and set(INPUT_COLUMNS) <= set(row())


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 20000), c=st.integers(1, 5000), window=st.one_of(st.just(math.inf), st.integers(1, 8192)))
def test_history_sum_closed_form_equals_the_loop(n, c, window):
    from chunkpilot.features import history_sum

    c = min(c, n)
    expected = sum(min(start, window) for start in range(0, n, c))
    assert history_sum(np.array([n], float), np.array([c], float), np.array([window], float))[0] == expected


@settings(max_examples=300, deadline=None)
@given(q=st.integers(1, 3000), h=st.integers(0, 20000), window=st.one_of(st.just(math.inf), st.integers(1, 8192)))
def test_the_keys_a_chunk_s_queries_see_closed_form_equals_the_loop(q, h, window):
    """What the split kernel computes: query i of a chunk after h tokens sees min(h + i + 1, window) keys."""
    from chunkpilot.features import visible_sum

    expected = sum(min(h + i + 1, window) for i in range(q))
    assert visible_sum(np.array([q], float), np.array([h], float), np.array([window], float))[0] == expected


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 32768),
    window=st.integers(0, 8192),
    every=st.integers(0, 12),
    sizes=st.lists(st.integers(1, 8192), min_size=1, max_size=12),
)
def test_a_config_given_once_builds_the_same_rows_as_a_repeated_column(n, window, every, sizes):
    """The service passes one config as scalars beside its candidate sizes; training passes columns."""
    config = row(context_length=n, window=window, layout="shift" if window else "none", global_every=every)
    columns = build({**{k: v * len(sizes) for k, v in config.items()}, "chunk_size": sizes})
    shared = build({**{k: v[0] for k, v in config.items()}, "chunk_size": sizes})
    assert np.array_equal(columns, shared)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 32768),
    window=st.integers(0, 8192),
    sinks=st.integers(0, 64),
    layout=st.sampled_from(["shift", "ring"]),
    every=st.integers(0, 12),
    attn=st.sampled_from(["masked", "eager", "split", "flash"]),
    backend=st.sampled_from(BACKENDS),
)
def test_no_chunk_size_is_priced_below_the_prompt_s_floor(n, window, sinks, layout, every, attn, backend):
    """The service weighs its decision budget against `floor_ms` before building any feature row:
    whatever size the anchor takes, its analytic TTFT is at least that."""
    changed = row(context_length=n, window=window, sinks=sinks, layout=layout, global_every=every, attn_impl=attn)
    config = {k: v[0] for k, v in changed.items()} | {"backend": backend}
    sizes = sorted({1, 16, 64, 256, 768, 1024, 4096, n} & set(range(1, n + 1)))
    every_size = build({**config, "chunk_size": sizes})
    assert floor_ms(config) <= np.exp(base_log_ms(every_size)).min()
    assert floor_ms(config | {"matmul_gflops": 0.0}) == 0.0  # no speed to divide by
