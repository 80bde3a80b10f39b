"""`quinebox serve`: a per-user command server that runs thin clients' commands in warm, already-imported processes.

The server imports the CLI and everything a command loads (typer, docker,
openai, the policy and seccomp data) once (serve.py's `warm`), then forks workers that run the commands,
as Mercurial's chg server does (workers.py). A worker takes the client's stdin, stdout
and stderr as its own, its cwd and environment, and runs the very same CLI
code a cold `quinebox` would, so options, errors, exit codes, `--json` and
terminals are the same by construction; only the start-up is gone. Each
worker holds its client's connection: a signal the client forwards is raised
in the worker, and a client that goes away (SIGKILL included) is a SIGTERM,
which kills its boxes. Workers are processes of their own: stopping the server
ends no command that runs. A worker its command left clean says it is free, and the server hands it the next
command before any other (the one freed last first: its pages are the warmest); up to KEEP_FREE wait so.

The server never starts a thread or keeps an engine connection, so every
worker starts clean: the pool of warm boxes (box/pool/warm.py) lives in a process of its
own, forked between two commands once commands keep coming (warm.Demand). Workers and the pool die with the
server, however it dies (SIGKILL included), and their boxes with them; `serve
stop` lets running commands finish first. The boxes' keeper (box/backends/keeper.py) is forked once, before
the first worker: each worker tells it of its boxes, and it removes those of a worker that dies (SIGKILL included). A server exits once idle, and once its
state dir is gone (freshness.Gone).

It serves only its own user's processes that are as free as itself (fdpass.unfree: the same namespaces, no
NoNewPrivs, seccomp or fewer capabilities than it has): a sandboxed process's command would otherwise run with
the server's freedom. Such a process's command is handed back unrun, to run in-process, in its own sandbox.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from quinebox import fdpass
from quinebox.cli.workers import Worker
from quinebox.errors import QuineboxError, StateError
from quinebox.processes import reap_children
from quinebox.state import pool_socket, run_dir, serve_socket, state_root

if TYPE_CHECKING:
    from collections.abc import Callable

    from quinebox.box.pool.warm import Demand, Settings
    from quinebox.cli.freshness import Changes

#: A client sends its request as it connects; one that says nothing for this long is dropped (it would hold the server up).
REQUEST_TIMEOUT = 2.0
#: How long a status waits for the pool's keeper's figures: well within the client's own wait for the status
#: (serve.status), or a keeper busy making its first boxes (accepting only once its default shape is known, which may
#: unpack an image first) made the server look gone.
POOL_STATS_TIMEOUT = 1.0
#: How often an idle server looks at whether it has been idle long enough to exit, at most.
IDLE_CHECK = 5.0
#: How many times the server tries a warm-up it could not do at its start again, one after each command, before it
#: leaves it to every worker (Server.warm_later).
WARM_TRIES = 32
#: A server nobody stops exits after this long with no command running (`serve --idle`, `serve: {idle: ...}`).
IDLE_DEFAULT = 15 * 60.0
#: How many free workers wait for a command at most (each a few MB of its own); one freed beyond them exits.
KEEP_FREE = 8


class Server:
    def __init__(self, pool: Settings, idle: float | None = None) -> None:
        self.path = str(serve_socket())
        self.started = time.time()
        self.served = 0
        self.listener: socket.socket | None = None
        self.pool = pool
        self.keeper: int | None = None
        #: When commands have kept coming enough to start the pool (its keeper is forked then, between two commands).
        self.demand: Demand | None = None
        self.pool_due = False
        #: Seconds with no command running after which the server exits (None: never), and when the last one ended.
        self.idle = idle
        self.last = time.monotonic()
        #: What the code and config were when it started (cli/freshness.py): taken by `serve_forever`, after `warm`.
        self.paths = list(sys.path)
        self.fingerprint = ""
        self.changes: Changes | None = None
        #: Workers and the pool's keeper: what the server waits for when it stops. Not every child of this process
        #: (the boxes' keeper, backends/keeper.py, lives until every worker has exited: waiting for it never ends).
        self.children: set[int] = set()
        #: A worker forked ahead, waiting for the next command (its fork is then off that command's path).
        self.spare: Worker | None = None
        #: Every worker that has taken a command and runs on (by its pair's fd: the server hears each say it is free,
        #: or go), and those free now, the one freed last at the end.
        self.workers: dict[int, Worker] = {}
        self.free: list[Worker] = []
        #: A warm-up that could not be done at the start (serve.warm_bwrap: its image not unpacked yet), tried again
        #: after each command until it is done, or WARM_TRIES: True once done.
        self.warm_later: Callable[[], bool] | None = None
        self.warm_tries = 0

    def bind(self) -> None:
        """Listen on the state dir's socket; refuse to take it from a server that answers there."""
        import fcntl

        run = run_dir()
        lock = os.open(run, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the directory itself: no lock file left behind
        try:  # two servers started at once: one binds, the other finds it answering
            fcntl.flock(lock, fcntl.LOCK_EX)
            answering = fdpass.connect(self.path)
            if answering is not None:
                answering.close()
                raise QuineboxError(f"a command server already answers on {self.path}: `quinebox serve stop` first")
            self.listener = fdpass.listen(self.path, mode=0o600, backlog=64)
        finally:
            os.close(lock)
        try:  # it started: the next client that finds none answering may start another at once (client.py)
            os.unlink(run / "serve.started")
        except FileNotFoundError:
            pass

    def keep_pool(self) -> None:
        """Fork the pool's keeper (it dies with this process), unless the pool's size is 0 or it runs already."""
        self.pool_due = False
        if not self.pool.size or self.keeper is not None:
            return
        from quinebox.box.pool.keeper import keep

        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 125
            try:
                assert self.listener is not None
                self.listener.close()
                for worker in self._every_worker():
                    worker.dismiss()  # the keeper's copy of its end: a worker hears only the server's
                keep(self.pool, parent)
            finally:
                os._exit(code)
        self.keeper = pid
        self.children.add(pid)

    def serve_forever(self) -> None:
        import select

        from quinebox.box.backends import keeper
        from quinebox.box.pool.warm import Demand
        from quinebox.cli.freshness import Changes, Gone, fingerprint

        assert self.listener is not None
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.changes = Changes(self.paths)  # before the fingerprint: what changes meanwhile is seen
        self.fingerprint = fingerprint(paths=self.paths)
        gone = Gone(state_root(), str(run_dir()), os.path.basename(self.path))
        self.last = time.monotonic()  # idle from when it answers, not from before its imports
        self.demand = Demand(self.pool.after)
        keeper.start()  # before any worker or the pool's keeper is forked: each tells this one, and forks none of its own
        if not self.pool.after:
            self.keep_pool()
        # Everything imported so far lives as long as the server: out of the collector's sight, a worker's collections
        # do not write to (and so copy) the pages it shares with the server.
        gc.freeze()
        self.spare = Worker(self.listener)
        self.listener.setblocking(False)  # select says when to accept; a client gone meanwhile is no wait
        try:
            while (listener := self.listener) is not None:  # the one this turn: a SIGTERM's stop() may close it meanwhile
                try:
                    ready, _, _ = select.select([listener.fileno(), gone.fileno(), *self.workers], [], [], None if self.idle is None else min(self.idle, IDLE_CHECK))
                    for fd in set(ready) & self.workers.keys():
                        self._heard(self.workers[fd])
                    if gone.fileno() in ready and gone.happened():
                        print(f"quinebox serve: the state dir {state_root()} is gone (or this server's socket in it): exiting", file=sys.stderr, flush=True)
                        break
                    if listener.fileno() not in ready:
                        if not ready and self.idled():
                            print(f"quinebox serve: idle for {self.idle:g} s: exiting", file=sys.stderr, flush=True)
                            break
                        continue
                    conn, _ = listener.accept()
                except (OSError, ValueError):  # ValueError: select on the listener a stop() closed just now
                    if self.listener is None:
                        break
                    continue
                conn.settimeout(None)
                with conn:
                    try:
                        self._answer(conn)
                    except OSError:
                        pass  # a client that went away, or never said what it wanted: the next one
                if self.pool_due and self.listener is not None:
                    self.keep_pool()  # forked with no client's connection or descriptors open here, and no spare
                if self.warm_later is not None and self.listener is not None:
                    self.warm_again()  # before the next spare is forked, which inherits it
                if self.spare is None and not self.free and self.listener is not None:
                    # The next command's worker, forked once this one's connection and descriptors are closed here (a
                    # spare holding a client's stdout would keep its reader from ever seeing the end)
                    self.spare = Worker(self.listener, others=self._every_worker())
        finally:
            self.stop()
            gone.close()
            _wait_for(self.children)

    def warm_again(self) -> None:
        """Try the start's warm-up that could not be done then once more: a worker has likely unpacked the image
        since. Given up after WARM_TRIES (a server of the Docker backend never unpacks one): workers do their own."""
        assert self.warm_later is not None
        self.warm_tries += 1
        if self.warm_later() or self.warm_tries >= WARM_TRIES:
            self.warm_later = None

    def stop(self) -> None:
        """Answer no more; the pool's warm boxes go at once, running commands go on (serve_forever waits for them)."""
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.close()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        for worker in self._every_worker():
            worker.dismiss()  # a free one exits; one running a command finishes it, then exits
        self.spare, self.workers, self.free = None, {}, []
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            try:
                os.kill(keeper, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def idled(self) -> bool:
        """Whether no command has run for `idle` seconds (the pool's keeper is not a command)."""
        if _reap(self.children):
            self.last = time.monotonic()
        if self.children - {self.keeper} - {worker.pid for worker in self.free}:
            self.last = time.monotonic()
            return False
        return self.idle is not None and time.monotonic() - self.last >= self.idle

    def stale(self) -> bool:
        """Whether a fresh `quinebox` would load other code or config than this server did (looked at again only
        once something happened where it would show: freshness.Changes)."""
        from quinebox.cli.freshness import fingerprint

        if self.changes is not None and not self.changes.happened():
            return False
        return fingerprint(paths=self.paths) != self.fingerprint

    def _answer(self, conn: socket.socket) -> None:
        unfree = fdpass.unfree(conn)  # SO_PEERCRED, and the peer's /proc held by its pidfd: ~0.1 ms
        if unfree is not None and fdpass.peer_uid(conn) != os.getuid():
            return  # only the owner; the run dir is private anyway
        _reap(self.children)
        message, fds = fdpass.receive(conn, REQUEST_TIMEOUT)
        kind = message.get("kind")
        if kind == "run" and unfree is not None:
            # A process of this user less free than the server (a sandboxed agent's): run for it here, the command would
            # have the server's freedom. Handed back unrun, it runs in the client, under the client's own confinement.
            fdpass.send(conn, {"kind": "confined", "why": unfree})
        elif unfree is not None:
            pass  # neither a status nor a stop for it
        elif kind == "run" and len(fds) in (3, 4) and self.stale():
            print("quinebox serve: the code or config.yaml changed since this server started: exiting", file=sys.stderr, flush=True)
            self.stop()  # the socket goes first, so that the client's new server can take it
            fdpass.send(conn, {"kind": "stale"})
        elif kind == "run" and len(fds) in (3, 4):
            self.last = time.monotonic()  # a command, not a status or a stop, is what keeps the server from idling out
            self.served += 1
            worker = self._worker_for(conn, message, fds)
            self.children.add(worker.pid)
            self.workers[worker.fileno()] = worker
            if self.keeper is None and self.demand is not None and self.demand.command():
                self.pool_due = True
        elif kind == "status":
            try:
                pool = fdpass.ask(str(pool_socket()), {"kind": "stats"}, POOL_STATS_TIMEOUT)
            except StateError:  # another user's process answers at the pool's socket: it was sent nothing, and has no say here
                pool = None
            if pool == {} and self.keeper is not None:  # its keeper, still making its first boxes (an image unpacked first)
                pool = {"pid": self.keeper, "busy": True}
            free = [worker.pid for worker in self.free]
            fdpass.send(conn, {"kind": "status", "pid": os.getpid(), "since": self.started, "served": self.served, "idle_exit": self.idle, "pool": pool or None,
                             "workers": {"free": free, "running": len(self.children - {self.keeper, *free})},
                             "pool_after": None if self.keeper is not None or not self.pool.size else self.pool.after})
        elif kind == "stop":
            fdpass.send(conn, {"kind": "stopping"})
            self.stop()
        for fd in fds:
            os.close(fd)


    def _worker_for(self, conn: socket.socket, message: dict[str, Any], fds: list[int]) -> Worker:
        """The worker that runs this command, handed it: a free one (the one freed last), else the spare, else one
        forked for it."""
        while self.free:
            worker = self.free.pop()
            if worker.take(conn, message, fds):
                return worker
            self._forget(worker)
        spare, self.spare = self.spare, None
        if spare is not None and spare.take(conn, message, fds):
            return spare
        if spare is not None:
            spare.dismiss()
        return Worker(self.listener, (conn, message, fds), others=self._every_worker())  # none was ready: one forked for this command

    def _heard(self, worker: Worker) -> None:
        """A worker said it is free (kept, up to KEEP_FREE), or went."""
        if worker.heard() and self.listener is not None and len(self.free) < KEEP_FREE:
            self.free.append(worker)
        else:
            self._forget(worker)

    def _forget(self, worker: Worker) -> None:
        self.workers.pop(worker.fileno(), None)
        if worker in self.free:
            self.free.remove(worker)
        worker.dismiss()

    def _every_worker(self) -> list[Worker]:
        return [*self.workers.values(), *([self.spare] if self.spare is not None else [])]


def _reap(children: set[int]) -> bool:
    """Collect the workers that ended (the server waits on them only when it stops); whether one of them had."""
    ended = set(reap_children()[0]) & children
    children -= ended
    return bool(ended)


def _wait_for(children: set[int]) -> None:
    """Until each of `children` has exited (one `_reap` collected already counts as exited)."""
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
