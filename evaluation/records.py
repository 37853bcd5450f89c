"""Run records: every race (`make demo`, bench/policies.py), every `chunkpilot train` and the
memory and chunking benches (bench/memory.py, bench/chunking_pays.py) append one JSON line to
results/runs.jsonl (when, commit, machine, command, the prompts' seed, every figure).
docs/results.md's tables, the README's results table and the figures of docs/memory.md and
docs/backends.md are rendered from them by one command, `chunkpilot results`, and
tests/test_docs.py fails when the committed pages differ from what the records render: a figure in
them is never copied by hand."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path("results/runs.jsonl")  # in the working directory; $CHUNKPILOT_RESULTS elsewhere (the tests' own)


def results_path() -> Path:
    return Path(os.environ.get("CHUNKPILOT_RESULTS") or RESULTS)


def _commit() -> str:
    """This checkout's commit, `+changes` when the working tree differs from it in more than the
    records themselves (a session's second record is made by the same code as its first)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS}"]
        dirty = subprocess.run(status, capture_output=True, text=True)
        return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _machine() -> dict:
    from engine.machine import fingerprint

    found = fingerprint("cpu")
    return {k: found[k] for k in ("hardware_id", "device_name", "cores")}


def stamp(command: str) -> dict:
    """What every record starts with: when, the commit, the machine, the command."""
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        **_machine(),
        "command": command,
    }


def race_record(ev, command: str, seed: int | None, backend: str, model: str) -> dict:
    """A race's record (evaluation.comparison.Evaluation): each prompt's choices and medians, each
    saving of auto gross, warm and cold with its interval, the strongest baseline, and what the best
    size of each prompt, picked in hindsight, saves over it (judge.savings.hindsight)."""
    prompts = [
        {
            "prompt": p.case.label,
            "best": p.best,
            "best_ms": p.median(p.best),
            "chosen": dict(p.choices),
            "ms": {n: p.median(c) for n, c in p.choices.items()},
            "cold_ms": {n: p.cold_ms(n) for n in p.choices},
            "warm_ms": {n: p.steady_ms(n) for n in p.choices},
        }
        for p in ev.prompts
    ]
    savings = [
        {
            "reference": s.reference,
            "prompts": s.prompts,
            "gross": [s.saving, s.low, s.high],
            "warm": [s.warm, s.warm_low, s.warm_high],
            "cold": [s.cold, s.cold_low, s.cold_high],
        }
        for s in ev.savings
    ]
    regret = {n: ev.mean_regret(n) for n in ev.policies}
    bound = ev.hindsight
    return {
        **stamp(command),
        "kind": "race",
        "backend": backend,
        "model": model,
        "seed": seed,
        "rounds": ev.rounds,
        "policies": list(ev.policies),
        "strongest": ev.strongest(),
        "hindsight": None
        if bound is None
        else {"gross": [bound.saving, bound.low, bound.high], "cold": [bound.cold, bound.cold_low, bound.cold_high]},
        "mean_regret": regret,
        "prompts": prompts,
        "savings": savings,
    }


def train_record(
    command: str,
    metrics: dict[str, dict[str, dict[str, float]]],
    served: str,
    lineup: set[str],
    sources: dict[str, int],
) -> dict:
    """A training's record: what it read (configs per spec, training.train.data_sources), and per
    held-out slice the served recipe's mean and p95 regret and the strongest simple baseline's."""
    slices = {}
    for s in metrics[served]:
        simple = [n for n in metrics if n in lineup]
        best = min(simple, key=lambda n: metrics[n][s]["mean_regret"]) if simple else None
        slices[s] = {
            "auto": [metrics[served][s]["mean_regret"], metrics[served][s]["p95_regret"]],
            "strongest": best,
            "baseline": [metrics[best][s]["mean_regret"], metrics[best][s]["p95_regret"]] if best else None,
        }
    return {**stamp(command), "kind": "train", "recipe": served, "sources": sources, "slices": slices}


def memory_record(command: str, report) -> dict:
    """bench/memory.py's record (training.memory.MemoryReport): the memory model's held-out error
    over all and per backend and kernel, and each budget's decisions, compliance and TTFT given up."""
    return {
        **stamp(command),
        "kind": "memory",
        "rows": report.rows,
        "configs": report.configs,
        "error": [report.mean_error, report.p95_error],
        "per_kind": {
            kind: {"configs": n, "error": [mean, p95], "margin": margin}
            for kind, (mean, p95, n, margin) in report.per_backend.items()
        },
        "budgets": [
            {
                "share": b.share,
                "decisions": b.decisions,
                "refused": b.refused,
                "kept": b.kept,
                "given_up": [b.given_up, b.given_up_p95],
            }
            for b in report.budgets
        ],
    }


