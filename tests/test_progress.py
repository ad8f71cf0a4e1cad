"""The progress display: on a terminal only (not in pipes, not under CI, not with NXSAT_PROGRESS=0),
redrawn in place at most ten times a second, erased at the end; interpret shows its run with it."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from conftest import DATA
from nxsat.cli import main
from nxsat.frontend import load
from nxsat.interpreter import PROGRESS_EVERY, run_module
from nxsat.progress import Progress, progress_wanted

MLP = str(DATA / "jax" / "mlp.hlo")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NXSAT_PROGRESS", raising=False)
    return monkeypatch


def test_shown_on_a_terminal_only(clean_env):
    assert progress_wanted(Tty()) and not progress_wanted(io.StringIO())
    clean_env.setenv("CI", "true")
    assert not progress_wanted(Tty())
    clean_env.setenv("NXSAT_PROGRESS", "1")  # forced on, even under CI and in a pipe
    assert progress_wanted(io.StringIO())
    clean_env.setenv("NXSAT_PROGRESS", "0")
    clean_env.delenv("CI")
    assert not progress_wanted(Tty())


def test_stage_counter_elapsed_throttled_and_erased():
    out, clock = io.StringIO(), Clock()
    with Progress(out, enabled=True, clock=clock) as p:
        clock.now += 2.5
        p.stage("run", total=200, unit="instructions")
        assert out.getvalue() == "\rrun: 0/200 instructions (0%)  2.5 s"
        for i in range(1, 100):
            p.update(i)  # no time has passed: nothing is drawn
        assert out.getvalue().count("\r") == 1
        clock.now += 0.05
        p.update(100)
        assert out.getvalue().count("\r") == 1  # under 0.1 s since the last draw
        clock.now += 0.06
        p.update(150)
        assert out.getvalue().endswith("\rrun: 150/200 instructions (75%)  2.6 s")
        clock.now += 1
        p.stage("write")  # a stage without a counter; the longer line before is blanked out
        last = out.getvalue().rsplit("\r", 1)[1]
        assert last.startswith("write  3.6 s") and last.strip() == "write  3.6 s"
        assert len(last) == len("run: 150/200 instructions (75%)  2.6 s")
    assert out.getvalue().endswith(last + "\r" + " " * len("write  3.6 s") + "\r")  # erased at the end


def test_erased_when_the_work_fails():
    out = io.StringIO()
    with pytest.raises(RuntimeError), Progress(out, enabled=True) as p:
        p.stage("run", total=3)
        raise RuntimeError("boom")
    assert out.getvalue().endswith(" \r")


def test_disabled_writes_nothing():
    out = io.StringIO()
    with Progress(out, enabled=False) as p:
        p.stage("run", total=10)
        p.update(5)
    assert out.getvalue() == ""


def test_never_wider_than_the_terminal(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((30, 24)))
    out = io.StringIO()
    Progress(out, enabled=True).stage("a-very-long-stage-name", total=10**9, unit="instructions")
    assert len(out.getvalue()) == 1 + 29


def test_the_interpreter_counts_entry_instructions_cheaply():
    module = load(MLP)
    calls: list[int] = []

    class Recorder(Progress):
        def update(self, done: int) -> None:
            calls.append(done)

    rec = Recorder(io.StringIO(), enabled=True)
    run_module(module, [__import__("numpy").zeros(p.type.shape, p.type.dtype.np) for p in module.entry.params],
               progress=rec)
    n = len(module.entry.post_order())
    assert rec.name == "run" and rec.total == n and rec.unit == "instructions"
    assert calls and calls == sorted(calls) and calls[-1] <= n
    assert len(calls) <= n // PROGRESS_EVERY + 1


def test_interpret_shows_load_and_run_and_leaves_its_output_alone(clean_env, capsys):
    assert main(["interpret", MLP, "--seed", "1"]) == 0
    plain = capsys.readouterr()
    assert "\r" not in plain.err  # captured stderr is not a terminal
    clean_env.setenv("NXSAT_PROGRESS", "1")
    assert main(["interpret", MLP, "--seed", "1"]) == 0
    shown = capsys.readouterr()
    assert shown.out == plain.out
    assert "\rload  " in shown.err and "\rrandom inputs: 0/5 parameters (0%)  " in shown.err
    assert "\rrun: 0/" in shown.err and " instructions (0%)" in shown.err
    # What remains once the drawn lines are erased is what the command prints without them.
    assert [seg for seg in shown.err.split("\r") if seg.strip() and "  " not in seg] == [plain.err]


def test_silent_in_a_pipe_and_under_ci(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NXSAT_PROGRESS")}
    proc = subprocess.run([sys.executable, "-m", "nxsat", "interpret", MLP], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "\r" not in proc.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a Linux pseudo-terminal")
def test_shown_on_a_real_terminal_unless_ci():
    import pty

    def stderr_on_a_terminal(extra_env: dict[str, str]) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "NXSAT_PROGRESS")} | extra_env
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "nxsat", "interpret", MLP], stdout=subprocess.DEVNULL,
                                stderr=slave, env=env)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end closed
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        assert proc.wait() == 0
        return b"".join(chunks).decode()

    assert "\rrun: " in stderr_on_a_terminal({})
    assert "\r" not in stderr_on_a_terminal({"CI": "true"}).replace("\r\n", "\n")  # the tty turns \n into \r\n
