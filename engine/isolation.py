"""Native code that can kill its process runs here, in a child: llama.cpp's kernels die with SIGILL
where a build's instructions meet a CPU (or hypervisor) that refuses them, and a death by a signal
cannot be caught in the process it happens in. The child is a fresh interpreter (spawn: nothing
inherited but the arguments); its result or exception comes back, and its death becomes
`ChildDied` in the caller, with the lines it `note`d before dying."""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import pickle
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")

_notes: Connection | None = None  # set in a child only: where `note` writes


class ChildDied(RuntimeError):
    """The child ended without an answer: killed by a signal, exited, or ran past its time."""

    def __init__(self, what: str, how: str, notes: list[str]) -> None:
        self.what, self.how, self.notes = what, how, notes
        said = f"; before that it said: {' | '.join(notes)}" if notes else ""
        super().__init__(f"{what}: the child process {how}{said}")

    def __reduce__(self) -> tuple:  # from a child's child, back through a pipe
        return type(self), (self.what, self.how, self.notes)


def note(text: str) -> None:
    """From inside `run_in_child`'s target: a line the caller keeps even if the child then dies."""
    if _notes is not None:
        _notes.send(("note", text))


def _child(conn: Connection, target: Callable[..., Any], args: tuple) -> None:
    global _notes
    _notes = conn
    faulthandler.enable()  # a fatal signal prints the Python stack on the inherited stderr
    try:
        conn.send(("ok", target(*args)))
    except BaseException as exc:  # every failure goes back to the caller, as it was raised
        told = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(exc))  # one that pickles but does not come back goes as its text too
            conn.send(("raised", exc, told))
        except Exception:  # an exception that does not pickle goes back as its text
            conn.send(("raised", RuntimeError(repr(exc)), told))


def how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"died of {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"died of signal {-exitcode}"
    return f"exited with status {exitcode} without an answer"


def run_in_child(target: Callable[..., T], *args: Any, what: str, timeout_s: float = 300.0) -> T:
    """`target(*args)` in a fresh child process (target and args picklable). Its exception is
    raised here (with the child's traceback as a note); its death or a run past `timeout_s` raises
    `ChildDied` naming `what`."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    # not a daemon: a child may start children of its own (a probe quantising); it is joined or killed below
    process = ctx.Process(target=_child, args=(child, target, args))
    process.start()
    child.close()  # the child's end lives in the child now: its death closes the pipe
    notes: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if not parent.poll(min(0.2, max(deadline - time.monotonic(), 0))):
                if time.monotonic() > deadline:
                    raise ChildDied(what, f"ran past {timeout_s:.0f} s and was killed", notes)
                continue
            try:
                kind, *payload = parent.recv()
            except EOFError:  # closed without an answer: the child is gone
                process.join(timeout=5)
                raise ChildDied(what, how_it_ended(process.exitcode), notes) from None
            if kind == "note":
                notes.append(payload[0])
            elif kind == "ok":
                return payload[0]
            else:
                exc, told = payload
                exc.add_note(f"in the child process ({what}):\n{told}")
                raise exc
    finally:
        parent.close()
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()
