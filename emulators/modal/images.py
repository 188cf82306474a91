"""Modal's image builder and mounts, as the Modal emulator plays them.

Every layer of an image (``from_registry``, then each ``env``, ``workdir``,
``add_local_*(copy=True)``, ``run_commands``...) is an image of its own
(``ImageGetOrCreate`` with the layer below as its base), identified by its
whole definition. A layer is not run: the sandbox's system is the host's
(`emulators.filesystem.GuestSandbox`), so ``RUN`` commands (package
installs) are skipped; what a layer says about the sandbox is kept:
``ENV`` variables, the ``WORKDIR``, and the files a ``COPY`` takes from its
context mount (placed as Docker places them). A registry tag not in
``allowed`` fails its build, as a missing registry image does.

Local files reach Modal as mounts: the SDK asks which contents Modal lacks
(``MountBatchedCheckExistence``), uploads them (``MountPutFile``) and
names the files (``MountGetOrCreate``). A sandbox gets the files of its
image's copied mounts and of the create's ``mount_ids``
(``add_local_*`` without ``copy``). Contents of 4 MiB or more go through
blob storage (`emulators.modal.volumes.BlobStore`). A volume's V1 uploads
put their contents here too.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import posixpath
import re
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpclib import GRPCError, Status
from modal_proto import api_pb2

__all__ = ["Copy", "ImageRecord", "Images", "Mounts"]

_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_PAIR = re.compile(r"""([^\s=]+)=("(?:[^"\\]|\\.)*"|'[^']*'|\S*)""")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class Copy:
    """A ``COPY`` of files of a mount: its sources (``.``: all) to a destination."""

    mount_id: str
    sources: tuple[str, ...]
    destination: str

    def place(self, files: Iterable[tuple[str, bytes, int]]) -> list[tuple[str, bytes, int]]:
        """Where Docker puts ``files`` (path in the mount, contents, mode): a directory's
        contents into the destination, a file to it, or into it when it ends with ``/`` or
        there are several sources."""
        into = self.destination.endswith("/") or len(self.sources) > 1
        placed: list[tuple[str, bytes, int]] = []
        sources = [posixpath.normpath(source.lstrip("/")) for source in self.sources]
        for path, data, mode in files:
            name = posixpath.normpath(path.lstrip("/"))
            for source in sources:
                if source == ".":
                    placed.append((posixpath.join(self.destination, name), data, mode))
                elif name.startswith(source + "/"):
                    rest = name[len(source) + 1 :]
                    placed.append((posixpath.join(self.destination, rest), data, mode))
                elif name == source or fnmatch.fnmatchcase(name, source):
                    to = self.destination
                    if into or name != source:
                        to = posixpath.join(to, posixpath.basename(name))
                    placed.append((to, data, mode))
        return placed


@dataclass
class ImageRecord:
    """What one image (a layer and those below it) gives a sandbox."""

    tag: str  # the registry tag of the bottom layer ("" when unknown)
    ready_at: float  # time.monotonic() when its build is over
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    copies: list[Copy] = field(default_factory=list)


class Images:
    """The emulated image builder: each layer built once, maybe slowly.

    Args:
        allowed: registry tags a build may pull; None pulls any (an unknown
            tag fails its build, as a missing registry image does).
        build_seconds: how long a first build of a layer takes; until then
            ``ImageGetOrCreate`` answers without a result and the SDK waits
            on ``ImageJoinStreaming``.
    """

    def __init__(self, allowed: set[str] | None = None, build_seconds: float = 0.0) -> None:
        self.allowed = allowed
        self.build_seconds = build_seconds
        self._records: dict[str, ImageRecord] = {}

    def get_or_create(self, image: api_pb2.Image) -> tuple[str, dict[str, Any]]:
        """The image id of ``image`` (its whole definition) and, when its build is over,
        its result."""
        digest = hashlib.sha256(image.SerializeToString(deterministic=True)).hexdigest()
        image_id = "im-" + digest[:22]
        if image_id not in self._records:
            self._records[image_id] = self._layer(image)
        return image_id, self._result(image_id)

    def _layer(self, image: api_pb2.Image) -> ImageRecord:
        base = next((self._records.get(b.image_id) for b in image.base_images), None)
        record = ImageRecord(tag="", ready_at=time.monotonic() + self.build_seconds)
        if base is not None:
            record.tag, record.workdir = base.tag, base.workdir
            record.env, record.copies = dict(base.env), list(base.copies)
        for command in image.dockerfile_commands:
            word, _, rest = command.strip().partition(" ")
            word, rest = word.upper(), rest.strip()
            if word == "FROM" and not image.base_images:
                record.tag = rest.split()[0] if rest else ""
            elif word == "ENV":
                record.env.update(_env(rest, record.env))
            elif word == "WORKDIR" and rest:
                record.workdir = posixpath.join(record.workdir or "/", _unquote(rest))
            elif word == "COPY" and image.context_mount_id:
                words = _words(rest)
                if len(words) >= 2:
                    to = words[-1]
                    destination = posixpath.normpath(posixpath.join(record.workdir or "/", to))
                    if to.endswith("/") or posixpath.basename(to) in (".", ".."):
                        destination = destination.rstrip("/") + "/"
                    copy = Copy(image.context_mount_id, tuple(words[:-1]), destination)
                    record.copies.append(copy)
        return record

    def record(self, image_id: str) -> ImageRecord | None:
        """What a built image gives a sandbox; None for an image not built (or failed)."""
        return self._records.get(image_id) if self.built(image_id) else None

    def forget(self, image_id: str) -> bool:
        """Delete the image ``image_id`` (a later build of its definition makes it again)."""
        return self._records.pop(image_id, None) is not None

    def built(self, image_id: str) -> bool:
        result = self._result(image_id).get("result")
        return result is not None and result.status == api_pb2.GenericResult.GENERIC_STATUS_SUCCESS

    async def join(self, image_id: str, timeout: float) -> dict[str, Any]:
        """Wait (up to ``timeout``) for the build of ``image_id``; its result when over."""
        record = self._records.get(image_id)
        if record is None:
            raise GRPCError(Status.NOT_FOUND, f"Image '{image_id}' not found")
        wait = record.ready_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(min(wait, timeout))
        return self._result(image_id)

    def _result(self, image_id: str) -> dict[str, Any]:
        record = self._records.get(image_id)
        if record is None or time.monotonic() < record.ready_at:
            return {}
        if self.allowed is not None and record.tag and record.tag not in self.allowed:
            failure = api_pb2.GenericResult(
                status=api_pb2.GenericResult.GENERIC_STATUS_FAILURE,
                exception=f"Failed to pull image {record.tag!r}: manifest unknown",
            )
            return {"result": failure}
        success = api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS)
        return {"result": success, "metadata": api_pb2.ImageMetadata(workdir=record.workdir or "/")}


