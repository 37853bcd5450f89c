"""What the service holds: the predictor now serving, its decision cache, and why it is not ready
(if it is not). Loading and reloading go through one place, which swaps only a model that loaded
and answered its smoke request."""

from __future__ import annotations

import logging
import queue
import socket
import threading
from collections import Counter as Tally
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError

from chunkpilot import plausibility
from chunkpilot.chunks import DEFAULT_CHUNKS
from chunkpilot.contract import AttentionConfig, ChunkRequest, ConfigError, Decision, Hardware, ModelShape, Outcome
from chunkpilot.correction import neighbourhood
from estimator.decide import Infeasible
from store import registry
from store.dataset import Partition
from store.fleet import SPEC_TAG, TELEMETRY_EXPERIMENT, Publisher
from store.registry import CHALLENGER

from .explore import Explorer
from .model import Predictor, load_predictor, past_outcomes
from .schemas import FeedbackResult
from .settings import Settings

log = logging.getLogger(__name__)


class ServiceMetrics:
    """The service's own Prometheus metrics, in the app's registry (one per app, so tests can
    build several apps in one process)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "chunkpilot_decisions",
            "Chunk-size decisions by chosen size and source",
            ["chunk_size", "source"],
            registry=registry,
        )
        self.rejections = Counter(
            "chunkpilot_rejections", "Requests refused (4xx/503), by reason", ["reason"], registry=registry
        )
        self.reloads = Counter("chunkpilot_model_reloads", "Model loads by outcome", ["outcome"], registry=registry)
        self.outcomes = Counter(
            "chunkpilot_outcomes", "Telemetry outcomes by result (accepted, rejected)", ["result"], registry=registry
        )
        self.outcome_rejections = Counter(
            "chunkpilot_outcome_rejections",
            "Telemetry outcomes refused, by the field that broke the contract",
            ["reason"],
            registry=registry,
        )
        self.explored = Counter(
            "chunkpilot_explored", "Answers that explored a non-argmin candidate", registry=registry
        )
        self.explore_share = Gauge(
            "chunkpilot_explore_spent_share", "Predicted extra TTFT of exploring / TTFT served", registry=registry
        )
        self.published = Counter(
            "chunkpilot_telemetry_published",
            "Telemetry files published to the tracking server, by result (ok, failed)",
            ["result"],
            registry=registry,
        )
        self.skipped_telemetry = Counter(
            "chunkpilot_telemetry_skipped",
            "Telemetry files or rows a load could not learn from (unreadable, or refused by the checks)",
            registry=registry,
        )
        self.model_version = Gauge(
            "chunkpilot_model_version", "Registered model version being served", registry=registry
        )


@dataclass
class ServiceState:
    settings: Settings
    metrics: ServiceMetrics
    predictor: Predictor | None = None
    challenger: Predictor | None = None  # a newer version waiting to be judged; exploring measures its picks
    telemetry: Partition = field(init=False)
    explorer: Explorer = field(init=False)
    not_ready: str = "no model loaded yet"
    last_error: str | None = None  # the last failed load, shown by /readyz even while an old model serves
    last_retrain: str | None = None  # what the latest (re)training did or why it failed (registry tag)
    skipped_telemetry: list[str] = field(default_factory=list)  # telemetry the last load could not learn from
    draining: bool = False  # shutting down: /readyz says so while in-flight requests finish
    unpublished: queue.Queue[Path] = field(default_factory=queue.Queue)  # telemetry files for the server
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.telemetry = Partition(self.settings.telemetry_dir, self.settings.telemetry_max_bytes)
        self.explorer = Explorer(self.settings.explore_budget)
        self.metrics.explore_share.set_function(lambda: self.explorer.spent_share)

    def load(self, force: bool = False) -> str:
        """Load name@alias; swap it in if it differs from what serves (or `force`). Returns what
        happened. The alias's version is compared before anything is downloaded; any failure, of the
        store or of the telemetry, leaves the old model serving and is recorded (/readyz)."""
        s = self.settings
        with self._lock:  # one load at a time; requests keep reading the current predictor meanwhile
            try:
                self.last_retrain = registry.last_retrain(s.tracking_uri, s.model_name)
                serving = self.predictor
                if serving is not None and not force:
                    if registry.alias_version(s.tracking_uri, s.model_name, s.model_alias) == serving.version:
                        self.challenger = self._waiting_challenger(serving)
                        return f"version {serving.version} already serving"
                loaded = load_predictor(s.tracking_uri, s.model_name, s.model_alias, s.decision_budget)
                self.challenger = self._waiting_challenger(loaded)
                past = past_outcomes(s.telemetry_dir)
                loaded.learn(past.outcomes)  # this machine's correction, against the new model
            except Exception as exc:  # the old model keeps serving
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                reason = f"loading {s.model_name}@{s.model_alias} failed: {type(exc).__name__}: {first_line}"
                self.last_error = reason
                if self.predictor is None:
                    self.not_ready = reason
                self.metrics.reloads.labels("failed").inc()
                log.warning("%s; %s", reason, "not ready" if self.predictor is None else "the old version serves")
                return reason
            self.skipped_telemetry = past.skipped
            self.metrics.skipped_telemetry.inc(len(past.skipped))
            old, self.predictor, self.last_error = self.predictor, loaded, None
            if old is not None:
                old.close()  # its table's builder ends; requests in flight still finish on it
            self.not_ready = ""
            self.metrics.model_version.set(float(loaded.version))
            self.metrics.reloads.labels("swapped").inc()
            log.info("serving %s v%s (%s)", s.model_name, loaded.version, loaded.recipe.name)
            return f"serving version {loaded.version}"

    def _waiting_challenger(self, champion: Predictor) -> Predictor | None:
        """The challenger alias when it is newer than the champion and waits for telemetry (kept
        loaded between polls); None when exploring is off or there is none."""
        s, current = self.settings, self.challenger
        if s.explore_budget <= 0:
            return None
        try:
            if (
                current is not None
                and registry.alias_version(s.tracking_uri, s.model_name, CHALLENGER) == current.version
            ):
                found = current
            else:
                # its shadow answers run on LightGBM's predictor: reloaded every poll until it waits,
                # a challenger would set a compile going each time
                found = load_predictor(s.tracking_uri, s.model_name, CHALLENGER, s.decision_budget, compiled=False)
        except Exception:  # no challenger (or one that does not load): explore as without one
            return None
        return found if found.waits and int(found.version) > int(champion.version) else None

    def decide_at_once(self, request: ChunkRequest) -> Decision | None:
        """The decision if the champion's table (and a waiting challenger's) holds it: microseconds,
        for the event loop. None: `decide` must run (milliseconds, in the thread pool: it builds the
        cell, or past the budget answers the anchor's size and queues it)."""
        pick, challenger = self.predictor.tabled_answer(request, queue=False), self.challenger
        if pick is None:
            return None
        if challenger is None:
            return self._served(request, pick, None)
        theirs = challenger.tabled_answer(request, queue=False)
        return None if theirs is None else self._served(request, pick, theirs.chunk_size)

    def decide(self, request: ChunkRequest) -> Decision:
        """The champion's decision for `request` (predictor.model.Predictor.answer), or the candidate
        exploring measures instead."""
        pick, challenger = self.predictor.answer(request), self.challenger
        shadow = None
        if challenger is not None and not request.schedule:
            try:
                shadow = challenger.answer(request).chunk_size
            except Infeasible:  # the challenger cannot keep this budget: the champion's answer stands
                shadow = None
        return self._served(request, pick, shadow)

    def _served(self, request: ChunkRequest, pick: Decision, shadow: int | None) -> Decision:
        """The model's own pick, or the one exploring answers instead (decided per answer), counted."""
        if request.schedule:  # a schedule's prefill is not a row of the dataset: nothing to learn by exploring
            answer = pick
        else:
            answer = self.explorer.explore(pick, shadow, neighbourhood(request))
        if answer.explored:
            self.metrics.explored.inc()
        self.metrics.decisions.labels(size_label(answer.chunk_size, request.context_length), answer.source).inc()
        return answer

    def feedback(self, raw_outcomes: list[dict]) -> FeedbackResult:
        """The engine's outcomes, each checked on its own: the contract (refused by the field it broke),
        then whether its machine could have measured it (refused as `implausible`); the accepted are
        stamped with the time the service received them (the client's clock decides nothing) and
        recorded. Reasons are labels from a fixed set, whatever a client sends."""
        received = datetime.now(UTC)
        predictor = self.predictor
        accepted, rejected = [], Tally()
        for raw in raw_outcomes:
            try:
                outcome = Outcome.model_validate(raw)
            except ValidationError as exc:
                field_name = ConfigError.of(exc).field.rsplit(".", 1)[-1]
                rejected[field_name if field_name in FIELD_LABELS else "other"] += 1
                continue
            try:
                checked = plausibility.check(outcome) if predictor is None else predictor.check(outcome)
            except ConfigError:
                rejected["implausible"] += 1
                continue
            accepted.append(checked.model_copy(update={"finished_at": received}))
        for reason, count in rejected.items():
            self.metrics.outcome_rejections.labels(reason).inc(count)
        self.metrics.outcomes.labels("rejected").inc(rejected.total())
        if accepted:
            self.record(accepted)
            self.metrics.outcomes.labels("accepted").inc(len(accepted))
        return FeedbackResult(accepted=len(accepted), rejected=dict(rejected))

    def record(self, outcomes: list[Outcome]) -> None:
        """Accepted outcomes into the telemetry partition (one atomic file per machine), queued for
        publishing when the fleet shares a tracking server; the serving model's correction learns
        from them at once (its decision table is rebuilt)."""
        if self.predictor is not None:
            self.predictor.learn(outcomes)
        for path in self.telemetry.append(outcomes):
            if self.settings.publish_telemetry:
                self.unpublished.put(path)

    def publish_forever(self, stop: threading.Event) -> None:
        """Publish queued telemetry files into this replica's `telemetry` run (opened with the first),
        off the request path; after `stop`, what is queued still goes. A file that fails stays on disk."""
        publisher = None
        while not (stop.is_set() and self.unpublished.empty()):
            try:
                path = self.unpublished.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                name = f"telemetry {socket.gethostname()}"
                tags = {SPEC_TAG: TELEMETRY_EXPERIMENT}  # its rows' spec: the telemetry partition
                publisher = publisher or Publisher.open(self.settings.tracking_uri, TELEMETRY_EXPERIMENT, name, tags)
                ok = publisher.publish(path)
            except Exception:  # the server is unreachable: the next file tries again
                ok = False
            self.metrics.published.labels("ok" if ok else "failed").inc()

    def poll_forever(self, stop: threading.Event) -> None:
        """Re-check the alias every poll_interval_s until stopped; nothing a poll meets ends the thread."""
        while not stop.wait(self.settings.poll_interval_s):
            try:
                self.load()
            except Exception as exc:  # load records its own failures; this is what it did not foresee
                self.last_error = f"poll failed: {type(exc).__name__}: {exc}"
                log.error(self.last_error)


def size_label(chunk_size: int, context_length: int) -> str:
    """A decided size as a metric label from a fixed set: a default candidate, `full`, or `other`
    (a client's own candidates would otherwise grow /metrics without bound)."""
    if chunk_size == context_length:
        return "full"
    return str(chunk_size) if chunk_size in DEFAULT_CHUNKS else "other"


# the labels an outcome's refusal may carry: the contract's field names (never a client's own key)
FIELD_LABELS = frozenset(
    name for model in (Outcome, ChunkRequest, ModelShape, AttentionConfig, Hardware) for name in model.model_fields
) | {"value", "implausible", "other"}
