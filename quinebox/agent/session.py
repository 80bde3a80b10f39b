"""One agent's session on the host: its budgets, its model calls, and its tape.

The broker hands every frame from the box to an `AgentSession`; the session
validates it, enforces the budgets (turns per conversation, exec cycles,
tokens), calls the provider, and records everything before answering. The
guest only asks: every limit here holds even against a guest that lies.
A resumed session (resumption.py) goes on with the tape, counts and
conversation its lost process left, and tells the guest where it was.
"""

from __future__ import annotations

import functools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from quinebox.agent.budgets import Budget
from quinebox.agent.providers import Provider, ProviderError
from quinebox.agent.providers.replay import digest
from quinebox.agent.records import BOX_SHARE, MAX_REFUSALS, Exit, Refusal, Terminated, as_dict, box_record
from quinebox.agent.resumption import Resumption
from quinebox.agent.store import Index, Tape
from quinebox.audit import log
from quinebox.box.net.broker import error_frame
from quinebox.errors import EXIT_QUINEBOX, StateError
from quinebox.state import session_dir

ROLES = {"system", "user", "assistant", "tool"}
#: Longest command a revision's record keeps (the box names it; the request before it has it whole).
MAX_COMMAND = 64 << 10

View = Callable[[dict[str, Any]], None]


