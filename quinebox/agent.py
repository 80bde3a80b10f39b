"""Running a mission: a box whose main process is the guest's agent loop, and its session on the host.

`Agent` starts both and ties their ends together: when the box is gone, the
session records the outcome on the tape and in the index.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from quinebox.api import Popen, Stream
from quinebox.errors import QuineboxError
from quinebox.policy import AGENT_COMMAND
from quinebox.providers import provider_for, resolve_model
from quinebox.session import DEFAULT_MAX_CYCLES, DEFAULT_MAX_TURNS, AgentSession, Budget, View
from quinebox.spec import BoxSpec, build_spec

if TYPE_CHECKING:
    from quinebox.supervisor import Node


class Agent:
    def __init__(
        self,
        mission: str,
        *,
        model: str | None = None,
        grants: Iterable[str] = (),
        policy: str | None = None,
        timeout: float | str | None = None,
        image: str | None = None,
        workdir: str | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
        max_cycles: int | None = None,
        world: str | None = None,
        world_from: str | Sequence[str] | None = None,
        world_tar: str | None = None,
        world_at: tuple[str, int] | None = None,
        history: list[dict[str, Any]] | None = None,
        forked_from: dict[str, Any] | None = None,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        view: View | None = None,
        spec: BoxSpec | None = None,
        node: "Node | None" = None,
    ):
        """A root agent from options; or, given `spec` and `node`, a child its parent's node has checked."""
        from quinebox.supervisor import Node

        if not mission.strip():
            raise QuineboxError("the mission is empty: say what the agent should do, as in `quinebox run \"summarize this\"`")
        if spec is None:
            spec = build_spec(
                [*AGENT_COMMAND, mission], grants=grants, policy=policy, timeout=timeout, image=image, workdir=workdir, agent=True,
                world=world, world_from=world_from, world_tar=world_tar, world_at=world_at,
            )
        model = resolve_model(model)
        provider = provider_for(model)
        if node is None:
            node = Node.root(spec, model=model, tokens=max_tokens or spec.grants.tokens)
        node.model = model
        budget = Budget(
            max_turns=max_turns or DEFAULT_MAX_TURNS,
            max_cycles=DEFAULT_MAX_CYCLES if max_cycles is None else max_cycles,
            tokens=node.tokens,
        )
        meta: dict[str, Any] = {"grants": spec.grants.format(), "image": spec.image, "workdir": spec.workdir, "depth": node.depth}
        if forked_from:
            meta["forked_from"] = forked_from
        self.session = AgentSession(
            spec.session, mission=mission, provider=provider, budget=budget, parent=spec.parent, meta=meta, view=view, calls=node.tree.calls,
            history=history,
        )
        node.session = self.session
        self.session.node = node
        node.box = self
        self._finishing = threading.Lock()
        try:
            self.proc = Popen(spec.argv, spec=spec, handler=self.session, spawner=node, stdin=stdin, stdout=stdout, stderr=stderr)
        except QuineboxError as exc:
            self.session.finish(exc.exit_code)
            raise
        self.outcome: dict[str, Any] | None = None

    def kill(self) -> None:
        self.proc.kill()

    def wait(self) -> int:
        code = self.proc.wait()
        with self._finishing:
            if self.outcome is None:
                self.outcome = self.session.finish(code, timed_out=self.proc.timed_out, oom_killed=self.proc.oom_killed)
        return code
