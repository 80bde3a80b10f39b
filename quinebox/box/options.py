"""`BoxOptions`: what a caller may say about a box, in one frozen value that every front end builds and every layer takes.

Why one type: the options used to be written out by each front end (`quinebox.exec`, `Popen`, `run`, the Runner,
`Sandbox`, the supervisor, the CLI's commands, MCP, Inspect) and each layer below them, and the copies drifted:
one could not choose a backend (so the CLI handed it down through the process's environment), another dropped an
option it did not know. Here they are written once; a front end turns its flags or keywords into a `BoxOptions`
(`BoxOptions.of`, which names an unknown option in one line), and `box.spec.build_spec` renders it, with the
box's command and its place, into a checked `BoxSpec`.

What is not here, on purpose: how a box's streams connect (stdin/stdout/stderr, `tty`), what an agent is given
(model, turns, tokens), and where a box sits in a tree (parent, agent). Limits and variables are grants
(`mem:512m`, `cpus:2`, `pids:64`, `env:NAME`): the grant language is the one way to say what a box may use.
Values are checked where a spec is built (a bad grant, pull policy or backend is a GrantError there); names are
checked here, when the options are made.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any


def _strings(name: str, value: Any) -> tuple[str, ...]:
    """A list of grant strings as a tuple; one bare string is refused (it would be taken letter by letter)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"box option {name} is a list of grant strings, as in {name}=['mem:512m'], not {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class BoxOptions:
    """A box as its caller describes it: grants, rules, image, world and where it runs. Frozen: a layer that needs
    another box derives one with `dataclasses.replace` (or `of`), never by changing the caller's."""

    #: Grant strings, as for `quinebox exec -g`: "ro:PATH", "net:HOST", "mem:512m", "env:NAME", "time:5m", …
    grants: tuple[str, ...] = ()
    #: A policy file or preset (strict, dev, pypi, github): grants, ask and deny rules, and the backend it requires.
    policy: str | None = None
    #: Wall-clock limit ("30s", "5m", or seconds); when it runs out the box is killed and exits 124.
    timeout: float | str | None = None
    #: Any image (default quinebox's agent image); "host": this machine's own root, read-only.
    image: str | None = None
    #: When to pull the image: "missing", "always" or "never".
    pull: str = "missing"
    #: The working directory inside the box (an absolute path).
    workdir: str | None = None
    #: The box's /world: a host directory (read-write), copies of host paths, an archive's contents, or a
    #: recorded session's world at a revision ((session, revision), for `quinebox fork`); at most one of them.
    world: str | None = None
    world_from: str | tuple[str, ...] | None = None
    world_tar: str | None = None
    world_at: tuple[str, int] | None = None
    #: Rules a person may approve (`quinebox approve`, or the terminal) within `ask_timeout`; `deny` refuses what it
    #: covers, held or approved. Inherited by every box below this one.
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    ask_timeout: float | str | None = None
    #: Where the box runs: "auto", "oci" or "docker", and the OCI runtime ("runc", "crun", "runsc" or a path).
    #: None: QUINEBOX_BACKEND / QUINEBOX_RUNTIME, else config.yaml's, else quinebox's choice (backends/choice.py).
    backend: str | None = None
    runtime: str | None = None
    #: Labels of the tree's boxes (box.spec.TAGS: a cluster attempt's run, input and attempt number).
    tags: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("grants", "ask", "deny"):
            object.__setattr__(self, name, _strings(name, getattr(self, name)))
        if self.world_from is not None and not isinstance(self.world_from, str):
            object.__setattr__(self, "world_from", tuple(self.world_from) or None)
        if isinstance(self.tags, Mapping):
            object.__setattr__(self, "tags", tuple(sorted(self.tags.items())))
        else:
            object.__setattr__(self, "tags", tuple(sorted(tuple(pair) for pair in self.tags)))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in fields(cls))

    @classmethod
    def of(cls, base: BoxOptions | None = None, /, **given: Any) -> BoxOptions:
        """`base` (default: every option's default) with the options `given` by name; an unknown name is a TypeError
        that says which, what it may have meant, and what the options are."""
        check_names(given)
        return replace(base, **given) if base is not None else cls(**given)

    def given(self) -> dict[str, Any]:
        """The options that differ from their defaults, by name: what a caller said (and what to pass on to a
        front end that takes options by name)."""
        default = BoxOptions()
        return {name: getattr(self, name) for name in self.names() if getattr(self, name) != getattr(default, name)}


def check_names(given: Iterable[str]) -> None:
    """A TypeError naming the first of `given` that is no box option (a typo such as `grant=`, or `tty=` where
    no terminal is given), with the nearest option and the list of them."""
    known = BoxOptions.names()
    for name in given:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"unknown box option {name!r}{hint}: a box's options are {', '.join(known)}")


__all__ = ["BoxOptions", "check_names"]
