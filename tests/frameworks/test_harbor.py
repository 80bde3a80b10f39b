"""Harbor's own `harbor run`, its oracle agent and its verifier, over tasks in Harbor's format, each trial in a quinebox box.

The tasks (harbor_data/) are built on the local base image, with no network: three the oracle solves (reward 1.0)
and one whose tests fail (reward 0). The rewards are read from Harbor's own result files, and the figures (wall
time at 4 concurrent trials, the time per trial beyond the task's own commands) from its own timing records and
the commands' own clocks (each script prints how long it ran).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable
from datetime import datetime
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from quinebox import QuineboxError, Sandbox
from quinebox.integrations.harbor import QuineboxEnvironment

HARBOR = Path(sys.executable).parent / "harbor"
DATA = Path(__file__).parent / "harbor_data"
IMPORT_PATH = "quinebox.integrations.harbor:QuineboxEnvironment"
EXPECTED = {"write-file": 1.0, "fix-script": 1.0, "root-layer": 1.0, "wrong-answer": 0.0}


def harbor_run(jobs: Path, name: str) -> float:
    """One `harbor run` of the oracle over every task, 4 trials at once, as job `name`: its wall time."""
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "NO_COLOR": "1"}
    # No network: Harbor runs in a network namespace of its own with nothing in it (as root), so a registry or a
    # model it tried to reach would fail the run; the engine and quinebox's state are reached over unix sockets.
    offline = ["unshare", "--net", "--"] if os.geteuid() == 0 and shutil.which("unshare") else []
    began = time.monotonic()
    done = subprocess.run(
        [*offline, str(HARBOR), "run", "--path", str(DATA), "--agent", "oracle", "--env", IMPORT_PATH, "--n-concurrent", "4",
         "--jobs-dir", str(jobs), "--job-name", name, "--quiet", "--yes", "--ek", "ttl=10m"],  # a box a failure left goes
        capture_output=True, text=True, timeout=600, env=env, cwd=jobs,
    )
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return wall


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, float]]:
    """The job twice: cold (this state dir unpacks each task's image the first time a box takes it) and warm (as
    every later trial of a benchmark's runs): each one's job dir and wall time."""
    root = tmp_path_factory.mktemp("harbor-jobs")
    return {name: (root / name, harbor_run(root, name)) for name in ("cold", "warm")}


def trial_results(job_dir: Path) -> dict[str, dict]:
    """Each trial's result.json (Harbor's own record), by task name."""
    results = {}
    for path in job_dir.glob("*/result.json"):
        result = json.loads(path.read_text())
        results[result["task_name"]] = result | {"_dir": path.parent}
    return results


def seconds(timing: dict | None) -> float:
    if not timing or not timing.get("started_at") or not timing.get("finished_at"):
        return 0.0
    return (datetime.fromisoformat(timing["finished_at"]) - datetime.fromisoformat(timing["started_at"])).total_seconds()


def own_time(log: Path) -> float:
    """What a task's script said it ran for (its `qb-elapsed-ns` line), in seconds."""
    found = re.search(r"qb-elapsed-ns (\d+)", log.read_text())
    assert found, f"{log} has no elapsed line: {log.read_text()!r}"
    return int(found.group(1)) / 1e9


@pytest.mark.parametrize("run", ["cold", "warm"])
def test_oracle_rewards_from_harbors_result_files(jobs: dict[str, tuple[Path, float]], run: str) -> None:
    job_dir, _ = jobs[run]
    results = trial_results(job_dir)
    assert set(results) == set(EXPECTED), results.keys()
    for name, reward in EXPECTED.items():
        result = results[name]
        assert result.get("exception_info") is None, (name, result["exception_info"])
        assert result["verifier_result"]["rewards"] == {"reward": reward}, (name, result["verifier_result"])
    summary = json.loads((job_dir / "result.json").read_text())
    assert (summary["stats"]["n_completed_trials"], summary["stats"]["n_errored_trials"]) == (4, 0), summary["stats"]
    (evals,) = summary["stats"]["evals"].values()
    assert evals["metrics"] == [{"mean": 0.75}]


