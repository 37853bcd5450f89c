"""Native code that can kill its process runs in a child: its answer comes back, its exception is
raised in the caller, and its death by a signal becomes an error that names the signal, never the
caller's death. llama.cpp is probed so before its first use, and a `native` test runs so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from chunkpilot.contract import ConfigError
from engine.isolation import ChildDied, note, run_in_child
from engine.llama_probe import verdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def double(x: int) -> int:
    return 2 * x


def refuse(field: str) -> None:
    raise ConfigError(field, "refused in the child")


def say_then_die(sig: int) -> None:
    note("about to die")
    os.kill(os.getpid(), sig)


def linger(seconds: float) -> None:
    time.sleep(seconds)


def dies_in_decode(file_type: int, flash_attn: bool, folder: str) -> str:
    """A probe whose backend dies mid-decode, as a build the CPU refuses does: llama.cpp loaded and
    its features noted first, as the real probe does."""
    from engine.llama_lib import llama_cpp

    note(llama_cpp().llama_print_system_info().decode())
    os.kill(os.getpid(), signal.SIGILL)
    return "never"


def test_a_child_answers_and_its_exception_is_raised_here_as_it_was():
    assert run_in_child(double, 21, what="doubling") == 42
    with pytest.raises(ConfigError, match="threads: refused in the child") as raised:
        run_in_child(refuse, "threads", what="refusing")
    assert any("in the child process (refusing)" in n for n in raised.value.__notes__)


@pytest.mark.parametrize("sig", [signal.SIGILL, signal.SIGSEGV, signal.SIGKILL])
def test_a_child_killed_by_a_signal_is_an_error_naming_it_and_what_it_said(sig):
    with pytest.raises(ChildDied, match=f"decoding: the child process died of {sig.name}") as died:
        run_in_child(say_then_die, sig, what="decoding")
    assert died.value.notes == ["about to die"]


def die_in_a_grandchild() -> None:
    run_in_child(say_then_die, signal.SIGSEGV, what="the grandchild")


def test_an_error_from_a_child_s_child_comes_back_whole():
    """A probe's child quantises in a child of its own: that one's death reaches the caller with its
    fields, not as an error about unpickling it."""
    with pytest.raises(ChildDied) as died:
        run_in_child(die_in_a_grandchild, what="the child")
    assert (died.value.what, died.value.how, died.value.notes) == (
        "the grandchild",
        "died of SIGSEGV",
        ["about to die"],
    )


def test_a_child_past_its_time_is_killed():
    t0 = time.monotonic()
    with pytest.raises(ChildDied, match="ran past 1 s"):
        run_in_child(linger, 60.0, what="lingering", timeout_s=1.0)
    assert time.monotonic() - t0 < 30


def test_a_probed_backend_killed_by_a_signal_is_refused_with_the_quantisation_and_cpu_features():
    with pytest.raises(ConfigError) as refused:
        verdict(dies_in_decode, 7, False)
    message = str(refused.value)
    assert refused.value.field == "quant"
    assert "cannot run q8_0" in message and "died of SIGILL" in message
    assert "llama.cpp reported: CPU : " in message and "AVX" in message  # what llama.cpp said of this CPU


@pytest.mark.slow  # a pytest run of its own, with two workers
def test_a_native_test_that_dies_fails_alone_and_its_file_goes_on(tmp_path):
    (tmp_path / "test_dies.py").write_text(
        textwrap.dedent(
            """
            import os, signal, pytest

            def test_before(): pass

            @pytest.mark.native
            def test_dies(): os.kill(os.getpid(), signal.SIGILL)

            def test_after(): pass
            """
        )
    )
    (tmp_path / "test_other.py").write_text("def test_other(): pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tests"), ROOT])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "conftest",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-p",
            "no:cacheprovider",
            # its own temp root: a pytest on the default one makes /tmp/pytest-of-<user> private
            # again, and a PostgreSQL of the outer run (another user) then cannot reach its folder
            "--basetemp",
            str(tmp_path / "inner"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 3 passed" in run.stdout and "test_dies.py::test_dies" in run.stdout
    assert "the child process died of SIGILL" in run.stdout and "crashed" not in run.stdout  # no worker died
