"""`DaytonaCode`: code in a Daytona sandbox.

Python runs in Daytona's stateful interpreter (variables stay for the next
call; rich results through the router's helper, `providers.kernel.daytona`),
the sandbox's other language in its code runner (stdout and stderr merged,
as Daytona gives them) and bash in a shell session.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.base import CodeContext, CodeError, CodeResult, RichResult
from providers.code import error_of_output
from providers.daytona.errors import EXECUTION_TIMEOUT, StreamBroken, facts
from providers.daytona.handle import DaytonaHandle, json_object
from providers.daytona.processes import follow
from providers.errors import SandboxError
from providers.kernel.daytona import daytona_results, results_of
from providers.kernel.host import refuse_context
from providers.shell import piped

__all__ = ["DaytonaCode"]

_INTERPRETER_TIMED_OUT = 4008  # the interpreter's close code when the code ran out of time
_NO_CONTEXT = 1008  # ... when the request names a context it does not have


class DaytonaCode(DaytonaHandle):
    """``run_code`` and the code contexts of a Daytona sandbox."""

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = 60.0,
        context: CodeContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CodeResult:
        if language == "python":
            return await self._interpret(code, timeout, context, env)
        refuse_context(self, context, language)
        if language == self.language:
            return await self._code_run(code, timeout, env)
        if language != "bash":
            raise SandboxError(
                f"run_code: language {language!r} is not supported here "
                f"(expected {self.language!r}, 'python' or 'bash')",
                provider=self.provider,
                sandbox_id=self.id,
            )
        res = await self.run(piped(code, "bash -s"), timeout=timeout, env=env)
        return CodeResult.of_command(res, timeout)

    async def code_context(self, *, cwd: str | None = None) -> CodeContext:
        """A context of Daytona's interpreter: a Python worker of its own."""
        from daytona_toolbox_api_client_async.models.create_context_request import (
            CreateContextRequest,
        )

        async with self._toolbox(), asyncio.timeout(self._request_timeout):
            made = await (await self._tools()).interpreter.create_interpreter_context(
                request=CreateContextRequest(cwd=cwd, language="python")
            )
        return CodeContext(made.id, made.language or "python", made.cwd)

    async def remove_code_context(self, context: CodeContext) -> None:
        async with self._toolbox(), asyncio.timeout(self._request_timeout):
            await (await self._tools()).interpreter.delete_interpreter_context(id=context.id)
        self._interpreted.discard(context.id)

    async def _interpret(
        self,
        code: str,
        timeout: float | None,
        context: CodeContext | None,
        env: Mapping[str, str] | None,
    ) -> CodeResult:
        """Python in Daytona's interpreter, whose contexts keep their variables.

        A websocket: the code goes up as JSON, its output comes back a chunk per
        message (``stdout``, ``stderr`` or ``error``), and the close ends the run
        (with code 4008 when the code ran out of time). Daytona gives no rich
        results, so the cell runs through the router's `providers.kernel.program`
        (`daytona_results`), which puts them in one marked line of stdout.
        """
        started = time.monotonic()
        key = context.id if context is not None else ""
        installed = key in self._interpreted
        ran = await self._interpreter_cell(code, timeout, context, env, installed=installed)
        if ran.marked.get("missing"):  # its worker restarted: the module goes again
            ran = await self._interpreter_cell(code, timeout, context, env, installed=False)
        marked = ran.marked
        error = ran.error
        if isinstance(marked.get("error"), dict):
            error = CodeError(**{k: str(v) for k, v in marked["error"].items()})
        restarted = bool(marked.get("fresh")) and installed
        self._interpreted.add(key)
        results = tuple(
            RichResult.of_formats(r, is_main_result=bool(r.pop("is_main_result", False)))
            for r in marked.get("results") or ()
        )
        if ran.timed_out:
            error = CodeError("TimeoutError", f"execution timed out after {timeout}s")
        return CodeResult(
            ran.stdout,
            ran.stderr,
            -1 if ran.timed_out else (1 if error else 0),
            time.monotonic() - started,
            ran.timed_out,
            results,
            error,
            True,
            restarted,
        )

    async def _interpreter_cell(
        self,
        code: str,
        timeout: float | None,
        context: CodeContext | None,
        env: Mapping[str, str] | None,
        *,
        installed: bool,
    ) -> _Cell:
        """One execution on the interpreter's websocket (`_interpret`)."""
        cell = _Cell()
        nonce = secrets.token_hex(8)
        request: dict[str, Any] = {
            "code": daytona_results(code, nonce, installed=installed),
            "timeout": math.ceil(timeout) if timeout else 0,
        }
        if context is not None:
            request["contextId"] = context.id
        if env:
            request["envs"] = dict(env)
        out: list[str] = []
        err: list[str] = []
        async with self._toolbox():
            toolbox = await self._tools()
            async with (
                asyncio.timeout(timeout + self._request_timeout if timeout else None),
                await toolbox.websocket("/process/interpreter/execute") as ws,
            ):
                await ws.send_str(json.dumps(request))
                try:
                    async for data in follow(ws):
                        chunk = json_object(data)
                        kind, text = chunk.get("type"), str(chunk.get("text", ""))
                        if kind == "stdout":
                            out.append(text)
                        elif kind == "stderr":
                            err.append(text)
                        elif kind == "error":
                            cell.error = CodeError(
                                str(chunk.get("name", "")),
                                str(chunk.get("value", "")),
                                str(chunk.get("traceback", "")),
                            )
                except StreamBroken:
                    if ws.close_code == _NO_CONTEXT and context is not None:
                        raise SandboxError(
                            f"no code context {context.id!r} in Daytona's interpreter "
                            "(removed?): it refused the cell",
                            provider=self.provider,
                            sandbox_id=self.id,
                        ) from None
                    if ws.close_code != _INTERPRETER_TIMED_OUT:
                        raise
                    cell.timed_out = True
        cell.stdout, cell.marked = results_of("".join(out), nonce)
        cell.stderr = "".join(err)
        return cell

    async def _code_run(
        self, code: str, timeout: float | None, env: Mapping[str, str] | None
    ) -> CodeResult:
        """Daytona's code runner (stdout and stderr merged, as it gives them)."""
        from daytona_toolbox_api_client_async.models.code_run_request import CodeRunRequest

        started = time.monotonic()
        slack = self._request_timeout
        request = CodeRunRequest(
            code=code,
            language=self.language,
            timeout=math.ceil(timeout) if timeout else None,
            envs=dict(env) if env else None,
        )
        async with self._toolbox():
            try:
                async with asyncio.timeout(timeout + slack if timeout else None):
                    response = await (await self._tools()).process.code_run(request)
            except Exception as exc:
                if facts(exc).code != EXECUTION_TIMEOUT:
                    raise
                elapsed = time.monotonic() - started
                failed = CodeError("TimeoutError", f"execution timed out after {timeout}s")
                return CodeResult("", "", -1, elapsed, True, (), failed)
        output = response.result or ""
        exit_code = response.exit_code
        if exit_code is None:
            exit_code = response.additional_properties.get("code")
        exit_code = exit_code if isinstance(exit_code, int) else -1
        charts = tuple(
            RichResult.of_formats(chart.model_dump(), is_main_result=False)
            for chart in (response.artifacts and response.artifacts.charts) or ()
        )
        return CodeResult(
            output,
            "",
            exit_code,
            time.monotonic() - started,
            False,
            charts,
            error_of_output(output, exit_code, False, timeout),
        )


@dataclass
class _Cell:
    """What one execution of Daytona's interpreter gave."""

    stdout: str = ""
    stderr: str = ""
    error: CodeError | None = None
    timed_out: bool = False
    marked: dict[str, Any] = field(default_factory=dict)  # what the results helper said
