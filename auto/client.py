"""The `auto` chunk-size policy: the engine's only way to the predictor. It asks the service over
HTTP (keep-alive, short timeout) with this machine's measured descriptors, caches each answer for
the lengths it holds for (a decision-table segment, else its own length) and its model version (an
answer older than a few seconds still answers at once and is asked again in the background, so a
steady decision never costs more than a first one), and falls back to the anchor (the strongest
simple baseline of this machine, backend and kernel, as the service last said: judge.lineup)
on a timeout, a refused connection, an error status or an infeasible answer, saying why; a circuit
breaker stops asking after repeated failures and probes again later. An in-process variant loads
the model."""

from __future__ import annotations

import bisect
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import ValidationError

from auto.connection import ServiceConnection, ServiceUnavailable, StatusError, TimedOut
from auto.telemetry import Reporter, outcome
from chunkpilot.contract import ChunkRequest, ConfigError, Decision, Hardware, Outcome
from engine.policy import DECISION_TIMEOUT_S, BaselinePolicy, ChunkPolicy
from judge.lineup import Baseline, anchor_for, anchor_key
from store.registry import CHAMPION, MODEL_NAME

if TYPE_CHECKING:
    from engine.engine import TTFTResult

CACHE_TTL_S = 5.0  # a promoted model reaches the engine within the service's alias poll + this
MAX_SPANS = 4096  # answers kept per kind of request
# a decision table's cells build in milliseconds; the forests compile in about two minutes of one
# core, once per machine and model (estimator.forest)
WARM_UP_S = 300.0
FORESTS_S = 900.0  # the longest wait for them (a compile took 223 s on the AMD EPYC 99ce2872fe46)


@dataclass
class Answers:
    """The service's answers per kind of request, each kept with when it came (time.monotonic()) and
    its span of lengths (its own length where it has none), as what holds for every length of it:
    the size (a whole-prompt answer as its span's last length, which `ChunkRequest.clamp` cuts to
    each length's whole prompt), the model version, no prediction. One older than `ttl_s` is stale:
    it still answers, and is asked again."""

    ttl_s: float
    kinds: dict[str, list[tuple[Decision, float]]] = field(default_factory=dict)  # sorted by span, disjoint
    lock: threading.Lock = field(default_factory=threading.Lock)  # the background refresh writes too

    def get(self, request: ChunkRequest) -> tuple[Decision, bool] | None:
        """(the answer holding the request's length, whether it is stale), or None."""
        n = request.context_length
        with self.lock:
            held = self.kinds.get(request.kind(), [])
            i = bisect.bisect_right(held, n, key=lambda h: h[0].span[0]) - 1
            found = held[i] if i >= 0 and held[i][0].span[1] >= n else None
        return None if found is None else (found[0], time.monotonic() - found[1] >= self.ttl_s)

    def forget(self, request: ChunkRequest) -> None:
        """Every answer of the request's kind."""
        with self.lock:
            self.kinds.pop(request.kind(), None)

    def put(self, request: ChunkRequest, answer: Decision, at: float | None = None) -> None:
        """The answer to `request`, kept for its span in place of the answers it overlaps (a rebuilt
        table may draw other segments), and of the kind's oldest past MAX_SPANS (answers for one
        length each, from a service without tables, would otherwise pile up)."""
        n = request.context_length
        first, last = answer.span or (n, n)
        # what holds for every length of the span, no prediction made for this one length; the whole
        # prompt kept as the span's last length, each length's own once clamped
        kept = Decision(
            chunk_size=last if answer.chunk_size == n else answer.chunk_size,
            source=answer.source,
            schedule=answer.schedule,
            model_version=answer.model_version,
            deferred=answer.deferred,
            span=(first, last),
        )
        with self.lock:
            held = self.kinds.setdefault(request.kind(), [])
            held[:] = [h for h in held if h[0].span[1] < first or h[0].span[0] > last]
            if len(held) >= MAX_SPANS:
                held.remove(min(held, key=lambda h: h[1]))
            bisect.insort(held, (kept, time.monotonic() if at is None else at), key=lambda h: h[0].span[0])


def ask(request: ChunkRequest, hardware: Hardware, schedule: bool = False) -> ChunkRequest:
    """The engine's `request` with this machine's measured descriptors in place of its id alone (and
    for its schedule, if asked): both are checked values, so the copy needs no new check."""
    return request.model_copy(update={"hardware": hardware, "schedule": schedule})


_warned = False


SERVED = ("model", "table", "anchor")  # the sources a service answers with
ANSWERED = ("predicted_ttft_ms", "model_version", "rule", "anchor")  # what its every answer carries
BUDGET = "memory_budget_mb"
BUDGET_REFUSALS = ("over_memory_budget", "no_memory_model")  # the model's refusals of a budget (estimator.decide)


