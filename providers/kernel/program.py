"""The router's code kernel as it runs inside a sandbox: standard library only.

`providers.kernel.host` starts ``python -u -c BOOTSTRAP TOKEN`` in the
sandbox; the bootstrap reads this file's text as the first line of stdin
(a JSON string) and calls `main`. It must run on whatever Python the
sandbox's image has (3.8 on), so it uses nothing newer.

The protocol: one JSON request per line on stdin (``run``: ``id``, ``code``,
``env``, ``timeout``; ``interrupt``: ``id``), and on stdout one frame per
line, ``TOKEN`` then JSON: ``start`` (the cell began, with its execution
count), ``stdout``/``stderr`` (``text``), ``result`` (a rich result's
formats), ``error`` (``name``, ``value``, ``traceback``) and ``done``. The
cell's own output never reaches that channel: fds 1 and 2 are pipes whose
readers send what arrives as frames, so a ``print``, a subprocess, or C
code writing to fd 1 cannot break a frame. Requests arrive on a private
copy of fd 0; fd 0 itself is ``/dev/null``.

A cell runs in the namespace of ``__main__`` (so pickle finds what it
defines), its last expression's value becomes the main result, and what it
displays (``display(...)``, ``plt.show()``, figures left open) becomes
results. A cell past its timeout is interrupted (SIGINT to the main
thread: ``KeyboardInterrupt``, state kept); one that ignores the interrupt
for `ESCALATE_SECONDS` ends the kernel (the host restarts it, saying so).

`cell` is also what `providers.daytona` runs inside Daytona's own
interpreter (``daytona_cell``) to give its results the same shape.
"""

from __future__ import annotations

import ast
import base64
import builtins
import codecs
import contextlib
import importlib.abc
import importlib.util
import io
import itertools
import json
import linecache
import os
import queue
import signal
import sys
import threading
import traceback
import types
import warnings
from collections.abc import Callable
from typing import Any

ESCALATE_SECONDS = 2.0
DRAIN_SECONDS = 2.0
_READ = 1 << 16


_REPRS = (
    ("html", "_repr_html_"),
    ("markdown", "_repr_markdown_"),
    ("svg", "_repr_svg_"),
    ("png", "_repr_png_"),
    ("jpeg", "_repr_jpeg_"),
    ("pdf", "_repr_pdf_"),
    ("latex", "_repr_latex_"),
    ("json", "_repr_json_"),
    ("javascript", "_repr_javascript_"),
)
_MIME = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
_BINARY = ("png", "jpeg", "pdf")


def plain(text: str) -> str:
    """A repr as E2B's interpreter gives it: one pair of enclosing quotes dropped."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _binary(data: Any) -> Any:
    return base64.b64encode(data).decode("ascii") if isinstance(data, (bytes, bytearray)) else data


def _figure_png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _is_figure(value: Any) -> bool:
    kind = type(value)
    return kind.__module__ == "matplotlib.figure" and kind.__name__ == "Figure"


def formats_of(value: Any) -> dict[str, Any]:
    """Every representation of ``value`` that IPython's display protocol would give."""
    formats: dict[str, Any] = {}
    bundle = getattr(type(value), "_repr_mimebundle_", None)
    if callable(bundle):
        try:
            data = value._repr_mimebundle_()
            data = data[0] if isinstance(data, tuple) else data
            for mime, shown in (data or {}).items():
                name = _MIME.get(mime, mime)
                formats[name] = plain(shown) if name == "text" else _binary(shown)
        except Exception:
            pass
    for name, method in _REPRS:
        if name in formats or not callable(getattr(type(value), method, None)):
            continue
        try:
            shown = getattr(value, method)()
        except Exception:
            continue
        if isinstance(shown, tuple):
            shown = shown[0]
        if shown is not None:
            formats[name] = _binary(shown)
    if _is_figure(value) and "png" not in formats:
        formats["png"] = _figure_png(value)
    if "text" not in formats:
        try:
            formats["text"] = plain(repr(value))
        except Exception as exc:
            formats["text"] = f"<repr failed: {type(exc).__name__}: {exc}>"
    return formats


