"""Ray jobs on the head `rayq start` starts, with nothing set beyond what it prints, and
starting beside a cluster that is gone. Each test keeps Ray's files (ray_current_cluster,
session directories) in a temporary directory of its own (RAY_TMPDIR), so it sees and
stops only its own head; own_process, as `rayq start` runs `ray start`."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.own_process]

AGENT_PORT = 52365  # Ray's default dashboard agent port


@pytest.fixture
def ray_tmp():
    """A short private Ray temp dir (unix socket paths must stay under 108 bytes)."""
    path = tempfile.mkdtemp(prefix="rq", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def shell(ray_tmp: str, *args: str, env: dict | None = None, timeout_s: float = 600,
          cwd: str | None = None) -> subprocess.CompletedProcess:
    """A fresh process as from another shell of this machine, Ray's files in ``ray_tmp``."""
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    base["PYTHONPATH"] = os.pathsep.join([os.getcwd(), base.get("PYTHONPATH", "")])
    base["RAY_TMPDIR"] = ray_tmp
    return subprocess.run([sys.executable, *args], env={**base, **(env or {})}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout_s)


def rayq_cli(ray_tmp: str, *args: str) -> subprocess.CompletedProcess:
    return shell(ray_tmp, "-m", "rayq.cli", *args)


def current_cluster(ray_tmp: str) -> str:
    with open(os.path.join(ray_tmp, "ray", "ray_current_cluster")) as f:
        return f.read().strip()


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


JOB = textwrap.dedent("""
    import ray
    import rayq

    @rayq.task(type="square")
    def square(x):
        return x * x

    client = rayq.connect()
    print("squares:", ray.get([client.submit(square, i, tenant="jobs") for i in range(6)]))
""")

SUBMIT = textwrap.dedent("""
    import sys, time
    from ray.job_submission import JobStatus, JobSubmissionClient

    jobs = JobSubmissionClient(sys.argv[1])
    job = jobs.submit_job(entrypoint="python job.py", runtime_env={"working_dir": sys.argv[2]})
    deadline = time.monotonic() + 300
    while jobs.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED,
                                           JobStatus.STOPPED} and time.monotonic() < deadline:
        time.sleep(1)
    print("status:", jobs.get_job_status(job))
    print(jobs.get_job_logs(job))
""")


def printed_exports(output: str) -> dict:
    return dict(re.findall(r"^\s*export (\w+)=(\S+)$", output, re.MULTILINE))


def test_a_ray_job_submitted_to_the_printed_dashboard_gets_its_task_results(ray_tmp, tmp_path):
    taken = socket.socket()
    try:  # Ray's default agent port busy, as when another Ray runs here: not needed
        taken.bind(("127.0.0.1", AGENT_PORT))
        taken.listen()
    except OSError:
        pass  # another Ray holds it already
    started = rayq_cli(ray_tmp, "start", "--data-dir", str(tmp_path / "data"), "--consumers", "1")
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        out = started.stdout
        url = re.search(r"ray job submit --address (http://127\.0\.0\.1:\d+) ", out).group(1)
        assert re.search(r"Ray dashboard: " + re.escape(url), out)
        work = tmp_path / "work"
        work.mkdir()
        (work / "job.py").write_text(JOB)
        done = shell(ray_tmp, "-c", SUBMIT, url, str(work), env=printed_exports(out))
        assert done.returncode == 0, done.stderr[-3000:]
        assert "status: SUCCEEDED" in done.stdout, done.stdout[-3000:]
        assert "squares: [0, 1, 4, 9, 16, 25]" in done.stdout
    finally:
        taken.close()
        stopped = rayq_cli(ray_tmp, "stop")
    assert stopped.returncode == 0, stopped.stderr[-3000:]


def test_start_passes_over_a_stale_cluster_file_in_one_line(ray_tmp, tmp_path):
    os.makedirs(os.path.join(ray_tmp, "ray"))
    stale = f"127.0.0.1:{dead_port()}"
    with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
        f.write(stale)
    code = (f"import rayq; c = rayq.start(data_dir={str(tmp_path / 'data')!r}, consumers=0, "
            "dashboard=False); print('queues:', c.list_queues()); rayq.shutdown()")
    done = shell(ray_tmp, "-c", code, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "queues: []" in done.stdout
    said = [line for line in done.stderr.splitlines() if stale in line]
    assert len(said) == 1 and "does not answer" in said[0] and "embedded" in said[0], said


def test_a_named_address_that_does_not_answer_fails_in_one_line(ray_tmp, tmp_path):
    address = f"127.0.0.1:{dead_port()}"
    code = f"import rayq; rayq.start(data_dir={str(tmp_path / 'data')!r})"
    done = shell(ray_tmp, "-c", code, env={"RAY_ADDRESS": address}, timeout_s=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rayq.errors.RuntimeFailure") and address in last, last


def test_start_after_its_head_was_killed_starts_a_new_head(ray_tmp, tmp_path):
    from rayq.runtime.local import session_processes

    data = str(tmp_path / "data")
    first = rayq_cli(ray_tmp, "start", "--data-dir", data, "--consumers", "0", "--no-dashboard")
    assert first.returncode == 0, first.stderr[-3000:]
    dead = current_cluster(ray_tmp)
    sessions = os.path.join(ray_tmp, "ray", "session_latest")
    for proc in session_processes(os.path.realpath(sessions)):  # this test's head only
        os.kill(proc.pid, signal.SIGKILL)
    again = rayq_cli(ray_tmp, "start", "--data-dir", data, "--consumers", "0", "--no-dashboard")
    try:
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"the Ray at {dead}" in again.stdout and "does not answer" in again.stdout
        assert "(started)" in again.stdout and current_cluster(ray_tmp) != dead
    finally:
        assert rayq_cli(ray_tmp, "stop").returncode == 0


WORKING_DIR_JOB = textwrap.dedent("""
    import ray
    import rayq
    from helpers import shout  # a sibling module, shipped with the job's working_dir

    def greet(word):
        return shout(word)

    client = rayq.connect()
    job_dir = ray.get_runtime_context().runtime_env["working_dir"]  # gcs://_ray_pkg_...zip
    greet_task = rayq.task(type="greet", num_cpus=0, runtime_env={"working_dir": job_dir})(greet)
    print("greetings:", ray.get([client.submit(greet_task, w) for w in ("hello", "rayq")]))
""")


def test_a_jobs_type_with_the_jobs_working_dir_runs_its_handler_beside_its_modules(ray_tmp,
                                                                                  tmp_path):
    started = rayq_cli(ray_tmp, "start", "--data-dir", str(tmp_path / "data"), "--consumers", "1")
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        url = re.search(r"ray job submit --address (http://127\.0\.0\.1:\d+) ",
                        started.stdout).group(1)
        work = tmp_path / "work"
        work.mkdir()
        (work / "job.py").write_text(WORKING_DIR_JOB)
        (work / "helpers.py").write_text("def shout(word):\n    return word.upper() + '!'\n")
        done = shell(ray_tmp, "-c", SUBMIT, url, str(work), env=printed_exports(started.stdout))
        assert done.returncode == 0, done.stderr[-3000:]
        assert "status: SUCCEEDED" in done.stdout, done.stdout[-3000:]
        assert "greetings: ['HELLO!', 'RAYQ!']" in done.stdout
    finally:
        stopped = rayq_cli(ray_tmp, "stop")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
