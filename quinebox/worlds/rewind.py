"""A world no box runs in, made as it was at one of its revisions, on the host: for a session resumed after the
process running it was lost, whose turn in flight runs again on the world it was asked on.

No box has the world (its box died with its lifeline), so the host writes it itself, beneath its root as
everywhere (materialize.carry_out), never through a link the box left. What the lost turn had changed is kept
first as a revision of its own (`interrupted`), so that its history still shows it; then the world is brought
back, and that is kept as one more (`resume`).
"""

from __future__ import annotations

import os

from quinebox.errors import ErrorKind
from quinebox.worlds import beneath
from quinebox.worlds.build import load_spec
from quinebox.worlds.materialize import carry_out
from quinebox.worlds.revisions import WorldError, changes
from quinebox.worlds.world import World


def rewind(session: str, rev: int) -> list[str]:
    """Make `session`'s world as it was at revision `rev`; `path (why)` of each entry that could not be made again."""
    spec, meta = load_spec(session)
    if spec.kind == "overlay":
        raise WorldError(
            f"session {session}'s world is a layer over its parent's: only a session started at the host goes back to a revision",
            kind=ErrorKind.UNSUPPORTED, session=session,
        )
    world = World(session, spec, track=False)
    try:
        world.revise("interrupted")
        delta = changes(world.manifest, world.log.manifest(rev))
        if not delta:
            return []
        try:
            root = os.open(spec.layer, beneath.DIR_FLAGS)
            try:
                skipped = carry_out(delta, world.store, root, uid=meta.get("uid"), gid=meta.get("gid"))
            finally:
                os.close(root)
        except (OSError, beneath.Escape) as exc:
            raise WorldError(f"cannot bring session {session}'s world back to revision {rev}: {exc}") from None
        world.revise("resume")
        return skipped
    finally:
        world.close()
