"""A long-lived measuring process: set up once like the engine (allocator, threads), fed configs
one at a time, restarted if it dies. The parent process only plans and writes."""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from pathlib import Path

import pandas as pd

from chunkpilot.contract import ConfigError

from .spec import ProfileConfig, Spec


def _serve(tasks: mp.Queue, results: mp.Queue, spec: Spec, hardware_dir: str) -> None:
    from engine.hardware import descriptors

    from .measure_config import EnginePool, measure_config

    pool = EnginePool(spec.device)
    while (task := tasks.get()) is not None:
        config, deadline = task
        try:
            hardware = descriptors(Path(hardware_dir), config.dtype, config.threads, spec.device)
            results.put(("ok", measure_config(pool, config, spec, hardware, deadline)))
        except ConfigError as exc:
            results.put(("config", (exc.field, exc.message)))
        except Exception:  # report and keep serving: one bad config must not end the sweep
            results.put(("error", traceback.format_exc(limit=3)))


class WorkerError(RuntimeError):
    pass


class Worker:
    def __init__(self, spec: Spec, hardware_dir: Path) -> None:
        self.spec, self.hardware_dir = spec, hardware_dir
        self.ctx = mp.get_context("spawn")  # a fresh interpreter: no state inherited from the parent
        self.process: mp.Process | None = None

    def _start(self) -> None:
        self.tasks, self.results = self.ctx.Queue(), self.ctx.Queue()
        # not a daemon: measuring llama.cpp starts child processes (engine/isolation.py); close() ends it
        self.process = self.ctx.Process(
            target=_serve, args=(self.tasks, self.results, self.spec, str(self.hardware_dir))
        )
        self.process.start()

    def measure(self, config: ProfileConfig, deadline: float | None = None) -> pd.DataFrame:
        """`config`'s rows; no remeasuring of a noisy config past `deadline` (time.time())."""
        if self.process is None or not self.process.is_alive():
            self._start()
        self.tasks.put((config, deadline))
        while True:
            try:
                status, payload = self.results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    code = self.process.exitcode
                    self.process = None
                    raise WorkerError(f"worker died (exit code {code}) while measuring {config.key}") from None
        if status == "config":
            raise ConfigError(*payload)
        if status == "error":
            raise WorkerError(f"measuring {config.key} failed:\n{payload}")
        return payload

    def close(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.tasks.put(None)
            self.process.join(timeout=5)
            if self.process.is_alive():
                self.process.terminate()
        self.process = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