def _env(rest: str, current: Mapping[str, str]) -> dict[str, str]:
    """The variables of an ``ENV`` instruction, ``$VAR`` expanded. Also in single quotes,
    unlike Docker: ``Image.env`` single-quotes every value with a ``$`` and Modal's own
    examples rely on ``.env({"PATH": "/root/.local/bin:$PATH"})`` extending the PATH."""
    known = {"PATH": _DEFAULT_PATH, **current}
    if "=" not in rest.split(None, 1)[0]:
        key, _, value = rest.partition(" ")
        return {key: _expand(value.strip(), known)}
    found: dict[str, str] = {}
    for key, raw in _ENV_PAIR.findall(rest):
        if raw.startswith("'"):
            found[key] = _expand(raw[1:-1], {**known, **found})
        elif raw.startswith('"'):
            found[key] = _expand(re.sub(r"\\(.)", r"\1", raw[1:-1]), {**known, **found})
        else:
            found[key] = _expand(raw, {**known, **found})
    return found


def _expand(value: str, env: Mapping[str, str]) -> str:
    return _VARIABLE.sub(lambda m: env.get(m[1] or m[2], ""), value)


def _words(rest: str) -> list[str]:
    """A ``COPY``'s sources and destination (shell or JSON form), its ``--flags`` dropped."""
    try:
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    except ValueError:
        return []
    return [str(w) for w in words if not str(w).startswith("--")]


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        return word[1:-1]
    return word


class Mounts:
    """Uploaded file contents (by SHA-256) and the mounts that name them."""

    def __init__(self) -> None:
        self._contents: dict[str, bytes] = {}
        self._mounts: dict[str, list[api_pb2.MountFile]] = {}

    def missing(self, hashes: Iterable[str]) -> list[str]:
        return [h for h in hashes if h not in self._contents]

    def put(self, sha256_hex: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != sha256_hex:
            raise GRPCError(Status.INVALID_ARGUMENT, "the data does not match its sha256_hex")
        self._contents[sha256_hex] = data

    def content(self, sha256_hex: str) -> bytes:
        try:
            return self._contents[sha256_hex]
        except KeyError:
            raise GRPCError(
                Status.FAILED_PRECONDITION, f"file contents {sha256_hex} were not uploaded"
            ) from None

    def create(self, files: Iterable[api_pb2.MountFile]) -> str:
        """A mount of ``files`` (their contents uploaded before); its id."""
        listed = sorted(files, key=lambda f: f.filename)
        absent = self.missing(f.sha256_hex for f in listed)
        if absent:
            raise GRPCError(Status.FAILED_PRECONDITION, f"mount file contents missing: {absent}")
        key = "\n".join(f"{f.filename}\0{f.sha256_hex}\0{f.mode}" for f in listed)
        mount_id = "mo-" + hashlib.sha256(key.encode()).hexdigest()[:22]
        self._mounts[mount_id] = listed
        return mount_id

    def files(self, mount_id: str) -> list[tuple[str, bytes, int]]:
        """The mount's files: (path in the mount, contents, mode)."""
        try:
            listed = self._mounts[mount_id]
        except KeyError:
            raise GRPCError(Status.NOT_FOUND, f"Mount '{mount_id}' not found") from None
        return [(f.filename, self._contents[f.sha256_hex], f.mode) for f in listed]