def test_figures_at_four_concurrent_trials(jobs: dict[str, tuple[Path, float]], capsys: pytest.CaptureFixture[str]) -> None:
    """Wall time, and each trial's time beyond the task's own commands (solve.sh, test.sh, by their own clocks),
    Harbor's environment setup (the build or its reuse, the box's start) apart."""
    for run, (job_dir, wall) in jobs.items():
        rows = []
        for name, result in sorted(trial_results(job_dir).items()):
            trial = seconds({"started_at": result["started_at"], "finished_at": result["finished_at"]})
            setup = seconds(result["environment_setup"])
            commands = own_time(result["_dir"] / "agent" / "oracle.txt") + own_time(result["_dir"] / "verifier" / "test-stdout.txt")
            rows.append((name, trial, setup, commands, trial - setup - commands))
        with capsys.disabled():
            print(f"\nharbor run ({run}), oracle, {len(rows)} tasks, 4 concurrent trials, quinebox environment: wall {wall:.2f} s")
            for name, trial, setup, commands, added in rows:
                print(f"  {name:13} trial {trial:5.2f} s = environment setup {setup:5.2f} s + the task's commands {commands:5.3f} s + the rest {added:5.2f} s")
            print(f"  a trial's time beyond its commands, mean: {sum(r[4] + r[2] for r in rows) / len(rows):.2f} s "
                  f"({sum(r[2] for r in rows) / len(rows):.2f} s setup, {sum(r[4] for r in rows) / len(rows):.2f} s the rest)")
        assert all(added > 0 for *_, added in rows)


async def timed(call: Awaitable[object]) -> float:
    began = time.monotonic()
    await call
    return time.monotonic() - began


def make_environment(tmp_path: Path, environment_dir: Path, **options) -> QuineboxEnvironment:
    """The provider as Harbor's trial makes it (environment dir, task config, trial paths, options)."""
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    config = EnvironmentConfig.model_validate(options.pop("task_env", {}))
    options.setdefault("ttl", "10m")  # a box a failed test left goes
    return QuineboxEnvironment(
        environment_dir=environment_dir, environment_name=environment_dir.parent.name, session_id=f"{tmp_path.name}__env",
        trial_paths=paths, task_env_config=config, logger=logging.getLogger("test"), **options,
    )


def test_a_compose_task_is_refused_in_one_line(tmp_path: Path) -> None:
    environment = tmp_path / "task" / "environment"
    environment.mkdir(parents=True)
    (environment / "Dockerfile").write_text("FROM quinebox/base:bookworm\n")
    (environment / "docker-compose.yaml").write_text("services:\n  main:\n    build: .\n")
    with pytest.raises(ValueError) as refused:
        make_environment(tmp_path, environment)
    said = str(refused.value)
    assert "docker-compose" in said and "--env docker" in said and "\n" not in said


