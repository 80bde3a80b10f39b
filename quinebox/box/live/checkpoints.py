"""Taking a snapshot of a long-lived box on gVisor, and bringing a copy of it back: the host's side, step by step.

What runsc does here decides each step (runsc 2022-12, found by trying):

- `runsc checkpoint` always ends the sandbox it saves (`--leave-running` destroys it too, restores a new one in
  its place and waits on it), so the original goes on as a successor restored from the same image, in its own
  bundle, as its own container (`OciBox.succeed`): the process that made the box waits for it as before.
- It cannot save a socket of the box's that its gofer connected to the host (the encoder fails, and the sandbox
  dies of it), even one whose host end is closed; a restore cannot give back a file of the host's other than the
  box's own stdio (it fails on the descriptor), which a background process keeps when it holds an exec's output.
  So: no exec may run; the box's init is asked to let go of its lifeline (`drop`), and it first looks for such
  files in the box and, finding one, keeps the lifeline and says what (guest/checkpoints.py); then the box is
  paused (`runsc pause`) and the host counts the connections its gofer holds to the host (stream sockets in the
  gofer's network namespace): any is refused, by number, and the box goes on as it was.
- A restored copy's mounts must be the checkpointed box's, in order, but their sources may be other paths: a
  copy's world, host socket and egress socket are its own. Its processes keep their old container id inside
  gVisor (`runsc ps` of a copy lists only what was started in it since).
- The image is read whole by the restore: it may be removed once the copy runs.

After the instant, each box's init (the original's, a copy's) waits for SIGPWR to dial its lifeline again; it is
sent once the box runs (`redial`).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from quinebox.audit import log
from quinebox.box.backends.boxes import Box
from quinebox.box.backends.oci.box import RESTORE_IMAGE
from quinebox.box.configure import unpacked_image
from quinebox.box.live import freezing, snapshot_rules, snapshots
from quinebox.box.live.snapshots import Recipe, Snapshot
from quinebox.box.net.broker import Broker
from quinebox.box.policy import LABEL_PREFIX
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, build_spec
from quinebox.errors import EngineError, QuineboxError
from quinebox.processes import owner_id
from quinebox.worlds.build import copy_file

#: How long the box's init may take to answer `drop` (it looks through /proc first), and to close its lifeline.
DROP_WITHIN = 10.0
#: How long a box may take to dial its lifeline again once told.
REDIAL_WITHIN = 10.0
#: The signal that has a box's init dial its lifeline again (guest/checkpoints.py's REDIAL).
REDIAL = "PWR"
#: How long a snapshot waits for an exec that started just before it to end.
SETTLE_WITHIN = 2.0
#: Where a snapshot keeps the image and the world.
IMAGE, WORLD = "image", "world"


@dataclass(frozen=True)
class Live:
    """A long-lived box as its owner holds it: what a snapshot of it is taken from."""

    session: str
    spec: BoxSpec
    #: The box as its backend lists it, and the host end of its socket.
    box: Box
    broker: Broker | None
    #: The image's id, and (for another image) the agent image's, whose guest runtime the box runs.
    image_id: str
    #: Whether a command runs in the box (an exec of this process or of another).
    busy: Callable[[], bool]
    #: The stdin, stdout and stderr the original's successor gets (its owner's).
    stdio: Callable[[], tuple[int, int, int]]


def facts(live: Live) -> snapshot_rules.Facts:
    """What decides whether the box can be snapshotted at all: its backend's capability (and, lacking it, the
    backend's reason, asking the engine or CRIU only then), and the box's grants."""
    box, world = live.box, live.spec.world
    cannot = None if box.capabilities.checkpoint else box.why_not("checkpoint")
    return snapshot_rules.Facts(live.session, box.label, None if world is None else world.kind, bool(live.spec.grants.secrets), cannot, live.spec.grants.rootfs_rw)


def take(live: Live, *, transient: bool = False) -> Snapshot:
    """A snapshot of the box, sealed and in its place; the box goes on as it was (paused still, if it was)."""
    session, spec, box = live.session, live.spec, live.box
    refused = snapshot_rules.refusal(facts(live))
    if refused is not None:
        raise QuineboxError(refused)
    if not box.held() or live.broker is None:
        raise QuineboxError(f"box {session} is not held by this process: its owner takes its snapshots (`quinebox box checkpoint` asks it)")
    running = f"a command is running in box {session}: a snapshot cannot carry an exec's streams; take it once the command has ended"
    if live.busy():
        raise QuineboxError(running)
    layer = Path(spec.world.layer) if spec.world is not None else None
    specials = special_files(layer) if layer is not None else []
    if specials:
        raise QuineboxError(snapshot_rules.world_refusal(session, specials))
    before = freezing.pause_of(session)
    if before is not None and before.why == freezing.CHECKPOINT:
        raise QuineboxError(f"a snapshot of box {session} is being taken already")
    if before is not None:
        box.thaw()
    freezing.mark(session, freezing.CHECKPOINT)  # from now on no exec starts (one already past its check may)
    snapshot, making = snapshots.start()
    try:
        if not _settled(live):
            raise QuineboxError(running)
        _let_go(live)
        try:
            box.freeze()
            links, execs = box.host_links(), box.execs_running()
            if links or execs:
                box.thaw()
                raise QuineboxError(snapshot_rules.links_refusal(session, links) if links else running)
        except BaseException:
            redial(box, live.broker)
            raise
        (making / IMAGE).mkdir()
        stdio = live.stdio()
        try:
            box.checkpoint(str(making / IMAGE), stdio, lambda: copy_world(layer, making / WORLD, session) if layer is not None else None)
        except EngineError as exc:  # the checkpoint or the successor's restore failed: the sandbox that was is gone
            raise EngineError(f"box {session} could not go on after its checkpoint, and has ended: {exc}") from None
        finally:
            for fd in stdio:  # the successor holds its own copies
                os.close(fd)
        redial(box, live.broker)
        recipe = Recipe(
            image=spec.image, image_id=live.image_id, agent_id=_agent_id(spec.image, live.image_id),
            grants=tuple(g for g in spec.grants.format() if not g.startswith("time:")),
            ask=tuple(spec.asks.ask.format()), deny=tuple(spec.asks.deny.format()), ask_timeout=spec.asks.timeout,
            workdir=spec.workdir, world=layer is not None, runtime=box.backend,
        )
        made = snapshots.commit(making, Snapshot(snapshot, os.getuid(), session, owner_id(), time.time(), recipe, transient=transient))
    except BaseException:
        snapshots.discard(making)
        raise
    finally:
        if before is not None and box.held():  # paused before: paused after, since then
            freezing.mark(session, freezing.PAUSED, since=before.since)
            box.freeze()
        else:
            freezing.unmark(session)
    log.note("snapshot_taken", session, snapshot=made.id, bytes=made.size, transient=transient)
    return made


def _agent_id(image: str, image_id: str) -> str:
    """The agent image's id: its guest runtime is what the box's init runs, whatever the box's image."""
    return image_id if image == DEFAULT_IMAGE else unpacked_image(DEFAULT_IMAGE, pull="never")[0].id


