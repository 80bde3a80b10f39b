"""`quinebox resume`: an interrupted session goes on where it was (agent/resumption.py says from where).

A session is interrupted when it has not ended and the process that ran it is gone (SIGKILL, a reboot, the
host's OOM killer): its box died with its lifeline; its tape and its world stay. Resuming refuses, in one line and
starting nothing, a session that still runs, has ended, was pruned, or is a child (its root is what goes on, and
the turn it runs again starts its children again), and one that another process is resuming: a resume holds
the session's lock (sessions/ID/resume.lock) until the session ends, and the kernel lets go of it with a process
that dies, so a resume that is itself lost can be resumed in turn.

Then, in this order: the resume is recorded in the audit log; the material the session had read is passed over
on the stdin given (the material again, whole, as the session was started with it); the children still running
when it was lost are recorded as ended, interrupted (they died with it); what the lost process left of its box
goes; the world goes back to the revision current when the turn in flight was asked; and the agent starts under
its own session id, its budgets as spent: the tokens of its whole tree, its spawn budget less the children of
its complete turns, its time less the time it ran.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from quinebox.agent.records import Request, Response
from quinebox.agent.resumption import Resumption, resumption
from quinebox.agent.session import View
from quinebox.agent.store import Index, SessionRow, Tape, read_records
from quinebox.agent.tapes import not_found
from quinebox.agent.timeline import revision_at
from quinebox.audit import log
from quinebox.box.owners.gc import clear_session
from quinebox.box.policy import AGENT_COMMAND
from quinebox.box.process import Stream
from quinebox.box.spec import BoxSpec, build_spec, run_files
from quinebox.errors import ErrorKind, QuineboxError
from quinebox.processes import owner_alive, owner_id, user_name
from quinebox.state import session_dir
from quinebox.tree.supervisor import Node
from quinebox.worlds.build import load_spec
from quinebox.worlds.revisions import RevisionLog
from quinebox.worlds.rewind import rewind

if TYPE_CHECKING:
    from quinebox.agent.records import Meta
    from quinebox.tree.agent import Agent

#: How a child still running when its tree's process was lost ends on its tape: its box was killed with the tree's.
INTERRUPTED = "interrupted"
EXIT_KILLED = 137
RESUME_LOCK = "resume.lock"

Say = Callable[[str], None]


def resume_agent(
    session: str, *, stdin: Stream | bytes = None, stdout: Stream = None, stderr: Stream = None, view: View | None = None, say: Say | None = None,
    backend: str | None = None, runtime: str | None = None,
) -> Agent:
    """The interrupted `session` (an id or a unique prefix) going on; `stdin` gives its material again, whole.
    QuineboxError (nothing started) for one that may not be resumed; `say` hears what the resume could not keep.
    `backend`, `runtime`: where it runs, unless it was started on one asked for by name (that one again)."""
    from quinebox.tree.agent import Agent

    index = Index()
    try:
        lock = _lock(resumable(index, session).id)
        try:
            row = resumable(index, session)  # again, under the lock: a resume that held it may have ended the session
            _gone(index, row)
            tape = read_records(row.id)
            meta = tape.meta()
            if meta is None:
                raise QuineboxError(f"session {row.id}'s tape does not say how it was started: it cannot be resumed")
            point = resumption(tape)
            spec = _spec(row, meta, point, backend, runtime)
            stdin = passed_over(stdin, point.material or 0, row.id)
            if point.material is None and say is not None:
                say(f"session {row.id}'s tape does not say how much of its material it had read: it reads the stdin given from the start")
            lost = [r for r in index.subtree(row.id)[1:] if r.ended is None]
            log.record("session_resumed", row.id, turn=point.turn, cycle=point.cycle, answered=point.answer is not None, material=point.material or 0,
                       was=index.owners([row.id]).get(row.id), by=user_name(os.getuid()), lost=[r.id for r in lost])
            spent = point.tokens + sum(_tokens(r) for r in index.subtree(row.id)[1:])
            for child in lost:
                _interrupted(index, child)
            clear_session(row.id)
            point = _world_back(row.id, point, say)
            if spec.world is not None and spec.world.kind == "dir":  # it starts from that revision, as it is: no warm box's empty world stands in
                spec = replace(spec, world=replace(spec.world, base=(row.id, point.revision or 0)))
            node = Node.root(spec, model=meta.model, tokens=meta.tokens)
            node.tokens.spend(spent)
            for cost in point.spawn_costs:
                node.charge_spawn(cost)
        except BaseException:
            os.close(lock)
            raise
    finally:
        index.close()
    return Agent(
        row.mission, spec=node.spec, node=node, model=meta.model, max_turns=meta.max_turns, max_cycles=meta.max_cycles,
        resumption=point, lock=lock, stdin=stdin, stdout=stdout, stderr=stderr, view=view,
    )


def resumable(index: Index, session: str) -> SessionRow:
    """The row of `session` if it is one a resume may take on (its process yet to be checked, under its lock)."""
    row = index.get(session)
    if row is None:
        raise not_found(index, session)
    if row.parent:
        root = row
        while root.parent and (parent := index.get(root.parent)) is not None:
            root = parent
        raise QuineboxError(f"session {row.id} is a child of {row.parent}: resume the root of its tree ({root.id}), whose turn in flight starts its children again",
                            kind=ErrorKind.BAD_INPUT, session=row.id, root=root.id)
    if row.ended is not None:
        raise QuineboxError(
            f"session {row.id} has ended (exit {row.exit_code}, {row.termination}): "
            f"there is nothing to resume (`quinebox fork {row.id} --at TURN` goes on from one of its turns)",
            kind=ErrorKind.CONFLICT, session=row.id,
        )
    return row


def _lock(session: str) -> int:
    """The session's resume lock, taken (an fd to close to let go), or QuineboxError when another process holds it."""
    path = session_dir(session) / RESUME_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 256).decode(errors="replace").strip()
        os.close(fd)
        raise QuineboxError(f"session {session} is being resumed already (by {holder or 'another process'}): one resume at a time",
                            kind=ErrorKind.CONFLICT, session=session, holder=holder or None) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, owner_id().encode(), 0)
    return fd


