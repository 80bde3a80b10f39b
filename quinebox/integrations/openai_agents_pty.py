"""The OpenAI Agents SDK's PTY sessions on a quinebox box: commands the model goes on with.

The SDK's `exec_command` tool starts a command through `pty_exec_start` and gives the model what it printed within
its yield; a command still running then keeps a session id, and `write_stdin` polls it or writes to it. Here each is a
`Sandbox.Popen` of the session's box, its stdout and stderr one stream (as a terminal shows them) read by a thread of
its own; `QuineboxSandboxSession` (openai_agents.py) takes these methods.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.sandbox.errors import ExecTransportError
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.types import User
from agents.sandbox.util.blocking_io import run_blocking_workspace_io

from quinebox import DEVNULL, PIPE, QuineboxError, Sandbox

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass
class Running:
    """A command the model goes on with (`exec_command` that outlasts its yield, then `write_stdin`): its output
    as it comes (stdout and stderr as one stream, as a terminal shows them), and its exit status once it ends."""

    proc: Any
    stdin: Any
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    code: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    reader: threading.Thread | None = None


class PtySessions:
    """The SDK's PTY methods of a session (which sets these attributes and defines these methods)."""

    _running: dict[int, Running]

    if TYPE_CHECKING:

        def _live_box(self) -> Sandbox: ...

        async def _exec_context(self) -> tuple[dict[str, str], str | None]: ...

        def _prepare_exec_command(self, *command: str | Path, shell: bool | list[str], user: str | User | None) -> list[str]: ...

        def _resolve_pty_session_entry(self, *, pty_processes: Mapping[int, Running], session_id: int) -> Running: ...

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(self, *command: str | Path, timeout: float | None = None, shell: bool | list[str] = True,
                             user: str | User | None = None, tty: bool = False, yield_time_s: float | None = None,
                             max_output_tokens: int | None = None) -> PtyExecUpdate:
        """Start a command and give what it printed within `yield_time_s`; one still running keeps a session id.
        `tty`: its stdin stays open for `write_stdin` (through a pipe: the box's exec has no terminal to give here,
        so Ctrl-C, which a terminal would deliver as SIGINT, ends the command's whole tree). The box bounds the
        start itself: `timeout` is not needed."""
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        box = self._live_box()
        env, cwd = await self._exec_context()
        read_end, write_end = os.pipe()
        try:
            # Not given up while it starts (even if this task is cancelled): the pipe's ends are closed only after.
            proc = await run_blocking_workspace_io(functools.partial(
                box.Popen, argv, stdin=PIPE if tty else DEVNULL, stdout=write_end, stderr=write_end, cwd=cwd,
                env=env, user=user.name if isinstance(user, User) else user,
            ))
        except (QuineboxError, OSError) as exc:
            os.close(read_end)
            raise ExecTransportError(command=argv, message=str(exc), cause=exc) from exc
        finally:
            os.close(write_end)
        entry = Running(proc, proc.stdin)
        entry.reader = threading.Thread(target=_pump, args=(entry, read_end, asyncio.get_running_loop()), daemon=True)
        entry.reader.start()
        process_id = allocate_pty_process_id(set(self._running))
        self._running[process_id] = entry
        if len(self._running) > PTY_PROCESSES_MAX:
            oldest = process_id_to_prune_from_meta([(pid, e.last_used, e.ended.is_set()) for pid, e in self._running.items()])
            if oldest is not None:
                await _end(self._running.pop(oldest))
        waited = clamp_pty_yield_time_ms(10_000 if yield_time_s is None else int(yield_time_s * 1000))
        return await self._update(process_id, entry, waited, max_output_tokens)

    async def pty_write_stdin(self, *, session_id: int, chars: str, yield_time_s: float | None = None,
                              max_output_tokens: int | None = None) -> PtyExecUpdate:
        entry = self._resolve_pty_session_entry(pty_processes=self._running, session_id=session_id)
        if chars:
            if entry.stdin is None:
                raise RuntimeError("stdin is not available for this process: start it with tty=true")
            if "\x03" in chars:
                await asyncio.to_thread(entry.proc.kill)
            else:
                try:
                    await asyncio.to_thread(_send, entry.stdin, chars.encode())
                except (BrokenPipeError, ValueError):
                    pass  # it stopped reading (or ended): what it printed says how
        entry.last_used = time.monotonic()
        waited = resolve_pty_write_yield_time_ms(yield_time_ms=250 if yield_time_s is None else int(yield_time_s * 1000), input_empty=chars == "")
        return await self._update(session_id, entry, waited, max_output_tokens)

    async def _update(self, process_id: int, entry: Running, waited_ms: int, max_output_tokens: int | None) -> PtyExecUpdate:
        output, tokens, ended = await collect_pty_output(
            output_chunks=entry.chunks, output_lock=entry.lock, output_notify=entry.notify, is_done=entry.ended.is_set,
            yield_time_ms=waited_ms, max_output_tokens=max_output_tokens,
        )
        if not ended:
            return PtyExecUpdate(process_id=process_id, output=output, exit_code=None, original_token_count=tokens)
        self._running.pop(process_id, None)
        await _end(entry)
        return PtyExecUpdate(process_id=None, output=output, exit_code=entry.code, original_token_count=tokens)

    async def pty_terminate_all(self) -> None:
        running, self._running = list(self._running.values()), {}
        for entry in running:
            await _end(entry)



def _pump(entry: Running, fd: int, loop: asyncio.AbstractEventLoop) -> None:
    """The command's output into its entry as it comes, then its exit status (in a thread of its own)."""
    def came(chunk: bytes) -> None:
        entry.chunks.append(chunk)
        entry.notify.set()

    def ended(code: int) -> None:
        entry.code = code
        entry.ended.set()
        entry.notify.set()

    try:
        with os.fdopen(fd, "rb", buffering=0) as output:
            while chunk := output.read(65536):
                loop.call_soon_threadsafe(came, chunk)
        code = entry.proc.wait()
    except BaseException:  # noqa: BLE001 the loop ends or the box went: the command counts as killed
        code = 137
    try:
        loop.call_soon_threadsafe(ended, code)
    except RuntimeError:
        pass  # the event loop closed first: no one waits for it


def _send(stdin: Any, data: bytes) -> None:
    stdin.write(data)
    stdin.flush()


async def _end(entry: Running) -> None:
    """Kill what is left of a command (its whole tree) and let go of its streams."""
    if not entry.ended.is_set():
        await asyncio.to_thread(entry.proc.kill)
    if entry.stdin is not None:
        try:
            entry.stdin.close()
        except OSError:
            pass
    if entry.reader is not None:
        await asyncio.to_thread(entry.reader.join, 10)

