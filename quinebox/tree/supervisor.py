"""The process tree of one root quinebox process: who may start whom, with what, and until when.

Every box has a `Node`. A box asks for a child over its socket (the in-box
`quinebox` command, or the agent's fork tool); its node attenuates the request
against what the box holds now — grants, spawn and depth budgets, time and
tokens left — and starts the child with a node of its own. A child's streams
travel over the connection that asked for it, and when that connection breaks
the child is killed (unless it was started detached: then the tree's end
bounds it). Killing a node kills its subtree. Every box in the tree shares the
tree's cap on concurrent model calls.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from quinebox.agent.budgets import TokenPool
from quinebox.agent.providers import resolve_model
from quinebox.audit import boxes, log
from quinebox.audit.approvals import Approver, Decision
from quinebox.audit.asks import ASK, DENY, REFUSE, Asks
from quinebox.audit.request import Request
from quinebox.box.net.broker import Channel
from quinebox.box.options import BoxOptions
from quinebox.box.policy import AGENT_COMMAND, DEFAULT_MEM, DEFAULT_PIDS, DEFAULT_TMP
from quinebox.box.process import PIPE, BoxProcess, Stream
from quinebox.box.spec import HOST_IMAGE, BoxSpec, build_spec, new_session_id, protected_paths, run_files
from quinebox.errors import GrantError, QuineboxError
from quinebox.grants import Grants, Mount, check_mount, parse_duration, read_only_all_the_way, within
from quinebox.guest.protocol import MAX_PAYLOAD
from quinebox.state import state_dir
from quinebox.worlds.spec import child_world

if TYPE_CHECKING:
    from quinebox.agent.session import View
    from quinebox.tree.agent import Agent
    from quinebox.worlds.world import World


class Tree:
    def __init__(self, asks: Asks):
        self.calls = threading.BoundedSemaphore(int(os.environ.get("QUINEBOX_MAX_CONCURRENT_CALLS", "8")))
        self.lock = threading.Lock()
        self.nodes: list[Node] = []
        #: Puts the requests that only an ask rule covers to a person, one at a time on the root's terminal.
        self.approver = Approver(asks)


def child_model(parent: str | None, requested: str | None) -> str | None:
    """A child uses its parent's model, another model at the same endpoint, or a script beside the parent's."""
    if requested is None or requested == parent:
        return parent
    if parent and parent.startswith("script:"):
        name = requested[len("script:") :] if requested.startswith("script:") else ""
        if not name or "/" in name or name.startswith("."):
            raise GrantError(f"refused model {requested!r}: a scripted parent's children use scripts beside its own, as script:NAME.yaml")
        return "script:" + os.path.join(os.path.dirname(parent[len("script:") :]), name)
    if requested.startswith(("script:", "replay:")):
        raise GrantError(f"refused model {requested!r}: children use a model at their parent's endpoint")
    return requested


class Node:
    def __init__(self, tree: Tree, spec: BoxSpec, parent: Node | None = None, model: str | None = None, tokens: int | None = None):
        self.tree = tree
        self.spec = spec
        self.parent = parent
        self.model = model
        g = spec.grants
        self.grants = replace(g, mem=g.mem or DEFAULT_MEM, pids=g.pids or DEFAULT_PIDS, tmp=g.tmp or DEFAULT_TMP)
        self.spawn_left = g.spawn
        #: Children a person may still approve beyond the spawn budget (an `ask: spawn:N` rule).
        self.ask_spawn_left = spec.asks.ask.spawn or 0
        #: Shared by this box's own model calls and the budgets it hands its children.
        self.tokens = TokenPool(tokens if tokens is not None else g.tokens)
        self.started = time.monotonic()
        self.box: Any = None  # what to wait on and kill: the BoxProcess, or the Agent around it
        self.session: Any = None  # the AgentSession, for an agent's box
        self.children: list[Node] = []
        self.world: World | None = None  # the box's world while it runs
        self._lock = threading.Lock()
        with tree.lock:
            tree.nodes.append(self)

    @classmethod
    def root(cls, spec: BoxSpec, model: str | None = None, tokens: int | None = None) -> Node:
        return cls(Tree(spec.asks), spec, model=model, tokens=tokens)

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1

    def left(self) -> Grants:
        """What this box holds right now: its grants, with its budgets as they stand."""
        time_left = None if self.grants.time is None else max(0.001, self.grants.time - (time.monotonic() - self.started))
        return replace(self.grants, spawn=self.spawn_left, time=time_left, tokens=self.tokens.left)

    # -- the box's side (box.process.Place) -------------------------------------------

    def attach(self, box: BoxProcess) -> None:
        """The box has its world and is about to start: from now on it may ask for children."""
        self.world = box.world
        if self.box is None:
            self.box = box
        if self.session is not None:  # an agent's session revises the world after its tools
            self.session.world = box.world
        spec = self.spec
        rules = {"grants": spec.grants.format(), "image": spec.image, "parent": spec.parent, **spec.asks.format()}
        digest = hashlib.sha256(log.canonical({"argv": list(spec.argv), "workdir": spec.workdir, **rules})).hexdigest()
        log.record(boxes.CREATED, spec.session, spec_digest=digest, image_digest=box.image_id, owner=spec.owner, agent=spec.agent, **rules)

    def ended(self, box: BoxProcess) -> None:
        """The box is gone; at the root, nothing in the tree may outlive it."""
        self.world = None
        log.note(boxes.ENDED, self.spec.session, exit=box.returncode, termination=box.ending.termination if box.ending else "exit")
        if self.parent is None:
            self.end_tree()

    def approve(self, kind: str, subject: str, facts: dict[str, Any]) -> Decision:
        """Ask a person (or what they remembered) about what this box asked for; at most until the box's time is up."""
        return self.tree.approver.decide(Request(self.spec.session, kind, subject, facts), time_left=self.left().time)

    def record(self, kind: str, **fields: Any) -> None:
        if self.session is not None:
            self.session.tape.append(kind, **fields)

    # -- starting a child -----------------------------------------------------------

    def spawn(self, request: dict[str, Any], channel: Channel) -> ChildRelay:
        what = request["what"]
        if what not in ("run", "exec"):
            raise GrantError(f"cannot start {what!r}: a child is `run` (an agent) or `exec` (a command)")
        cwd = str(request.get("cwd") or "/world")
        asked = Grants.parse([str(g) for g in request.get("grants") or []], cwd=cwd)
        if request.get("timeout") is not None:
            asked = asked.merge(Grants(time=parse_duration(str(request["timeout"]))))
        argv = (*AGENT_COMMAND, str(request["mission"])) if what == "run" else tuple(str(a) for a in request["argv"])
        if not argv or (what == "run" and not str(request["mission"]).strip()):
            raise GrantError("nothing to run: give a mission or a command")
        workdir = request.get("workdir") or None
        if workdir is not None and not str(workdir).startswith("/"):
            raise GrantError(f"bad workdir {workdir!r}: it must be an absolute path inside the box")
        image = request.get("image") or self.spec.image
        if not isinstance(image, str):
            raise GrantError("bad image: give an image's name, as in --image python:3.12-slim")
        shown = {k: v for k, v in request.items() if k != "kind"}
        try:
            if image == HOST_IMAGE and self.spec.image != HOST_IMAGE:
                raise GrantError("a child may use --image host only if its parent's box is one: the host's own root is more than this box was given")
            model = child_model(self.model, request.get("model")) if what == "run" else None
            outcome, _, why = self._classify(asked)
            if outcome == ASK:
                decision = self.approve("child", f"a child ({what}) with {' '.join(asked.format()) or 'no grants'}", {**shown, "why": why})
                if not decision.allowed:
                    raise GrantError(f"{why}; and a person did not approve it (decided by {decision.by})")
            with self._lock:  # checked again and charged in one step, only for a request that can start
                grants, charge = self._charge(asked, approved=outcome == ASK)
        except GrantError as exc:
            self.record("escalation_refused", request=shown, reason=str(exc))
            log.note("child_refused", self.spec.session, request=shown, why=str(exc))
            raise
        session = new_session_id()
        relay = ChildRelay(channel, detached=bool(request.get("detach")))
        try:
            spec = replace(
                self.spec,
                argv=argv,
                grants=grants,
                session=session,
                parent=self.spec.session,
                cwd=self._host_path(cwd),
                workdir=workdir,
                **run_files(session, grants, self.spec.asks),
                agent=what == "run",
                world=child_world(self.world, session, request.get("world")),
                image=image,
                pull="never",  # the host never fetches an image because a box asked for it
                tty=False,
            )
            node = Node(self.tree, spec, parent=self, model=model)
            node.box = relay.box = node.start(what, request, relay)
        except QuineboxError:
            with self._lock:  # nothing started: the budgets it was charged come back
                self.spawn_left = (self.spawn_left or 0) + charge[0]
                self.ask_spawn_left += charge[1]
            if grants.tokens is not None:
                self.tokens.refund(grants.tokens)
            raise
        with self._lock:
            self.children.append(node)
        if self.session is not None:
            self.session.children.add(session)
        self.record("spawn", child=session, what=what, grants=grants.format(), detached=relay.detached)
        log.note("child_allowed", self.spec.session, child=session, what=what, grants=grants.format(), by="approval" if outcome == ASK else "grant")
        channel.send({"kind": "spawned", "session": session})
        threading.Thread(target=self._await, args=(node, relay), daemon=True).start()
        return relay

    def _classify(self, asked: Grants) -> tuple[str, Grants | None, str]:
        """What a child's grants come to under the tree's rules, with this box's spawn budgets as they stand."""
        asks = self.spec.asks
        return replace(asks, ask=replace(asks.ask, spawn=self.ask_spawn_left or None)).child(self.left(), asked)

    def _charge(self, asked: Grants, approved: bool) -> tuple[Grants, tuple[int, int]]:
        """The child's grants, checked; its cost taken from the spawn budget first, then from what a person approved."""
        outcome, grants, why = self._classify(asked)
        if outcome in (DENY, REFUSE) or grants is None or (outcome == ASK and not approved):
            raise GrantError(why)
        grants = self._checked(grants, self.spec.asks.ask.mounts if approved else ())
        charge = self.charge_spawn(1 + (grants.spawn or 0))
        if grants.tokens is not None:
            self.tokens.spend(grants.tokens)  # reserved; what the child leaves comes back
        return grants, charge

    def charge_spawn(self, cost: int) -> tuple[int, int]:
        """A child's `cost` taken from the spawn budget first, then from what a person may approve: (each's share).
        Also how a resumed session's node is charged for the children it had started (tree/resume.py)."""
        held = min(cost, max(0, self.spawn_left or 0))
        self.spawn_left = (self.spawn_left or 0) - held
        self.ask_spawn_left -= cost - held
        return held, cost - held

    def _checked(self, grants: Grants, approved: tuple[Mount, ...] = ()) -> Grants:
        """Host-side checks attenuation cannot make: symlinks inside a grant may point out of it."""
        held = [os.path.realpath(m.source) for m in (*self.grants.mounts, *approved)]
        mounts = []
        for mount in grants.mounts:
            checked = check_mount(mount, protected=protected_paths(os.environ, state_dir()))
            if not any(within(checked.source, root) for root in held):
                raise GrantError(f"refused {mount.dest}: it resolves to {checked.source}, outside what this box was granted")
            mounts.append(checked)
        return replace(grants, mounts=read_only_all_the_way(tuple(mounts)))

    def _host_path(self, box_path: str) -> str:
        for mount in self.grants.mounts:
            if within(box_path, mount.dest):
                return os.path.normpath(os.path.join(mount.source, os.path.relpath(box_path, mount.dest)))
        return "/nonexistent"

    def start(self, what: str, request: dict[str, Any], relay: ChildRelay) -> Any:
        if what == "exec":
            return BoxProcess(self.spec, place=self, stdin=PIPE, stdout=relay.out, stderr=relay.err)
        from quinebox.tree.agent import Agent  # sessions and their store: only once an agent starts

        max_turns = request.get("max_turns")
        return Agent(
            self.spec.argv[-1], spec=self.spec, node=self, model=self.model, max_turns=int(max_turns) if max_turns else None,
            stdin=PIPE, stdout=relay.out, stderr=relay.err,
        )

    def _await(self, node: Node, relay: ChildRelay) -> None:
        code = node.box.wait()
        outcome = getattr(node.box, "outcome", None) or {}
        if node.grants.tokens is not None:
            self.tokens.refund(max(0, node.tokens.left or 0))
        relay.channel.send({"kind": "exit", "code": code, "session": node.spec.session, **{k: outcome[k] for k in ("termination", "tokens", "turns") if k in outcome}})

    # -- ending ----------------------------------------------------------------------

    def kill(self) -> None:
        """This box and every box below it."""
        for child in list(self.children):
            child.kill()
        if self.box is not None:
            if getattr(getattr(self.box, "proc", self.box), "returncode", 0) is None:
                log.note("kill", self.spec.session, by="tree", why="its parent or the tree ended it")
            self.box.kill()

    def end_tree(self) -> None:
        """The root's box has ended: nothing in its tree may outlive it, detached children included."""
        for child in list(self.children):
            child.kill()
        for node in list(self.tree.nodes):
            if node is not self and node.box is not None:
                node.box.wait()