def test_network_policy_resources_and_mounts_become_grants(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    environment = make_environment(
        tmp_path, DATA / "write-file" / "environment",
        network_policy=NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org", "*.pythonhosted.org", "10.1.2.3", "10.0.0.0/8", "2001:db8::1"]),
        override_cpus=1.5, override_memory_mb=768, override_storage_mb=2048, mounts=[{"type": "bind", "source": str(shared), "target": "/data", "read_only": True}],
    )
    assert environment.grants() == [
        "rootfs:rw", "net:pypi.org:*", "net:*.pythonhosted.org:*", "net:10.1.2.3", "net:10.0.0.0/8", "net:[2001:db8::1]:*",
        "cpus:1.5", "mem:768m", "tmp:2048m", f"ro:{shared}=/data",
    ]
    public = make_environment(tmp_path / "p", DATA / "write-file" / "environment")
    assert public.grants() == ["rootfs:rw", "net"]
    closed = make_environment(tmp_path / "c", DATA / "write-file" / "environment", network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    assert closed.grants() == ["rootfs:rw"]


def test_a_trial_on_the_docker_engine_is_refused_in_one_line_and_leaves_no_box(tmp_path: Path) -> None:
    """A task's box needs a writable root of its own, bounded, and a root that is no one outside: the engine gives
    neither here (overlay2 on ext4 has no size; no userns-remap), so the trial's start is one line saying so."""
    environment = make_environment(tmp_path, DATA / "write-file" / "environment", network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK), backend="docker")

    async def trial() -> None:
        try:
            await environment.start(force_build=False)
        finally:
            await environment.stop(delete=True)

    before = {sb.id for sb in Sandbox.running()}
    with pytest.raises(QuineboxError) as refused:
        asyncio.run(trial())
    said = str(refused.value)
    assert said.startswith("refused rootfs:rw on the Docker engine") and said.endswith("use --backend oci") and "\n" not in said, said
    assert {sb.id for sb in Sandbox.running()} == before


def test_stop_without_delete_keeps_the_box(tmp_path: Path) -> None:
    """`--no-delete`: the trial's box outlives its environment (and Harbor's process); it is found by id and removed."""
    environment = make_environment(tmp_path, DATA / "write-file" / "environment", network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))

    async def trial() -> str:
        await environment.start(force_build=False)
        made = await environment.exec("echo kept > /app/note && id -u && pwd", user="root")
        assert (made.return_code, made.stdout) == (0, "0\n/app\n")
        box = environment.sandbox.id
        await environment.stop(delete=False)
        return box

    box = asyncio.run(trial())
    kept = Sandbox.connect(box)
    try:
        assert kept.read_file("/app/note") == b"kept\n"
    finally:
        kept.destroy()
    with pytest.raises(QuineboxError):
        Sandbox.connect(box)


def test_files_in_and_out_keep_bytes_and_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (local / "run.sh").chmod(0o755)
    (local / "sub" / "data.bin").write_bytes(bytes(range(256)) * 64)
    environment = make_environment(tmp_path, DATA / "write-file" / "environment", network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))

    async def trial() -> None:
        await environment.start(force_build=False)
        try:
            await environment.upload_dir(local, "/solution")
            await environment.upload_file(local / "run.sh", "/opt/one/run.sh")
            ran = await environment.exec("/solution/run.sh && /opt/one/run.sh && stat -c %a /opt/one/run.sh")
            assert (ran.return_code, ran.stdout) == (0, "ran\nran\n755\n")
            await environment.download_dir("/solution", tmp_path / "back")
            await environment.download_file("/solution/sub/data.bin", tmp_path / "one.bin")
            with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
                await environment.exec("sleep 30", timeout_sec=1)
            alive = await environment.exec("echo still")
            assert alive.stdout == "still\n"
            heard: list[tuple[str, str]] = []

            async def watch(text: str, stream: str) -> None:
                heard.append((stream, text))

            with environment.scoped_output_callback(watch):  # a trial's log callbacks: output as it comes
                watched = await environment.exec("echo one; echo two >&2; exit 3")
            assert (watched.return_code, watched.stdout, watched.stderr) == (3, "one\n", "two\n")
            assert sorted(heard) == [("stderr", "two\n"), ("stdout", "one\n")]
            through = [await timed(environment.exec("true")) for _ in range(10)]
            direct = [await timed(environment.sandbox.aexec(["bash", "-c", "true"], user="0")) for _ in range(10)]
            latency.extend([statistics.median(through), statistics.median(direct)])
        finally:
            await environment.stop(delete=True)

    latency: list[float] = []
    asyncio.run(trial())
    with capsys.disabled():
        print(f"\nexec latency, median of 10: Harbor's exec through the provider {latency[0] * 1000:.1f} ms, sb.aexec of the same command {latency[1] * 1000:.1f} ms")
    assert (tmp_path / "back" / "sub" / "data.bin").read_bytes() == bytes(range(256)) * 64
    assert (tmp_path / "one.bin").read_bytes() == bytes(range(256)) * 64
    assert (tmp_path / "back" / "run.sh").stat().st_mode & 0o777 == 0o755
    shutil.rmtree(tmp_path / "back")