class Displays:
    """What a cell displayed, in order: ``display(...)`` calls and shown figures."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.shown: list[int] = []

    def reset(self) -> None:
        self.results, self.shown = [], []

    def take(self) -> list[dict[str, Any]]:
        """The results so far, forgotten here."""
        taken, self.results = self.results, []
        return taken

    def display(self, *values: Any) -> None:
        for value in values:
            if _is_figure(value):
                self.shown.append(id(value))
            self.results.append(formats_of(value))

    def figures(self) -> None:
        """Every open pyplot figure as a result, then closed (as IPython's inline backend)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            if id(figure) not in self.shown:
                self.results.append({"text": plain(repr(figure)), "png": _figure_png(figure)})
        pyplot.close("all")


DISPLAYS = Displays()


def display(*values: Any) -> None:
    """Show ``values`` as results of the running cell (IPython's ``display``)."""
    DISPLAYS.display(*values)


def _show(*args: Any, **kwargs: Any) -> None:
    DISPLAYS.figures()


class _PyplotHook(importlib.abc.MetaPathFinder):
    """Makes ``matplotlib.pyplot.show`` put the open figures among the cell's results."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "matplotlib.pyplot":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            module.show = _show  # type: ignore[attr-defined]

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def use_display() -> None:
    """Headless matplotlib whose ``show`` displays, and ``display`` as a builtin."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    if not any(isinstance(finder, _PyplotHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PyplotHook())
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.__dict__["show"] = _show
    builtins.display = display  # type: ignore[attr-defined]


class _Unguarded:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def cell(
    code: str, namespace: dict[str, Any], filename: str, guard: Any = None
) -> list[dict[str, Any]]:
    """Run ``code`` in ``namespace``: its results (displays, the last expression's value,
    figures left open). What it raises propagates, its displays left in `DISPLAYS`;
    ``guard`` wraps what runs the user's code (theirs, their reprs, their figures)."""
    DISPLAYS.reset()
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        del tree.body[-1]
    body = compile(tree, filename, "exec")
    main: list[dict[str, Any]] = []
    with guard or _Unguarded():
        exec(body, namespace)
        value = None if last is None else eval(compile(last, filename, "eval"), namespace)
        if value is not None:
            if _is_figure(value):
                DISPLAYS.shown.append(id(value))
            main.append(dict(formats_of(value), is_main_result=True))
        shown = DISPLAYS.take()
        DISPLAYS.figures()
    return shown + main + DISPLAYS.take()


def leftover() -> list[dict[str, Any]]:
    """What a cell that raised had displayed, with its figures left open."""
    with contextlib.suppress(Exception):
        DISPLAYS.figures()
    return DISPLAYS.take()


def error_of(exc: BaseException, filename: str) -> dict[str, str]:
    """The error frame of ``exc``: its traceback from the cell's first frame on."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    return {"name": type(exc).__name__, "value": str(exc), "traceback": "".join(lines)}


_CELLS = itertools.count(1)


def daytona_cell(code: str, namespace: dict[str, Any], nonce: str, fresh: bool) -> None:
    """`cell` inside Daytona's interpreter: its results, and its error as the kernel
    reports one, go out as one marked line of stdout (``\\x00`` + ``nonce`` + JSON) that
    the adapter takes out again; the error propagates to Daytona too."""
    use_display()
    filename = f"<cell-{next(_CELLS)}>"
    marked: dict[str, Any] = {"fresh": fresh, "results": []}
    try:
        marked["results"] = cell(code, namespace, filename)
    except BaseException as exc:
        marked["results"], marked["error"] = leftover(), error_of(exc, filename)
        raise
    finally:
        sys.stdout.flush()
        sys.stdout.write("\x00" + nonce + json.dumps(marked) + "\n")
        sys.stdout.flush()


class Kernel:
    """The kernel process: requests in, frames out, one cell at a time."""

    def __init__(self, token: str, leftover: bytes) -> None:
        self.token = token.encode("ascii")
        self.lock = threading.Lock()  # one frame at a time on the channel
        self.state = threading.Lock()  # the running cell and whether it may be interrupted
        self.running: int | None = None
        self.interruptible = False
        self.timed_out = False
        self.count = 0
        self.requests: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.main_thread = threading.get_ident()
        self.channel = os.dup(1)
        self.diagnostics = os.dup(2)
        self.inbox = os.dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        self.drain = b"\x00\x1b[sandbox-router-drain:" + self.token + b"]"
        self.drained = {1: threading.Event(), 2: threading.Event()}
        self.pipes: dict[int, tuple[int, int]] = {}  # what fds 1 and 2 are (device, inode)
        signal.signal(signal.SIGINT, self._on_interrupt)
        for fd, kind in ((1, "stdout"), (2, "stderr")):
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            self.pipes[fd] = _identity(fd)
            self._thread(self._pump, read, fd, kind)
        self._thread(self._read, leftover)

    @staticmethod
    def _thread(target: Callable[..., None], *args: Any) -> None:
        """A daemon thread that never takes SIGINT: interrupts are the main thread's."""
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            threading.Thread(target=target, args=args, daemon=True).start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def emit(self, frame: dict[str, Any]) -> None:
        data = self.token + json.dumps(frame).encode("ascii") + b"\n"
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.channel, view) :]

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.interruptible:
            raise KeyboardInterrupt
        # Between cells (a late timer, an interrupt for a cell that ended): nothing to stop.

    def interrupt(self, cell_id: int, *, timed_out: bool) -> bool:
        """SIGINT to the main thread if ``cell_id`` still runs; False when it has ended."""
        with self.state:
            if self.running != cell_id:
                return False
            self.timed_out = self.timed_out or timed_out
            signal.pthread_kill(self.main_thread, signal.SIGINT)
            return True

    def _read(self, leftover: bytes) -> None:
        buffer = leftover
        while True:
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                try:
                    self._request(json.loads(line))
                except (ValueError, KeyError, TypeError, AttributeError):
                    os.write(self.diagnostics, b"sandbox-router kernel: a malformed request\n")
            data = os.read(self.inbox, _READ)
            if not data:
                self.requests.put(None)
                return
            buffer += data

    def _request(self, request: dict[str, Any]) -> None:
        if request.get("op") == "interrupt":
            self.interrupt(int(request["id"]), timed_out=False)
        else:
            self.requests.put(request)

    def _pump(self, read: int, fd: int, kind: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = b""
        while True:
            data = os.read(read, _READ)
            if not data:
                return
            pending += data
            while True:
                at = pending.find(self.drain)
                if at < 0:
                    break
                self._forward(kind, decoder.decode(pending[:at]))
                pending = pending[at + len(self.drain) :]
                self._forward(kind, decoder.decode(b"", True))
                self.drained[fd].set()
            kept = self._prefix_kept(pending)
            self._forward(kind, decoder.decode(pending[: len(pending) - kept]))
            pending = pending[len(pending) - kept :]

    def _prefix_kept(self, data: bytes) -> int:
        """How many bytes at the end of ``data`` may begin the drain mark (held back)."""
        for size in range(min(len(self.drain) - 1, len(data)), 0, -1):
            if data.endswith(self.drain[:size]):
                return size
        return 0

    def _forward(self, kind: str, text: str) -> None:
        cell_id = self.running
        if text and cell_id is not None:
            self.emit({"id": cell_id, "type": kind, "text": text})

    def _drain(self) -> None:
        """Wait until every byte the cell wrote to fds 1 and 2 is sent as frames."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, drained in self.drained.items():
            drained.clear()
            try:
                if _identity(fd) != self.pipes[fd]:
                    continue  # the cell pointed it elsewhere: the mark is not the pipe's
                os.write(fd, self.drain)
            except OSError:  # the cell closed it
                continue
            drained.wait(DRAIN_SECONDS)

    def _watch(self, cell_id: int, timeout: float, ended: threading.Event) -> None:
        if ended.wait(timeout) or not self.interrupt(cell_id, timed_out=True):
            return
        if ended.wait(ESCALATE_SECONDS):
            return
        self.emit({"id": cell_id, "type": "done", "timed_out": True, "lost": True})
        os._exit(70)

    def serve(self, namespace: dict[str, Any]) -> None:
        while True:
            try:
                request = self.requests.get()
            except KeyboardInterrupt:
                continue
            if request is None:
                return
            if request.get("op") == "run":
                self._run(request, namespace)

    def __enter__(self) -> None:
        with self.state:
            self.interruptible = True

    def __exit__(self, *exc: Any) -> None:
        with self.state:
            self.interruptible = False

    def _run(self, request: dict[str, Any], namespace: dict[str, Any]) -> None:
        cell_id = int(request["id"])
        self.count += 1
        env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        ended = threading.Event()
        with self.state:
            self.running, self.timed_out = cell_id, False
        self.emit({"id": cell_id, "type": "start", "count": self.count})
        timeout = request.get("timeout")
        if timeout:
            self._thread(self._watch, cell_id, float(timeout), ended)
        results: list[dict[str, Any]] = []
        error: dict[str, str] | None = None
        filename = f"<cell-{self.count}>"
        try:
            results = cell(str(request["code"]), namespace, filename, self)
        except BaseException as exc:
            error = error_of(exc, filename)
            results = leftover()
        finally:
            ended.set()
            with self.state:
                self.interruptible = False
        self._drain()
        with self.state:
            self.running = None
            timed_out = self.timed_out
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for result in results:
            self.emit({"id": cell_id, "type": "result", **result})
        if error is not None:
            self.emit({"id": cell_id, "type": "error", **error})
        self.emit({"id": cell_id, "type": "done", "timed_out": timed_out, "count": self.count})


def _identity(fd: int) -> tuple[int, int]:
    found = os.fstat(fd)
    return found.st_dev, found.st_ino


def main(token: str, leftover: bytes) -> None:
    """Serve requests until stdin ends; the cells run in ``__main__``'s namespace."""
    main_module = sys.modules["__main__"]
    namespace = main_module.__dict__
    for name in [name for name in namespace if not name.startswith("__")]:
        del namespace[name]  # the bootstrap's names
    use_display()
    kernel = Kernel(token, leftover)
    try:
        kernel.serve(namespace)
    except BaseException:
        os.write(kernel.diagnostics, traceback.format_exc().encode("utf-8", "replace"))
        raise
