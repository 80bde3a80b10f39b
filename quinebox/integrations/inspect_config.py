"""The Inspect AI provider's configuration: what a task's `sandbox=("quinebox", FILE)` names, and the images it builds.

A YAML file or a `QuineboxSandboxConfig` (Inspect passes either): an image or a Dockerfile, grants, a policy,
limits, where boxes run, and further named environments beside the default one. Apart from the provider
(inspect_sandbox.py) because a config is checked (pydantic) and its images are built before any box exists.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from inspect_ai.util import SandboxEnvironmentConfigType
from pydantic import BaseModel, ConfigDict, Field, model_validator

from quinebox import BoxOptions, QuineboxError


class QuineboxLimits(BaseModel):
    """Resource limits of a box, each the grant of the same name (`mem:1g`, `cpus:2`, `pids:256`, `tmp:64m`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mem: str | None = None
    cpus: str | float | None = None
    pids: int | None = None
    tmp: str | None = None

    def grants(self) -> list[str]:
        return [f"{name}:{value}" for name, value in self.model_dump().items() if value is not None]


class QuineboxEnvironmentConfig(BaseModel):
    """One box of each sample: what it runs (an image, or a Dockerfile built once per task) and what it may do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str | None = None
    """Any image; neither this nor `dockerfile`: quinebox's agent image (Debian bookworm with python3)."""
    dockerfile: str | None = None
    """A Dockerfile to build (with the Docker engine) at task start; relative paths are the config file's."""
    context: str | None = None
    """The Dockerfile's build context (default: its directory)."""
    grants: tuple[str, ...] = ()
    """Grant strings, as for `quinebox exec -g`: "net:pypi.org", "rw:/data", "env:NAME=V", ..."""
    policy: str | None = None
    """A policy file (relative paths are the config file's) or preset."""
    limits: QuineboxLimits = Field(default_factory=QuineboxLimits)
    backend: str | None = None
    """Where the box runs: "auto" or a backend's name ("oci", "docker", "bwrap", as `quinebox exec --backend` takes;
    a bad one is refused in one line before the box starts) (default: QUINEBOX_BACKEND, else quinebox's choice)."""
    runtime: str | None = None
    """The OCI runtime: "runc", "runsc", a path (default: QUINEBOX_RUNTIME, else runc)."""
    workdir: str | None = None
    """The default cwd of every exec, and what relative paths are relative to (default: /world)."""
    pull: Literal["missing", "always", "never"] = "missing"
    ttl: str | float | None = None
    """The longest a box may live ("2h"): a sample still running then finds its sandbox gone."""

    @model_validator(mode="after")
    def _one_image(self) -> QuineboxEnvironmentConfig:
        if self.image and self.dockerfile:
            raise ValueError("give `image` or `dockerfile`, not both")
        if self.context and not self.dockerfile:
            raise ValueError("`context` is the build context of a `dockerfile`: give one")
        return self

    def resolved(self, base: Path) -> Self:
        """This config with its relative host paths made absolute from `base` (a config file's directory)."""

        def absolute(path: str | None) -> str | None:
            return str((base / path).resolve()) if path else None

        policy = self.policy
        if policy and (base / policy).is_file():
            policy = absolute(policy)
        return self.model_copy(update={"dockerfile": absolute(self.dockerfile), "context": absolute(self.context), "policy": policy})

    def built_tag(self) -> str:
        """The image tag a `dockerfile` is built as: one per Dockerfile and context, so a task's samples share it."""
        assert self.dockerfile is not None
        key = hashlib.sha256(f"{self.dockerfile}\0{self.build_context()}".encode()).hexdigest()[:16]
        return f"quinebox-inspect:{key}"

    def build_context(self) -> str:
        assert self.dockerfile is not None
        return self.context or str(Path(self.dockerfile).parent)

    def box_options(self) -> BoxOptions:
        """A box of this environment, as every front end describes one: its limits are grants, a built image is
        never pulled."""
        return BoxOptions(
            image=self.built_tag() if self.dockerfile else self.image,
            grants=(*self.grants, *self.limits.grants()),
            policy=self.policy,
            workdir=self.workdir,
            pull="never" if self.dockerfile else self.pull,
            backend=self.backend,
            runtime=self.runtime,
        )

    def sandbox_options(self) -> dict[str, Any]:
        """`quinebox.Sandbox`'s keyword arguments for a box of this environment: its BoxOptions, and how long it lasts."""
        return {**self.box_options().given(), "ttl": self.ttl}


class QuineboxSandboxConfig(QuineboxEnvironmentConfig):
    """A sample's boxes: the top-level fields are the "default" one's; `environments` names more, each a box of its own."""

    environments: dict[str, QuineboxEnvironmentConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _named(self) -> QuineboxSandboxConfig:
        if "default" in self.environments:
            raise ValueError("the top-level fields are the 'default' environment: name the others something else")
        return self

    def __hash__(self) -> int:  # Inspect keys its task-level setup on the sandbox spec, config included
        return hash(self.model_dump_json())

    def named(self) -> dict[str, QuineboxEnvironmentConfig]:
        """Each environment by name, "default" first (Inspect's `sandbox()` is the first)."""
        default = QuineboxEnvironmentConfig(**self.model_dump(exclude={"environments"}))
        return {"default": default, **self.environments}

    def resolved(self, base: Path) -> Self:
        top = QuineboxEnvironmentConfig.resolved(self, base)
        return top.model_copy(update={"environments": {name: env.resolved(base) for name, env in self.environments.items()}})


def load_config(config: SandboxEnvironmentConfigType | None) -> QuineboxSandboxConfig:
    """The configuration Inspect hands over: None, a YAML file's path, or a model (or its dict) of ours."""
    if config is None:
        return QuineboxSandboxConfig()
    if isinstance(config, str):
        path = Path(config)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise QuineboxError(f"cannot read the quinebox sandbox config {config}: {exc.strerror}") from None
        if not isinstance(data, dict):
            raise QuineboxError(f"the quinebox sandbox config {config} is not a mapping of fields (see docs/inspect.md)")
        return QuineboxSandboxConfig.model_validate(data).resolved(path.resolve().parent)
    if isinstance(config, QuineboxSandboxConfig):
        return config.resolved(Path.cwd())
    if isinstance(config, BaseModel):
        return QuineboxSandboxConfig.model_validate(config.model_dump()).resolved(Path.cwd())
    raise QuineboxError(f"a quinebox sandbox config is a YAML file's path or a QuineboxSandboxConfig, not {type(config).__name__}")


def build_image(env: QuineboxEnvironmentConfig) -> None:
    """Build `env`'s Dockerfile with the Docker engine, tagged as its boxes ask for it (the layer cache reused)."""
    import quinebox

    try:
        quinebox.build_image(env.dockerfile or "", env.build_context(), tag=env.built_tag())
    except quinebox.EngineError as exc:
        raise quinebox.EngineError(f"{exc}; give the config an `image:` instead (a user with no engine runs any image: docs/backends.md#rootless)") from exc



