"""quinebox: run LLM agents and untrusted programs as processes in hardened containers.

The Python API mirrors `subprocess`: `quinebox.exec` runs a command in a box
and returns a completed result, `quinebox.Popen` streams, `quinebox.run`
runs an agent on a mission, `quinebox.resume_session` goes on with one whose
process was lost, and `quinebox.Runner` runs many from one set of defaults.
Every one of them takes a box's options as one `quinebox.BoxOptions`, or by name.
`quinebox.Sandbox` is a box that lasts, with execs, files, snapshots and forks.

The top level is the front door and the foundation. Front doors: api.py (exec,
Popen, run, Runner), sandbox.py (Sandbox) and client.py (the thin `quinebox`
command that hands argv, cwd and its fds to a warm server). The foundation every
room stands on: errors.py (errors as data: a kind, fields, the cause), state.py
(the state dir, kept the user's alone), fdpass.py (the one framing between
quinebox's processes, descriptors riding along), grants.py and netrules.py (the
grant grammar and the network's rules), untar.py (a box's tar unpacked on the
host, as untrusted), documents.py (the YAML and JSON lines people and quinebox
write), processes.py (who owns a process, and whether it lives) and
resources.py (the files that ship beside the code).

The rooms, from the bottom up: guest/ (stdlib only, inside boxes), audit/,
worlds/, box/ (one hardened box and its backends), agent/, tree/ (agents
spawning agents), cluster/, then the front ends: cli/, integrations/ (other
frameworks' sandbox providers, Inspect, MCP, pytest) and view/ (the web view).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "__version__", "exec", "run", "resume_session", "Runner", "BoxOptions", "Sandbox", "Snapshot", "Popen", "ExecResult", "RunResult",
    "QuineboxError", "ErrorKind", "GrantError", "FileTooLargeError", "EngineError", "FileInfo", "PIPE", "DEVNULL", "build_image",
]


def __getattr__(name: str):
    # Imported lazily so `import quinebox` (and the CLI's start-up) stays cheap.
    if name in ("exec", "run", "resume_session", "Runner", "Popen", "ExecResult", "RunResult", "PIPE", "DEVNULL"):
        from quinebox import api

        return getattr(api, name)
    if name in ("Box", "resume"):  # deprecated names, for one release: a DeprecationWarning that gives the new one
        import warnings

        from quinebox import api

        new, why = api.DEPRECATED[name]
        warnings.warn(why, DeprecationWarning, stacklevel=2)
        return getattr(api, new)
    if name == "BoxOptions":
        from quinebox.box.options import BoxOptions

        return BoxOptions
    if name == "Sandbox":
        from quinebox.sandbox import Sandbox

        return Sandbox
    if name == "Snapshot":
        from quinebox.box.live.snapshots import Snapshot

        return Snapshot
    if name == "build_image":
        from quinebox.box.images.dockerfiles import build

        return build
    if name == "FileInfo":
        from quinebox.box.live.box_files import FileInfo

        return FileInfo
    if name in ("QuineboxError", "ErrorKind", "GrantError", "FileTooLargeError", "EngineError"):
        from quinebox import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'quinebox' has no attribute {name!r}")