class ChildRelay:
    """The streams of a child box, carried over the connection that asked for it."""

    def __init__(self, channel: Channel, detached: bool):
        self.channel = channel
        self.detached = detached
        self.box: Any = None

    def out(self, data: bytes) -> None:
        self._send("stdout", data)

    def err(self, data: bytes) -> None:
        self._send("stderr", data)

    def _send(self, kind: str, data: bytes) -> None:
        for start in range(0, len(data), MAX_PAYLOAD):
            if not self.channel.send({"kind": kind}, data[start : start + MAX_PAYLOAD]):
                return  # the asker is gone; a detached child's output has nowhere to go

    def stdin(self, payload: bytes, eof: bool) -> None:
        proc = getattr(self.box, "proc", self.box)
        try:
            if payload:
                proc.stdin.write(payload)
            if eof:
                proc.stdin.close()
        except OSError:
            pass  # the child stopped reading

    def kill(self) -> None:
        self.box.kill()

    def disconnected(self) -> None:
        if not self.detached:
            self.box.kill()


def start_agent(
    mission: str,
    options: BoxOptions | None = None,
    *,
    model: str | None = None,
    max_turns: int | None = None,
    max_tokens: int | None = None,
    max_cycles: int | None = None,
    history: list[dict[str, Any]] | None = None,
    forked_from: dict[str, Any] | None = None,
    stdin: Stream | bytes = None,
    stdout: Stream = None,
    stderr: Stream = None,
    view: View | None = None,
    **given: Any,
) -> Agent:
    """A root agent from the caller's options (its box's `options` and/or those `given` by name, as BoxOptions
    has them): its box checked, the root of a tree of its own."""
    if not mission.strip():
        raise QuineboxError("the mission is empty: say what the agent should do, as in `quinebox run \"summarize this\"`")
    spec = build_spec([*AGENT_COMMAND, mission], options, agent=True, **given)
    from quinebox.tree.agent import Agent

    model = resolve_model(model)
    node = Node.root(spec, model=model, tokens=max_tokens or spec.grants.tokens)
    return Agent(
        mission, spec=spec, node=node, model=model, max_turns=max_turns, max_cycles=max_cycles, history=history, forked_from=forked_from,
        stdin=stdin, stdout=stdout, stderr=stderr, view=view,
    )
