"""A smolagents code executor on a router lease: `RouterExecutor`.

A ``CodeAgent`` runs each step's code through its executor and expects the
variables of one step in the next, as E2B's and Modal's Jupyter kernels
keep them. The executor runs the code with ``sandbox.run_code``, so it asks
for an entry that declares ``run_code.stateful`` by default (every
provider's kernel; docs/code-interpreter.md). It gives the agent what
smolagents' ``E2BExecutor`` does: the cell's output as its logs, the last
expression's value as the output (an image as a ``PIL.Image``), a
``final_answer`` call as the final answer, and any other error raised as an
``AgentError`` carrying the exception's name, value and traceback. A cell
that found its kernel restarted (the sandbox's kernel died) says so in its
logs, since what earlier steps defined is gone.

Needs the ``smolagents`` extra: ``pip install "sandbox-router[smolagents]"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from io import BytesIO
from types import TracebackType
from typing import Any

try:
    import PIL.Image
    from smolagents.local_python_executor import CodeOutput
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.tools import Tool, get_tools_definition_code
    from smolagents.utils import AgentError
except ModuleNotFoundError as missing:  # pragma: no cover - the extra's own message
    raise ModuleNotFoundError(
        'router.integrations.smolagents needs smolagents: pip install "sandbox-router[smolagents]"',
        name="smolagents",
    ) from missing

from providers.base import CodeResult, SandboxSpec
from providers.errors import InvalidArgument
from router.core import Router
from router.integrations.leases import Held
from router.lease import AsyncLease, Lease

__all__ = ["DEFAULT_TIMEOUT", "STATEFUL", "RouterExecutor"]

DEFAULT_TIMEOUT = 300.0  # a cell's, as e2b_code_interpreter's run_code
STATEFUL = ("run_code.stateful",)
# E2BExecutor's order: images first, then the first other format the main result has.
_FORMATS = ("data", "html", "javascript", "json", "latex", "markdown", "pdf", "svg", "text")


class RouterExecutor(RemotePythonExecutor):
    """A smolagents ``RemotePythonExecutor`` whose sandbox comes from a `Router`.

    ``CodeAgent(tools=[], model=model, executor=RouterExecutor(router))``:
    the lease is acquired here, as ``E2BExecutor`` makes its sandbox, and
    released by ``cleanup()``, which ``with CodeAgent(...) as agent:`` calls
    at the end of its block. ``RouterExecutor(lease)`` runs on a lease the app
    holds; its ``cleanup()`` leaves the release to the app.

    Args:
        source: the `Router` to acquire from, or a held `Lease` / `AsyncLease`.
        additional_imports: packages to ``pip install`` in the sandbox first.
        logger: smolagents' logger (a new ``AgentLogger`` at INFO by default).
        spec: what to create (template, env, resources...).
        requires: capabilities the entry must declare; ``run_code.stateful``
            by default, so variables persist between steps.
        labels: extra labels put on the sandbox.
        session: a sticky session key.
        acquire_timeout: the acquire's overall deadline in seconds.
        timeout: a cell's timeout in seconds.
        allow_pickle: as smolagents' executors: pickle for values JSON cannot carry.
    """

    def __init__(
        self,
        source: Router | Lease | AsyncLease,
        additional_imports: Iterable[str] = (),
        logger: AgentLogger | None = None,
        *,
        spec: SandboxSpec | None = None,
        requires: Iterable[str] = STATEFUL,
        labels: Mapping[str, str] | None = None,
        session: str | None = None,
        acquire_timeout: float | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        allow_pickle: bool = False,
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidArgument(f"RouterExecutor(timeout={timeout!r}): a number of seconds > 0")
        self.timeout = float(timeout)
        self._held = Held.of(
            source, "RouterExecutor", spec, requires, labels, session, acquire_timeout
        )
        super().__init__(list(additional_imports), logger or AgentLogger(LogLevel.INFO))
        self.allow_pickle = allow_pickle
        self._held.enter()
        try:
            self.installed_packages = self.install_packages(self.additional_imports)
        except BaseException:
            self._held.exit()
            raise
        self.logger.log(
            f"Sandbox router lease on {self.lease.entry} is running", level=LogLevel.INFO
        )

    @property
    def lease(self) -> Lease | AsyncLease:
        """The lease the executor runs on (``lease.entry`` names the chain entry that served)."""
        self._held.sync()  # refuses once cleaned up
        assert self._held.lease is not None
        return self._held.lease

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run one step's code in the sandbox's kernel; its error raised as an ``AgentError``,
        the ``final_answer`` call returned as the final answer."""
        ran = self._held.sync().run_code(code, timeout=self.timeout)
        logs = ran.stdout + ran.stderr
        if ran.restarted:
            logs = (
                "(the sandbox's Python kernel restarted: earlier steps' variables are gone)\n"
                + logs
            )
        if ran.error is not None:
            if ran.error.name == self.FINAL_ANSWER_EXCEPTION:
                answer = self._deserialize_final_answer(ran.error.value, self.allow_pickle)
                return CodeOutput(output=answer, logs=logs, is_final_answer=True)
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{ran.error.name}\n"
                f"{ran.error.value}\n{ran.error.traceback}",
                self.logger,
            )
        return CodeOutput(output=_main_output(ran), logs=logs, is_final_answer=False)

    def send_tools(self, tools: dict[str, Tool]) -> None:
        """Define the agent's tools in the kernel, as every remote executor does, with the
        module-level imports smolagents hoists out of the tools' code made optional: it
        hoists the guarded ``import numpy`` / ``import PIL`` of ``final_answer``, which
        would otherwise stop the agent on a sandbox without them before its first step."""
        if "final_answer" in tools:
            self._patch_final_answer_with_exception(tools["final_answer"])
        wanted = {
            "pillow" if pkg == "PIL" else pkg
            for tool in tools.values()
            for pkg in tool.to_dict()["requirements"]
            if pkg not in [*self.installed_packages, "smolagents"]
        }
        if wanted:
            self.installed_packages += self.install_packages(sorted(wanted))
        code = get_tools_definition_code(tools)
        if code:
            self.logger.log(self.run_code_raise_errors(_OPTIONAL_IMPORT.sub(_guard, code)).logs)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """``pip install`` the distributions the kernel's interpreter lacks (the router's
        kernel has no ``!pip`` magic). A failed install is logged, not raised, as the
        Jupyter executors' ``!pip`` is: smolagents asks for the optional imports of its
        tools too (numpy and pillow for ``final_answer``)."""
        if additional_imports:
            output = self.run_code_raise_errors(_PIP.format(names=list(additional_imports)))
            self.logger.log(output.logs)
        return additional_imports

    def cleanup(self) -> None:
        """Release the lease the executor acquired (a lease the app gave it stays live)."""
        if self._held.handles is not None:
            self.logger.log("Releasing the sandbox router lease...", level=LogLevel.INFO)
            self._held.exit()

    def __enter__(self) -> RouterExecutor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"<RouterExecutor {self._held.lease!r}>"


_OPTIONAL_IMPORT = re.compile(r"^((?:import|from) [\w.]+.*)$", re.MULTILINE)


def _guard(line: re.Match[str]) -> str:
    return f"try:\n    {line.group(1)}\nexcept ImportError:\n    pass"


_PIP = """
def __sandbox_router_pip(names):
    import importlib.metadata, subprocess, sys
    missing = []
    for name in names:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-input", *missing]
        if subprocess.run(argv).returncode:
            print("pip install " + " ".join(missing) + " failed")
__sandbox_router_pip({names!r})
del __sandbox_router_pip
"""


def _main_output(ran: CodeResult) -> Any:
    """The cell's last expression as ``E2BExecutor`` gives it: an image as a PIL image, else
    the first format it has (``text`` last)."""
    for result in ran.results:
        if not result.is_main_result:
            continue
        for image in (result.jpeg, result.png):
            if image is not None:
                return PIL.Image.open(BytesIO(image))
        if "chart" in result.extra:
            return result.extra["chart"]
        for name in _FORMATS:
            value = getattr(result, name)
            if value is not None:
                return value
    return None
