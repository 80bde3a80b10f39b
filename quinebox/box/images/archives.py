"""Images from files, for a machine with no engine: `docker save` tarballs and OCI image layouts.

Both end as rootfs.py's unpacked images. A tarball's manifest.json (or a
layout's index.json, then its manifest) names the image's config and its
layers in order; the layers are applied by box/images/layers.py, each checked
against the config's diff ids. The image id is the config's digest, as
Docker computes it, so an image loaded from a file and the same image in the
engine share one unpacked tree, and a file cannot pass for another image.
Only images for this machine's architecture are taken (a multi-platform
layout gives its native one); their names are remembered for `rootfs.lookup`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from quinebox.box.images.layers import Tree
from quinebox.box.images.rootfs import HEX, familiar, remember, unpack, unpacked
from quinebox.box.policy import native_machine
from quinebox.box.spec import ImageInfo
from quinebox.errors import ImageError

_OCI_NAME = "org.opencontainers.image.ref.name"
_CONTAINERD_NAME = "io.containerd.image.name"


def from_docker_archive(path: str | os.PathLike[str], ref: str | None = None) -> ImageInfo:
    """Unpack the image of a `docker save` tarball (gzipped or not); `ref` picks one when it holds several."""
    try:
        tar = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise ImageError(f"cannot read {path} as a `docker save` tarball: {getattr(exc, 'strerror', None) or exc}") from None
    with tar:
        files = _TarFiles(tar, str(path))
        manifest = files.json("manifest.json")
        if not isinstance(manifest, list) or not manifest or not all(isinstance(e, dict) for e in manifest):
            raise ImageError(f"{path} is not a `docker save` tarball: its manifest.json lists no image")
        tags = sorted(str(t) for e in manifest for t in e.get("RepoTags") or [])
        entries = [e for e in manifest if ref is None or familiar(ref) in map(familiar, e.get("RepoTags") or [])]
        if not entries:
            raise ImageError(f"{path} holds no image named {ref}: name one of {', '.join(tags) or '(it names none)'}")
        if len(entries) > 1:
            raise ImageError(f"{path} holds {len(entries)} images: name one of {', '.join(tags)}")
        entry = entries[0]
        if not isinstance(entry.get("Config"), str) or not isinstance(entry.get("Layers"), list):
            raise ImageError(f"{path} is not a `docker save` tarball: its manifest.json names no config or layers")
        config_bytes = files.read(entry["Config"])
        names = [str(t) for t in entry.get("RepoTags") or []]
        return _unpack_archive(files, config_bytes, list(entry["Layers"]), ref or (names[0] if names else None), names, "docker-archive")


def from_oci_layout(path: str | os.PathLike[str], ref: str | None = None) -> ImageInfo:
    """Unpack the image of an OCI image layout (a directory, or a tar of one); `ref` (a ref.name annotation) picks one."""
    where = Path(path)
    if where.is_dir():
        files: _Files = _DirFiles(where)
        return _unpack_oci(files, ref, str(path))
    try:
        with tarfile.open(where, "r:*") as tar:
            return _unpack_oci(_TarFiles(tar, str(path)), ref, str(path))
    except (OSError, tarfile.TarError) as exc:
        raise ImageError(f"cannot read {path} as an OCI image layout: {getattr(exc, 'strerror', None) or exc}") from None


def _unpack_oci(files: _Files, ref: str | None, where: str) -> ImageInfo:
    try:
        layout = files.json("oci-layout")
    except ImageError:
        layout = None
    if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
        raise ImageError(f"{where} is not an OCI image layout (no oci-layout file)")
    descriptor = _pick(files, _mapping(files.json("index.json"), where), ref, where)
    manifest = _mapping(files.json(_blob(descriptor, where)), where)
    config_descriptor = _mapping(manifest.get("config"), where)
    config_bytes = files.read(_blob(config_descriptor, where))
    if "sha256:" + hashlib.sha256(config_bytes).hexdigest() != config_descriptor.get("digest"):
        raise ImageError(f"{where}: the image's config does not match its digest: the layout is damaged")
    annotations = descriptor.get("annotations") or {}
    name = annotations.get(_CONTAINERD_NAME) or annotations.get(_OCI_NAME) or ref
    names = [name] if name and (":" in name or "/" in name) else []
    layers = [_blob(_mapping(layer, where), where) for layer in manifest.get("layers") or []]
    return _unpack_archive(files, config_bytes, layers, name, names, "oci-layout")


def _mapping(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ImageError(f"{where}: a manifest or descriptor of the image is not a JSON object: the archive is damaged")
    return doc


def _names(descriptor: dict[str, Any]) -> set[str]:
    annotations = _mapping(descriptor.get("annotations") or {}, "")
    return {str(annotations[k]) for k in (_OCI_NAME, _CONTAINERD_NAME) if k in annotations}


def _pick(files: _Files, index: dict[str, Any], ref: str | None, where: str) -> dict[str, Any]:
    """The manifest descriptor meant: `ref`'s, else the only one; a multi-platform index gives this machine's."""
    every = [_mapping(m, where) for m in index.get("manifests") or []]
    manifests = [m for m in every if ref is None or ref in _names(m) or familiar(ref) in map(familiar, _names(m))]
    if len(manifests) != 1:
        found = sorted(name for m in every for name in _names(m))
        what = f"no image named {ref}" if ref is not None else f"{len(manifests)} images"
        raise ImageError(f"{where} holds {what}: name one of {', '.join(found)}" if found else f"{where} holds {what}")
    chosen = manifests[0]
    if chosen.get("mediaType", "").endswith(("image.index.v1+json", "manifest.list.v2+json")):
        platforms = [_mapping(m, where) for m in _mapping(files.json(_blob(chosen, where)), where).get("manifests") or []]
        native = [m for m in platforms if (m.get("platform") or {}).get("architecture") == native_machine() and (m.get("platform") or {}).get("os", "linux") == "linux"]
        if not native:
            raise ImageError(f"{where} has no image for linux/{native_machine()}: quinebox runs native images only")
        return {**native[0], "annotations": chosen.get("annotations") or native[0].get("annotations")}
    return chosen


def _blob(descriptor: dict[str, Any], where: str) -> str:
    algorithm, _, digest = str(descriptor.get("digest", "")).partition(":")
    if algorithm != "sha256" or not HEX.fullmatch(digest):
        raise ImageError(f"{where}: bad digest {descriptor.get('digest')!r} in the layout (sha256 only)")
    return f"blobs/sha256/{digest}"


def _unpack_archive(files: _Files, config_bytes: bytes, layers: list[str], name: str | None, names: list[str], source: str) -> ImageInfo:
    """Check the config, apply its layers (each against its diff id) unless unpacked already, and remember its names."""
    image_id = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    try:
        config = json.loads(config_bytes)
        diff_ids = list(config["rootfs"]["diff_ids"])
    except (ValueError, KeyError, TypeError):
        raise ImageError(f"{files.where}: the image's config is not an image config (no rootfs.diff_ids)") from None
    if len(diff_ids) != len(layers):
        raise ImageError(f"{files.where}: the image lists {len(layers)} layers and its config {len(diff_ids)}: the archive is damaged")
    try:
        info = ImageInfo.from_inspect(name or image_id, {"Id": image_id, "Config": config.get("config"), "Architecture": config.get("architecture")})
    except (AttributeError, TypeError, ValueError):
        raise ImageError(f"{files.where}: the image's config is not an image config (its config section is malformed)") from None
    if info.arch != native_machine():
        raise ImageError(f"image {info.name} is for {info.arch}, and this machine runs {native_machine()}: quinebox runs native images only")
    if unpacked(image_id) is None:

        def fill(root: Path) -> None:
            tree = Tree(str(root), f"image {info.name}")
            for number, (layer, diff_id) in enumerate(zip(layers, diff_ids, strict=True), 1):
                with files.open(layer) as stream:
                    tree.layer(stream, diff_id=diff_id, number=number)
            tree.close()

        unpack(info, source, fill)
    for each in names:
        remember(replace(info, name=each), source)
    return info


class _Files:
    """The files of an archive (a tarball or a directory), by their path inside it."""

    where: str

    def open(self, name: str) -> IO[bytes]:
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        with self.open(name) as file:
            return file.read()

    def json(self, name: str) -> Any:
        try:
            return json.loads(self.read(name))
        except ValueError:
            raise ImageError(f"{self.where}: {name} is not JSON: the archive is damaged") from None


class _TarFiles(_Files):
    def __init__(self, tar: tarfile.TarFile, where: str):
        self.tar, self.where = tar, where

    def open(self, name: str) -> IO[bytes]:
        try:
            member = self.tar.getmember(name.lstrip("/").removeprefix("./"))
            file = self.tar.extractfile(member)
        except (KeyError, tarfile.TarError):
            file = None
        if file is None:
            raise ImageError(f"{self.where} has no file {name}: it is not a whole image archive")
        return file


class _DirFiles(_Files):
    def __init__(self, root: Path):
        self.root, self.where = root, str(root)

    def open(self, name: str) -> IO[bytes]:
        if ".." in name.split("/"):
            raise ImageError(f"{self.where}: {name} is outside the layout")
        try:
            return open(self.root / name, "rb")
        except OSError as exc:
            raise ImageError(f"{self.where}: cannot read {name} ({exc.strerror}): it is not a whole OCI image layout") from None