def copy_spec(manifest: Snapshot, argv: tuple[str, ...], *, ttl: float | str | None) -> BoxSpec:
    """The spec of a copy of the snapshot's box: its recipe, a session and world of its own (the snapshot's world
    copied in), restored from its image rather than run (ocibox.RESTORE_IMAGE). The same image still, or refused:
    the copy's processes go on with the files they had open and mapped."""
    recipe = manifest.recipe
    for name, wanted in ((recipe.image, recipe.image_id), (DEFAULT_IMAGE, recipe.agent_id)):
        now = unpacked_image(name, pull="never")[0].id
        if now != wanted:
            raise QuineboxError(f"snapshot {manifest.id}'s image {name} has changed since (it was {wanted[:19]}, it is {now[:19]}): a copy cannot go on with other files")
    spec = build_spec(
        argv, grants=recipe.grants, ask=recipe.ask, deny=recipe.deny, ask_timeout=recipe.ask_timeout, timeout=ttl, image=recipe.image,
        workdir=recipe.workdir, backend="oci", runtime=recipe.runtime,
    )
    world = None
    if recipe.world and spec.world is not None:
        world = replace(spec.world, sources=tuple(sorted(str(entry) for entry in (manifest.path / WORLD).iterdir())))
    return replace(spec, world=world, tags=(*spec.tags, (RESTORE_IMAGE.removeprefix(LABEL_PREFIX), str(manifest.path / IMAGE))))


def _let_go(live: Live) -> None:
    """The box's init lets go of its lifeline (and stops handing connections over), or the snapshot is refused."""
    assert live.broker is not None
    session = live.session
    answer = live.broker.ask_lifeline({"kind": "drop"}, DROP_WITHIN)
    if answer is None:
        open_now = live.broker.connections()
        if open_now != 1:
            raise QuineboxError(snapshot_rules.links_refusal(session, max(0, open_now - 1)))
        raise QuineboxError(f"box {session}'s init did not answer: a box made by an older quinebox cannot be snapshotted")
    if answer.get("kind") == "kept":
        held_now = [str(line) for line in answer.get("held") or []] or ["a file of the host's"]
        raise QuineboxError(snapshot_rules.held_refusal(session, held_now))
    if not live.broker.wait_unconnected(DROP_WITHIN):
        redial(live.box, live.broker)
        raise QuineboxError(snapshot_rules.links_refusal(session, live.broker.connections()))


def _settled(live: Live) -> bool:
    """Whether no exec runs in the box within SETTLE_WITHIN (one that passed its check just before the marker)."""
    until = time.monotonic() + SETTLE_WITHIN
    while live.busy() or live.box.execs_running():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True


def redial(box: Box, broker: Broker | None) -> None:
    """Tell the box's init to dial its lifeline again, and wait until it has (EngineError when it does not)."""
    box.signal_init(REDIAL)
    until = time.monotonic() + REDIAL_WITHIN
    while broker is not None and broker.connections() == 0:
        if time.monotonic() > until:
            raise EngineError(f"box {box.session} did not dial its host socket again within {REDIAL_WITHIN:g} s")
        time.sleep(0.002)


def special_files(layer: Path) -> list[str]:
    """What of a world a snapshot cannot copy: each FIFO, socket or device, as /world/PATH (kind)."""
    found = []
    for directory, dirs, files in os.walk(layer):
        for name in [*dirs, *files]:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
                found.append(f"{kind} at /world/{os.path.relpath(path, layer)}")
    return sorted(found)


def copy_world(layer: Path, into: Path, session: str) -> None:
    """The box's world copied into the snapshot while nothing of the box runs: links as links (never followed), files
    copy-on-write where the filesystem can (so are each copy's, from the snapshot's)."""
    specials = special_files(layer)
    if specials:  # made since it was first looked at
        raise QuineboxError(snapshot_rules.world_refusal(session, specials))
    shutil.copytree(layer, into, symlinks=True, copy_function=copy_file)
