"""Reading documents: the YAML that people write (policies, model scripts, batch files, the config file), and the
JSON lines that quinebox appends (tapes, the audit log) as readers that only show them take them.

One place turns a missing or malformed file into one clear line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from quinebox.errors import ErrorKind, QuineboxError


def read_yaml(path: str | Path, what: str, error: type[QuineboxError] = QuineboxError) -> Any:
    """The parsed document at `path`; `what` names it in errors ("policy", "model script", …)."""
    import yaml  # kept off the start-up of commands that read no YAML

    try:  # libyaml's parser where PyYAML was built with it (Debian's and PyPI's wheels are): ~10x the pure one's speed
        return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except FileNotFoundError:
        raise error(f"{what} {path} not found", kind=ErrorKind.NOT_FOUND, path=str(path)) from None
    except (OSError, yaml.YAMLError) as exc:
        kind = ErrorKind.BAD_INPUT if isinstance(exc, yaml.YAMLError) else ErrorKind.FAILED
        raise error(f"cannot read {what} {path}: {str(exc).splitlines()[0]}", kind=kind, path=str(path)) from None


def load_config() -> dict[str, Any]:
    """~/.config/quinebox/config.yaml (model, base_url, max_retries, pool, backend, runtime); the environment wins over it."""
    path = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "quinebox", "config.yaml")
    if not os.path.exists(path):
        return {}
    doc = read_yaml(path, "config file") or {}
    if not isinstance(doc, dict):
        raise QuineboxError(f"{path} must be a YAML mapping (model:, base_url:, max_retries:, backend:, runtime:)", kind=ErrorKind.BAD_INPUT, path=path)
    return doc


def json_objects(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Each line that is a JSON object; any other line (torn, junk, an array) is passed over."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record