def budget_refused(detail: str) -> ConfigError:
    """A refusal of the request's memory budget, as the engine raises it: naming the field."""
    return ConfigError(BUDGET, detail.removeprefix(f"{BUDGET}: "))


def fall_back(request: ChunkRequest, reason: str, anchor: Baseline) -> Decision:
    """The anchor's size, with the reason; the process's first fallback says so on stderr. A request
    with a memory budget is refused instead: the anchor knows nothing of memory, and a prefill run
    past its budget can take the process down."""
    if request.memory_budget_mb is not None:
        raise ConfigError(
            BUDGET, f"no model could keep the budget ({reason}); the prefill is refused, not run unchecked"
        )
    global _warned
    if not _warned:
        _warned = True
        print(f"chunkpilot: auto fell back to {anchor.name}: {reason}", file=sys.stderr, flush=True)
    size = BaselinePolicy(anchor).decide(request).chunk_size
    return Decision(chunk_size=size, source="fallback", reason=f"{reason}; {anchor.name} answered")


def failure_reason(exc: Exception, url: str, timeout_s: float) -> str:
    if isinstance(exc, TimedOut):
        return f"timeout: {url} gave no answer within {timeout_s * 1e3:g} ms"
    if isinstance(exc, StatusError):
        return f"the service answered {exc.status}: {exc.detail}"
    if isinstance(exc, ServiceUnavailable):
        return f"cannot reach {url}: {exc}"
    if isinstance(exc, ValidationError):  # one line: the first field the answer broke
        first = exc.errors()[0]
        return f"unusable answer from {url}: {'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}"
    return f"unusable answer from {url}: {exc}"


@dataclass
class Breaker:
    """Closed until `failures` in a row; then open for `cooldown_s`; then one probe decides."""

    failures: int = 3
    cooldown_s: float = 10.0
    streak: int = 0
    opened_at: float | None = None

    def allows(self) -> bool:
        return self.opened_at is None or time.monotonic() - self.opened_at >= self.cooldown_s

    def record(self, ok: bool) -> None:
        if ok:
            self.streak, self.opened_at = 0, None
        else:
            self.streak += 1
            if self.streak >= self.failures:
                self.opened_at = time.monotonic()  # (re)open: a failed probe waits a full cooldown again

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None


class Observing(ChunkPolicy):
    """Reports every prefill it decided as a telemetry outcome, when it has a reporter."""

    hardware: Hardware
    reporter: Reporter | None
    anchors: dict[str, Baseline]  # judge.lineup.anchor_key -> the model's anchor there

    def anchor(self, request: ChunkRequest) -> Baseline:
        """What a fallback answers: the model's anchor for this machine, backend and kernel."""
        return anchor_for(self.anchors, self.hardware.hardware_id, request.backend, request.attn_impl)

    def observe(self, request: ChunkRequest, result: TTFTResult) -> None:
        # the dataset's rows are one size each; the service checks an outcome by its chunks' times, so
        # a backend that shows none (stock generate) reports nothing
        if self.reporter is not None and result.schedule is None and result.chunk_ms:
            self.reporter.report(outcome(ask(request, self.hardware), result))

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.close()