def chunking_record(command: str, spec: str, configs) -> dict:
    """bench/chunking_pays.py's record (its per-config frame, kept whole): per machine, backend and
    kernel, the configs, the sizes that were best, and each baseline's mean and largest regret."""
    groups = []
    for (hardware, backend, kernel), group in configs.groupby(["hardware_id", "backend", "kernel"]):
        best = group.best.astype(str).value_counts()
        groups.append(
            {
                "hardware_id": hardware,
                "backend": backend,
                "kernel": kernel,
                "configs": len(group),
                "models": sorted(set(group.model)),
                "best": {size: int(count) for size, count in best.items()},
                "spread": float(group.spread.mean()),
                "regret": {
                    name: [float(group[name].mean()), float(group[name].max())]
                    for name in ("one_shot", "default", "best_single")
                },
                "single": sorted(set(group.single)),
            }
        )
    every = json.loads(configs.to_json(orient="records"))  # each config's line, plain JSON types
    return {**stamp(command), "kind": "chunking", "spec": spec, "groups": groups, "configs": every}


def append_record(record: dict, path: Path | None = None) -> Path:
    path = path or results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def read_records(path: Path = RESULTS) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ci(triple: list[float]) -> str:
    value, low, high = triple
    return f"{value:+.1%} [{low:+.1%}, {high:+.1%}]"


def _saving(record: dict, reference: str) -> dict | None:
    return next((s for s in record["savings"] if s["reference"] == reference), None)


def _bound(record: dict) -> str:
    """The hindsight bound of a race (recorded since 2026-12-07; older records: n/a)."""
    found = record.get("hindsight")
    return f"{_ci(found['gross'])} ({found['cold'][0]:+.1%})" if found else "n/a"


def _prompts_label(record: dict) -> str:
    """Drawn prompts name their seed; lengths given on the command line are in its command."""
    return "given prompts" if record["seed"] is None else f"prompts of seed {record['seed']}"


def _sources_label(record: dict, names_only: bool = False) -> str:
    """What a training read: its configs and their specs (records before they said so: not recorded)."""
    sources = record.get("sources")
    if not sources:
        return "data not recorded"
    specs = ", ".join(name if names_only else f"{name} {n}" for name, n in sources.items())
    return f"{sum(sources.values())} configs ({specs})"


def _machine_label(record: dict) -> str:
    return f"{record['device_name']} `{record['hardware_id']}`"


