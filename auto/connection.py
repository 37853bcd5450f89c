"""The engine's HTTP client to the service: bytes over keep-alive connections of the standard
library's http.client, a connection per concurrent caller (the decision path and the background
refresh; the telemetry reporter has its own). A decision the engine's cache cannot answer is on the
prefill's path: on loopback, paced as an engine asks, httpx's round trip took about 0.6 ms more
(its request and connection machinery, in Python), measured side by side by
bench/predictor_latency.py. Every failure is a `ServiceUnavailable` that says what happened."""

from __future__ import annotations

import http.client
import json
import select
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class ServiceUnavailable(Exception):
    """No usable answer: the service timed out, could not be reached, or answered an error status."""


class TimedOut(ServiceUnavailable):
    pass


class Unreachable(ServiceUnavailable):
    pass


class StatusError(ServiceUnavailable):
    """An error status, with the service's own words (`detail`)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body

    @property
    def detail(self) -> str:
        """FastAPI's `detail` of the error, else the body's first 200 characters."""
        try:
            return str(json.loads(self.body)["detail"])
        except (ValueError, KeyError, TypeError):
            return self.body.decode(errors="replace")[:200]


@dataclass
class ServiceConnection:
    url: str  # http://host:port or https://host:port, no path
    timeout_s: float  # each connect, send and read
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request (a bearer token)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the service's URL must be http(s)://host[:port], not {self.url!r}")
        self._kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host, self._port = parts.hostname, parts.port
        self._idle: list[http.client.HTTPConnection] = []
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
            conn.request(method, path, body, headers)
            response = conn.getresponse()
            data = response.read()
        except TimeoutError:
            conn.close()
            raise TimedOut(f"no answer within {timeout * 1e3:g} ms") from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, not HTTP
            conn.close()
            raise Unreachable(str(exc) or type(exc).__name__) from None
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                self._idle.append(conn)
        if response.status >= 400:
            raise StatusError(response.status, data)
        return data

    def _take(self, timeout: float) -> http.client.HTTPConnection:
        """An idle connection the service has not closed (uvicorn closes one idle for 5 s: its socket
        then reads as ready, at end of file), else a new one; either with `timeout`."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.sock is not None and not select.select([conn.sock], [], [], 0)[0]:
                    conn.timeout = timeout
                    conn.sock.settimeout(timeout)
                    return conn
                conn.close()
        return self._kind(self._host, self._port, timeout=timeout)

    def close(self) -> None:
        with self._lock:
            for conn in self._idle:
                conn.close()
            self._idle.clear()
