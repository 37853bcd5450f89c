"""Chunked prefill + first decode step equals one reference forward, for every preset, layout,
sinks setting and chunk size (1, a non-divisor, = window, > window, one-shot), and, for every model
family, schedules (chunk sizes that change along the prompt) and global tokens."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_logits

from chunkpilot.contract import PRESETS, AttentionConfig, ConfigError
from engine.kv_cache import ChunkCache
from engine.prefill import decode_one_token, forward_step, prefill

N, W, S = 64, 16, 4  # context, window, sinks: the ring (2W slots) wraps twice
ATTENTION = {
    "full": AttentionConfig(),
    "shift": AttentionConfig(window=W),
    "shift+sinks": AttentionConfig(window=W, sinks=S),
    "ring": AttentionConfig(window=W, layout="ring"),
    "ring+sinks": AttentionConfig(window=W, layout="ring", sinks=S),
}
CHUNKS = [1, 7, W, W + 8, N]  # 7 does not divide 64; W + 8 > W (shift only); N is one shot
# `make test` checks every preset; the fast loop keeps the smallest plus the interleaved local/global
# one, which between them walk every code path (full and windowed layers, every layout)
FAST = {"llama-tiny", "gemma3-interleaved"}


# schedules and global tokens are cache logic: every family checks them; llama-110m is llama-tiny's
# family at 110M parameters (the same code path), checked at full size by the main test, where its
# one-token chunks alone take 3 s a layout
FAMILIES = [p for p in PRESETS if p != "llama-110m"]


def presets(names: list[str] | None = None) -> list:
    return [pytest.param(p, marks=() if p in FAST else pytest.mark.slow) for p in names or PRESETS]


def chunked(engine, ids, attention, chunk, kernel, global_positions=(), sized=True):
    """The engine's path: prefill in chunks, argmax, one decode step -> (prefill logits, decode logits).
    `sized`: the cache is told the tokens to come, as the engine tells it; else its buffers grow."""
    capacity = ids.shape[1] + 1 if sized else 0
    cache = ChunkCache(engine.shape.local_layers, attention, global_positions, capacity)
    with torch.inference_mode():
        logits, _ = prefill(engine.model, cache, ids, chunk, kernel)
        first = logits.argmax(-1)
        decoded = decode_one_token(engine.model, cache, first, ids.shape[1], kernel)
    return logits[0].float(), decoded[0].float(), first


def check(engine, attention, chunk, kernel, n=N, atol=1e-4, global_positions=(), sized=True):
    ids = torch.randint(0, engine.shape.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
    got, got_next, first = chunked(engine, ids, attention, chunk, kernel, global_positions, sized)
    ref = reference_logits(
        engine.model,
        engine.shape,
        torch.cat([ids, first[None]], 1),
        attention.window,
        attention.sinks,
        "eager" if kernel == "eager" else "sdpa",  # split and masked against transformers' sdpa
        global_positions,
    )
    for mine, theirs in ((got, ref[n - 1]), (got_next, ref[n])):
        torch.testing.assert_close(mine, theirs, atol=atol, rtol=0)
        assert_same_choice(mine, theirs, atol)


def assert_same_choice(got: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    """Same argmax; where the reference's top two are closer than the tolerance (random weights
    make near-ties common in bf16), the engine's pick must be one of those tied tokens."""
    top = ref.topk(2).values
    if top[0] - top[1] > 2 * atol:
        assert got.argmax() == ref.argmax()
    else:
        assert ref[got.argmax()] >= top[0] - 2 * atol


KERNELS = ["split", "masked"]  # blocks merged by log-sum-exp; the dense mask


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("preset", presets())
@pytest.mark.parametrize("attn_name", list(ATTENTION))
def test_chunked_prefill_matches_one_forward_fp32(engines, preset, attn_name, kernel):
    engine, attention = engines(preset), ATTENTION[attn_name]
    for chunk in CHUNKS:
        if attention.layout == "ring" and chunk > W:
            with pytest.raises(ConfigError, match="chunk_size"):
                attention.check_chunk(chunk)
            continue
        check(engine, attention, chunk, kernel)


@pytest.mark.parametrize("preset", presets(["mistral-44m", "gemma3-interleaved"]))
@pytest.mark.parametrize("attn_name", ["full", "shift+sinks", "ring"])
def test_eager_kernel_matches_too(engines, preset, attn_name):
    for chunk in (7, W):
        check(engines(preset), ATTENTION[attn_name], chunk, "eager")


