"""The baselines `auto` is judged against, defined once for every judge (the demo, bench/policies.py
on each backend, the training table, bench/closed_loop.py): one shot, the backend's own default,
the best single size for this machine and backend (what one sweep of it gives a user, chosen from
its profile rows only), the hand rule, the simple rule and fixed 1024.

A baseline is a chunk-size spec in `--chunk-size`'s words ("full", "rule", "simple-rule" or a
number), applied cut to what a config allows, so the engine runs it, training scores it on measured
rows and the service answers it alike. The strongest of them on a machine's own rows (the lowest
mean regret) is the anchor: what the recipe's do-no-harm keeps when the cost model is unsure and
what `auto` falls back to (estimator.recipe). Light: no numpy, no pandas."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from chunkpilot.chunks import DEFAULT_CHUNKS, clamp_chunk, landed, rule_size, simple_rule

from .regret import regret_of

Spec = str  # "full", "rule", "simple-rule" or a positive integer, as `--chunk-size` takes them

# what each backend does when nobody picks a size: the bundled engine's `--chunk-size` default (the
# hand rule), stock generate without prefill_chunk_size (the whole prompt), llama.cpp's n_ubatch
BACKEND_DEFAULTS: dict[str, tuple[str, Spec]] = {
    "chunkpilot": ("the engine's default", "rule"),
    "transformers": ("generate's default", "full"),
    "llama.cpp": ("n_ubatch 512", "512"),
}
ANY = "*"
V = TypeVar("V")


class Baseline(NamedTuple):
    name: str
    spec: Spec


def backend_default(backend: str) -> Baseline:
    """What `backend` does when nobody picks a size, as a baseline."""
    name, spec = BACKEND_DEFAULTS[backend]
    return Baseline(f"default ({name})", spec)


def applied(spec: Spec, context_length: int, window: int | None, layout: str) -> int:
    """The size `spec` runs for a config: one shot, a rule's size or a fixed size, cut to what the
    config allows (ring: the window; the context)."""
    if spec == "rule":
        return rule_size(context_length, window, layout)
    if spec == "simple-rule":
        return simple_rule(context_length, window, layout)
    size = context_length if spec == "full" else int(spec)
    return clamp_chunk(size, context_length, window, layout)


def describe(spec: Spec) -> str:
    return {"full": "one shot", "rule": "hand rule", "simple-rule": "simple rule"}.get(spec, spec)


@dataclass(frozen=True)
class MeasuredConfig:
    """One config's measured sizes (the whole prompt as its length) and their TTFT."""

    sizes: Sequence[int]
    ttft_ms: Sequence[float]
    context_length: int
    window: int | None
    layout: str

    def size(self, spec: Spec) -> int:
        """The measured size `spec` lands on here (chunkpilot.chunks.landed)."""
        return landed(self.sizes, applied(spec, self.context_length, self.window, self.layout))

    def regret(self, spec: Spec) -> float:
        """The regret of `spec` here: the TTFT of the measured size it lands on over the best."""
        return regret_of(dict(zip(self.sizes, self.ttft_ms, strict=True)), self.size(spec))


def mean_regret(spec: Spec, configs: Sequence[MeasuredConfig]) -> float:
    return sum(c.regret(spec) for c in configs) / len(configs)


def best_single_size(configs: Sequence[MeasuredConfig]) -> Spec:
    """The one size (of the default candidates, one shot among them) with the lowest mean regret
    over `configs`: what a user would keep after one sweep of the machine."""
    specs = [str(c) for c in DEFAULT_CHUNKS]
    return min(specs, key=lambda s: (mean_regret(s, configs), specs.index(s)))


def lineup(backend: str, best: Spec | None = None) -> list[Baseline]:
    """The baselines of `backend`, in order: one shot, the backend's default, the best single size
    (when known), the hand rule, the simple rule, fixed 1024; two of one spec are one baseline with
    both names."""
    default = backend_default(backend)
    named = [
        ("one shot", "full"),
        (default.name, default.spec),
        *([(f"best single size ({describe(best)})", best)] if best is not None else []),
        ("hand rule", "rule"),
        ("simple rule", "simple-rule"),
        ("fixed 1024", "1024"),
    ]
    merged: dict[Spec, list[str]] = {}
    for name, spec in named:
        merged.setdefault(spec, []).append(name)
    return [Baseline(" = ".join(names), spec) for spec, names in merged.items()]


# kernels on which a chunk longer than the window builds a mask and scores every pair of it
DENSE_KERNELS = ("masked", "eager")


def strongest(baselines: Iterable[Baseline], configs: Sequence[MeasuredConfig], dense: bool = False) -> Baseline:
    """The baseline with the lowest mean regret over `configs`, the first of equals; on a dense
    kernel (`dense`) the simple rule first among equals: rows where it ties one shot hold no window
    shorter than the prompt, the one place the two differ, and there one shot scores every pair
    (stock transformers under mistral-44m's 1,024 window, 8,192 tokens: 3.2 times the best size,
    docs/training.md)."""
    listed = list(baselines)
    if dense:
        listed.sort(key=lambda b: b.spec != "simple-rule")  # stable: the others keep their order
    return min(listed, key=lambda b: (mean_regret(b.spec, configs), listed.index(b)))


def anchor_key(hardware_id: str | None, backend: str, attn_impl: str) -> str:
    return f"{hardware_id or ANY}/{backend}/{attn_impl}"


def with_pooled(configs: Mapping[str, Sequence[MeasuredConfig]]) -> dict[str, list[MeasuredConfig]]:
    """Each machine's configs per backend and kernel, and under the key of any machine (ANY) every
    machine's configs of that backend and kernel pooled: what a machine the rows do not hold gets."""
    out: dict[str, list[MeasuredConfig]] = {key: list(measured) for key, measured in configs.items()}
    for key, measured in configs.items():
        out.setdefault(anchor_key(None, *key.split("/")[1:]), []).extend(measured)
    return out


def machine_or_pooled(fitted: Mapping[str, V], hardware_id: str | None, backend: str, attn_impl: str) -> V | None:
    """What `fitted` (keyed as with_pooled) holds for this machine, backend and kernel, else for any
    machine of that backend and kernel (None: neither)."""
    return fitted.get(anchor_key(hardware_id, backend, attn_impl)) or fitted.get(anchor_key(None, backend, attn_impl))


def fit_anchors(configs: Mapping[str, Sequence[MeasuredConfig]]) -> dict[str, Baseline]:
    """Each machine's anchor per backend and kernel (`configs`: anchor_key -> that machine's
    configs): the strongest of its lineup, the best single size chosen from its own rows; and, under
    the key of any machine (ANY), every machine's configs of that backend and kernel pooled: the
    anchor of a machine the rows do not hold."""
    anchors = {}
    for key, measured in with_pooled(configs).items():
        if measured:
            _, backend, kernel = key.split("/")  # anchor_key's machine/backend/kernel
            anchors[key] = strongest(lineup(backend, best_single_size(measured)), measured, kernel in DENSE_KERNELS)
    return anchors


def anchor_for(anchors: Mapping[str, Baseline], hardware_id: str | None, backend: str, attn_impl: str) -> Baseline:
    """The anchor of this machine, backend and kernel; for a machine the data does not hold, the
    strongest baseline of every machine's rows of that backend and kernel (held out by machine, in
    the training table, its choices came within 3.2% of the measured best on average where the
    backend's own default came within 7.1%); for a backend or kernel no machine ran, the backend's
    own default: what its users run today, so keeping it does no harm."""
    return machine_or_pooled(anchors, hardware_id, backend, attn_impl) or backend_default(backend)
