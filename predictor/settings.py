"""Service settings from the environment (prefix CHUNKPILOT_), e.g. CHUNKPILOT_ADMIN_TOKEN."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from chunkpilot.paths import TELEMETRY_DIR
from store.registry import CHAMPION, MODEL_NAME
from store.tracking import tracking_uri

# a decision on the request path may cost at most this share of the TTFT it decides (by the analytic
# estimate of the anchor's size): a small share of the points the recipe's held-out regret lies below
# the rules' (docs/training.md), so spending it keeps most of that saving; a cell not worth it is
# answered by the anchor while the table builds it
BUDGET = 0.01
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})  # names and addresses of this machine alone


class Settings(BaseSettings):
    """Each field is an environment variable (CHUNKPILOT_ and its name in capitals) and, but for the
    secret and the list, a `chunkpilot serve` option: the option wins over the variable."""

    model_config = SettingsConfigDict(env_prefix="CHUNKPILOT_")

    tracking_uri: str = Field(default_factory=tracking_uri, description="the MLflow tracking store")
    model_name: str = Field(default=MODEL_NAME, description="the registered model to serve")
    model_alias: str = Field(default=CHAMPION, description="its alias to serve (and to follow)")
    poll_interval_s: float = Field(default=30.0, ge=0, description="how often to check the alias; 0: never")
    admin_token: SecretStr | None = Field(default=None, description="bearer token of /admin/reload; unset: route off")
    max_body_bytes: int = Field(default=256 * 1024, ge=1024, description="the largest request body accepted")
    decision_budget: float = Field(
        default=BUDGET, ge=0, le=1, description="share of a TTFT a decision on the request path may cost; 1: no limit"
    )
    # an unreachable tracking server must fail a load fast (MLflow's own default retries for minutes)
    store_timeout_s: int = Field(default=5, ge=1, le=600, description="MLflow HTTP request timeout")
    store_retries: int = Field(default=0, ge=0, le=10, description="MLflow HTTP retries per request")
    host: str = Field(default="127.0.0.1", description="the bind address: beyond loopback, feedback needs the token")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="names clients may reach the service by (the Host header) besides the bind address and "
        "loopback: any other is refused (a page's DNS rebinding), e.g. CHUNKPILOT_ALLOWED_HOSTS='[\"predictor.lan\"]'",
    )
    drain_delay_s: float = Field(
        default=1.0, ge=0, le=60, description="on SIGTERM, how long /readyz says 503 before the listener closes"
    )
    drain_timeout_s: int = Field(default=10, ge=1, le=600, description="on SIGTERM, the most in-flight requests get")
    telemetry_dir: Path = Field(default=TELEMETRY_DIR, description="where accepted outcomes go")
    explore_budget: float = Field(
        default=0.01,
        ge=0,
        le=0.5,
        description="share of the served (predicted) TTFT exploring may cost; 0: never explore",
    )
    telemetry_max_bytes: int = Field(default=256 * 2**20, ge=2**16, description="the oldest files go beyond this")
    publish_telemetry: bool = Field(
        default=False,
        description="also publish each telemetry file to the tracking "
        "server, for `chunkpilot train --from-tracking` (a fleet of replicas)",
    )