# sizes in order summing to N: decreasing (Sarathi-Serve), increasing, mixed; ring ones fit the window
SCHEDULES = {"shift": [[W + 8, W, 7, 7, 1, 9], [1, 7, W, 40]], "ring": [[W, 7, 1, W, 8, W], [1, 1, 7, 7, W, W, W]]}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("preset", presets(FAMILIES))
@pytest.mark.parametrize("attn_name", list(ATTENTION))
def test_a_schedule_matches_one_forward(engines, preset, attn_name, kernel):
    attention = ATTENTION[attn_name]
    for schedule in SCHEDULES["ring" if attention.layout == "ring" and attention.window else "shift"]:
        assert sum(schedule) == N
        check(engines(preset), attention, schedule, kernel)


BF16_ATOL = 0.05  # bf16 keeps 8 bits of mantissa; different chunkings round differently


@pytest.mark.parametrize("preset", presets(["mistral-44m", "qwen2-gqa", "gemma3-interleaved"]))
@pytest.mark.parametrize("attn_name", ["full", "shift+sinks", "ring+sinks"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_bf16_same_argmax_within_tolerance(engines, preset, attn_name, kernel):
    for chunk in (7, W):
        check(engines(preset, "bfloat16"), ATTENTION[attn_name], chunk, kernel, atol=BF16_ATOL)


@pytest.mark.parametrize("layout", ["ring+sinks", "shift+sinks"])
def test_windowed_memory_does_not_grow_with_context(engines, layout):
    """A ring holds 2W slots; a shift buffer at most twice the window and a chunk, however long the prompt."""
    engine = engines("llama-tiny")
    sizes = {}
    for n in (4 * W, 8 * W, 32 * W):  # from 4W on, the shift buffer is not cut to the prompt
        cache = ChunkCache(engine.shape.local_layers, ATTENTION[layout], capacity=n + 1)
        with torch.inference_mode():
            prefill(engine.model, cache, torch.zeros(1, n, dtype=torch.long), W, "split")
        sizes[n] = cache.nbytes
    assert len(set(sizes.values())) == 1, sizes
    full = ChunkCache(engine.shape.local_layers, ATTENTION["full"], capacity=8 * W + 1)
    with torch.inference_mode():
        prefill(engine.model, full, torch.zeros(1, 8 * W, dtype=torch.long), W, "split")
    assert full.nbytes > sizes[8 * W]  # while the full layout grows with the context


def test_sinks_are_copies_and_a_shift_buffer_with_sinks_is_sized_once(engines):
    """The sinks keep copies of their keys and values (a view would keep the whole first chunk's
    alive, every layer, through the prefill); a shift buffer is sized at the first chunk before its
    sinks are taken out, so the next full chunk does not double it."""
    engine = engines("llama-tiny")
    for layout in ("shift+sinks", "ring+sinks"):
        cache = ChunkCache(engine.shape.local_layers, ATTENTION[layout])  # unsized: a buffer may grow
        with torch.inference_mode():
            prefill(engine.model, cache, torch.zeros(1, N, dtype=torch.long), W, "split")
        for layer in cache.layers:
            assert layer.sinks.keys.untyped_storage().nbytes() == layer.sinks.keys.nbytes, layout
            assert layer.sinks.values.untyped_storage().nbytes() == layer.sinks.values.nbytes, layout
        if layout == "shift+sinks":
            assert {layer.buffer.keys.shape[-2] for layer in cache.layers} == {2 * (W - 1 + W)}


def test_full_layers_write_every_key_once_into_one_buffer(engines):
    """Told the tokens to come, a full layer allocates once; every chunk and the decode step write
    into that buffer in place (the hypothesis tests cover the unsized cache, which doubles)."""
    engine = engines("llama-tiny")
    cache = ChunkCache(engine.shape.local_layers, ATTENTION["full"], capacity=N + 1)
    ids = torch.zeros(1, N, dtype=torch.long)
    with torch.inference_mode():
        forward_step(engine.model, cache, ids[:, :7], 0, "split")
        buffers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
        forward_step(engine.model, cache, ids[:, 7:], 7, "split")
        decode_one_token(engine.model, cache, ids[0, :1], N, "split")
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers] == buffers
    assert {(layer.length, layer.buffer.keys.shape[-2]) for layer in cache.layers} == {(N + 1, N + 1)}


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 80),
    window=st.integers(1, 40),
    sinks=st.integers(0, 6),
    layout=st.sampled_from(["shift", "ring"]),
    kernel=st.sampled_from(KERNELS),
    sized=st.booleans(),
    data=st.data(),
)
def test_any_context_chunk_window_sinks(engines, n, window, sinks, layout, kernel, sized, data):
    max_chunk = min(n, window) if layout == "ring" else n
    chunk = data.draw(st.integers(1, max_chunk), label="chunk")
    attention = AttentionConfig(window=window, layout=layout, sinks=sinks)
    check(engines("llama-tiny"), attention, chunk, kernel, n=n, sized=sized)


