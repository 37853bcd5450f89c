"""Run records: every race (`make demo`, bench/policies.py) and every `chunkpilot train` appends one
JSON line to results/runs.jsonl (when, commit, machine, command, the prompts' seed, every policy's
figures). docs/results.md's tables and the README's results table are rendered from them by one
command, `chunkpilot results`, and tests/test_docs.py fails when the committed pages differ from
what the records render: a figure in them is never copied by hand."""

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
    """This checkout's commit, `+changes` when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
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
    saving of auto gross, warm and cold with its interval, and the strongest baseline."""
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
    regret = {
        n: sum(q["ms"][n] / q["best_ms"] - 1 for q in prompts if n in q["ms"])
        / max(1, sum(n in q["ms"] for q in prompts))
        for n in ev.policies
    }
    return {
        **stamp(command),
        "kind": "race",
        "backend": backend,
        "model": model,
        "seed": seed,
        "rounds": ev.rounds,
        "policies": list(ev.policies),
        "strongest": ev.strongest(),
        "mean_regret": regret,
        "prompts": prompts,
        "savings": savings,
    }


def train_record(command: str, metrics: dict[str, dict[str, dict[str, float]]], served: str, lineup: set[str]) -> dict:
    """A training's record: per held-out slice, the served recipe's mean and p95 regret and the
    strongest simple baseline's."""
    slices = {}
    for s in metrics[served]:
        simple = [n for n in metrics if n in lineup]
        best = min(simple, key=lambda n: metrics[n][s]["mean_regret"]) if simple else None
        slices[s] = {
            "auto": [metrics[served][s]["mean_regret"], metrics[served][s]["p95_regret"]],
            "strongest": best,
            "baseline": [metrics[best][s]["mean_regret"], metrics[best][s]["p95_regret"]] if best else None,
        }
    return {**stamp(command), "kind": "train", "recipe": served, "slices": slices}


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


def _prompts_label(record: dict) -> str:
    """Drawn prompts name their seed; lengths given on the command line are in its command."""
    return "given prompts" if record["seed"] is None else f"prompts of seed {record['seed']}"


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
        "| net cold | auto vs hand rule, net cold | mean regret auto / strongest | rounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in races:
        strongest = _saving(r, r["strongest"])
        rule = _saving(r, next((n for n in r["policies"] if "hand rule" in n), ""))
        lines.append(
            f"| {r['when'][:10]} | {r['commit']} | {_machine_label(r)} | `{r['command']}` | {r['model']} | {r['seed']} "
            f"| {r['strongest']} | {_ci(strongest['gross'])} | {_ci(strongest['warm'])} | {_ci(strongest['cold'])} "
            f"| {_ci(rule['cold']) if rule else 'n/a'} "
            f"| {r['mean_regret']['auto']:.1%} / {r['mean_regret'][r['strongest']]:.1%} | {r['rounds']} |"
        )
    lines += [
        "",
        "### Training: held-out mean regret of the served recipe against the strongest simple baseline of each slice",
        "",
        "| date | commit | machine | command | slice | auto mean / p95 | strongest simple baseline | its mean / p95 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in trains:
        for s, v in r["slices"].items():
            theirs = f"{v['baseline'][0]:.1%} / {v['baseline'][1]:.1%}" if v["baseline"] else "n/a"
            lines.append(
                f"| {r['when'][:10]} | {r['commit']} | {_machine_label(r)} | `{r['command']}` | {s} "
                f"| {v['auto'][0]:.1%} / {v['auto'][1]:.1%} | {v['strongest']} | {theirs} |"
            )
    return "\n".join(lines)


def render_readme(records: Iterable[dict]) -> str:
    """The README's results table: the latest race of each command, model and machine, and the
    latest training's `all` slice of each command."""
    latest: dict[tuple, dict] = {}
    for r in sorted(records, key=lambda r: r["when"]):
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
                f"| held-out configs of the data, trained on {_machine_label(r)} | mean regret vs the measured best "
                f"| {v['auto'][0]:.1%} | {v['strongest']} {v['baseline'][0]:.1%} | `{r['command']}` |"
            )
    return "\n".join(lines)


def replace_block(text: str, name: str, block: str) -> str:
    """`text` with what lies between `<!-- name:start -->` and `<!-- name:end -->` replaced by `block`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{block}\n{end}{after}"


PAGES = {Path("docs/results.md"): ("results", render_results), Path("README.md"): ("results", render_readme)}


def rendered(root: Path, records: list[dict]) -> dict[Path, str]:
    """Each page under `root` as the records render it."""
    return {
        root / page: replace_block((root / page).read_text(), name, render(records))
        for page, (name, render) in PAGES.items()
    }
