"""What a code interpreter gives back beside output: rich results, errors, contexts.

One shape on every provider, modelled on ``e2b_code_interpreter`` (its
``Result``, ``ExecutionError`` and ``Context``): E2B's and Daytona's native
interpreters are mapped into it, and the router's own kernel
(`providers.kernel`) produces it, so an agent sees the same values whichever
entry served it.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["CodeContext", "CodeError", "RichResult", "error_of_output"]

_EXCEPTION_LINE = re.compile(
    r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Iteration))(?:: (.*))?"
)


class CodeError(str):
    """A cell's error: the exception's ``name``, ``value`` and ``traceback``, as E2B gives them.

    It is also the text ``"Name: value"`` (a ``str``), which is what
    ``CodeResult.error`` held before it carried the parts, so code that
    compares or prints it keeps working.
    """

    name: str
    value: str
    traceback: str

    def __new__(cls, name: str, value: str = "", traceback: str = "") -> CodeError:
        made = super().__new__(cls, f"{name}: {value}" if value else name)
        made.name, made.value, made.traceback = name, value, traceback
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (CodeError, (self.name, self.value, self.traceback))


def error_of_output(
    output: str, exit_code: int, timed_out: bool, timeout: float | None
) -> CodeError | None:
    """The error of code run as a command, from its stderr: None when nothing went wrong.

    A Python exception's last line (``NameError: name 'x' is not defined``)
    gives the name and value; any other failure is an ``ExitCode`` error
    whose value is the output's last line (or the exit code).
    """
    if timed_out:
        return CodeError("TimeoutError", f"execution timed out after {timeout}s", output)
    if exit_code == 0:
        return None
    lines = [line for line in output.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if match := _EXCEPTION_LINE.fullmatch(last):
        return CodeError(match[1], match[2] or "", output)
    return CodeError("ExitCode", last or f"exit code {exit_code}", output)


@dataclass(frozen=True, slots=True)
class RichResult:
    """One rich result of a cell: the value of its last expression (``is_main_result``)
    or something it displayed (a matplotlib figure, ``display(...)``).

    Each format is one representation of the same object: ``text`` is its
    plain text (its ``repr``, a string's quotes dropped as E2B drops them),
    ``png``/``jpeg``/``pdf`` are the image's bytes, the others the text of
    that format. ``extra`` holds what has no field (other MIME types, E2B's
    ``chart``).
    """

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: bytes | None = None
    jpeg: bytes | None = None
    pdf: bytes | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    data: Any = None
    is_main_result: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def formats(self) -> list[str]:
        """The formats this result has, in E2B's order (``text`` first), then ``extra``'s."""
        held = [
            f.name
            for f in fields(self)
            if f.name not in ("is_main_result", "extra") and getattr(self, f.name) is not None
        ]
        return held + list(self.extra)

    def __repr__(self) -> str:
        if self.text is not None:
            return f"RichResult({self.text})"
        return f"RichResult(formats: {', '.join(self.formats())})"

    @classmethod
    def of_formats(cls, formats: Mapping[str, Any], *, is_main_result: bool) -> RichResult:
        """A result from named formats; the binary ones come as base64 text (E2B, the kernel)."""
        known = {f.name for f in fields(cls)} - {"is_main_result", "extra"}
        values: dict[str, Any] = {
            name: _binary(value) if name in _BINARY and isinstance(value, str) else value
            for name, value in formats.items()
            if name in known and value is not None
        }
        extra = {name: value for name, value in formats.items() if name not in known}
        return cls(**values, is_main_result=is_main_result, extra=extra)


_BINARY = frozenset({"png", "jpeg", "pdf"})


def _binary(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return text.encode()


@dataclass(frozen=True, slots=True)
class CodeContext:
    """An independent namespace of a sandbox's code interpreter (E2B's ``Context``).

    `Sandbox.code_context` makes one; ``run_code(code, context=ctx)`` runs
    in it. Variables, imports and the working directory of one context are
    not seen by another, nor by the default context (``context=None``).

    Attributes:
        id: the context's id (the vendor's, or the router kernel's).
        language: the language its code is in (``python``).
        cwd: the directory its code starts in (None: the sandbox's default).
    """

    id: str
    language: str = "python"
    cwd: str | None = None
