"""`map --cluster` on a real multi-node Ray cluster on this machine, every node running real boxes.

The nodes share this machine's engine, so each has a state dir of its own (its raylet's
QUINEBOX_STATE_DIR): what a node spools, its sessions and its lifeline sockets are its own.
"""

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from commands import QUINEBOX, qb, scripts, wait_for
from live_boxes import live_boxes

pytestmark = pytest.mark.root_only  # its nodes run on the Docker backend

REPO = Path(__file__).resolve().parents[2]
COUNT = f"script:{REPO / 'examples' / 'missions' / 'count-lines.yaml'}"
RUN_LABEL = "io.quinebox.run"


@dataclass
class Node:
    ray_node: object
    state: Path


@dataclass
class LocalCluster:
    cluster: object
    nodes: dict
    root: Path

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, name: str, slots: int = 2, **env: str) -> Node:
        state = self.root / name
        state.mkdir()
        # Nodes on the Docker backend: these tests break a node by taking its engine away, and count the engine's boxes.
        env_vars = {"QUINEBOX_STATE_DIR": str(state), "QUINEBOX_BACKEND": "docker", **env}
        ray_node = self.cluster.add_node(num_cpus=2, resources={"quinebox": slots}, env_vars=env_vars)
        self.cluster.wait_for_nodes()
        self.nodes[name] = Node(ray_node, state)
        return self.nodes[name]

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name).ray_node, allow_graceful=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, engine):
    """A head that runs no boxes and three worker nodes of two box slots each."""
    from ray.cluster_utils import Cluster

    made = LocalCluster(Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}), {}, tmp_path_factory.mktemp("cluster"))
    for name in ("a", "b", "c"):
        made.add(name)
    yield made
    import ray

    ray.shutdown()
    made.cluster.shutdown()


@pytest.fixture
def connected(cluster):
    """This test process as a driver of the cluster (the CLI's drivers are processes of their own)."""
    from quinebox.cluster.connect import connect

    return connect(cluster.address)


def inputs(directory: Path, count: int) -> list[Path]:
    directory.mkdir()
    paths = []
    for i in range(count):
        paths.append(directory / f"doc{i:02d}.txt")
        paths[-1].write_text("line\n" * (i + 1))
    return paths


def results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def sessions_on(node: Node) -> set[str]:
    return {p.name for p in (node.state / "sessions").iterdir()} if (node.state / "sessions").is_dir() else set()


def boxes_of_runs(engine) -> list:
    return [box for box in live_boxes(engine, RUN_LABEL) if box.status != "exited"]


