"""`retention:` in config.yaml: finished sessions pruned by age, count and size, at most once a day, by
whichever quinebox process finds it due, in a process of its own, so that it never delays a box.

    retention:
      age: 30d       # a session that ended longer ago goes
      count: 1000    # the newest 1000 finished sessions stay, older ones go
      size: 2g       # the oldest go until the state dir fits in 2 GiB (its unpacked images and audit log aside)
      images: 30d    # `gc` and `prune` let go of unpacked images no box has used this long (box/images/usage.py)

Each limit given is enforced: a session over any one of them goes (unlike `prune`'s options, each of which
must hold). What `prune` never takes (tree/prune.py), retention never takes either, so the size is a goal:
what is running or still needed stays even where it is over.

Every `quinebox` process, as it ends, asks `due()`: one stat of `retention.last` in the state dir. Once a
day that finds it old, and the process starts `quinebox prune --retention` detached, logging to
`retention.log`; with no `retention:` it only reads the config and starts nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quinebox.errors import ErrorKind, QuineboxError
from quinebox.state import state_root

if TYPE_CHECKING:  # the rest is imported where used: every command's end imports this module for `due`
    from pathlib import Path

    from quinebox.agent.store import SessionRow

STAMP = "retention.last"
LOG = "retention.log"
#: How often retention runs at most.
EVERY = 86400.0
FIELDS = ("age", "count", "size", "images")


class RetentionError(QuineboxError):
    """A `retention:` that config.yaml cannot mean: one line, and nothing is pruned."""

    exit_code = 2
    default_kind = ErrorKind.BAD_INPUT


@dataclass(frozen=True)
class Limits:
    age: float | None = None
    count: int | None = None
    size: int | None = None

    @classmethod
    def from_config(cls, config: Any) -> Limits:
        from quinebox.grants import parse_duration, parse_size

        where = "bad `retention:` in config.yaml"
        if not isinstance(config, dict) or not config or set(config) - set(FIELDS):
            raise RetentionError(f"{where}: give one or more of age (7d), count (1000), size (2g) and images (30d)")
        try:
            age = parse_duration(str(config["age"])) if "age" in config else None
            size = parse_size(str(config["size"])) if "size" in config else None
            if "images" in config:
                parse_duration(str(config["images"]))  # the image step's (box/images/usage.py); refused here too, before anything goes
        except QuineboxError as exc:
            raise RetentionError(f"{where}: {exc}") from None
        count = config.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise RetentionError(f"{where}: count is how many finished sessions stay, a whole number 0 or more")
        return cls(age=age, count=count, size=size)

    def candidates(self, rows: list[SessionRow], now: float, sessions: Path | None = None) -> set[str]:
        finished = sorted((r for r in rows if r.ended is not None), key=lambda r: r.started, reverse=True)
        going = {r.id for r in finished if self.age is not None and r.ended is not None and now - r.ended >= self.age}
        if self.count is not None:
            going |= {r.id for r in finished[self.count :]}
        if self.size is not None and sessions is not None:
            going |= over_size([r.id for r in reversed(finished)], self.size, weigh(sessions), going)
        return going

    def said(self) -> dict[str, object]:
        return {"retention": {k: v for k, v in (("age", self.age), ("count", self.count), ("size", self.size)) if v is not None}}


def configured_limits() -> Limits:
    from quinebox.documents import load_config

    config = load_config().get("retention")
    if config is None:
        raise RetentionError("no `retention:` in config.yaml: give age (7d), count (1000) or size (2g) there, or prune with options")
    return Limits.from_config(config)


#: What the state dir holds for all its sessions at once, counted in `size`: the sessions' index and the
#: `map`/`batch` run records. Not counted: the unpacked images (`images:` is theirs) and the audit log, which
#: nothing prunes (it outlives what it records).
SHARED = ("sessions.db", "runs")


@dataclass(frozen=True)
class Weights:
    """What each session dir holds on disk, the world objects each one's revisions name (sha: size), and what
    the state dir holds for all of them (SHARED), which no one session's going frees."""

    own: dict[str, int]
    objects: dict[str, dict[str, int]]
    shared: int = 0

    def sizes(self) -> dict[str, int]:
        """Each world object named, once: sha: size."""
        return {sha: size for objects in self.objects.values() for sha, size in objects.items()}

    def total(self) -> int:
        """What retention's `size` weighs: the session dirs, the objects their worlds name and what is shared."""
        return sum(self.own.values()) + sum(self.sizes().values()) + self.shared


def weigh(sessions: Path) -> Weights:
    """`sessions`: the state dir's sessions dir, beside SHARED."""
    from quinebox.state import tree_bytes
    from quinebox.worlds.sweep import objects_of

    try:
        entries = list(os.scandir(sessions))
    except FileNotFoundError:
        entries = []
    shared = sum(tree_bytes(sessions.parent / name) for name in SHARED)
    return Weights(own={entry.name: tree_bytes(entry.path) for entry in entries}, objects=objects_of(sessions), shared=shared)


def over_size(oldest_first: list[str], budget: int, weights: Weights, going: set[str]) -> set[str]:
    """The oldest of `oldest_first` that must go too, after `going`, for the sessions, the objects their worlds
    name and what is shared to fit in `budget` bytes (an object goes only with the last world naming it)."""
    names = Counter(sha for objects in weights.objects.values() for sha in objects)
    sizes = weights.sizes()
    total = weights.total()

    def take(session: str) -> int:
        freed = weights.own.get(session, 0)
        for sha in weights.objects.get(session, {}):
            names[sha] -= 1
            if names[sha] == 0:
                freed += sizes[sha]
        return freed

    for session in going:
        total -= take(session)
    more: set[str] = set()
    for session in oldest_first:
        if total <= budget:
            break
        if session not in going:
            total -= take(session)
            more.add(session)
    return more


def due(now: float | None = None) -> bool:
    """As a quinebox process ends: start retention if `retention:` is set and it has not run for a day (whether it
    started). Never raises: retention that cannot run says so in its log, and costs the command nothing."""
    now = time.time() if now is None else now
    try:
        stamp = os.path.join(state_root(), STAMP)
    except QuineboxError:  # a state dir quinebox refuses (state.py): the command said so, as it failed
        return False
    try:
        if now - os.stat(stamp).st_mtime < EVERY:
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return False
    import subprocess

    from quinebox.documents import load_config

    try:
        if load_config().get("retention") is None:
            return False
        scratch = f"{stamp}.{os.getpid()}"
        with open(scratch, "w"):
            pass
        os.replace(scratch, stamp)  # claimed: processes ending after this one find it fresh
        with open(os.path.join(state_root(), LOG), "ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", "quinebox", "prune", "--retention"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True, env={**os.environ, "QUINEBOX_SERVE": "off"},
            )
    except (OSError, QuineboxError):
        return False
    return True
