"""Which paths of a world changed since we last looked, and how much the world has grown.

Reading a 10,000-file world to find one changed file costs as much as the
world; inotify tells us which names changed, so a revision rereads only
those. Events are read continuously by one thread per world, which also
keeps the world's disk use (allocated blocks) and calls `on_full` once the
box has added more than its `world:SIZE` grant. When the kernel's queue
overflows, a directory moves, or watches run out, the tracker says so and
the next revision reads the whole world instead: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import os
import select
import threading
from collections.abc import Callable

import inotify_simple
from inotify_simple import Event, INotify, flags

from quinebox.worlds import beneath

_MASK = (
    flags.CREATE | flags.DELETE | flags.MODIFY | flags.ATTRIB | flags.CLOSE_WRITE | flags.MOVED_FROM | flags.MOVED_TO
    | flags.ONLYDIR | flags.EXCL_UNLINK
)
#: How often the usage is brought up to date with what the events said.
USAGE_INTERVAL = 0.2


def inotify() -> INotify:
    """A non-blocking INotify, calling the libc this process has loaded already: inotify_simple looks for libc itself
    on its first use in a process (ctypes.util.find_library, which runs `ldconfig -p`, a process of its own), which every
    cold command paid for its world's tracker, and every server for its freshness watches."""
    if getattr(inotify_simple, "_libc", None) is None:
        inotify_simple._libc = ctypes.CDLL(None, use_errno=True)
    return INotify(nonblocking=True)


class Tracker:
    def __init__(self, root: str, *, limit: int | None = None, on_full: Callable[[str], None] | None = None):
        self.root = root
        self.limit = limit
        self.on_full = on_full
        self._inotify = inotify()
        self._paths: dict[int, str] = {}
        self._dirty: set[str] = set()
        self._unmeasured: set[str] = set()
        self._sizes: dict[str, int] = {}
        self._total = 0  # the sum of _sizes, kept as it changes: usage is checked several times a second
        self._lock = threading.Lock()
        #: One reader of the inotify fd at a time: `take` (the revising thread) and our own thread both read it.
        self._reading = threading.Lock()
        self.lost = False  # events were lost: the next reader must look at everything
        self._root_fd = os.open(root, beneath.DIR_FLAGS)
        self._stop_r, self._stop_w = os.pipe()
        self._watch_tree("")
        self.initial = self._total
        self._full_reported = False
        self._thread = threading.Thread(target=self._run, name=f"world:{os.path.basename(root)}", daemon=True)
        self._thread.start()

    @property
    def used(self) -> int:
        """Bytes the box has added to the world since it started (allocated blocks, so sparse files count as what they take)."""
        with self._lock:
            return self._total - self.initial

    def take(self) -> tuple[set[str], bool]:
        """(paths changed since the last take, whether everything must be reread instead)."""
        self._drain(0)
        with self._lock:
            dirty, lost = self._dirty, self.lost
            self._dirty, self.lost = set(), False
        return dirty, lost

    def close(self) -> None:
        """Stop watching. The thread releases the inotify instance as it leaves: the kernel takes
        milliseconds to tear down watches, which a box's caller should not wait for."""
        os.write(self._stop_w, b"x")

    # -- events --------------------------------------------------------------------

    def _watch_tree(self, top: str) -> None:
        """Watch `top` and every directory below it, and measure what it holds."""
        for rel_dir, fd, entries in beneath.walk(self._root_fd, top):
            try:
                self._paths[self._inotify.add_watch(f"/proc/self/fd/{fd}", _MASK)] = rel_dir
            except OSError:
                self.lost = True  # out of watches: revisions fall back to reading everything
            for rel, item in entries:
                try:
                    self._size(rel, item.stat(follow_symlinks=False).st_blocks * 512)
                except OSError:
                    continue

    def _size(self, path: str, size: int | None) -> None:
        """Record what `path` takes now (None: gone), keeping the running total."""
        with self._lock:
            self._total += (size or 0) - self._sizes.pop(path, 0)
            if size is not None:
                self._sizes[path] = size

    def _run(self) -> None:
        # poll, not select: a host holding many boxes has fds past select's 1024
        poller = select.poll()
        for fd in (self._inotify.fileno(), self._stop_r):
            poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll(USAGE_INTERVAL * 1000)}
            if self._stop_r in ready:
                with self._reading:
                    self._inotify.close()
                for fd in (self._stop_r, self._stop_w, self._root_fd):
                    os.close(fd)
                return
            try:
                self._drain(0)
                self._measure()
            except Exception:  # noqa: BLE001 — a world doing odd things must not kill the host's thread
                with self._lock:
                    self.lost = True

    def _drain(self, timeout: int) -> None:
        with self._reading:
            try:
                events = self._inotify.read(timeout=timeout)
            except BlockingIOError:
                return
            for event in events:
                self._handle(event)

    def _handle(self, event: Event) -> None:
        if event.mask & flags.Q_OVERFLOW:
            with self._lock:
                self.lost = True
            return
        if event.mask & flags.IGNORED:
            self._paths.pop(event.wd, None)
            return
        parent = self._paths.get(event.wd)
        if parent is None or not event.name:
            return
        path = f"{parent}/{event.name}" if parent else event.name
        is_dir = bool(event.mask & flags.ISDIR)
        with self._lock:
            self._dirty.add(path)
            self._unmeasured.add(path)
            if is_dir and event.mask & (flags.MOVED_FROM | flags.MOVED_TO):
                self.lost = True  # the watches below it now have stale names
            if is_dir and event.mask & flags.MOVED_FROM:
                prefix = path + "/"
                for sub in [p for p in self._sizes if p.startswith(prefix)]:
                    self._total -= self._sizes.pop(sub)
        if is_dir and event.mask & (flags.CREATE | flags.MOVED_TO):
            self._watch_tree(path)

    def _measure(self) -> None:
        with self._lock:
            paths, self._unmeasured = self._unmeasured, set()
        for path in paths:
            st = beneath.lstat(self._root_fd, path)  # gone: what was below it was reported name by name
            self._size(path, None if st is None else st.st_blocks * 512)
        if self.limit is not None and not self._full_reported and self.used > self.limit and self.on_full:
            self._full_reported = True
            from quinebox.grants import format_size

            self.on_full(f"the box added {self.used} bytes to its world, over its world:{format_size(self.limit)} grant")