def test_map_on_three_nodes_matches_a_local_map(cluster, engine, tmp_path):
    docs = inputs(tmp_path / "in", 40)
    before = {name: sessions_on(node) for name, node in cluster.nodes.items()}
    done = qb("map", "-m", COUNT, "Count the lines", str(tmp_path / "in" / "*.txt"), "--out", str(tmp_path / "remote"), "--cluster", cluster.address, "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    remote = results(tmp_path / "remote")
    # The driver has every session and its tape, so ls/show work there as for a local run.
    shown = qb("show", remote[0]["session"])
    assert shown.returncode == 0 and b"The material has" in shown.stdout + shown.stderr, shown.stderr
    listed = qb("ls", "-n", "100").stdout.decode()
    assert all(r["session"] in listed for r in remote)
    local = qb("map", "-m", COUNT, "Count the lines", str(tmp_path / "in" / "*.txt"), "--out", str(tmp_path / "local"), "-P", "6", timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]

    for doc in docs:
        for suffix in (".out", ".err"):
            assert (tmp_path / "remote" / (doc.name + suffix)).read_bytes() == (tmp_path / "local" / (doc.name + suffix)).read_bytes()
    assert (tmp_path / "remote" / "doc07.txt.out").read_bytes() == b"The material has 8 lines.\n"
    here = results(tmp_path / "local")
    assert [set(r) for r in remote] == [set(r) for r in here]
    assert sorted((r["input"], r["exit_code"], r["attempts"], r["termination"], r["tokens"]) for r in remote) == sorted(
        (r["input"], r["exit_code"], r["attempts"], r["termination"], r["tokens"]) for r in here
    )
    assert sorted(os.listdir(tmp_path / "remote")) == sorted(os.listdir(tmp_path / "local"))  # nothing staged is left behind
    assert json.loads(done.stderr.decode().splitlines()[-1])["done"] == 40

    # Placed by Ray over every node; each session ran on exactly one node.
    ran = {name: sessions_on(node) - before[name] for name, node in cluster.nodes.items()}
    assert all(ran.values()), {name: len(s) for name, s in ran.items()}
    assert sorted(s for sessions in ran.values() for s in sessions) == sorted(r["session"] for r in remote)

    assert not boxes_of_runs(engine)


def test_a_node_lost_mid_run_loses_no_input_and_duplicates_none(cluster, engine, tmp_path):
    slow = scripts(tmp_path, slow=[{"sh": "sleep 2; wc -l <&3 >&4"}, {"exit": "success"}]) / "slow.yaml"
    docs = inputs(tmp_path / "in", 16)
    victim = cluster.add("victim", slots=3)
    driver = subprocess.Popen(
        [QUINEBOX, "map", "-m", f"script:{slow}", "count", str(tmp_path / "in" / "*.txt"), "--out", str(tmp_path / "out"), "--cluster", cluster.address],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: list((victim.state / "run").glob("*.sock")) if (victim.state / "run").is_dir() else [], timeout=120)
        labelled = boxes_of_runs(engine)
        assert labelled and all({"io.quinebox.input", "io.quinebox.attempt"} <= set(b.labels) for b in labelled)
        runs = {b.labels[RUN_LABEL] for b in labelled}
        cluster.remove("victim")
        _, err = driver.communicate(timeout=300)
    finally:
        driver.kill()
    assert driver.returncode == 0, err[-3000:]
    records = results(tmp_path / "out")
    assert sorted(r["input"] for r in records) == sorted(str(d) for d in docs)  # one line per input
    assert all(r["exit_code"] == 0 for r in records)
    assert any(r["attempts"] > 1 for r in records)  # what the lost node ran was run again
    for i, doc in enumerate(docs):
        assert (tmp_path / "out" / f"{doc.name}.out").read_bytes() == f"{i + 1}\n".encode()
    assert sorted(os.listdir(tmp_path / "out")) == sorted(["results.jsonl", *(d.name + s for d in docs for s in (".out", ".err"))])

    # The lost node's boxes died with its workers (lifelines), or, caught between create and start, are reaped by its gc
    # once their workers are gone (Ray ends a removed node's workers a moment after the node: gc is run until they are).
    def collected() -> bool:
        gc = qb("gc", env={**os.environ, "QUINEBOX_STATE_DIR": str(victim.state)})
        assert gc.returncode == 0, gc.stderr
        return not [b for b in boxes_of_runs(engine) if b.labels[RUN_LABEL] in runs] and not list((victim.state / "cluster").glob("*"))

    wait_for(collected, timeout=30, every=1.0)
    assert not list((victim.state / "run").glob("*.sock"))
    assert not list((victim.state / "cluster").glob("*"))  # its attempts' spools, whose worker is gone


def test_an_input_run_twice_lands_once(cluster, connected, tmp_path):
    from quinebox.cluster.commit import Commits
    from quinebox.cluster.driver import Dispatch
    from quinebox.tree.fanout import Job, Options

    out = tmp_path / "out"
    out.mkdir()
    dispatch = Dispatch(connected, out, "twice", Options())
    job = Job(name="x", source="x", mission="count", material=b"a\nb\nc\n", model=COUNT)
    staged = [None, None]

    def attempt(number: int) -> None:
        staged[number - 1] = dispatch.run_attempt(job, number)

    both = [threading.Thread(target=attempt, args=(n,)) for n in (1, 2)]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(120)
    first, second = staged
    assert first.attempt.exit_code == second.attempt.exit_code == 0 and first.attempt.session != second.attempt.session
    commits = Commits(out)
    assert commits.commit(second) is True
    assert commits.commit(first) is False
    assert commits.landed == {"x": 2}
    commits.close()
    assert sorted(os.listdir(out)) == ["x.err", "x.out"]
    assert (out / "x.out").read_bytes() == b"The material has 3 lines.\n"
    assert not first.tapes.exists() and not second.tapes.exists()
    from quinebox.agent.store import Index

    index = Index()
    assert index.get(second.attempt.session) is not None and index.get(first.attempt.session) is None
    index.close()


def test_a_driver_killed_mid_run_is_finished_by_resume(cluster, engine, tmp_path):
    slow = scripts(tmp_path, slow=[{"sh": "sleep 1; wc -l <&3 >&4"}, {"exit": "success"}]) / "slow.yaml"
    docs = inputs(tmp_path / "in", 12)
    args = ["map", "-m", f"script:{slow}", "count", str(tmp_path / "in" / "*.txt"), "--out", str(tmp_path / "out"), "--cluster", cluster.address, "-P", "2"]
    driver = subprocess.Popen([QUINEBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (tmp_path / "out" / "results.jsonl").exists() and len(results(tmp_path / "out")) >= 3, timeout=180)
        runs = wait_for(lambda: {b.labels[RUN_LABEL] for b in boxes_of_runs(engine)}, timeout=60)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        driver.kill()
    finished = {r["input"]: r for r in results(tmp_path / "out") if r["exit_code"] == 0}
    assert 3 <= len(finished) < len(docs)
    # The cluster ends a dead driver's tasks, and their workers' boxes with them (through their lifelines);
    # a box a worker had created but not yet started is its node's gc's.
    wait_for(lambda: not [b for b in boxes_of_runs(engine) if b.labels[RUN_LABEL] in runs and b.status == "running"], timeout=90)
    for node in cluster.nodes.values():
        assert qb("gc", env={**os.environ, "QUINEBOX_STATE_DIR": str(node.state)}).returncode == 0
    assert not [b for b in boxes_of_runs(engine) if b.labels[RUN_LABEL] in runs]

    resumed = qb(*args, "--resume", "--json", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = results(tmp_path / "out")
    assert sorted(r["input"] for r in records) == sorted(str(d) for d in docs)
    for record in records:
        if record["input"] in finished:
            assert record == finished[record["input"]]  # kept, not redone
    summary = json.loads(resumed.stderr.decode().splitlines()[-1])
    assert summary["skipped"] == len(finished) and summary["done"] == len(docs)
    for i, doc in enumerate(docs):
        assert (tmp_path / "out" / f"{doc.name}.out").read_bytes() == f"{i + 1}\n".encode()
    assert not any(name.endswith(".part") for name in os.listdir(tmp_path / "out"))
    # What the killed driver was staging is its gc's to remove; the resumed one left nothing.
    staged = Path(os.environ["QUINEBOX_STATE_DIR"]) / "cluster"
    assert [p.name for p in staged.glob(f"{driver.pid}-*")]
    assert qb("gc").returncode == 0
    assert not [p.name for p in staged.glob(f"{driver.pid}-*")]


def test_ctrl_c_cancels_the_clusters_tasks_and_keeps_what_finished(cluster, engine, tmp_path):
    slow = scripts(tmp_path, slow=[{"sh": "sleep 3; wc -l <&3 >&4"}, {"exit": "success"}]) / "slow.yaml"
    inputs(tmp_path / "in", 10)
    args = ["map", "-m", f"script:{slow}", "count", str(tmp_path / "in" / "*.txt"), "--out", str(tmp_path / "out"), "--cluster", cluster.address, "-P", "3"]
    driver = subprocess.Popen([QUINEBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (tmp_path / "out" / "results.jsonl").exists() and results(tmp_path / "out"), timeout=180)
        runs = wait_for(lambda: {b.labels[RUN_LABEL] for b in boxes_of_runs(engine)}, timeout=60)
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=60)
    finally:
        driver.kill()
    assert driver.returncode == 130, err[-3000:]
    assert b"--resume runs the rest" in err
    kept = results(tmp_path / "out")
    assert 1 <= len(kept) < 10 and all(r["exit_code"] == 0 for r in kept)
    # Cancelled tasks' workers are killed, and their boxes with them; the driver has each node's gc reap
    # a box a killed worker had created but not yet started.
    wait_for(lambda: not [b for b in boxes_of_runs(engine) if b.labels[RUN_LABEL] in runs], timeout=30)


def test_a_node_that_cannot_run_boxes_is_reported_and_avoided(cluster, connected, tmp_path):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from quinebox.cluster.driver import ClusterRunner
    from quinebox.tree.fanout import Job, Options

    cluster.add("broken", slots=8, DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    try:
        doctor = qb("doctor", "--cluster", cluster.address, timeout=120)
        assert doctor.returncode == 1
        lines = doctor.stderr.decode().splitlines()
        assert sum("ok    node" in line for line in lines) == 3
        [failed] = [line for line in lines if "FAIL" in line]
        assert "engine" in failed.lower() or "docker" in failed.lower(), failed

        # Hold every working slot, so the first placements can only land on the broken node.
        ray = connected.ray

        @ray.remote(num_cpus=0)
        class Hold:
            def ready(self) -> bool:
                return True

        holds = [
            Hold.options(resources={"quinebox": 2}, scheduling_strategy=NodeAffinitySchedulingStrategy(node.ray_node.node_id, soft=False)).remote()
            for name, node in cluster.nodes.items()
            if name != "broken"
        ]
        ray.get([hold.ready.remote() for hold in holds], timeout=60)
        jobs = [Job(name=f"j{i}", source=f"j{i}", mission="count", material=b"x\n" * (i + 1), model=COUNT) for i in range(4)]
        out = tmp_path / "out"
        runner = ClusterRunner(jobs, str(out), Options(parallel=4), lambda tally, record: None, connected)
        ended = []
        thread = threading.Thread(target=lambda: ended.append(runner.run()))
        thread.start()
        time.sleep(3)  # long enough for each input to land on the broken node first, and be turned away
        for hold in holds:
            ray.kill(hold)
        thread.join(300)
        assert ended == [0]
        records = results(out)
        assert sorted(r["name"] for r in records) == [f"j{i}" for i in range(4)]
        assert all(r["exit_code"] == 0 and r["attempts"] >= 2 for r in records)
        assert (out / "j2.out").read_bytes() == b"The material has 3 lines.\n"
    finally:
        cluster.remove("broken")


def test_the_provider_key_reaches_the_nodes_brokers_only_when_forwarded(cluster, fake_openai, tmp_path):
    from openai_server import exit_, sh

    (tmp_path / "doc").write_text("material\n")
    common = ["map", "-m", "test-model", "show the environment", str(tmp_path / "doc"), "--cluster", cluster.address]
    kept = qb(*common, "--out", str(tmp_path / "kept"), timeout=300)
    assert kept.returncode == 1
    [record] = results(tmp_path / "kept")
    assert record["exit_code"] == 125 and "--forward-env OPENAI_API_KEY" in (tmp_path / "kept" / "doc.err").read_text() + str(record["termination"])
    assert fake_openai.requests == []  # no node had a key or an endpoint: nothing was sent anywhere

    fake_openai.steps = [sh("env >&4; cat <&3 >&4"), exit_()]
    forwarded = qb(*common, "--out", str(tmp_path / "sent"), "--forward-env", "OPENAI_API_KEY", "--forward-env", "OPENAI_BASE_URL", timeout=300)
    assert forwarded.returncode == 0, forwarded.stderr[-3000:]
    key = os.environ["OPENAI_API_KEY"]
    assert len(fake_openai.requests) == 2
    assert all(seen.headers["authorization"] == f"Bearer {key}" for seen in fake_openai.requests)
    deliverable = (tmp_path / "sent" / "doc.out").read_text()
    assert deliverable.endswith("material\n") and key not in deliverable  # the broker held it; the box never did

    missing = qb(*common, "--out", str(tmp_path / "none"), "--forward-env", "NOT_SET_ANYWHERE")
    assert missing.returncode == 125 and missing.stderr.decode().count("\n") == 1 and b"NOT_SET_ANYWHERE" in missing.stderr
    assert not (tmp_path / "none").exists()


def driver_peak_memory(args: list[str]) -> int:
    """The driver's peak private memory (RssAnon: not the object store's shared pages), sampled as it runs, in bytes."""
    driver = subprocess.Popen([QUINEBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while driver.poll() is None:
        try:
            status = Path(f"/proc/{driver.pid}/status").read_text()
        except OSError:
            break
        for line in status.splitlines():
            if line.startswith("RssAnon:"):
                peak = max(peak, int(line.split()[1]) * 1024)
        time.sleep(0.02)
    assert driver.wait() == 0, driver.stderr.read()[-3000:]
    return peak


def test_a_large_deliverable_streams_home_in_pieces(cluster, tmp_path):
    size = 384 << 20
    big = scripts(tmp_path, big=[{"sh": f"head -c {size} /dev/zero | tr '\\0' q >&4; wc -c <&3 >&5"}, {"exit": "success"}]) / "big.yaml"
    small = scripts(tmp_path, small=[{"sh": "echo q >&4; wc -c <&3 >&5"}, {"exit": "success"}]) / "small.yaml"
    material = tmp_path / "material"
    material.write_bytes(os.urandom(1 << 20) * 20)  # 20 MiB in: five pieces through the object store
    common = [str(material), "--cluster", cluster.address]
    baseline = driver_peak_memory(["map", "-m", f"script:{small}", "make a little", *common, "--out", str(tmp_path / "small")])
    peak = driver_peak_memory(["map", "-m", f"script:{big}", "make a lot", *common, "--out", str(tmp_path / "out")])
    out = tmp_path / "out" / "material.out"
    assert out.stat().st_size == size
    with open(out, "rb") as f:
        assert f.read(1 << 20) == b"q" * (1 << 20)
    assert (tmp_path / "out" / "material.err").read_bytes() == b"20971520\n"
    # The driver never held the deliverable whole: it grew by a few pieces at most.
    print(f"driver peak private memory: {baseline >> 20} MiB for a 2-byte deliverable, {peak >> 20} MiB for {size >> 20} MiB")
    assert peak - baseline < size / 8, f"driver peak private memory {peak >> 20} MiB against {baseline >> 20} MiB"


def test_the_python_api_runs_and_maps_on_the_cluster(cluster, tmp_path):
    import asyncio

    import quinebox

    box = quinebox.Runner(model=COUNT, cluster=cluster.address)
    one = box.run("Count the lines", input=b"a\nb\n")
    assert (one.returncode, one.stdout, one.termination, one.turns) == (0, b"The material has 2 lines.\n", "exit_success", 3)

    async def gather() -> dict:
        return {index: result async for index, result in box.map("Count the lines", [b"x\n" * n for n in range(1, 9)], parallel=4)}

    results = asyncio.run(gather())
    assert sorted(results) == list(range(8))
    assert all(results[i].stdout == f"The material has {i + 1} lines.\n".encode() and results[i].returncode == 0 for i in range(8))
    assert len({r.session for r in results.values()}) == 8

    with pytest.raises(quinebox.QuineboxError, match="cannot go to a cluster"):
        box.run("Count", input=b"", world=str(tmp_path))