@settings(max_examples=30, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 79), max_size=12, unique=True),
    sinks=st.integers(0, 6),
    layout=st.sampled_from(["shift", "ring"]),
    kernel=st.sampled_from(KERNELS),
    sized=st.booleans(),
)
def test_any_schedule(engines, cuts, sinks, layout, kernel, sized):
    """Chunk boundaries anywhere in an 80-token prompt (a ring needs each chunk <= its window); a
    schedule whose chunks grow makes an unsized shift buffer move its window, then grow."""
    bounds = [0, *sorted(cuts), 80]
    schedule = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    window = max(schedule) if layout == "ring" else 12
    attention = AttentionConfig(window=window, layout=layout, sinks=sinks)
    check(engines("llama-tiny"), attention, schedule, kernel, n=80, sized=sized)


# global tokens before the window, inside it, at its edge and in the last chunk; some also sinks
GLOBALS = (0, 2, 5, 9, 20, 37, 50, 63)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("preset", presets(FAMILIES))
@pytest.mark.parametrize("attn_name", list(ATTENTION))
def test_global_tokens_match_one_forward(engines, preset, attn_name, kernel):
    """Selective SWA: chosen tokens stay visible to every later query on the windowed layers."""
    attention = ATTENTION[attn_name]
    for chunk in CHUNKS:
        if attention.layout == "ring" and chunk > W:
            continue
        check(engines(preset), attention, chunk, kernel, global_positions=GLOBALS)


@pytest.mark.parametrize("attn_name", ["shift+sinks", "ring"])
def test_global_tokens_with_schedules_and_eager(engines, attn_name):
    attention = ATTENTION[attn_name]
    for schedule in SCHEDULES["ring" if attention.layout == "ring" else "shift"]:
        check(engines("gemma3-interleaved"), attention, schedule, "masked", global_positions=GLOBALS)
    check(engines("mistral-44m"), attention, 7, "eager", global_positions=GLOBALS)


def test_ring_memory_is_bounded_by_window_sinks_and_globals(engines):
    engine, attention = engines("llama-tiny"), ATTENTION["ring+sinks"]
    per_token = 2 * engine.shape.num_kv_heads * engine.shape.head_dim * 4  # keys and values, fp32
    layers = sum(engine.shape.local_layers)
    for n in (4 * W, 16 * W, 64 * W):
        globals_ = tuple(range(S, n, n // 8))  # 8 global tokens spread over the prompt
        cache = ChunkCache(engine.shape.local_layers, attention, globals_)
        with torch.inference_mode():
            prefill(engine.model, cache, torch.zeros(1, n, dtype=torch.long), W, "masked")
        assert cache.nbytes == layers * (2 * W + S + 8) * per_token, n


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 80),
    window=st.integers(1, 40),
    sinks=st.integers(0, 6),
    layout=st.sampled_from(["shift", "ring"]),
    globals_=st.lists(st.integers(0, 79), max_size=10),
    kernel=st.sampled_from(KERNELS),
    data=st.data(),
)
def test_any_global_tokens(engines, n, window, sinks, layout, globals_, kernel, data):
    max_chunk = min(n, window) if layout == "ring" else n
    chunk = data.draw(st.integers(1, max_chunk), label="chunk")
    attention = AttentionConfig(window=window, layout=layout, sinks=sinks)
    check(engines("llama-tiny"), attention, chunk, kernel, n=n, global_positions=tuple(globals_))