@dataclass
class AutoPolicy(Observing):
    url: str
    timeout_s: float
    hardware: Hardware  # this machine (engine.hardware.local_hardware)
    breaker: Breaker = field(default_factory=Breaker)
    cache_ttl_s: float = CACHE_TTL_S
    reporter: Reporter | None = None  # telemetry of each prefill (auto/telemetry.py)
    schedule: bool = False  # ask for a chunk schedule too (the service's per-chunk cost model)
    name: str = "auto"

    def __post_init__(self) -> None:
        self.client = ServiceConnection(self.url, self.timeout_s)  # keep-alive across prefills
        self.version: str | None = None  # the model version of the latest answer
        self.answers = Answers(self.cache_ttl_s)  # the current version's
        self.last_error = "no answer yet"
        self.anchors = self._served_anchors()
        self.refresher = ThreadPoolExecutor(1, thread_name_prefix="auto-refresh")  # stale answers, asked again
        self.refreshing: set[str] = set()  # kinds asked again now
        # an exploration a refresh was answered: for the next prefill of that kind and length to measure
        self.explorations: dict[tuple[str, int], Decision] = {}
        self.lock = threading.Lock()  # the refresher and the decisions both record answers

    def _served_anchors(self) -> dict[str, Baseline]:
        """The served model's anchors, asked once at start (each answer then updates its own): what
        a fallback answers before the first answer; none from a service that cannot say."""
        try:
            said = json.loads(self.client.get("/v1/model", max(self.timeout_s, 1.0)))["anchors"]
            return {key: Baseline(*anchor) for key, anchor in said.items()}
        except (ServiceUnavailable, ValueError, KeyError, TypeError):
            return {}

    def decide(self, request: ChunkRequest) -> Decision:
        explored = self.explorations.pop((request.kind(), request.context_length), None)
        if explored is not None:
            return explored
        cached = self.answers.get(request)
        if cached is not None:
            found, stale = cached
            if stale and request.kind() not in self.refreshing:
                self.refreshing.add(request.kind())
                try:
                    self.refresher.submit(self._refresh, request)
                except RuntimeError:  # closed: the cached answer still answers
                    self.refreshing.discard(request.kind())
            return found.model_copy(update={"chunk_size": request.clamp(found.chunk_size), "source": "cache"})
        return self._decide_now(request)

    def _refresh(self, request: ChunkRequest) -> None:
        """A stale answer asked again, off the decision's path: the answer is the next decision's (an
        exploration is kept for the next prefill of that length, which measures it)."""
        try:
            decision = self._decide_now(request)
            if decision.explored:
                self.explorations[(request.kind(), request.context_length)] = decision
        except ConfigError:  # its budget is refused now (a promoted model's wider margin): no stale answer stays
            self.answers.forget(request)
        finally:
            self.refreshing.discard(request.kind())

    def _decide_now(self, request: ChunkRequest) -> Decision:
        if not self.breaker.allows():
            return fall_back(
                request,
                f"circuit breaker open after {self.breaker.failures} failures (last: {self.last_error})",
                self.anchor(request),
            )
        try:
            answer = self._ask(request)
        except StatusError as exc:
            if exc.status == 422 and exc.detail.startswith(f"{BUDGET}: "):
                raise budget_refused(exc.detail) from None  # the service is well: the budget cannot be kept
            with self.lock:
                self.breaker.record(False)
                self.last_error = failure_reason(exc, self.url, self.timeout_s)
            return fall_back(request, self.last_error, self.anchor(request))
        except (ServiceUnavailable, ValueError, KeyError, TypeError) as exc:  # timeout, refused, garbage
            with self.lock:
                self.breaker.record(False)
                self.last_error = failure_reason(exc, self.url, self.timeout_s)
            return fall_back(request, self.last_error, self.anchor(request))
        with self.lock:
            self.breaker.record(True)
            key = anchor_key(self.hardware.hardware_id, request.backend, request.attn_impl)
            self.anchors[key] = Baseline(answer.anchor.name, answer.anchor.spec)
            if answer.model_version != self.version:  # a promotion: answers of the old model go
                self.version, self.answers = answer.model_version, Answers(self.cache_ttl_s)
            if not answer.explored:  # an exploration is for this prefill only
                self.answers.put(request, answer)
        return answer.model_copy(update={"source": "service"})

    def forests_ready(self, timeout_s: float = FORESTS_S) -> dict:
        """Wait until the service's forests are no longer compiling (minutes of one core, once per
        machine and model, which would otherwise share the cores with every prefill timed meanwhile)
        or `timeout_s` passes; its /v1/model answer then (`forests`, `forests_compile_s`)."""
        end = time.monotonic() + timeout_s
        while True:
            model = json.loads(self.client.get("/v1/model"))
            if model.get("forests") != "compiling" or time.monotonic() > end:
                return model
            time.sleep(0.5)

    def warm_up(self, requests: list[ChunkRequest], timeout_s: float = WARM_UP_S) -> int:
        """Wait for the service's compiled forests, and ask about each request until the service
        answers it from its decision table (both built in the background: seconds of the service's
        cores, which would otherwise share the machine with the first prefills), then forget the
        answers, so that the next decisions are the steady state's. Returns how many the table
        answered before `timeout_s` (0 from a service that builds no tables)."""
        end = time.monotonic() + timeout_s
        if not self.forests_ready(timeout_s)["decision_table"]["builds"]:
            return 0
        waiting = list(requests)
        while waiting and time.monotonic() < end:
            waiting = [r for r in waiting if self._ask(r, schedule=False).source != "table"]
            if waiting:
                time.sleep(0.5)
        self.answers = Answers(self.cache_ttl_s)
        return len(requests) - len(waiting)

    def _ask(self, request: ChunkRequest, schedule: bool | None = None) -> Decision:
        body = ask(request, self.hardware, self.schedule if schedule is None else schedule).model_dump_json()
        said = self.client.post("/v1/chunk-size", body.encode())
        answer = Decision.model_validate_json(said, strict=True)  # the service's own model
        missing = [name for name in ANSWERED if getattr(answer, name) is None]
        if answer.source not in SERVED or missing:
            raise ValueError(
                f"not a service's answer: source {answer.source!r}, missing {', '.join(missing) or 'nothing'}"
            )
        if not 1 <= answer.chunk_size <= request.max_chunk:
            raise ValueError(f"infeasible chunk {answer.chunk_size} (allowed 1..{request.max_chunk})")
        n, span = request.context_length, answer.span
        if span is not None and not span[0] <= n <= span[1]:
            raise ValueError(f"span {list(span)} does not hold the asked length {n}")
        if answer.schedule is not None:  # sizes that fit and sum to the prompt, else ValueError
            request.attention.check_schedule(answer.schedule, n)
        return answer

    def close(self) -> None:
        self.refresher.shutdown(wait=True)
        self.client.close()
        super().close()


