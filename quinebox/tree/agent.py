"""Running a mission: a box whose main process is the guest's agent loop, and its session on the host.

`Agent` starts both, gives them their place in the tree, and ties their ends
together: when the box is gone, the session records the outcome on the tape
and in the index. It lives with the tree because it is where a box, a session
and a node meet.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol

from quinebox.agent.budgets import DEFAULT_MAX_CYCLES, DEFAULT_MAX_TURNS, Budget, TokenPool
from quinebox.agent.providers import provider_for, resolve_model
from quinebox.agent.resumption import Resumption
from quinebox.agent.session import AgentSession, View
from quinebox.box.process import BoxProcess, Place, Stream
from quinebox.box.spec import BoxSpec
from quinebox.errors import EXIT_QUINEBOX, QuineboxError


class _Tree(Protocol):
    #: The tree's cap on model calls in flight at once, shared by every agent in it.
    calls: threading.BoundedSemaphore


class Seat(Place, Protocol):
    """What an agent needs of its place in the tree: a `supervisor.Node`, described here because the supervisor
    starts agents and so imports this module, never the other way round.

    The agent reads its depth, the tree's cap on model calls and the token pool it spends from, and tells the
    node its model, its session and itself (what to wait on and kill)."""

    model: str | None
    tokens: TokenPool
    session: Any
    box: Any

    @property
    def tree(self) -> _Tree: ...

    @property
    def depth(self) -> int: ...


class Agent:
    def __init__(
        self,
        mission: str,
        *,
        spec: BoxSpec,
        node: Seat,
        model: str | None = None,
        max_turns: int | None = None,
        max_cycles: int | None = None,
        history: list[dict[str, Any]] | None = None,
        forked_from: dict[str, Any] | None = None,
        resumption: Resumption | None = None,
        lock: int | None = None,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        view: View | None = None,
    ):
        """An agent for a checked `spec` at its `node`: a root's (see `supervisor.start_agent`) or a child's, or an
        interrupted session's going on from `resumption` (tree/resume.py), holding its resume `lock` (an fd) until it ends."""
        model = resolve_model(model)
        node.model = model
        budget = Budget(
            max_turns=max_turns or DEFAULT_MAX_TURNS,
            max_cycles=DEFAULT_MAX_CYCLES if max_cycles is None else max_cycles,
            tokens=node.tokens,
        )
        meta: dict[str, Any] = {
            "grants": spec.grants.format(), "image": spec.image, "workdir": spec.workdir, "depth": node.depth, "tokens": node.tokens.limit,
            "max_turns": max_turns, "max_cycles": max_cycles, "backend": spec.backend, "runtime": spec.runtime,
            **spec.asks.format(), "ask_timeout": spec.asks.timeout,
        }
        if forked_from:
            meta["forked_from"] = forked_from
        meta = {key: value for key, value in meta.items() if value is not None}  # what the tape's reader defaults
        self._lock_fd = lock
        self._finishing = threading.Lock()
        try:
            provider = provider_for(model, answered=resumption.answers if resumption else 0)
            self.session = AgentSession(
                spec.session, mission=mission, provider=provider, budget=budget, parent=spec.parent, meta=meta, view=view, calls=node.tree.calls,
                history=history, owner=spec.owner, resumption=resumption,
            )
        except BaseException:
            self._release()
            raise
        node.session = self.session
        node.box = self
        try:
            self.proc = BoxProcess(spec, handler=self.session, place=node, stdin=stdin, stdout=stdout, stderr=stderr)
        except BaseException as exc:  # a bug's exception too: the tree's end must not find a box without a process
            node.box = None  # no box was made: the tree's end has nothing of it to wait for or kill
            if resumption is None:
                self.session.finish(exc.exit_code if isinstance(exc, QuineboxError) else EXIT_QUINEBOX)
            else:  # it stays interrupted, to be resumed once what stopped it is put right
                self.session.abandon()
            self._release()
            raise
        self.outcome: dict[str, Any] | None = None

    def kill(self) -> None:
        self.proc.kill()

    def wait(self) -> int:
        code = self.proc.wait()
        with self._finishing:
            if self.outcome is None:
                try:
                    self.outcome = self.session.finish(code, timed_out=self.proc.timed_out, oom_killed=self.proc.oom_killed)
                finally:
                    self._release()
        return code

    def _release(self) -> None:
        """Let go of a resumed session's lock: it has ended, or is left interrupted as it was."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
