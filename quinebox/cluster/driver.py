"""The driver: each input a Ray task on some node, its outputs streamed home, landed exactly once.

Ray places every task (one unit of the `quinebox` resource each); quinebox schedules nothing. What
Ray cannot know the driver does: an attempt whose node or worker died is tried again (Ray's own
retries are off, so every attempt has a number of ours, on its boxes' labels and its staging
files), and a node that cannot run boxes is kept out of that input's next placement. Results,
`--resume`, retries of temporary failures and Ctrl-C are the local runner's (tree/fanout.py); a stop
also cancels the cluster's tasks, which kills their workers and so their boxes.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quinebox.cluster.commit import Commits, Staged
from quinebox.cluster.connect import RESOURCE, Cluster, first_line
from quinebox.cluster.node import CHUNK, attempt
from quinebox.errors import QuineboxError
from quinebox.processes import owner_tag
from quinebox.state import cluster_dir
from quinebox.tree.fanout import RETRY_PAUSE, Attempt, Job, Options, Progress, Runner

#: Tries at one input whose nodes died under it before the input fails (Ray's own default is three retries).
NODE_TRIES = 4
#: Pieces a node may stream ahead of the driver taking them.
AHEAD = 4


class NodeLost(Exception):
    """The attempt's node, or its worker, died before the attempt came home whole."""


@dataclass(frozen=True)
class Unready:
    """The node the attempt landed on cannot run boxes (no engine, no image)."""

    node: str
    why: str


class Dispatch:
    """Runs numbered attempts as Ray tasks and streams each one home into staging files."""

    def __init__(self, cluster: Cluster, out: Path, run: str, options: Options):
        self.cluster = cluster
        self.out = out
        self.run = run
        self.agent_options = {
            "max_turns": options.max_turns, "max_tokens": options.max_tokens,
            "ask": options.ask, "deny": options.deny, "ask_timeout": options.ask_timeout,
        }
        placement: dict[str, Any] = {
            "resources": {RESOURCE: 1}, "num_cpus": 0, "max_retries": 0, "num_returns": "streaming",
            "_generator_backpressure_num_objects": AHEAD,  # the node waits for the driver, instead of filling the object store
        }
        if cluster.forwarded:
            placement["runtime_env"] = {"env_vars": cluster.forwarded}
        self.task = cluster.ray.remote(**placement)(attempt)
        self.staging = cluster_dir() / owner_tag() / run
        self.inflight: set[Any] = set()
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Kill every running attempt's worker, and with it its boxes."""
        with self._lock:
            running = list(self.inflight)
        for generator in running:
            try:
                self.cluster.ray.cancel(generator, force=True)
            except Exception:  # noqa: BLE001 it ended meanwhile (Ray's error for that has no stable type)
                pass

    def run_attempt(self, job: Job, number: int, avoid: Collection[str] = ()) -> Staged | Unready:
        """Attempt `number` at `job`, on any node but those in `avoid`; raises NodeLost."""
        ray = self.cluster.ray
        sent = time.time()
        task = self.task
        if avoid:
            from ray.util.scheduling_strategies import NodeLabelSchedulingStrategy, NotIn

            task = task.options(scheduling_strategy=NodeLabelSchedulingStrategy(hard={"ray.io/node-id": NotIn(*avoid)}))
        wire = {"mission": job.mission, "model": job.model, "grants": list(job.grants), "image": job.image, "timeout": job.timeout}
        tags = {"run": self.run, "input": job.name, "attempt": str(number)}
        generator = task.remote(wire, self._material(job), tags, self.agent_options)
        with self._lock:
            self.inflight.add(generator)
        try:
            return self._receive(job, number, iter(generator), sent)
        except ray.exceptions.RayTaskError as exc:  # quinebox's own code failed on the node (its disk full, say): the input fails, the run goes on
            raise QuineboxError(f"the node failed the attempt: {first_line(exc.cause if exc.cause is not None else exc)}") from None
        except ray.exceptions.RayError as exc:
            raise NodeLost(first_line(exc)) from None
        finally:
            with self._lock:
                self.inflight.discard(generator)

    def _material(self, job: Job) -> bytes | list[Any] | None:
        """Small material goes with the task; larger goes through the object store in CHUNK pieces."""
        material = job.material
        if material is None or (isinstance(material, bytes) and len(material) <= CHUNK):
            return material
        if isinstance(material, bytes):
            return [self.cluster.ray.put(material[at : at + CHUNK]) for at in range(0, len(material), CHUNK)]
        if material.stat().st_size <= CHUNK:
            return material.read_bytes()
        refs = []
        with open(material, "rb") as source:
            while piece := source.read(CHUNK):
                refs.append(self.cluster.ray.put(piece))
        return refs

    def _receive(self, job: Job, number: int, stream: Any, sent: float) -> Staged | Unready:
        get = self.cluster.ray.get
        first = next(stream, None)  # a generator cancelled (Ctrl-C) before its first object simply ends
        if first is None:
            raise NodeLost("the attempt ended before it said where it ran: cancelled, or its worker gone")
        news = get(first)
        if news["kind"] == "unready":
            return Unready(news["node"], news["why"])
        label = f"{self.run}-{number}"
        staged = Staged(
            name=job.name, number=number, node=news["node"], attempt=Attempt(**news["attempt"]),
            out=self.out / f".{job.name}.out.{label}.part", err=self.out / f".{job.name}.err.{label}.part",
            tapes=self.staging / f"{job.name}-{number}", sessions=news["sessions"],
        )
        staged.tapes.mkdir(parents=True, exist_ok=True)
        files: dict[str, Any] = {}
        try:
            pieces = news["inline"].items() if news["inline"] is not None else (get(ref) for ref in stream)
            for kind, piece in pieces:
                if kind not in files:
                    path = staged.out if kind == "out" else staged.err if kind == "err" else staged.tapes / f"{kind.removeprefix('tape:')}.tape"
                    files[kind] = open(path, "wb")
                files[kind].write(piece)
                del piece
        except BaseException:
            for file in files.values():
                file.close()
            staged.discard()
            raise
        for file in files.values():
            file.close()
        staged.overhead_s = max(0.0, time.time() - sent - news["ran_s"])
        return staged


