"""quinebox: run LLM agents and untrusted programs as processes in hardened containers.

The Python API mirrors `subprocess`: `quinebox.exec` runs a command in a box
and returns a completed result, `quinebox.Popen` streams, `quinebox.run`
runs an agent on a mission, and `quinebox.resume` goes on with one whose
process was lost.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "exec", "run", "resume", "Box", "BoxOptions", "Sandbox", "Snapshot", "Popen", "ExecResult", "RunResult", "QuineboxError", "GrantError", "FileTooLargeError", "EngineError", "FileInfo", "PIPE", "DEVNULL", "build_image"]


def __getattr__(name: str):
    # Imported lazily so `import quinebox` (and the CLI's start-up) stays cheap.
    if name in ("exec", "run", "resume", "Box", "Popen", "ExecResult", "RunResult", "PIPE", "DEVNULL"):
        from quinebox import api

        return getattr(api, name)
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
    if name in ("QuineboxError", "GrantError", "FileTooLargeError", "EngineError"):
        from quinebox import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'quinebox' has no attribute {name!r}")
