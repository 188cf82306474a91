"""A blueprint's Dockerfile, read for what it says about the devboxes made from it.

A devbox's system is the host's (`emulators.filesystem.GuestSandbox`), so a
Dockerfile is not built: its ``RUN`` steps (package installs, written for
root in a throwaway container) are skipped, as the Modal emulator skips
them. What an instruction says about the devbox is kept in an `Image`:
``ENV`` variables (``$VAR`` expanded, ``ARG`` defaults and the blueprint's
``build_args`` included) and the ``WORKDIR``; each ``COPY`` and ``ADD`` is
read into a `Copy` (its destination made absolute from the ``WORKDIR`` of
that point), which `emulators.runloop.build_context` plays from the
blueprint's build context. A Dockerfile Docker would refuse fails the build
with the reason (`DockerfileError`): a first instruction other than
``FROM`` (``ARG`` aside), an unknown instruction, one without its
arguments, a ``COPY`` without a destination or with an unknown flag. What
the emulator cannot play is refused the same way, saying so: ``COPY
--from`` (one stage is built, and no other image is pulled) and ``ADD``
from a URL or a git repository (only the build context is read).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_PATH", "Copy", "DockerfileError", "Image", "read_dockerfile"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INSTRUCTIONS = frozenset(
    {
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "MAINTAINER",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    }
)
_ENV_PAIR = re.compile(r"""([^\s=]+)=("(?:[^"\\]|\\.)*"|'[^']*'|\S*)""")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git@)", re.IGNORECASE)
_COPY_FLAGS = frozenset({"chown", "chmod", "link"})


class DockerfileError(Exception):
    """The Dockerfile cannot be built; the message says why, as a build log does."""


@dataclass(frozen=True)
class Image:
    """What a built blueprint gives its devboxes: the environment and the working directory."""

    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None


@dataclass(frozen=True)
class Copy:
    """A ``COPY`` or ``ADD`` from the build context: its sources (context paths, maybe with
    wildcards), its absolute destination (a trailing ``/`` kept: it names a directory) and
    the ``--chmod`` mode; ``step`` is its build log line, for a failure to name."""

    instruction: str
    sources: tuple[str, ...]
    destination: str
    mode: int | None
    step: str


def _copy(word: str, rest: str, known: Mapping[str, str], workdir: str | None, step: str) -> Copy:
    """A ``COPY`` / ``ADD`` line read: ``--flags``, then the shell or JSON form."""
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.strip()
    if "from" in flags:
        raise DockerfileError(
            f"{step}: {word} --from is not modelled: the emulator builds one stage "
            "and pulls no other image"
        )
    for name in flags:
        if name not in _COPY_FLAGS:
            raise DockerfileError(f"{step}: unknown flag: {name}")
    try:
        mode = int(flags["chmod"], 8) if flags.get("chmod") else None
    except ValueError:
        raise DockerfileError(f"{step}: invalid --chmod {flags['chmod']!r}") from None
    try:
        words = [str(w) for w in json.loads(rest)] if rest.startswith("[") else rest.split()
    except ValueError:
        words = rest.split()
    words = [_expand(w, known) for w in words]
    if len(words) < 2:
        raise DockerfileError(
            f"{step}: {word} requires at least two arguments, but only one was provided. "
            "Destination could not be determined."
        )
    *sources, destination = words
    remote = [s for s in sources if word == "ADD" and _REMOTE.match(s)]
    if remote:
        raise DockerfileError(
            f"{step}: {word} from {remote[0]} is not modelled: the emulator builds from "
            "the build context only"
        )
    absolute = posixpath.normpath(posixpath.join(workdir or "/", destination))
    directory = destination.endswith("/") or posixpath.basename(destination) in (".", "..")
    if directory and absolute != "/":
        absolute += "/"
    return Copy(word, tuple(sources), absolute, mode, step)


def _lines(text: str) -> list[str]:
    """The instructions: comments and blank lines dropped, ``\\`` continuations joined."""
    joined: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending.strip():
        joined.append(pending.strip())
    return joined


def _expand(value: str, known: Mapping[str, str]) -> str:
    return _VARIABLE.sub(lambda m: known.get(m[1] or m[2], ""), value)


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        return word[1:-1]
    return word


def _env(rest: str, known: Mapping[str, str]) -> dict[str, str]:
    """``ENV KEY=VALUE ...`` or the legacy ``ENV KEY VALUE``, expanded as Docker does."""
    if "=" not in rest.split(None, 1)[0]:
        key, _, value = rest.partition(" ")
        if not value.strip():
            raise DockerfileError(f"ENV {key} must have two arguments")
        return {key: _expand(_unquote(value.strip()), known)}
    found: dict[str, str] = {}
    for key, raw in _ENV_PAIR.findall(rest):
        if raw.startswith("'"):
            found[key] = raw[1:-1]
        elif raw.startswith('"'):
            found[key] = _expand(re.sub(r"\\(.)", r"\1", raw[1:-1]), {**known, **found})
        else:
            found[key] = _expand(raw, {**known, **found})
    return found


def read_dockerfile(
    text: str, build_args: Mapping[str, str], base: Image
) -> tuple[Image, list[str], list[Copy]]:
    """The image ``text`` makes on top of ``base``, a log line per step and its copies.

    Raises:
        DockerfileError: Docker would refuse it.
    """
    env = dict(base.env)
    workdir = base.workdir
    args: dict[str, str] = {}
    log: list[str] = []
    copies: list[Copy] = []
    instructions = _lines(text)
    seen_from = False
    for number, line in enumerate(instructions, 1):
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        step = f"Step {number}/{len(instructions)} : {line}"
        if word not in _INSTRUCTIONS:
            raise DockerfileError(f"{step}: unknown instruction: {word}")
        if not rest:
            raise DockerfileError(f"{step}: {word} requires at least one argument")
        if not seen_from and word not in ("FROM", "ARG"):
            raise DockerfileError(f"{step}: no build stage in current context (FROM first)")
        known = {"PATH": DEFAULT_PATH, **args, **env}
        if word == "FROM":
            seen_from = True
        elif word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = build_args.get(name, _expand(_unquote(default), known))
        elif word == "ENV":
            env.update(_env(rest, known))
        elif word == "WORKDIR":
            path = _expand(_unquote(rest), known)
            workdir = posixpath.normpath(posixpath.join(workdir or "/", path))
        elif word in ("COPY", "ADD"):
            copies.append(_copy(word, rest, known, workdir, step))
        elif word == "RUN":
            step += "  (skipped: a devbox's system packages are the host's)"
        elif rest.startswith("[") and word in ("CMD", "ENTRYPOINT", "SHELL"):
            try:
                json.loads(rest)
            except ValueError:
                raise DockerfileError(f"{step}: {word} is not valid JSON") from None
        log.append(step)
    if instructions and not seen_from:
        raise DockerfileError("no build stage in current context (the Dockerfile has no FROM)")
    return Image(env=env, workdir=workdir), log, copies
