"""The MCP tools that run quinebox agents: run_mission (a mission in a fresh box, on the server's model) and
fork_session (going on from a turn of a session this server ran), at most as many at once as the server has boxes.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from quinebox.grants import Grants
from quinebox.integrations.mcp_boxes import Boxes
from quinebox.integrations.mcp_checks import IMAGE_PATTERN, MAX_INPUT, MAX_OUTPUT, MAX_TIMEOUT, Capped, Refused, lifetime, narrow, shown, size, strings, text


def look_session(session: str) -> dict[str, str]:
    return {"show": f"quinebox show {session}", "logs": f"quinebox logs {session}", "diff": f"quinebox world diff {session}",
            "fork": f"quinebox fork {session} --at TURN"}


class MissionTools(Boxes):
    """run_mission and fork_session, and the sessions they ran."""

    def run_mission(self, mission: str, input: str | None = None, grants: list[str] | None = None, image: str | None = None,
                    timeout: float | str | None = None, max_turns: int | None = None, from_box: str | None = None) -> dict[str, Any]:
        """Run a quinebox agent on a mission in a fresh box (the server's model); input: its material on stdin;
        from_box: start its /world as a copy of that box's newest revision. Returns its deliverable (stdout),
        diagnostics (stderr), exit code and session, which fork_session can go on from."""
        mission = text(mission, "mission", 64 << 10)
        data = text(input, "input", MAX_INPUT, empty=True).encode() if input is not None else b""
        image = text(image, "image", 255) if image is not None else self.image
        if not IMAGE_PATTERN.match(image):
            raise Refused(f"bad image {image!r}")
        granted = narrow(self.ceiling, strings(grants, "grants"), "run_mission", cwd=self.cwd)
        seconds = lifetime(self.ceiling, timeout, "timeout", 600.0, MAX_TIMEOUT)
        turns = size(max_turns, "max_turns", 0, 1000) or None
        with tempfile.TemporaryDirectory(prefix="quinebox-mcp-") as scratch:
            world_tar = None
            if from_box is not None:
                world_tar = os.path.join(scratch, "world.tar")
                with open(world_tar, "wb") as tar:
                    self.box(from_box).world.export(tar)
            return self.agent(mission, granted, stdin=data, timeout=seconds, max_turns=turns, image=image, world_tar=world_tar)

    def agent(self, mission: str, granted: Grants, **options: Any) -> dict[str, Any]:
        with self.lock:
            if self.missions >= self.max_boxes:
                raise Refused(f"this server already runs {self.max_boxes} missions: wait for one to end")
            self.missions += 1
        try:
            return self._agent(mission, granted, **options)
        finally:
            with self.lock:
                self.missions -= 1

    def _agent(self, mission: str, granted: Grants, **options: Any) -> dict[str, Any]:
        from quinebox.tree.supervisor import start_agent

        out, err = Capped(MAX_OUTPUT), Capped(MAX_OUTPUT)
        image = options.pop("image", None) or self.image
        agent = start_agent(mission, model=self.model, grants=granted.format(), deny=self.deny, stdout=out, stderr=err,
                            image=image, pull=self.pull(image), ask_timeout=0, **options)
        code = agent.wait()
        session = agent.session.session
        with self.lock:
            self.sessions.add(session)
        outcome = agent.outcome or {}
        return {"session": session, "exit_code": code, "termination": outcome.get("termination"), "turns": outcome.get("turns"),
                "tokens": outcome.get("tokens"), "stdout": shown(out.data, out.cut), "stderr": shown(err.data, err.cut),
                "stdout_bytes_cut": out.cut, "stderr_bytes_cut": err.cut, "look": look_session(session)}

    def fork_session(self, session: str, at: int, mission: str | None = None, grants: list[str] | None = None,
                     timeout: float | str | None = None, max_turns: int | None = None) -> dict[str, Any]:
        """Go on from turn `at` of a session this server ran: the model answers that turn afresh, in a world made
        again as it was then; mission: new instructions after the recorded conversation. grants default to the session's."""
        from quinebox.agent.tapes import find
        from quinebox.agent.timeline import moment

        session = text(session, "session", 64)
        with self.lock:
            mine = sorted(s for s in self.sessions if s.startswith(session))
        if len(mine) != 1:
            raise Refused(f"no session {session!r} run by this server (or more than one starts so): run_mission makes them")
        if isinstance(at, bool) or not isinstance(at, int) or at < 1:
            raise Refused("at must be a turn number, 1 or more")
        row = find(mine[0])
        then = moment(row.id, at)
        history = list(then.messages)
        if mission is not None:
            history.append({"role": "user", "content": f"New instructions from here on:\n\n{text(mission, 'mission', 64 << 10)}"})
        asked = strings(grants, "grants") if grants is not None else list(then.meta.get("grants") or [])
        granted = narrow(self.ceiling, asked, "fork_session", cwd=self.cwd)
        seconds = lifetime(self.ceiling, timeout, "timeout", 600.0, MAX_TIMEOUT)
        return self.agent(
            mission or row.mission, granted, timeout=seconds, max_turns=size(max_turns, "max_turns", 0, 1000) or None, stdin=b"",
            image=then.meta.get("image"), workdir=then.meta.get("workdir"), world_at=(row.id, then.revision), history=history,
            forked_from={"session": row.id, "turn": at, "revision": then.revision},
        )