@dataclass
class InProcessPolicy(Observing):
    """The same decision without HTTP: the registered model loaded into this process."""

    tracking_uri: str
    hardware: Hardware
    model_name: str = MODEL_NAME
    alias: str = CHAMPION
    reporter: Reporter | None = None
    schedule: bool = False  # answer a chunk schedule too (the per-chunk cost model)
    name: str = "auto"

    def __post_init__(self) -> None:
        from predictor.model import load_predictor

        self.predictor = load_predictor(self.tracking_uri, self.model_name, self.alias)
        self.anchors = self.predictor.recipe.anchors

    def observe(self, request: ChunkRequest, result: TTFTResult) -> None:
        """Reported as telemetry (if a reporter is set), and learnt by the loaded recipe's correction at once."""
        super().observe(request, result)
        if result.schedule is None and result.chunk_ms:
            try:
                reported = Outcome.model_validate(outcome(ask(request, self.hardware), result))
                self.predictor.learn([self.predictor.check(reported)])
            except ValueError:  # an outcome the contract refuses teaches nothing (the service would refuse it too)
                pass

    def forests_ready(self, timeout_s: float = FORESTS_S) -> dict:
        """As AutoPolicy.forests_ready: the forests compiled (on this process's cores) or `timeout_s` passed."""
        if self.predictor.forests is not None:
            self.predictor.forests.join(timeout_s)
        return {"forests": self.predictor.forest_state, "forests_compile_s": self.predictor.compile_s}

    def warm_up(self, requests: list[ChunkRequest], timeout_s: float = WARM_UP_S) -> int:
        """As AutoPolicy.warm_up: the forests compiled, each request's kind queued, and the table
        built (on this process's cores) before the first prefill is timed. Returns how many the
        table answers."""
        end = time.monotonic() + timeout_s
        self.forests_ready(timeout_s)
        for r in requests:
            self.predictor.tabled_answer(ask(r, self.hardware))  # a miss queues the kind
        self.predictor.recipe.table.wait(max(0.0, end - time.monotonic()))
        return sum(self.predictor.tabled_answer(ask(r, self.hardware)) is not None for r in requests)

    def close(self) -> None:
        self.predictor.close()  # its table's builder
        super().close()

    def decide(self, request: ChunkRequest) -> Decision:
        from estimator.decide import Infeasible

        try:
            answer = self.predictor.answer(ask(request, self.hardware, self.schedule))
        except (Infeasible, ValueError) as exc:  # the anchor always has an answer, but not to a budget
            if isinstance(exc, Infeasible) and exc.reason in BUDGET_REFUSALS:
                raise budget_refused(str(exc)) from None
            why = f"the in-process model cannot answer: {str(exc).splitlines()[0]}"
            return fall_back(request, why, self.anchor(request))
        return answer.model_copy(update={"source": "in-process"})


def make_auto(
    hardware: Hardware,
    *,
    service: str | None = None,
    tracking: str | None = None,
    timeout_s: float = DECISION_TIMEOUT_S,
    reporter: Reporter | None = None,
    schedule: bool = False,
) -> AutoPolicy | InProcessPolicy:
    """`auto`, built one way for every caller (the CLI, the demo, the transformers helper, the
    benches): the service at `service` over HTTP, or the champion of the MLflow store `tracking`
    loaded into this process."""
    if (service is None) == (tracking is None):
        raise ConfigError("predictor", "give either the service's URL or a tracking URI")
    if service is not None:
        return AutoPolicy(service, timeout_s, hardware, reporter=reporter, schedule=schedule)
    return InProcessPolicy(tracking, hardware, reporter=reporter, schedule=schedule)


def auto_at(hardware: Hardware, predictor: str, timeout_s: float = DECISION_TIMEOUT_S) -> AutoPolicy | InProcessPolicy:
    """`auto` from one address, as the helpers take it: the service's URL (http://...), else an
    MLflow tracking URI to load the champion from in-process."""
    if predictor.startswith(("http://", "https://")):
        return make_auto(hardware, service=predictor, timeout_s=timeout_s)
    return make_auto(hardware, tracking=predictor)
