"""Screenshots of the MLflow UI over a store (by default the demo's, `mlruns/mlflow.db`): the
`chunk-size` runs sorted by mean regret, the compare view of the served recipe beside the
baselines, and the registered model version's page, each taken by headless Chromium into docs/.

    .venv/bin/python tools/mlflow_screenshots.py [--store sqlite:///mlruns/mlflow.db] [--out docs]

Needs a Chromium (`apt-get install chromium`); starts and stops its own `mlflow server` on a free
loopback port.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from mlflow import MlflowClient

from cli.processes import answers, free_port, start_mlflow_server
from store.registry import CHAMPION, MODEL_NAME

# the runs a reader compares: the served recipe, its plain argmin, the old default and the fixed policies
COMPARED = ["per-chunk", "per-chunk-argmin", "lgbm-rank-level", "hand-rule", "fixed-1024", "best-single-size"]


def shoot(browser: str, url: str, path: Path, size: str) -> None:
    """One page, after the single-page app has fetched and drawn (virtual time lets it settle)."""
    subprocess.run(
        [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={size}",
            "--virtual-time-budget=20000",
            f"--screenshot={path}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    print(f"{path}  <- {url}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="sqlite:///mlruns/mlflow.db", help="the MLflow tracking URI to show")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="where the PNGs go")
    args = parser.parse_args()
    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if browser is None:
        print("mlflow_screenshots: no Chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    client = MlflowClient(args.store)
    experiment = client.get_experiment_by_name("chunk-size")
    if experiment is None:
        print(f"mlflow_screenshots: {args.store} has no chunk-size experiment; run `make demo` first", file=sys.stderr)
        return 2
    runs = {r.info.run_name: r.info.run_id for r in client.search_runs([experiment.experiment_id])}
    compared = [runs[name] for name in COMPARED if name in runs]
    version = client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version

    port = free_port()
    server = start_mlflow_server(args.store, port)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if answers(f"{base}/health"):
                break
            time.sleep(0.5)
        else:
            print("mlflow_screenshots: mlflow server did not answer /health in 60 s", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        ids = experiment.experiment_id
        order = f"orderByKey={quote('metrics.`mean_regret`')}&orderByAsc=true"
        compare = f"runs={quote(json.dumps(compared))}&experiments={quote(json.dumps([ids]))}"
        pages = {  # file: (page, window size); the compare view is tall so its parameter and metric rows show
            "mlflow_runs.png": (f"#/experiments/{ids}/runs?{order}", "1900,900"),
            "mlflow_compare.png": (f"#/compare-runs?{compare}", "1900,2300"),
            "mlflow_model.png": (f"#/models/{MODEL_NAME}/versions/{version}", "1600,900"),
        }
        for name, (page, size) in pages.items():
            shoot(browser, f"{base}/{page}", args.out / name, size)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
