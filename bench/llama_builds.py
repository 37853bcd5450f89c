"""Two (or more) builds of llama.cpp side by side on this machine: prefill tokens/s of one model at
one chunk size, per quantisation. A build is a folder of llama.cpp's shared libraries of the
installed llama-cpp-python's version (the package's own `llama_cpp/lib`, a variant beside it such as
`llama_cpp/lib-avx512`, or another build's, e.g. pip's default native one installed with `pip install
--no-deps --target DIR`, then DIR/llama_cpp/lib). Each measurement runs in a child process of its
own that loads that folder ($LLAMA_CPP_LIB_PATH), so that a build that crashes on this CPU is
reported (`died of SIGILL`), not fatal; builds and
quantisations alternate round by round, each child decoding one warm-up chunk then --repeats
chunks of --tokens tokens from an empty context. Prints each build's median tokens/s and, against
the first build, the ratio with its 95% bootstrap interval over rounds.

    .venv/bin/python bench/llama_builds.py --build native=/tmp/llama-native --build portable=venv \\
        --model llama-110m --tokens 512 --quants f32,q8_0 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from chunkpilot.contract import QUANTS, ConfigError, number
from engine.isolation import how_it_ended
from engine.llama_lib import LIB_PATH
from judge.intervals import median_ratio


def child(gguf: str, tokens: int, repeats: int, threads: int) -> None:
    """In the measuring child: print {"features", "ms": [...]} as one JSON line."""
    from engine.backends import decode_chunks
    from engine.llama_lib import llama_cpp

    llm = llama_cpp().Llama(gguf, n_ctx=tokens + 256, n_batch=tokens, n_ubatch=tokens, n_threads=threads, verbose=False)
    ids = [3 + i % 200 for i in range(tokens)]
    decode_chunks(llm, ids, [tokens])  # warm-up
    ms = [decode_chunks(llm, ids, [tokens])[0] for _ in range(repeats)]
    features = llama_cpp().llama_print_system_info().decode().strip()
    print(json.dumps({"features": features, "ms": ms}), flush=True)


def measure(folder: str, gguf: Path, tokens: int, repeats: int, threads: int) -> dict:
    """One child's measurement loading the libraries in `folder`, or how it ended."""
    env = {**os.environ, LIB_PATH: str(Path(folder).resolve())}
    command = [sys.executable, __file__, "--child", str(gguf), str(tokens), str(repeats), str(threads)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        return {"died": how_it_ended(run.returncode)}
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        gguf, tokens, repeats, threads = sys.argv[2], *map(int, sys.argv[3:6])
        return child(gguf, tokens, repeats, threads)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="append", required=True, help="NAME=FOLDER of libllama.so; repeat")
    parser.add_argument("--model", default="llama-110m", help="preset, checkpoint folder or shape file")
    parser.add_argument("--tokens", default="512", help="the chunk: tokens decoded at once (16-8192)")
    parser.add_argument("--quants", default="f32,q8_0", help=f"comma-separated, of {', '.join(QUANTS)}")
    parser.add_argument("--rounds", default="5", help="rounds, each child once per build and quantisation (1-100)")
    parser.add_argument("--repeats", default="3", help="timed decodes in each child after its warm-up (1-100)")
    parser.add_argument("--threads", default=str(os.cpu_count() or 1), help="llama.cpp threads")
    args = parser.parse_args()
    try:
        tokens = number("tokens", args.tokens, int, ge=16, le=8192)
        rounds = number("rounds", args.rounds, int, ge=1, le=100)
        repeats = number("repeats", args.repeats, int, ge=1, le=100)
        threads = number("threads", args.threads, int, ge=1, le=1024)
        quants = args.quants.split(",")
        if bad := [q for q in quants if q not in QUANTS]:
            raise ConfigError("quants", f"each must be one of {', '.join(QUANTS)}; got {bad}")
        builds = dict(b.split("=", 1) for b in args.build if "=" in b)
        if len(builds) != len(args.build) or not all((Path(f) / "libllama.so").is_file() for f in builds.values()):
            raise ConfigError("build", "each must be NAME=FOLDER, a folder holding libllama.so")
    except ConfigError as exc:
        parser.error(str(exc))

    from engine.backends import weights_of
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.gguf_export import write_gguf

    engine = Engine(EngineConfig(model=args.model, threads=threads))
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / "chunkpilot-llama-builds"
    ggufs = {q: folder / f"{Path(args.model).stem}-{q}.gguf" for q in quants}
    for q, path in ggufs.items():
        if not path.exists():
            write_gguf(weights_of(engine.model), engine.shape, path, q)
    del engine
    keys = [(b, q) for q in quants for b in builds]
    seen: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
    said: dict[tuple[str, str], dict] = {}
    t0 = time.monotonic()
    for r in range(rounds):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            if "died" in said.get(k, {}):
                continue
            said[k] = measure(builds[k[0]], ggufs[k[1]], tokens, repeats, threads)
            if "ms" in said[k]:
                seen[k].append(statistics.median(said[k]["ms"]))
        print(f"round {r + 1}/{rounds} done, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"{args.model}, {tokens}-token chunk from an empty context, {threads} threads, {rounds} rounds")
    for name, where in builds.items():
        features = next((said[(name, q)].get("features") for q in quants if "features" in said[(name, q)]), "?")
        print(f"  {name} ({where}): {features}")
    first = next(iter(builds))
    rng = np.random.default_rng(0)
    for q in quants:
        for name in builds:
            k = (name, q)
            if "died" in said[k]:
                print(f"{q:>7} {name:>10}: {said[k]['died']}")
                continue
            line = f"{q:>7} {name:>10}: {tokens / statistics.median(seen[k]) * 1e3:8.0f} tokens/s"
            base = seen[(first, q)]
            if name != first and base and len(base) == len(seen[k]):
                speed, low, high = median_ratio(base, seen[k], rng)  # time ratio first / this = speed ratio
                line += f"  x{speed:.3f} [{low:.3f}, {high:.3f}] of {first}"
            print(line)


if __name__ == "__main__":
    main()
