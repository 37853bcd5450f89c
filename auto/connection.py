"""The engine's HTTP client to the service: bytes over keep-alive connections of the standard
library's http.client, a connection per concurrent caller (the decision path and the background
refresh; the telemetry reporter has its own). A decision the engine's cache cannot answer is on the
prefill's path: on loopback, paced as an engine asks, httpx's round trip took about 0.5 ms more
(its request and connection machinery, in Python), measured side by side by
bench/predictor_latency.py. Every failure is a `ServiceUnavailable` that says what happened."""

from __future__ import annotations

import http.client
import json
import select
import ssl
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# a connection idle this long is not reused: uvicorn closes one idle for 5 s (its keep-alive), and
# a close that crosses a request on the wire fails that request
IDLE_S = 4.0


class ServiceUnavailable(Exception):
    """No usable answer: the service timed out, could not be reached, or answered an error status."""


class TimedOut(ServiceUnavailable):
    pass


class Unreachable(ServiceUnavailable):
    pass


class StatusError(ServiceUnavailable):
    """A status other than 2xx, with the service's own words (`detail`)."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body
        super().__init__(f"HTTP {status}: {self.detail}")

    @property
    def detail(self) -> str:
        """FastAPI's `detail` of the error, else the body's first 200 characters."""
        try:
            return str(json.loads(self.body)["detail"])
        except (ValueError, KeyError, TypeError):
            return self.body.decode(errors="replace")[:200]


@dataclass
class ServiceConnection:
    url: str  # http(s)://host[:port][/prefix]: the service's routes are under the prefix
    timeout_s: float  # each connect, send and read
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # sent with every request (a token)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.query:
            raise ValueError(f"the service's URL must be http(s)://host[:port][/path], not {self.url!r}")
        https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port or (443 if https else 80)
        self._prefix = parts.path.rstrip("/")
        self._context = ssl.create_default_context() if https else None  # its CA store read once
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []  # with when each was last used
        self._lock = threading.Lock()

    def get(self, path: str, timeout_s: float | None = None) -> bytes:
        return self._request("GET", path, None, timeout_s)

    def post(self, path: str, body: bytes, timeout_s: float | None = None) -> bytes:
        return self._request("POST", path, body, timeout_s)

    def _request(self, method: str, path: str, body: bytes | None, timeout_s: float | None) -> bytes:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        conn = self._take(timeout)
        headers = {**self.headers, "content-type": "application/json"} if body is not None else self.headers
        try:
            conn.request(method, self._prefix + path, body, headers)
            response = conn.getresponse()
            data = response.read()
        except TimeoutError:
            conn.close()
            raise TimedOut(f"no answer within {timeout * 1e3:g} ms") from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, not HTTP
            conn.close()
            raise Unreachable(str(exc) or type(exc).__name__) from None
        except BaseException:  # a malformed answer (ValueError) or an interrupt: never back in the pool
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                self._idle.append((conn, time.monotonic()))
        if not 200 <= response.status < 300:
            raise StatusError(response.status, data)
        return data

    def _take(self, timeout: float) -> http.client.HTTPConnection:
        """An idle connection used within IDLE_S that the service has not closed (its socket would
        read as ready, at end of file), else a new one; either with `timeout`."""
        with self._lock:
            while self._idle:
                conn, used = self._idle.pop()
                if conn.sock is not None and time.monotonic() - used < IDLE_S and not _readable(conn.sock):
                    conn.timeout = timeout
                    conn.sock.settimeout(timeout)
                    return conn
                conn.close()
        if self._context is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def close(self) -> None:
        with self._lock:
            for conn, _ in self._idle:
                conn.close()
            self._idle.clear()


def _readable(sock: object) -> bool:
    """Whether `sock` has something to read now (an idle connection's: the server closed it); a
    poll, not select.select, which refuses a descriptor of 1024 or more (nor a selector, which opens
    a descriptor of its own per call: ten times the cost on every decision)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
