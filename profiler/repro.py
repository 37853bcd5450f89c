"""`--check-repro`: re-measure a sample of finished configs in a fresh worker process and compare
the best chunk size and the TTFTs with what the dataset holds."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from chunkpilot.contract import ConfigError
from store.dataset import read_dataset

from .spec import Spec
from .worker import Worker

MIN_TIE = 0.02  # two chunk sizes within 2% (or twice their CV, if larger) are a tie


@dataclass(frozen=True)
class ReproRow:
    config_key: str
    old_best: int
    new_best: int
    tie: bool  # different best, but the old best is within the noise of the new one
    ratio: float  # median over chunk sizes of new TTFT / old TTFT

    @property
    def agrees(self) -> bool:
        return self.old_best == self.new_best or self.tie


def repro_row(key: str, old: dict[int, float], new: dict[int, float], new_cv: dict[int, float]) -> ReproRow:
    old_best, new_best = min(old, key=old.get), min(new, key=new.get)
    tolerance = max(MIN_TIE, 2 * max(new_cv[old_best], new_cv[new_best]))
    tie = new[old_best] <= new[new_best] * (1 + tolerance)
    ratio = statistics.median(new[c] / old[c] for c in old if c in new)
    return ReproRow(key, old_best, new_best, old_best != new_best and tie, ratio)


def check_reproducibility(spec: Spec, out: Path, sample: int) -> list[ReproRow]:
    from .run import machine_dir

    directory = machine_dir(out, spec)  # this machine's own measurements, not another's
    dataset = read_dataset(directory)
    by_key = {c.key: c for c in spec.configs}
    finished = sorted(k for k in dataset.config_key.unique() if k in by_key)
    if not finished:
        raise ConfigError("spec", f"no finished config of spec {spec.name!r} under {directory}")
    chosen = random.Random(0).sample(finished, min(sample, len(finished)))
    rows = []
    with Worker(spec, out.parent / "hardware") as worker:  # a new process, as a later run would have
        for i, key in enumerate(chosen):
            old = dataset[dataset.config_key == key]
            new = worker.measure(by_key[key])
            rows.append(
                repro_row(
                    key,
                    dict(zip(old.chunk_size, old.ttft_ms, strict=True)),
                    dict(zip(new.chunk_size, new.ttft_ms, strict=True)),
                    dict(zip(new.chunk_size, new.ttft_cv, strict=True)),
                )
            )
            print(
                f"[{i + 1}/{len(chosen)}] {key}: best {rows[-1].old_best} -> {rows[-1].new_best}, "
                f"TTFT ratio {rows[-1].ratio:.2f}",
                flush=True,
            )
    return rows


def format_repro(rows: list[ReproRow]) -> str:
    agree = sum(r.agrees for r in rows) / len(rows)
    ratio = statistics.median(r.ratio for r in rows)
    ties = sum(r.tie for r in rows)
    return (
        f"reproducibility over {len(rows)} configs re-measured in a fresh process: best chunk agrees on "
        f"{agree:.0%} ({ties} of them ties within the noise; target >= 90%), median TTFT ratio new/old "
        f"{ratio:.3f} (target within 10%: {'met' if abs(ratio - 1) <= 0.10 else 'MISSED'})"
    )
