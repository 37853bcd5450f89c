"""`chunkpilot results`: docs/results.md's tables, the README's results table and the figures of
docs/memory.md, docs/backends.md and docs/performance.md rendered from the run records
(results/runs.jsonl, evaluation/records.py), never copied by hand."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "render the results pages and tables of the docs and the README from the run records (results/runs.jsonl)"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")


def run(args: argparse.Namespace) -> int:
    from evaluation.records import read_records, rendered, results_path

    pages = rendered(Path("."), read_records(results_path()))
    stale = [str(page) for page, text in pages.items() if page.read_text() != text]
    if args.check:
        print(f"out of date: {', '.join(stale)}" if stale else "the pages match the records")
        return 1 if stale else 0
    for page in stale:
        Path(page).write_text(pages[Path(page)])
    print(f"rendered {', '.join(stale) or 'nothing: the pages already match'} from {results_path()}")
    return 0