class ClusterRunner(Runner):
    """The local runner's results, resume and stops, with each attempt run on the cluster."""

    def __init__(self, jobs: list[Job], out_dir: str, options: Options, progress: Progress, cluster: Cluster):
        super().__init__(jobs, out_dir, options, progress)
        self.cluster = cluster
        self.dispatch = Dispatch(cluster, self.out, secrets.token_hex(4), options)
        self.commits = Commits(self.out)
        #: Per landed input, what the cluster added to its time (bench/cluster.py reports the median).
        self.overheads: list[float] = []
        self._numbers: dict[str, int] = {}

    def run(self) -> int:
        try:
            return super().run()
        finally:
            if self.stopping.is_set():  # the cancelled attempts' workers are dead by now; a box one left created is its node's gc's
                self.cluster.collect_garbage()
            self.commits.close()
            shutil.rmtree(self.dispatch.staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.dispatch.staging.parent.rmdir()  # this process's, when no other run of it stages there

    def stop(self, *, interrupted: bool = False) -> None:
        super().stop(interrupted=interrupted)
        self.dispatch.cancel()

    def _await_engine(self) -> None:
        self.stopping.wait(RETRY_PAUSE)  # the engine of some node: the retry may well land on another

    def _failed(self, job: Job, why: str, tries: int, *, nodes: bool = False) -> Attempt:
        """An input that failed before any attempt came home: its .err says why, as a local map's would.
        `nodes`: the cluster's nodes failed it, not quinebox or the input, so `--retries` may try again."""
        (self.out / f"{job.name}.out").write_bytes(b"")
        (self.out / f"{job.name}.err").write_text(f"quinebox: {why}\n")
        return Attempt(QuineboxError.exit_code, termination=why, engine_failed=nodes, tries=tries)

    def _number(self, job: Job) -> int:
        with self._lock:
            self._numbers[job.name] = self._numbers.get(job.name, 0) + 1
            return self._numbers[job.name]

    def _attempt(self, job: Job) -> Attempt:
        avoid: set[str] = set()
        lost = 0
        tries = 0
        while not self.stopping.is_set():
            tries += 1
            self.record.attempt(job.name, job.source, None)  # its session is known here only once the attempt comes home
            try:
                got = self.dispatch.run_attempt(job, self._number(job), avoid)
            except NodeLost as exc:
                lost += 1
                if self.stopping.is_set():
                    break  # cancelled by the stop: not a result, so a resume runs it again
                if lost >= NODE_TRIES:
                    return self._failed(job, f"{lost} attempts lost their node: {exc}", tries, nodes=True)
                if not self.cluster.box_nodes():  # Ray would hold the retry until a node came back
                    return self._failed(job, "no node of the cluster runs boxes any more", tries, nodes=True)
                continue
            except QuineboxError as exc:
                return self._failed(job, str(exc), tries)
            if isinstance(got, Unready):
                avoid.add(got.node)
                if not set(self.cluster.box_nodes()) - avoid:
                    return self._failed(job, f"no node of the cluster can run it: {got.why}", tries, nodes=True)
                continue
            if self.commits.commit(got):
                with self._lock:
                    self.overheads.append(got.overhead_s)
            return Attempt(**{**got.attempt.__dict__, "tries": tries})
        return Attempt(130, termination="stopped", tries=tries)
