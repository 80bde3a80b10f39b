"""One mission over many inputs (`map`) or many jobs (`batch`): a bounded pool of agents.

Each job's deliverable goes to DIR/<name>.out and its diagnostics to
DIR/<name>.err; DIR/results.jsonl gets one line per finished job. Temporary
failures (the provider unavailable, exit 75; the engine failing or gone) are
retried when asked, after the engine answers again; an agent's own failure
never is. Stopping (Ctrl-C, --fail-fast, even SIGKILL) starts nothing new and
kills what runs; what finished is kept, and `resume` skips it next time and
keeps results.jsonl at one line per input.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quinebox.agent.providers import EXIT_UNAVAILABLE
from quinebox.box.options import BoxOptions
from quinebox.documents import read_yaml
from quinebox.errors import EngineError, QuineboxError
from quinebox.tree.runs import RunRecord

RESULTS = "results.jsonl"
RETRY_PAUSE = 0.5
#: How long a retry waits for an engine that failed to answer again.
ENGINE_WAIT = 120.0


@dataclass(frozen=True)
class Job:
    """One agent to run. `material` is a file to stream in, bytes, or nothing."""

    name: str
    source: str
    mission: str
    material: Path | bytes | None = None
    grants: tuple[str, ...] = ()
    image: str | None = None
    model: str | None = None
    timeout: str | None = None
    #: The command that made it, "map" or "batch": what the run's record (runs.py) calls the run.
    kind: str = "map"


@dataclass
class Options:
    #: None: the caller's default (4 here; a cluster's capacity there).
    parallel: int | None = 4
    retries: int = 0
    fail_fast: bool = False
    resume: bool = False
    max_turns: int | None = None
    max_tokens: int | None = None
    #: The ask and deny rules of every agent (a batch runs unattended: `ask_timeout` "0" denies at once).
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    ask_timeout: str | None = None

    def box_for(self, job: Job) -> BoxOptions:
        """The one description of the box a try at `job` runs in: the job's grants, image and time limit, the run's
        ask and deny rules."""
        return BoxOptions.of(grants=job.grants, image=job.image, timeout=job.timeout, ask=self.ask, deny=self.deny, ask_timeout=self.ask_timeout)


@dataclass
class Tally:
    total: int
    done: int = 0
    running: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)


Progress = Callable[[Tally, dict[str, Any] | None], None]


@dataclass(frozen=True)
class Attempt:
    """How one try at a job ended, wherever it ran."""

    exit_code: int
    session: str | None = None
    tokens: int = 0
    termination: str | None = None
    #: The engine (or the node running it) failed, not the agent: worth trying again once it answers.
    engine_failed: bool = False
    #: Tries it took: on a cluster, those whose node died or could not run boxes count too.
    tries: int = 1


def _check_names(jobs: list[Job]) -> list[Job]:
    seen: dict[str, str] = {}
    for job in jobs:
        if job.name in seen:
            raise QuineboxError(f"two inputs would both write {job.name}.out ({seen[job.name]} and {job.source}): rename one or map them separately")
        if not job.name or job.name.startswith(".") or "/" in job.name or job.name == "results":
            raise QuineboxError(f"job name {job.name!r} cannot name an output file: use letters, digits, '-', '_' or '.'")
        seen[job.name] = job.source
    return jobs


def map_jobs(mission: str, inputs: Iterable[str], jsonl: str | None, box: BoxOptions | None = None, *, model: str | None = None) -> list[Job]:
    """Files and globs (expanded here, so quoted patterns work too), or one material per JSON line; every job's box
    has `box`'s grants, image and time limit (the run's ask and deny rules are its Options')."""
    box = box or BoxOptions()
    common: dict[str, Any] = {"grants": box.grants, "image": box.image, "model": model, "timeout": None if box.timeout is None else str(box.timeout)}
    jobs: list[Job] = []
    for pattern in inputs:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise QuineboxError(f"no input matches {pattern!r}")
        for path in matches:
            if not os.path.isfile(path):
                raise QuineboxError(f"input {path} is not a readable file")
            jobs.append(Job(name=Path(path).name, source=path, mission=mission, material=Path(path), **common))
    if jsonl:
        try:
            lines = Path(jsonl).read_text().splitlines()
        except OSError as exc:
            raise QuineboxError(f"cannot read {jsonl}: {exc.strerror}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                raise QuineboxError(f"{jsonl}:{number} is not JSON: give one JSON string per line") from None
            material = value if isinstance(value, str) else json.dumps(value)
            jobs.append(Job(name=f"{Path(jsonl).stem}-{number:05d}", source=f"{jsonl}:{number}", mission=mission, material=material.encode(), **common))
    if not jobs:
        raise QuineboxError("no inputs: give files, globs or --jsonl FILE")
    return _check_names(jobs)


def batch_jobs(path: str) -> list[Job]:
    """A jobs.yaml: `defaults:` (mission, grants, image, model, timeout) and `jobs:` (each may override, with material or input)."""
    doc = read_yaml(path, "batch file")
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise QuineboxError(f"bad batch file {path}: expected a mapping with a non-empty 'jobs:' list")
    defaults = doc.get("defaults") or {}
    base = Path(path).parent
    jobs = []
    for number, entry in enumerate(doc["jobs"], 1):
        if not isinstance(entry, dict):
            raise QuineboxError(f"bad batch file {path}: job {number} is not a mapping")
        job = {**defaults, **entry}
        unknown = set(job) - {"name", "mission", "material", "input", "grants", "image", "model", "timeout"}
        if unknown:
            raise QuineboxError(f"bad batch file {path}: job {number} has unknown keys {sorted(unknown)}")
        if not isinstance(job.get("mission"), str) or not job["mission"].strip():
            raise QuineboxError(f"bad batch file {path}: job {number} needs a mission")
        if "material" in job and "input" in job:
            raise QuineboxError(f"bad batch file {path}: job {number} has both material (a file) and input (inline text)")
        material: Path | bytes | None = None
        if "material" in job:
            material = (base / str(job["material"])) if not os.path.isabs(str(job["material"])) else Path(job["material"])
            if not material.is_file():
                raise QuineboxError(f"bad batch file {path}: job {number}'s material {material} is not a file")
        elif "input" in job:
            material = str(job["input"]).encode()
        grants = job.get("grants") or []
        if not isinstance(grants, list) or not all(isinstance(g, str) for g in grants):
            raise QuineboxError(f"bad batch file {path}: job {number}'s grants must be a list of grant strings")
        name = str(job.get("name") or (material.name if isinstance(material, Path) else f"job-{number:04d}"))
        jobs.append(Job(name=name, source=f"{path}:{number}", mission=job["mission"], material=material, grants=tuple(grants),
                        image=job.get("image"), model=job.get("model"), timeout=None if job.get("timeout") is None else str(job["timeout"]),
                        kind="batch"))
    return _check_names(jobs)


class Runner:
    """Runs jobs on a bounded pool; `stop()` may be called from a signal handler. Each run is recorded in the state
    dir (runs.py) as it goes, and every line it adds to results.jsonl names the run."""

    def __init__(self, jobs: list[Job], out_dir: str, options: Options, progress: Progress):
        self.jobs = jobs
        self.out = Path(out_dir)
        self.options = options
        self.progress = progress
        self.tally = Tally(total=len(jobs))
        self.stopping = threading.Event()
        self.interrupted = False
        self._agents: set[Any] = set()
        self._lock = threading.Lock()
        kind = jobs[0].kind if jobs else "map"
        self.record = RunRecord(kind, jobs[0].mission if kind == "map" and jobs else None, self.out)

    def stop(self, *, interrupted: bool = False) -> None:
        self.interrupted = self.interrupted or interrupted
        self.stopping.set()
        with self._lock:
            agents = list(self._agents)
        for agent in agents:
            agent.kill()

    def run(self) -> int:
        code = 1  # unless it returns: an exception escaped
        try:
            code = self._run()
            return code
        finally:
            self.record.end(code)

    def _run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        results = self.out / RESULTS
        finished = self._keep_finished(results) if self.options.resume else set()
        todo = [job for job in self.jobs if job.source not in finished]
        self.record.begin(self.jobs, finished)
        self.tally.skipped = len(self.jobs) - len(todo)
        self.tally.done = self.tally.skipped
        self._results = open(results, "a" if self.options.resume else "w")
        self.progress(self.tally, None)
        try:
            with ThreadPoolExecutor(max_workers=max(1, self.options.parallel or 1)) as pool:
                for future in [pool.submit(self._job, job) for job in todo]:
                    future.result()
        finally:
            self._results.close()
        if self.interrupted:
            return 130
        return 0 if self.tally.failed == 0 and self.tally.done == self.tally.total else 1

    @staticmethod
    def _keep_finished(results: Path) -> set[str]:
        """The inputs that finished; results.jsonl is rewritten (atomically) to their lines alone,
        one each, so the failures run again and a line cut short by a kill is gone."""
        done: dict[str, str] = {}
        try:
            lines = results.read_bytes().split(b"\n")[:-1]  # the last, without its newline, was cut short
        except FileNotFoundError:
            return set()
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("exit_code") == 0 and isinstance(record.get("input"), str):
                done.setdefault(record["input"], line.decode() + "\n")
        kept = results.with_name(f".{RESULTS}.tmp")
        kept.write_text("".join(done.values()))
        os.replace(kept, results)
        return set(done)

    def _job(self, job: Job) -> None:
        if self.stopping.is_set():
            return
        with self._lock:
            self.tally.running += 1
        self.progress(self.tally, None)
        began = time.monotonic()
        attempts = rounds = 0
        while True:
            rounds += 1
            attempt = self._attempt(job)
            attempts += attempt.tries
            if not (attempt.engine_failed or attempt.exit_code == EXIT_UNAVAILABLE) or rounds > self.options.retries or self.stopping.is_set():
                break
            if attempt.engine_failed:
                self._await_engine()
            else:
                time.sleep(RETRY_PAUSE * rounds)
        code = attempt.exit_code
        if self.stopping.is_set() and code != 0:
            with self._lock:
                self.tally.running -= 1
            return  # killed by a stop: not a result, so a resume runs it again
        record = {
            "input": job.source,
            "name": job.name,
            "exit_code": code,
            "duration_s": round(time.monotonic() - began, 3),
            "tokens": attempt.tokens,
            "session": attempt.session,
            "termination": attempt.termination,
            "attempts": attempts,
            "run": self.record.id,
        }
        with self._lock:
            self.tally.running -= 1
            self.tally.done += 1
            if code != 0:
                self.tally.failures.append(job.source)
            self._results.write(json.dumps(record) + "\n")
            self._results.flush()
        self.progress(self.tally, record)
        if code != 0 and self.options.fail_fast:
            self.stop()

    def _await_engine(self) -> None:
        """Until the engine answers a ping (or ENGINE_WAIT passes, or we stop): it may be restarting."""
        from quinebox.box.backends.docker.engine import DockerBackend

        give_up = time.monotonic() + ENGINE_WAIT
        while not self.stopping.is_set() and time.monotonic() < give_up:
            try:
                DockerBackend.shared().ping()
                return
            except QuineboxError:
                self.stopping.wait(RETRY_PAUSE)

    def _attempt(self, job: Job) -> Attempt:
        from quinebox.box.process import DEVNULL
        from quinebox.tree.supervisor import start_agent

        out_path, err_path = self.out / f"{job.name}.out", self.out / f"{job.name}.err"
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(out_path, "wb"))
            err = files.enter_context(open(err_path, "wb"))
            # A file is streamed in by the box's stdin pump, so it stays open until the box is gone.
            stdin: Any = files.enter_context(open(job.material, "rb")) if isinstance(job.material, Path) else job.material
            try:
                agent = start_agent(
                    job.mission, self.options.box_for(job), model=job.model, max_turns=self.options.max_turns, max_tokens=self.options.max_tokens,
                    stdin=DEVNULL if stdin is None else stdin, stdout=out, stderr=err,
                )
            except QuineboxError as exc:
                err.write(f"quinebox: {exc}\n".encode())
                return Attempt(exc.exit_code, termination=str(exc), engine_failed=isinstance(exc, EngineError))
            self.record.attempt(job.name, job.source, agent.session.session)
            with self._lock:
                self._agents.add(agent)
            if self.stopping.is_set():
                agent.kill()
            try:
                return attempt_of(agent, agent.wait())
            finally:
                with self._lock:
                    self._agents.discard(agent)


def attempt_of(agent: Any, code: int) -> Attempt:
    """What an ended agent's tree says of its try."""
    outcome = agent.outcome or {}
    return Attempt(code, agent.session.session, outcome.get("tokens", 0), outcome.get("termination"), bool(agent.proc.engine_lost))
