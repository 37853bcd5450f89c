"""The options several commands share (engine, attention, `auto`), and what they build: parsed
once here for `prefill`, `prefill --prompts` and the demo."""

from __future__ import annotations

import argparse
from pathlib import Path

from chunkpilot.contract import AttentionConfig, ConfigError, number
from engine.config import EngineConfig
from engine.policy import DECISION_TIMEOUT_S

from .fields import add_fields, values

ENGINE_FLAGS = {
    "model": "--model",
    "dtype": "--dtype",
    "threads": "--threads",
    "attn_impl": ("--attn-impl", "--attn"),
    "device": "--device",
    "seed": "--seed",
    "compile": "--compile",
    "backend": "--backend",
    "quant": "--quant",
    "memory_budget_mb": "--memory-budget-mb",
}
ATTENTION_FLAGS = {"layout": "--kv-layout", "sinks": "--sinks"}  # --window: the model's own by default


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_fields(parser, EngineConfig, ENGINE_FLAGS)


def add_attention_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window", help="sliding window in tokens, or 'none' (default: the model's own)")
    add_fields(parser, AttentionConfig, ATTENTION_FLAGS)
    parser.add_argument(
        "--global-tokens",
        action="append",
        help="tokens every later query sees besides the window "
        "(selective SWA): positions 0,17,42, a token id id:5 or text:MARKER (its every occurrence); "
        "repeatable",
    )


def add_predictor_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--predictor-url", default="http://127.0.0.1:8000", help="the service `auto` asks")
    parser.add_argument(
        "--predictor-token",
        help="the service's admin token, sent with the telemetry (default: $CHUNKPILOT_ADMIN_TOKEN; "
        "prefer the variable: a flag shows in the process list)",
    )
    parser.add_argument(
        "--predictor-timeout-ms",
        default=f"{DECISION_TIMEOUT_S * 1e3:g}",
        help="give up on the service after this long (its anchor, the strongest simple baseline, answers)",
    )
    parser.add_argument("--in-process", action="store_true", help="auto: load the champion here instead of HTTP")
    parser.add_argument("--no-telemetry", action="store_true", help="auto: do not report the prefills' outcomes")
    parser.add_argument(
        "--schedule",
        action="store_true",
        help="auto: ask for a chunk schedule (sizes that change "
        "along the prompt) chosen by the per-chunk cost model, when the champion has one",
    )
    parser.add_argument(
        "--telemetry-dir",
        type=Path,
        help="auto --in-process: the local partition of the outcomes "
        "(default: the service's, $CHUNKPILOT_TELEMETRY_DIR or data/ttft/telemetry)",
    )


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """What `train` and `retrain` share: the LightGBM size and what the recipe is judged beside."""
    # the defaults: estimator.cost_models.LGBM (not imported here: LightGBM stays out of --help)
    parser.add_argument("--n-estimators", help="LightGBM trees of each member")
    parser.add_argument("--num-leaves", help="LightGBM leaves per tree")
    parser.add_argument("--learning-rate", help="LightGBM learning rate")
    parser.add_argument(
        "--compare",
        default="all",
        help="what the registered recipe is judged beside, each its own MLflow run: all (every baseline "
        "and recipe: the training table), recipes (the recipes and the quick baselines) or quick (fixed "
        "1024, the best fixed size, the hand rule and the simple rule: seconds); default all",
    )


def lgbm_params(args: argparse.Namespace) -> dict:
    """The LightGBM parameters given, over the cost models' defaults."""
    params: dict = {}
    if args.n_estimators is not None:
        params["num_boost_round"] = number("n_estimators", args.n_estimators, int, ge=1, le=100_000)
    if args.num_leaves is not None:
        params["num_leaves"] = number("num_leaves", args.num_leaves, int, ge=2, le=100_000)
    if args.learning_rate is not None:
        params["learning_rate"] = number("learning_rate", args.learning_rate, float, gt=0, le=1)
    return params


def compare(args: argparse.Namespace) -> str:
    from training.train import COMPARE  # training's imports stay out of the commands that do not train

    if args.compare not in COMPARE:
        raise ConfigError("compare", f"must be one of {', '.join(COMPARE)}; got {args.compare!r}")
    return args.compare


def auto_from_args(args: argparse.Namespace, engine):
    """The `auto` policy for this engine: over HTTP, or in-process with --in-process."""
    from auto.client import make_auto
    from auto.telemetry import Reporter, to_partition, to_service
    from store.tracking import tracking_uri

    timeout_ms = number("predictor_timeout_ms", args.predictor_timeout_ms, int, ge=1, le=60_000)
    if args.in_process:
        from predictor.settings import Settings

        directory = args.telemetry_dir or Settings().telemetry_dir
        reporter = None if args.no_telemetry else Reporter(to_partition(directory))
        return make_auto(engine.hardware(), tracking=tracking_uri(), reporter=reporter, schedule=args.schedule)
    reporter = None if args.no_telemetry else Reporter(to_service(args.predictor_url, args.predictor_token))
    return make_auto(
        engine.hardware(),
        service=args.predictor_url,
        timeout_s=timeout_ms / 1e3,
        reporter=reporter,
        schedule=args.schedule,
    )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**values(args, ENGINE_FLAGS))


def global_tokens(args: argparse.Namespace):
    """--global-tokens as the engine's GlobalTokens (None: not given)."""
    from engine.global_tokens import GlobalTokens

    return None if not args.global_tokens else GlobalTokens.parse(args.global_tokens)


def attention_config(args: argparse.Namespace, model_window: int | None) -> AttentionConfig:
    window = {None: model_window, "none": None}.get(args.window, args.window)
    return AttentionConfig(window=window, **values(args, ATTENTION_FLAGS))
