"""Children that cannot outlive their parent, and native crashes named as such.

Each test runs a real parent process, kills it the way users' processes die (SIGKILL, a
segfault, a normal exit), and waits (bounded, on the process table) for its server to go.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from relevancy_tracer._lifeline import spawn

from .conftest import ROOT, fake_model_env, subprocess_env

#: A parent that starts a long-running command through the lifeline, prints the pids of the
#: watcher and of the command, then dies as told: "kill" (waits for SIGKILL), "segfault", "exit".
PARENT = textwrap.dedent(
    """
    import ctypes, sys, time
    import psutil
    from relevancy_tracer._lifeline import spawn

    child = spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    deadline = time.monotonic() + 30
    watcher = psutil.Process(child.pid)
    while not watcher.children() and time.monotonic() < deadline:
        time.sleep(0.02)
    print(child.pid, watcher.children()[0].pid, flush=True)
    how = sys.argv[1]
    if how == "segfault":
        ctypes.string_at(0)
    elif how == "exit":
        sys.exit(0)
    time.sleep(600)
    """
)


def _start_parent(how: str) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(), cwd=ROOT)
    line = proc.stdout.readline()
    assert line.strip(), proc.stderr.read()
    return proc, [int(pid) for pid in line.split()]


def _gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` seconds for them to end."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:  # never leave them behind, whatever the assertion says
        p.kill()
    return [p.pid for p in alive]


@pytest.mark.parametrize("how", ["kill", "segfault", "exit"])
def test_the_command_dies_with_its_parent(how):
    proc, pids = _start_parent(how)
    assert all(psutil.pid_exists(pid) for pid in pids)
    if how == "kill":
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == {"kill": -signal.SIGKILL, "segfault": -signal.SIGSEGV, "exit": 0}[how]
    assert _gone(pids) == []


def test_the_command_dies_when_its_watcher_is_killed():
    """PR_SET_PDEATHSIG: SIGKILL of the watcher itself still takes the command down (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    child = spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        watcher = psutil.Process(child.pid)
        command = None
        for _ in range(1500):
            kids = watcher.children()
            if kids:
                command = kids[0]
                break
            time.sleep(0.02)
        assert command is not None
        os.kill(child.pid, signal.SIGKILL)
        assert _gone([command.pid]) == []
    finally:
        child.stop(grace=1)


def test_stop_ends_the_command_and_passes_on_its_status():
    child = spawn([sys.executable, "-c", "import sys; sys.exit(int(sys.stdin.readline()))"], stdin=subprocess.PIPE)
    child.process.stdin.write(b"7\n")
    child.process.stdin.flush()
    assert child.wait(30) == 7
    child.stop()
    sleeper = spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    sleeper.stop(grace=5)
    # 143: the command ended by SIGTERM, passed on by the watcher; -15: the watcher itself, when
    # SIGTERM came before it had started the command
    assert sleeper.poll() in (128 + signal.SIGTERM, -signal.SIGTERM)


def test_a_command_that_cannot_run_exits_127(tmp_path):
    child = spawn([str(tmp_path / "no-such-program")], stderr=subprocess.PIPE)
    assert child.wait(30) == 127
    assert b"cannot run" in child.process.stderr.read()
    child.stop()


def test_a_native_crash_in_a_command_is_reported_as_such():
    """faulthandler in the CLI: a segfault prints "Fatal Python error: Segmentation fault" and the
    Python stack that led to it, not only a bare signal exit."""
    app = "import ctypes, sys\nfrom relevancy_tracer import cli\ncli.cmd_demo = lambda args: ctypes.string_at(0)\nsys.exit(cli.main(['demo']))"
    proc = subprocess.run([sys.executable, "-c", app], capture_output=True, text=True, env=subprocess_env(), cwd=ROOT, timeout=60)
    assert proc.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in proc.stderr and "string_at" in proc.stderr


@pytest.mark.phoenix
def test_sigkill_of_the_demo_leaves_no_phoenix_behind(server, tmp_path):
    """`relevancy-tracer demo` starts Phoenix, then is killed with SIGKILL (no cleanup code can
    run): the Phoenix server and everything it started end too."""
    from relevancy_tracer._phoenix_server import free_port

    port = free_port()
    env = subprocess_env(fake_model_env(server), PHOENIX_PORT=str(port), PHOENIX_WORKING_DIR=str(tmp_path / "phoenix"))
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "demo", "--extractive", "--questions", "1", "--keep-running"]
    demo = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        seen = []
        for line in demo.stdout:  # "Scoring with ..." is printed once Phoenix answers /healthz
            seen.append(line)
            if line.startswith("Scoring with"):
                break
        assert seen and seen[-1].startswith("Scoring with"), "".join(seen)
        descendants = psutil.Process(demo.pid).children(recursive=True)
        assert any("phoenix" in " ".join(p.cmdline()) for p in descendants), [p.cmdline() for p in descendants]
        demo.send_signal(signal.SIGKILL)
        demo.wait(30)
        assert _gone([p.pid for p in descendants], timeout=60) == []
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