def render_results(records: Iterable[dict]) -> str:
    """docs/results.md's generated part: every race and training, newest first."""
    records = list(records)
    races = sorted((r for r in records if r["kind"] == "race"), key=lambda r: r["when"], reverse=True)
    trains = sorted((r for r in records if r["kind"] == "train"), key=lambda r: r["when"], reverse=True)
    lines = [
        "### Races: `auto` against the strongest baseline of each run",
        "",
        "| date | commit | machine | command | model | seed | strongest baseline | auto vs it, gross | net warm "
        "| net cold | best in hindsight vs it: gross (net cold) | auto vs hand rule, net cold "
        "| mean regret auto / strongest | rounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in races:
        strongest = _saving(r, r["strongest"])
        rule = _saving(r, next((n for n in r["policies"] if "hand rule" in n), ""))
        lines.append(
            f"| {r['when'][:10]} | {r['commit']} | {_machine_label(r)} | `{r['command']}` | {r['model']} | {r['seed']} "
            f"| {r['strongest']} | {_ci(strongest['gross'])} | {_ci(strongest['warm'])} | {_ci(strongest['cold'])} "
            f"| {_bound(r)} | {_ci(rule['cold']) if rule else 'n/a'} "
            f"| {r['mean_regret']['auto']:.1%} / {r['mean_regret'][r['strongest']]:.1%} | {r['rounds']} |"
        )
    lines += [
        "",
        "### Training: held-out mean regret of the served recipe against the strongest simple baseline of each slice",
        "",
        "| date | commit | machine | command | trained on | slice | auto mean / p95 | strongest simple baseline "
        "| its mean / p95 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in trains:
        for s, v in r["slices"].items():
            theirs = f"{v['baseline'][0]:.1%} / {v['baseline'][1]:.1%}" if v["baseline"] else "n/a"
            lines.append(
                f"| {r['when'][:10]} | {r['commit']} | {_machine_label(r)} | `{r['command']}` "
                f"| {_sources_label(r)} | {s} "
                f"| {v['auto'][0]:.1%} / {v['auto'][1]:.1%} | {v['strongest']} | {theirs} |"
            )
    return "\n".join(lines)


def render_readme(records: Iterable[dict]) -> str:
    """The README's results table: the latest race of each command, model and machine, and the
    latest training's `all` slice of each command."""
    latest: dict[tuple, dict] = {}
    for r in sorted((r for r in records if r["kind"] in ("race", "train")), key=lambda r: r["when"]):
        key = (
            (r["kind"], r["command"], r.get("model"), r["hardware_id"])
            if r["kind"] == "race"
            else (r["kind"], r["command"])
        )
        latest[key] = r
    lines = ["| where | what | auto | against | command |", "|---|---|---|---|---|"]
    for r in sorted(latest.values(), key=lambda r: (r["kind"] != "race", r["command"], r["when"])):
        if r["kind"] == "race":
            s = _saving(r, r["strongest"])
            lines.append(
                f"| {_machine_label(r)}, {r['backend']} ({r['model']}), {_prompts_label(r)} "
                f"| TTFT saved, net of cold decisions (gross) | {_ci(s['cold'])} ({s['gross'][0]:+.1%}) "
                f"| the strongest baseline here: {r['strongest']} | `{r['command']}` |"
            )
        else:
            v = r["slices"]["all"]
            lines.append(
                f"| held-out configs, trained on {_machine_label(r)}: {_sources_label(r, names_only=True)} "
                "| mean regret vs the measured best "
                f"| {v['auto'][0]:.1%} | {v['strongest']} {v['baseline'][0]:.1%} | `{r['command']}` |"
            )
    return "\n".join(lines)


def replace_block(text: str, name: str, block: str) -> str:
    """`text` with what lies between `<!-- name:start -->` and `<!-- name:end -->` replaced by `block`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{block}\n{end}{after}"


def _latest(records: Iterable[dict], kind: str) -> dict | None:
    return max((r for r in records if r["kind"] == kind), key=lambda r: r["when"], default=None)


def _provenance(r: dict) -> str:
    return f"`{r['command']}` at {r['commit']} on the {_machine_label(r)}, {r['when'][:10]}"


def _table(columns: list[str], rows: Iterable[str]) -> list[str]:
    """A markdown table's lines: its header, its rule and `rows`."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows]


def _unrecorded(script: str) -> str:
    return f"No run recorded yet: run `.venv/bin/python {script}`, then `chunkpilot results`."


def render_memory(records: Iterable[dict]) -> str:
    """docs/memory.md's figures: the latest bench/memory.py record."""
    r = _latest(records, "memory")
    if r is None:
        return _unrecorded("bench/memory.py")
    mean, p95 = r["error"]
    kinds = [
        f"| {kind} | {v['configs']} | {v['error'][0]:.1%} | {v['error'][1]:.1%} | {v['margin']:.1%} |"
        for kind, v in r["per_kind"].items()
    ]
    budgets = [
        f"| {b['share']:.0%} | {b['decisions']} | {b['refused']} | {b['kept']:.1%} "
        f"| {b['given_up'][0]:+.1%} / {b['given_up'][1]:+.1%} |"
        for b in r["budgets"]
    ]
    return "\n".join(
        [
            f"From {_provenance(r)}:",
            "",
            *_table(
                ["backend, kernel", "configs", "held-out error, mean", "p95", "safety margin"],
                [*kinds, f"| all ({r['rows']} rows) | {r['configs']} | {mean:.1%} | {p95:.1%} | |"],
            ),
            "",
            *_table(
                [
                    "budget (share of one shot's measured peak)",
                    "decisions",
                    "refused (no size predicted to fit)",
                    "measured peak within the budget (target 99%)",
                    "TTFT given up vs the unconstrained choice, mean / p95",
                ],
                budgets,
            ),
        ]
    )


def render_chunking(records: Iterable[dict]) -> str:
    """docs/backends.md's "does chunking pay" table: the latest bench/chunking_pays.py record."""
    r = _latest(records, "chunking")
    if r is None:
        return _unrecorded("bench/chunking_pays.py")
    rows = []
    for g in r["groups"]:
        best = ", ".join(f"{size} ({count})" for size, count in g["best"].items())
        regret = {name: f"{mean:.1%} ({top:.1%})" for name, (mean, top) in g["regret"].items()}
        rows.append(
            f"| `{g['hardware_id']}` | {g['backend']}, {g['kernel']} | {g['configs']} | {best} "
            f"| {regret['one_shot']} | {regret['default']} | {regret['best_single']}: {', '.join(g['single'])} |"
        )
    columns = ["machine", "backend, kernel", "configs", "best size (configs)", "one shot", "backend default"]
    columns.append("best single size of the spec's rows")
    intro = f"From {_provenance(r)}; regret against the measured best, mean (max):"
    return "\n".join([intro, "", *_table(columns, rows)])


def render_latency(records: Iterable[dict]) -> str:
    """docs/performance.md's decision latency table: the latest bench/predictor_latency.py record."""
    r = _latest(records, "latency")
    if r is None:
        return _unrecorded("bench/predictor_latency.py")
    rows = [
        f"| {f['path']} | {f['seconds']:.3g} s | |"
        if "seconds" in f
        else f"| {f['path']} | {f['p50_ms']:.3f} ms | {f['p99_ms']:.3f} ms |"
        for f in r["figures"]
    ]
    return "\n".join([f"From {_provenance(r)}:", "", *_table(["path", "p50", "p99"], rows)])


PAGES = {  # page -> its generated block's name and its renderer
    Path("docs/results.md"): ("results", render_results),
    Path("README.md"): ("results", render_readme),
    Path("docs/memory.md"): ("memory", render_memory),
    Path("docs/backends.md"): ("chunking", render_chunking),
    Path("docs/performance.md"): ("latency", render_latency),
}


def rendered(root: Path, records: list[dict]) -> dict[Path, str]:
    """Each page under `root` as the records render it."""
    return {
        root / page: replace_block((root / page).read_text(), name, render(records))
        for page, (name, render) in PAGES.items()
    }
