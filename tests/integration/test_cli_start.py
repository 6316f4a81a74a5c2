"""`rayq start` / `rayq stop` as a user runs them from shells, and CLI commands that find
no runtime. `rayq start` runs `ray start`: this module runs in its own process, after
the others, in its own namespace where the machine allows it (tests/own_process.sh)."""

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.own_process]


def shell(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """A fresh process, as from another shell: no Ray address inherited."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def rayq_cli(*args: str) -> subprocess.CompletedProcess:
    return shell("-m", "rayq.cli", *args)


def python(code: str) -> str:
    done = shell("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def assert_no_runtime(done: subprocess.CompletedProcess) -> None:
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "rayq start" in lines[0], lines
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["status"], ["report", "--out", "x"], ["stop"],
                                     ["account", "create", "nobody"]])
def test_a_command_that_finds_no_runtime_says_so_in_one_line(command):
    assert_no_runtime(rayq_cli(*command))


def test_a_started_runtime_outlives_its_shell_and_keeps_its_data_across_stop(tmp_path):
    data_dir = str(tmp_path / "data")
    started = rayq_cli("start", "--data-dir", data_dir, "--consumers", "1")
    assert started.returncode == 0, started.stderr[-3000:]
    assert "127.0.0.1:" in started.stdout and "rayq stop" in started.stdout
    try:
        python("import rayq; rayq.connect().create_queue('kept').send('still here')")
        status = rayq_cli("status")
        assert status.returncode == 0 and "kept" in status.stdout, status.stderr[-3000:]
    finally:
        stopped = rayq_cli("stop")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    said = " ".join(stopped.stdout.split())  # as the terminal wrapped it
    assert " processes); the data stays" in said, said  # none had to be killed
    assert_no_runtime(rayq_cli("status"))

    again = rayq_cli("start", "--data-dir", data_dir, "--no-dashboard")
    assert again.returncode == 0, again.stderr[-3000:]
    try:
        body = python("import rayq; q = rayq.connect().queue('kept'); "
                      "print([m.body for m in q.receive(wait_s=5)])")
        assert body == "['still here']"
    finally:
        assert rayq_cli("stop").returncode == 0
