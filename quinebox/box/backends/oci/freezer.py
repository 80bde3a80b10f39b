"""An OCI runtime box's pause by the cgroup freezer, written directly: ~1 ms where `runc pause` is a Go start-up.

v1's freezer.state, as on this machine's hybrid hierarchy; the unified hierarchy's cgroup.freeze where there is no
v1 freezer. The box's execs' cgroups lie below its own, so they stop with it, and runc reads its paused state from
the same file. A frozen process of v1 does not die of SIGKILL until it is thawed, so whoever kills a paused box
resumes it first (the Sandbox does; runc's own kill and delete thaw what they signal). Not for gVisor: the host's
freezer would stop the sentry itself, which would then answer nothing until thawed (runtimebox uses `runsc pause`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from quinebox.errors import EngineError

#: How long the freezer may take to stop every process of a box (it waits for each to leave the kernel).
FREEZE_WITHIN = 5.0
#: Where the cgroup hierarchies are: the v1 freezer's, and the unified one's (v2's, or a hybrid's beside v1).
CGROUPS = Path("/sys/fs/cgroup")


def freezer_files(cgroup: str, root: Path = CGROUPS) -> tuple[Path, str, Path, str]:
    """(the file to write, what to write, the file that says when it is done, what it then says) for freezing
    `cgroup`; thawing writes and waits for the other words (`_WORDS`). v1's freezer where the host has one."""
    v1 = root / "freezer" / cgroup.strip("/") / "freezer.state"
    if v1.parent.is_dir():
        return v1, "FROZEN", v1, "FROZEN"
    for unified in (root / "unified", root):
        group = unified / cgroup.strip("/")
        if (group / "cgroup.freeze").exists():
            return group / "cgroup.freeze", "1", group / "cgroup.events", "frozen 1"
    raise EngineError(f"no cgroup freezer for {cgroup} here (neither v1's freezer nor cgroup.freeze): the box cannot be paused")


#: Each freezer's words for frozen, and for thawed.
_WORDS = {"FROZEN": "THAWED", "1": "0", "frozen 1": "frozen 0"}


def set_freezer(bundle: Path, session: str, *, frozen: bool) -> None:
    """The box of `bundle` frozen (or thawed), waiting until every process of it is."""
    try:
        cgroup = json.loads((bundle / "config.json").read_text())["linux"]["cgroupsPath"]
    except (OSError, ValueError, KeyError, TypeError):
        raise EngineError(f"box {session} is going away: its bundle is gone") from None
    freeze_cgroup(cgroup, frozen=frozen, who=f"box {session}")


def freeze_cgroup(cgroup: str, *, frozen: bool, who: str) -> None:
    """Every process of `cgroup` frozen (or thawed), waiting until each is; `who` names the box in the one line an
    EngineError says. A freeze that does not finish in FREEZE_WITHIN is undone, so nothing is left half stopped."""
    control, word, done, said = freezer_files(cgroup)
    if not frozen:
        word, said = _WORDS[word], _WORDS[said]
    until = time.monotonic() + FREEZE_WITHIN
    try:
        control.write_text(word)
        while said not in done.read_text().splitlines():
            if time.monotonic() > until:
                if frozen:
                    control.write_text(_WORDS[word])
                raise EngineError(f"{who} did not {'stop' if frozen else 'go on'} within {FREEZE_WITHIN:g} s: a process of it is stuck in the kernel")
            time.sleep(0.0005)
    except OSError as exc:
        raise EngineError(f"cannot {'pause' if frozen else 'resume'} {who}: its cgroup freezer refused ({exc.strerror})") from None
