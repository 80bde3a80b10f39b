"""Reading the YAML that people write: policies, model scripts, batch files, the config file.

One place turns a missing or malformed file into one clear line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quinebox.errors import QuineboxError


def read_yaml(path: str | Path, what: str, error: type[QuineboxError] = QuineboxError) -> Any:
    """The parsed document at `path`; `what` names it in errors ("policy", "model script", …)."""
    import yaml  # kept off the start-up of commands that read no YAML

    try:
        return yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"cannot read {what} {path}: {str(exc).splitlines()[0]}") from None
