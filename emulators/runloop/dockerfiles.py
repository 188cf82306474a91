"""A blueprint's Dockerfile, read for what it says about the devboxes made from it.

A devbox's system is the host's (`emulators.filesystem.GuestSandbox`), so a
Dockerfile is not built: its ``RUN`` steps (package installs, written for
root in a throwaway container) are skipped, as the Modal emulator skips
them. What an instruction says about the devbox is kept in an `Image`:
``ENV`` variables (``$VAR`` expanded, ``ARG`` defaults and the blueprint's
``build_args`` included) and the ``WORKDIR``. A Dockerfile Docker would
refuse fails the build with the reason (`DockerfileError`): a first
instruction other than ``FROM`` (``ARG`` aside), an unknown instruction,
one without its arguments, or a ``COPY`` / ``ADD`` from a build context
(the emulator has no object storage to hold one).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_PATH", "DockerfileError", "Image", "read_dockerfile"]

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


class DockerfileError(Exception):
    """The Dockerfile cannot be built; the message says why, as a build log does."""


@dataclass(frozen=True)
class Image:
    """What a built blueprint gives its devboxes: the environment and the working directory."""

    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None


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
) -> tuple[Image, list[str]]:
    """The image ``text`` makes on top of ``base``, and a log line per step.

    Raises:
        DockerfileError: Docker would refuse it.
    """
    env = dict(base.env)
    workdir = base.workdir
    args: dict[str, str] = {}
    log: list[str] = []
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
            raise DockerfileError(f"{step}: {word} failed: no build context to copy from")
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
    return Image(env=env, workdir=workdir), log