def check_chat(request: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The schema of a chat frame; raises ValueError with what is wrong."""
    messages, tools = request.get("messages"), request.get("tools")
    if not isinstance(messages, list) or not messages or not isinstance(tools, list):
        raise ValueError("chat needs a non-empty 'messages' list and a 'tools' list")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError("each message must be an object with a role of system, user, assistant or tool")
        if not isinstance(message.get("content"), (str, type(None))):
            raise ValueError("message content must be a string or null")
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict) or not isinstance(tool["function"].get("name"), str):
            raise ValueError("each tool must be an object with a function and its name")
    return messages, tools


def _told(method: Callable[..., Any]) -> Callable[..., Any]:
    """A handler of the broker's whose StateError goes back to the box, whose guest says it on the box's stderr in one
    line: the session keeps it, so that its end, failing for the same full state dir, is not said again (finish)."""

    @functools.wraps(method)
    def handled(self: AgentSession, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except StateError as exc:
            self._told = exc
            raise

    return handled


class AgentSession:
    def __init__(
        self,
        session: str,
        *,
        mission: str,
        provider: Provider,
        budget: Budget,
        parent: str | None = None,
        meta: dict[str, Any] | None = None,
        view: View | None = None,
        calls: threading.BoundedSemaphore | None = None,
        history: list[dict[str, Any]] | None = None,
        owner: str | None = None,
        resumption: Resumption | None = None,
    ):
        """`owner`: the process running the session (`host:pid:start`), for the index. `resumption`: the session is
        not new but resumed from there (its tape goes on, and its index row is this process's from now on)."""
        self.session = session
        #: The state dir's refusal a handler sent back to the box, whose guest said it (_told).
        self._told: StateError | None = None
        #: A forked session's conversation so far, handed to the guest in its first welcome.
        self.history = history
        self.mission = mission
        self.provider = provider
        self.budget = budget
        self._view = view
        #: The tree's cap on model calls in flight at once.
        self._calls = calls or threading.BoundedSemaphore(1 << 16)
        self.tape = Tape(session)
        try:
            if resumption is None:
                self.tape.append("meta", session=session, parent=parent, mission=mission, model=provider.name, **(meta or {}))
            else:
                self.tape.append("resumed", turn=resumption.turn, cycle=resumption.cycle, material=resumption.material or 0, owner=owner,
                                 answered=resumption.answer is not None, revision=resumption.revision)
            self.index = Index()
            if resumption is None:
                self.index.start(session, parent=parent, mission=mission, model=provider.name, owner=owner)
            elif owner is not None:
                self.index.claim(session, owner)
        except StateError:  # a full state dir: nothing of a new session is left behind, and a resumed one stays as it was
            self.tape.close()
            if resumption is None:
                shutil.rmtree(session_dir(session), ignore_errors=True)
            raise
        self.tokens = 0
        self.turns = 0
        self.cycles = -1
        self.turns_this_cycle = 0
        self.termination: str | None = None
        self.reason = ""
        self._seen = 0
        #: What a resumed session's first welcome tells the guest: where its conversation was (None: start afresh).
        self._resume: dict[str, Any] | None = None
        #: Bytes of the material passed over before the box's stdin began (a resumed session's), which its count leaves out.
        self._material = 0
        #: A resumed session whose guest could not go on with it: it ends as it was, interrupted, with no outcome.
        self._unresumed = False
        #: Bytes the box's own records took, and its events refused: what a box writes to a tape is capped.
        self._box_bytes = 0
        self.refused = 0
        self._lock = threading.Lock()
        self.began = time.monotonic()
        self.world: Any = None  # the box's World, once the box exists
        #: Sessions this box started (its tree node adds them): the only ones it may adopt from.
        self.children: set[str] = set()
        if resumption is not None:
            self._go_on(resumption)

    def _go_on(self, resumption: Resumption) -> None:
        """A resumed session's counts as its lost process left them, and the conversation its guest goes on with:
        the turn in flight is asked again (its request adds no message the tape has), or its recorded answer is
        taken again (the model's count and the tape already hold it)."""
        self.tokens = resumption.tokens
        self.began -= resumption.ran_for  # its duration counts each run of it
        self.children.update(resumption.children)
        self._material = resumption.material or 0
        if not resumption.messages:
            return
        taken = 1 if resumption.answer is not None else 0  # the turn in flight, if its answer is taken again
        self.cycles = resumption.cycle
        self.turns = resumption.turn - 1 + taken
        self.turns_this_cycle = resumption.turn_in_cycle - 1 + taken
        self._seen = len(resumption.messages) + taken
        self._resume = {"cycle": resumption.cycle, "turn": resumption.turn_in_cycle - 1, "messages": resumption.messages, "answer": resumption.answer}

    def view(self, event: dict[str, Any]) -> None:
        if self._view is not None:
            self._view({"session": self.session, **event})

    # -- frames from the box ------------------------------------------------------

    def welcome(self, hello: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._resume is not None and not hello.get("resume"):  # a guest from before resume would start afresh
                self._unresumed = True
                return error_frame("unsupported", "this box's agent cannot go on with a resumed session: its image predates `quinebox resume`; "
                                   "build it again (`quinebox image build`) and resume again", EXIT_QUINEBOX)
            if self._resume is not None:  # a resumed session's guest: it goes on in the conversation it was in
                resume, self._resume = self._resume, None
                return {"kind": "welcome", "session": self.session, "max_turns": self.budget.max_turns, "cycles_left": self.budget.max_cycles - self.cycles, "resume": resume}
            self.cycles += 1
            self.turns_this_cycle = 0
            self._seen = 0
            if self.cycles > self.budget.max_cycles:
                self.termination = "cycle_exhaustion"
                return error_frame("budget", f"no exec cycles left ({self.budget.max_cycles} used)")
            if self.cycles:
                self.tape.append("cycle", cycle=self.cycles)
            welcome = {"kind": "welcome", "session": self.session, "max_turns": self.budget.max_turns, "cycles_left": self.budget.max_cycles - self.cycles}
            if self.history and not self.cycles:
                welcome["history"] = self.history
            return welcome

    @_told
    def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        messages, tools = check_chat(request)
        with self._lock:
            if self.turns_this_cycle > self.budget.max_turns:
                self.termination = "turn_exhaustion"
                return error_frame("budget", f"turn budget of {self.budget.max_turns} spent")
            if self.budget.tokens.exhausted:
                self.termination = "token_budget"
                return error_frame("budget", f"token budget of {self.budget.tokens.limit} spent ({self.tokens} used here)")
            self.turns_this_cycle += 1
            self.turns += 1
            turn = self.turns
            new = messages[self._seen :] if len(messages) >= self._seen else messages
            self._seen = len(messages) + 1  # the answer is appended by the guest
            read = request.get("material")  # how much of its stdin the box's tools have read, as it counts
            material = {"material": self._material + read} if isinstance(read, int) and not isinstance(read, bool) and read >= 0 else {}
            self.tape.append("request", turn=turn, cycle=self.cycles, digest=digest(messages), messages=new, **material)
        began = time.monotonic()
        try:
            with self._calls:
                completion = self.provider.complete(messages, tools)
        except ProviderError as exc:
            self.termination = exc.termination
            self.reason = str(exc)
            self.tape.append("provider_error", turn=turn, termination=exc.termination, message=str(exc))
            return error_frame(exc.termination, str(exc), exc.exit_code)
        latency = time.monotonic() - began
        with self._lock:
            used = int(completion.usage.get("total_tokens") or 0)
            self.tokens += used
            self.budget.tokens.spend(used)
            self.tape.append("response", turn=turn, message=completion.message, usage=completion.usage, finish_reason=completion.finish_reason, latency_s=round(latency, 4))
        self.view({"event": "response", "turn": turn, "message": completion.message, "usage": completion.usage})
        return {"kind": "chat_result", "turn": turn, "message": completion.message, "usage": completion.usage, "tokens_used": self.tokens}

    @_told
    def event(self, event: dict[str, Any]) -> None:
        """What the box's agent reports of its tools: recorded under a kind of the box's, or refused.

        The host chooses the kind (records.BOX_KINDS); nothing a box sends becomes a record of the host's
        (a `response`, an `outcome`). An event is never answered (the guest reads no reply to it), so a refusal
        is a `box_refused` record, the first MAX_REFUSALS of them, and the box carries on."""
        try:
            with self._lock:
                if self._box_bytes >= BOX_SHARE:
                    raise Refusal(f"the box has written its share of the tape ({BOX_SHARE >> 20} MiB)")
                record = box_record(event, time.time())
                fields = as_dict(record)
                kind, _ = fields.pop("kind"), fields.pop("t")
                self._box_bytes += len(json.dumps(fields, ensure_ascii=False))
        except Refusal as exc:
            self._refused(event.get("event"), str(exc))
            return
        if isinstance(record, Exit):
            self.termination = f"exit_{record.status}"
            self.reason = record.reason
        elif isinstance(record, Terminated):
            self.termination = record.termination
        self.tape.append(kind, **fields)
        self.view({"event": kind, **fields})

    def _refused(self, name: Any, why: str) -> None:
        with self._lock:
            self.refused += 1
            if self.refused > MAX_REFUSALS:
                return
        self.tape.append("box_refused", event=str(name)[:64], why=why)

    @_told
    def revise(self, request: dict[str, Any]) -> dict[str, Any]:
        """A revision of the world after a tool changed it: the guest asks after each sh and restore_world."""
        from quinebox.worlds.revisions import WorldError

        if self.world is None:
            return error_frame("unsupported", "this box's world keeps no revisions")
        turn = int(request["turn"]) if request.get("turn") is not None else None
        command = str(request["command"])[:MAX_COMMAND] if request.get("command") is not None else None
        what = str(request.get("what") or "sh")[:64]
        try:
            record = self.world.revise(what, turn=turn, command=command)
        except WorldError as exc:  # whatever the box did to its world, the host carries on
            self.tape.append("world_error", turn=turn, message=str(exc))
            return error_frame("world", str(exc))
        if record is None:
            return {"kind": "revised", "rev": self.world.rev, "new": False, "paths": 0}
        self.tape.append("revision", rev=record["rev"], turn=turn, what=what, command=record.get("command"), files=record["files"], bytes=record["bytes"])
        return {"kind": "revised", "rev": record["rev"], "new": True, "paths": record["files"]}

    def restore_world(self, request: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bytes]]:
        """The plan that rolls the world back to a revision, then the bytes of the files it rewrites."""
        rev = request.get("revision")
        if not isinstance(rev, int) or isinstance(rev, bool):
            return iter([(error_frame("invalid", "restore_world needs an integer revision"), b"")])
        return self._streamed("restore_world", lambda: self.world.restore_plan(rev))

    def adopt(self, request: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bytes]]:
        """The plan that brings a finished child's changes into this box's world (a race's winner, say)."""
        child = request.get("session")
        if not isinstance(child, str) or child not in self.children:
            return iter([(error_frame("invalid", f"{child!r} is not a child of this box"), b"")])
        return self._streamed("adopt", lambda: self.world.adopt_plan(child, force=bool(request.get("force"))))

    def _streamed(self, what: str, make: Callable[[], tuple[dict[str, Any], Iterator[bytes]]]) -> Iterator[tuple[dict[str, Any], bytes]]:
        """A world plan as frames: the plan, then its files' bytes; or one error frame."""
        from quinebox.guest.protocol import MAX_JSON
        from quinebox.worlds.revisions import WorldError

        if self.world is None:
            yield error_frame("unsupported", "this box's world keeps no revisions"), b""
            return
        try:
            plan, data = make()
        except (WorldError, OSError) as exc:
            yield error_frame("world", str(exc)), b""
            return
        if len(json.dumps(plan)) > MAX_JSON // 2:
            yield error_frame("world", f"too much to change in one step ({len(plan['files'])} files); do it in a shell instead"), b""
            return
        facts = {k: v[:200] if isinstance(v, list) else v for k, v in plan.items() if k in ("revision", "before", "undone", "adopted")}
        self.tape.append(what, **facts)
        log.note("world_restored" if what == "restore_world" else "world_adopted", self.session, by="box", **facts)
        yield plan, b""
        for chunk in data:
            yield {"kind": "world_data"}, chunk

    # -- the end ----------------------------------------------------------------

    def record_egress(self, facts: dict[str, Any]) -> None:
        """Each connection the box made or was refused (secret values never reach here)."""
        try:
            self.tape.append("egress", **facts)
        except StateError:
            pass  # a full state dir must not break the connection; finishing the session reports it

    def finish(self, exit_code: int, *, timed_out: bool = False, oom_killed: bool = False) -> dict[str, Any]:
        if self._unresumed:
            self.abandon()
            return {"exit_code": exit_code, "termination": "not_resumed", "duration_s": round(time.monotonic() - self.began, 3), "tokens": self.tokens, "turns": self.turns}
        if timed_out:
            self.termination = "timeout"
        elif oom_killed and exit_code == 137:
            self.termination = "oom"
        elif self.termination is None:
            self.termination = "killed" if exit_code >= 128 else "crashed" if exit_code else "exit_success"
        outcome = {
            "exit_code": exit_code,
            "termination": self.termination,
            "duration_s": round(time.monotonic() - self.began, 3),
            "tokens": self.tokens,
            "turns": self.turns,
        }
        failed: StateError | None = None
        try:  # both, whichever fails: each is whole either way
            self.tape.append("outcome", **outcome)
        except StateError as exc:
            failed = exc
        try:
            self.index.finish(self.session, exit_code=exit_code, termination=self.termination, tokens=self.tokens, turns=self.turns)
        except StateError as exc:
            failed = failed or exc
        self.tape.close()
        self.index.close()
        if failed and self._told is not None:  # the box said the state dir is full already: its exit status, no second line
            raise StateError(str(failed), kind=failed.kind, **failed.fields, said=True) from failed
        if failed:
            raise failed
        return outcome

    def abandon(self) -> None:
        """A resumed session whose box could not start: no outcome, so it stays interrupted (and may be resumed again)."""
        self.tape.close()
        self.index.close()