def _gone(index: Index, row: SessionRow) -> None:
    """Refuse unless the process that ran the session is known, and gone."""
    owner = index.owners([row.id]).get(row.id)
    if owner is None:
        raise QuineboxError(f"session {row.id} does not say which process ran it (it began before quinebox recorded that), so it cannot be told interrupted: it cannot be resumed",
                            kind=ErrorKind.UNSUPPORTED, session=row.id)
    if owner_alive(owner):
        host, _, rest = owner.partition(":")
        raise QuineboxError(f"session {row.id} is still running (process {rest.partition(':')[0]} on {host}): only a session whose process is gone can be resumed",
                            kind=ErrorKind.CONFLICT, session=row.id, owner=owner)


def passed_over(stdin: Stream | bytes, count: int, session: str) -> Stream | bytes:
    """`stdin` less its first `count` bytes, which the session had read already: the material is given again, whole.
    Bytes are cut; a file is read on from there (a regular one seeked); QuineboxError when it holds less."""
    if count <= 0:
        return stdin

    def short(held: int) -> QuineboxError:
        return QuineboxError(
            f"the material given holds {held} bytes, and session {session} had read {count} of it: "
            f"give it the material it was started with, whole (`quinebox resume {session} < FILE`)",
            kind=ErrorKind.BAD_INPUT, session=session, held=held, read=count,
        )

    if isinstance(stdin, bytes):
        if len(stdin) < count:
            raise short(len(stdin))
        return stdin[count:]
    fd = 0 if stdin is None else stdin if isinstance(stdin, int) and stdin >= 0 else stdin.fileno() if hasattr(stdin, "fileno") else None
    if fd is None or os.isatty(fd):
        raise QuineboxError(f"session {session} had read {count} bytes of its material: give the material again, whole, as bytes, a file or a pipe",
                            kind=ErrorKind.BAD_INPUT, session=session, read=count)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        left = st.st_size - os.lseek(fd, 0, os.SEEK_CUR)
        if left < count:
            raise short(left)
        os.lseek(fd, count, os.SEEK_CUR)
        return stdin
    read = 0
    while read < count:
        chunk = os.read(fd, min(1 << 16, count - read))
        if not chunk:
            raise short(read)
        read += len(chunk)
    return stdin


def _tokens(row: SessionRow) -> int:
    """Tokens a session below the resumed one used: as its row says once it ended, else as its tape does."""
    if row.ended is not None:
        return row.tokens
    return sum(int(r.usage.get("total_tokens") or 0) for r in read_records(row.id).of(Response))


def _interrupted(index: Index, row: SessionRow) -> None:
    """A child still running when its tree's process was lost: ended on its tape and in the index, interrupted."""
    tape = read_records(row.id)
    tokens, turns = _tokens(row), len({r.turn for r in tape.of(Request)})
    last = tape.records[-1].t if tape.records else row.started
    record = Tape(row.id)
    try:
        record.append("outcome", exit_code=EXIT_KILLED, termination=INTERRUPTED, duration_s=round(last - row.started, 3), tokens=tokens, turns=turns)
    finally:
        record.close()
    index.finish(row.id, exit_code=EXIT_KILLED, termination=INTERRUPTED, tokens=tokens, turns=turns)


def _spec(row: SessionRow, meta: Meta, point: Resumption, backend: str | None = None, runtime: str | None = None) -> BoxSpec:
    """The session's box as it was started, under its own id and with its own world, its time less what it ran;
    QuineboxError when what it was granted no longer holds, or it has no world left."""
    ask_timeout = None if meta.ask_timeout is None else "0" if meta.ask_timeout == 0 else meta.ask_timeout
    spec = build_spec(
        [*AGENT_COMMAND, row.mission], grants=meta.grants, image=meta.image, workdir=meta.workdir, agent=True,
        ask=meta.ask, deny=meta.deny, ask_timeout=ask_timeout, backend=meta.backend or backend, runtime=meta.runtime or runtime,
    )
    if spec.grants.time is not None:
        spec = replace(spec, grants=replace(spec.grants, time=max(0.001, spec.grants.time - point.ran_for)))
    world, _ = load_spec(row.id)
    return replace(spec, session=row.id, world=world, **run_files(row.id, spec.grants, spec.asks))


def _world_back(session: str, point: Resumption, say: Say | None) -> Resumption:
    """The session's world made as it was when the turn in flight was asked: the resume point with that revision."""
    if not RevisionLog(session).records():
        return point
    revision = revision_at(session, point.asked_at) if point.asked_at is not None else 0
    skipped = rewind(session, revision)
    if skipped and say is not None:
        say(
            f"revision {revision}'s world is made again without what its history could not keep: {'; '.join(skipped[:10])}"
            + (f"; and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        )
    return replace(point, revision=revision)
