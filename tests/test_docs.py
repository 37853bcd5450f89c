"""The commands README.md and docs/ quote still parse: every `chunkpilot` subcommand exists and
accepts the flags used, every `make` target exists, and every script's `--help` lists the flags
the docs give it. So the docs cannot drift from the CLI."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from cli import build_parser

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(?:\.venv/bin/)?(?:chunkpilot |make |(?:\.venv/bin/)?python (?:bench|tools)/|tools/\S+\.sh)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def quoted_commands(path: Path) -> list[str]:
    """Commands in ```bash blocks (continuation lines joined) and inline code that starts with one."""
    text = path.read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            found.append(line)
    found += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    return [c.strip() for c in found if COMMAND.match(c.strip())]


def commands() -> list[tuple[str, str]]:
    return [(path.name, command) for path in DOCS for command in quoted_commands(path)]


def test_the_docs_quote_commands_at_all():
    quoted = commands()
    assert len(quoted) > 30 and {"README.md"} < {name for name, _ in quoted}


def test_every_chunkpilot_command_names_a_subcommand_and_its_flags():
    subparsers = next(a for a in build_parser()._actions if a.dest == "command").choices
    for name, command in commands():
        words = command.removeprefix(".venv/bin/").split()
        if words[0] != "chunkpilot":
            continue
        assert words[1] in subparsers, f"{name}: `{command}`: no subcommand {words[1]!r}"
        accepted = subparsers[words[1]]._option_string_actions
        for flag in FLAG.findall(command):
            assert flag in accepted, f"{name}: `{command}`: chunkpilot {words[1]} has no {flag}"


def test_every_make_target_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    for name, command in commands():
        if command.startswith("make "):
            assert command.split()[1] in targets, f"{name}: `{command}`: no make target"


# every Python script's `--help` in one process, as `python SCRIPT --help` runs it (its folder first
# on sys.path): torch and mlflow are imported once, not once a script
HELPS = """
import contextlib, io, json, runpy, sys
scripts, helps = sys.argv[1:], {}
for script in scripts:
    sys.argv, text, code = [script, "--help"], io.StringIO(), 0
    sys.path.insert(0, script.rpartition("/")[0])
    with contextlib.redirect_stdout(text):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as done:
            code = done.code
    sys.path.pop(0)
    helps[script] = [code or 0, text.getvalue()]
print(json.dumps(helps))
"""


@pytest.mark.slow  # the scripts' --help imports what they need (torch, mlflow)
def test_every_script_s_help_lists_the_flags_the_docs_use():
    scripts: dict[str, set[str]] = {}
    for name, command in commands():
        words = shlex.split(command.replace(".venv/bin/", ""), comments=True)
        script = next((w for w in words if w.startswith(("bench/", "tools/"))), None)
        if script is not None:
            assert (ROOT / script).is_file(), f"{name}: `{command}`: no {script}"
            scripts.setdefault(script, set()).update(FLAG.findall(command))
    assert scripts

    python = [s for s in scripts if s.endswith(".py")]
    done = subprocess.run([sys.executable, "-c", HELPS, *python], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    helps = json.loads(done.stdout.splitlines()[-1])
    for script in set(scripts) - set(python):
        shell = subprocess.run([script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        helps[script] = [shell.returncode, shell.stdout + shell.stderr]
    for script, flags in scripts.items():
        code, text = helps[script]
        assert code == 0, f"{script} --help: exit {code}: {text[-500:]}"
        for flag in flags:
            assert flag in text, f"{script} --help does not list {flag}"


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as -."""
    headings = re.findall(r"^#+ (.*)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(path):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text()):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_readme_is_a_front_door_of_at_most_150_lines():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    sections = re.findall(r"^## (.*)$", readme, re.M)
    assert sections[:2] == ["The two commands", "What `make demo` tells you"]  # what it is comes first


def test_the_results_pages_are_what_the_run_records_render():
    """docs/results.md's tables and the README's results table come from results/runs.jsonl
    (`chunkpilot results`), never from hand: an edit by hand, or a record not rendered, fails here."""
    from evaluation.records import read_records, rendered

    for page, text in rendered(ROOT, read_records(ROOT / "results" / "runs.jsonl")).items():
        assert page.read_text() == text, f"{page.name} differs from its records: run .venv/bin/chunkpilot results"


def test_a_race_s_row_shows_its_hindsight_bound_and_older_records_say_they_have_none():
    """Made-up records (not measurements): the results page's race table reads each record's
    hindsight bound (judge.savings.hindsight), gross with its net cold; records from before it, n/a."""
    from evaluation.records import render_results

    race = {
        "kind": "race",
        "when": "2026-12-07T08:00:00+00:00",
        "commit": "abc1234",
        "device_name": "AMD EPYC",
        "hardware_id": "0123456789ab",
        "command": "make demo",
        "model": "llama-tiny",
        "seed": 7,
        "rounds": 12,
        "policies": ["auto", "one shot"],
        "strongest": "one shot",
        "mean_regret": {"auto": 0.01, "one shot": 0.02},
        "savings": [{"reference": "one shot", "gross": [0.01, -0.01, 0.03], "warm": [0.01, -0.01, 0.03]}],
        "hindsight": {"gross": [0.02, 0.005, 0.04], "cold": [0.021, 0.006, 0.041]},
    }
    race["savings"][0]["cold"] = [0.0, -0.02, 0.02]
    older = {key: value for key, value in race.items() if key != "hindsight"} | {"when": "2026-12-01T08:00:00+00:00"}
    rows = [line for line in render_results([race, older]).splitlines() if "| abc1234 |" in line]
    # after auto's net cold against the strongest: the bound, then auto against the hand rule (none here)
    assert "| +0.0% [-2.0%, +2.0%] | +2.0% [+0.5%, +4.0%] (+2.1%) | n/a |" in rows[0]
    assert "| +0.0% [-2.0%, +2.0%] | n/a | n/a |" in rows[1]


def test_a_training_s_row_names_the_data_it_read_and_older_records_say_they_did_not():
    """Made-up records (not measurements): a training's record keeps its configs per spec
    (training.train.data_sources); the results page and the README's table name them, and a record
    from before they were kept says so rather than guess."""
    from evaluation.records import render_readme, render_results

    slices = {"all": {"auto": [0.022, 0.09], "strongest": "one-shot", "baseline": [0.023, 0.1]}}
    stamp = {"commit": "abc1234", "device_name": "AMD EPYC", "hardware_id": "0123456789ab"}
    train = {**stamp, "kind": "train", "when": "2026-12-07T08:00:00+00:00", "command": "chunkpilot train"}
    trained = {**train, "recipe": "per-chunk", "slices": slices, "sources": {"cpu-shipped": 71, "llama-cpp": 22}}
    older = {**train, "command": "chunkpilot train --compare quick", "recipe": "per-chunk", "slices": slices}
    rows = [line for line in render_results([trained, older]).splitlines() if "| abc1234 |" in line]
    assert "| 93 configs (cpu-shipped 71, llama-cpp 22) | all |" in rows[0]
    assert "| data not recorded | all |" in rows[1]
    readme = render_readme([trained, older])
    assert "trained on AMD EPYC `0123456789ab`: 93 configs (cpu-shipped, llama-cpp) |" in readme
    assert "trained on AMD EPYC `0123456789ab`: data not recorded |" in readme
