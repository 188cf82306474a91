"""The MCP server's tools: what a model can do with a sandbox, and what each call answers.

Each tool is an argument model (its JSON schema, with a description per
field, is what the model sees), a result model (the structured output and
its schema) and an async function of a `Call` (the session, and where to
report progress) and the validated arguments. The descriptions are written
for a model to choose and call the tools well. The calls go through the
router's public async API (`Router.aacquire`, the lease's sandbox handle),
so every provider behaves here as it does for a Python caller; what a call
refuses (an oversized argument, an unknown sandbox) is an `InvalidArgument`
naming the argument and the limit.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from mcp_types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from providers.code import RichResult
from providers.errors import InvalidArgument, Unsupported
from router.mcp.sessions import McpSession, Slot

__all__ = ["TOOLS", "Call", "Tool"]

Progress = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call: the caller's session, and ``progress`` when the client asked for it."""

    session: McpSession
    progress: Progress | None = None


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


SandboxId = Annotated[
    str | None,
    Field(
        description="Which sandbox (an id from open_sandbox or list_sandboxes). Omit it to use "
        "the current sandbox: the one last opened or resumed, opened for you if there is none."
    ),
]
Timeout = Annotated[
    float,
    Field(gt=0, description="Seconds to wait before killing it; the result then says timed_out."),
]
Env = Annotated[
    dict[str, str] | None,
    Field(description="Extra environment variables for this command only."),
]
Cwd = Annotated[
    str | None,
    Field(description="Directory to run in (default: the sandbox's home directory)."),
]


# -- sandboxes -------------------------------------------------------------------
class OpenArgs(_Args):
    requires: list[str] = Field(
        default_factory=list,
        description='Capabilities the sandbox must have, e.g. ["run_code.stateful"] for a '
        'Python kernel that keeps variables, ["port"] to expose a server, ["pause"], '
        '["gpu"]; only providers that have all of them are used.',
    )
    template: str | None = Field(
        None,
        description="The provider's template, image or snapshot to start from; omit it for "
        "the default image.",
    )
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list,
        description="Ports you will expose with expose_port: some providers open a port only "
        "when the sandbox is created, so list them here.",
    )


class Opened(_Result):
    sandbox_id: str
    entry: str = Field(description="The router's chain entry serving it.")
    provider: str
    capabilities: list[str] = Field(description="What this sandbox can do beyond run and files.")
    failovers: list[str] = Field(description="Entries tried and skipped before this one.")


async def open_sandbox(call: Call, args: OpenArgs) -> Opened:
    """Open a new sandbox: an isolated Linux machine with a shell, Python and a filesystem,
    from the first provider of the router's chain that can serve (failing over when one is
    down or out of quota). It becomes the current sandbox, used by every other tool when
    sandbox_id is omitted. You need this only for a second sandbox, for a capability
    (requires) or for a template: the first tool call of a session opens one for you.
    Sandboxes live until close_sandbox or until this MCP session ends."""
    slot = await call.session.open(args.requires, args.template, args.ports)
    return _opened(slot)


def _opened(slot: Slot) -> Opened:
    return Opened(
        sandbox_id=slot.id,
        entry=slot.entry,
        provider=slot.provider,
        capabilities=sorted(slot.capabilities),
        failovers=slot.failovers,
    )


class SandboxArgs(_Args):
    sandbox_id: SandboxId = None


class SandboxView(_Result):
    sandbox_id: str
    entry: str
    provider: str
    paused: bool
    current: bool = Field(description="Whether tools use it when sandbox_id is omitted.")
    processes: list[str] = Field(description="Ids of the processes started by start_process.")


class Sandboxes(_Result):
    sandboxes: list[SandboxView]


class ListArgs(_Args):
    pass


async def list_sandboxes(call: Call, args: ListArgs) -> Sandboxes:
    """List this session's sandboxes: their ids, which is current, which are paused, and the
    background processes started in each."""
    current = call.session.current
    return Sandboxes(
        sandboxes=[
            SandboxView(
                sandbox_id=s.id,
                entry=s.entry,
                provider=s.provider,
                paused=s.paused,
                current=s.id == current,
                processes=list(s.processes),
            )
            for s in call.session.slots
        ]
    )


class Closed(_Result):
    sandbox_id: str
    closed: bool


async def close_sandbox(call: Call, args: SandboxArgs) -> Closed:
    """Close a sandbox: kill it and everything running in it, and free its place in the
    quota. Its files are gone. Close sandboxes you no longer need."""
    slot = await _existing(call, args.sandbox_id)
    await call.session.close_sandbox(slot)
    return Closed(sandbox_id=slot.id, closed=True)


class PauseState(_Result):
    sandbox_id: str
    paused: bool


async def pause_sandbox(call: Call, args: SandboxArgs) -> PauseState:
    """Pause a sandbox: its files stay, it stops costing compute, and on most providers its
    running processes end. Call resume_sandbox before using it again. Needs the "pause"
    capability (open_sandbox with requires=["pause"])."""
    slot = await _existing(call, args.sandbox_id)
    await call.session.pause(slot)
    return PauseState(sandbox_id=slot.id, paused=True)


async def resume_sandbox(call: Call, args: SandboxArgs) -> PauseState:
    """Resume a paused sandbox, with its files as they were; it becomes the current one."""
    slot = await _existing(call, args.sandbox_id)
    await call.session.resume(slot)
    return PauseState(sandbox_id=slot.id, paused=False)


async def _existing(call: Call, sandbox_id: str | None) -> Slot:
    """The sandbox named, else the current one (none is opened just to be closed)."""
    if sandbox_id is not None:
        return call.session.slot(sandbox_id)
    if call.session.current is None:
        raise InvalidArgument("sandbox_id: this session has no current sandbox; give its id")
    return call.session.slot(call.session.current)


# -- commands and code -----------------------------------------------------------
class RunArgs(_Args):
    command: str = Field(
        description="A shell command line (pipes, &&, redirects and quoting work as in sh)."
    )
    timeout: Timeout = 60.0
    cwd: Cwd = None
    env: Env = None
    sandbox_id: SandboxId = None


class CommandOutput(_Result):
    sandbox_id: str
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_seconds: float
    omitted_chars: int = Field(
        description="Characters cut from the middle of stdout and stderr to fit the result."
    )


async def run_command(call: Call, args: RunArgs) -> CommandOutput:
    """Run a shell command in the sandbox and wait for it; its output arrives as progress
    notifications while it runs, then the result has the exit code and the output. A
    non-zero exit code is a result, not an error. For a server or anything that should
    keep running, use start_process instead."""
    _limit(call, "command", args.command)
    slot = await call.session.sandbox(args.sandbox_id)
    sandbox = slot.handle()
    if call.progress is None:
        result = await sandbox.run(args.command, timeout=args.timeout, env=args.env, cwd=args.cwd)
    else:
        report = call.progress

        async def stderr(text: str) -> None:
            await report("[stderr] " + text)

        result = await sandbox.run(
            args.command,
            timeout=args.timeout,
            env=args.env,
            cwd=args.cwd,
            on_stdout=report,
            on_stderr=stderr,
        )
    limit = call.session.settings.max_output_chars
    stdout, cut_out = clip(result.stdout, limit)
    stderr_text, cut_err = clip(result.stderr, limit)
    return CommandOutput(
        sandbox_id=slot.id,
        exit_code=result.exit_code,
        stdout=stdout,
        stderr=stderr_text,
        timed_out=result.timed_out,
        duration_seconds=round(result.duration, 3),
        omitted_chars=cut_out + cut_err,
    )


class CodeArgs(_Args):
    code: str = Field(description="The program to run.")
    language: str = Field("python", description='The language: "python" (default) or "bash".')
    timeout: Timeout = 60.0
    sandbox_id: SandboxId = None


class CodeOutput(_Result):
    sandbox_id: str
    stdout: str
    stderr: str
    error: str | None = Field(description="What went wrong (the exception's last line), if any.")
    results: list[dict[str, Any]] = Field(
        description="Rich results of a kernel (its formats: text, html, png...), if any."
    )
    stateful: bool = Field(
        description="True when a kernel ran it and keeps its variables and imports for the "
        "next run_code in this sandbox; False when each run starts afresh."
    )
    timed_out: bool
    omitted_chars: int


async def run_code(call: Call, args: CodeArgs) -> CodeOutput:
    """Run a program in the sandbox and return its output. The result's "stateful" says
    whether variables and imports persist to the next run_code in the same sandbox (a
    kernel kept them) or not (each run starts afresh: keep state in files then). To get a
    sandbox that keeps state, open_sandbox with requires=["run_code.stateful"]."""
    _limit(call, "code", args.code)
    slot = await call.session.sandbox(args.sandbox_id)
    result = await slot.handle().run_code(args.code, args.language, timeout=args.timeout)
    limit = call.session.settings.max_output_chars
    stdout, cut_out = clip(result.stdout, limit)
    stderr, cut_err = clip(result.stderr, limit)
    return CodeOutput(
        sandbox_id=slot.id,
        stdout=stdout,
        stderr=stderr,
        error=result.error,
        results=[_rich(r) for r in result.results],
        stateful=result.stateful,
        timed_out=result.timed_out,
        omitted_chars=cut_out + cut_err,
    )


def _rich(result: RichResult) -> dict[str, Any]:
    """A rich result as JSON: its text formats as they are, its images base64."""
    shown: dict[str, Any] = {"is_main_result": result.is_main_result}
    for name in result.formats():
        value = getattr(result, name, None) if name not in result.extra else result.extra[name]
        shown[name] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
    return shown


# -- files -----------------------------------------------------------------------
Path = Annotated[
    str,
    Field(description="A path in the sandbox, absolute or relative to its home directory."),
]


class PathArgs(_Args):
    path: Path
    sandbox_id: SandboxId = None


class FileContent(_Result):
    sandbox_id: str
    path: str
    encoding: Literal["utf-8", "base64"] = Field(
        description='"utf-8" for text; "base64" when the file is not valid UTF-8.'
    )
    content: str
    size: int = Field(description="Bytes.")


async def read_file(call: Call, args: PathArgs) -> FileContent:
    """Read a file from the sandbox: text as it is, other bytes as base64."""
    slot = await call.session.sandbox(args.sandbox_id)
    data = await _read_capped(call, slot, args.path)
    try:
        return FileContent(
            sandbox_id=slot.id,
            path=args.path,
            encoding="utf-8",
            content=data.decode("utf-8"),
            size=len(data),
        )
    except UnicodeDecodeError:
        content = base64.b64encode(data).decode()
        return FileContent(
            sandbox_id=slot.id, path=args.path, encoding="base64", content=content, size=len(data)
        )


async def _read_capped(call: Call, slot: Slot, path: str) -> bytes:
    """The file's bytes, read as a stream and refused once past ``max_read_bytes`` (never
    held beyond it); read whole where the provider cannot stream."""
    limit = call.session.settings.max_read_bytes
    sandbox = slot.handle()
    try:
        stream = sandbox.read_stream(path)
    except Unsupported:
        data = await sandbox.read_file(path)
        if len(data) > limit:
            _too_big_to_read(path, limit)
        return data
    parts, size = [], 0
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                _too_big_to_read(path, limit)
            parts.append(chunk)
    return b"".join(parts)


def _too_big_to_read(path: str, limit: int) -> None:
    raise InvalidArgument(
        f"path {path!r}: the file is larger than this server's read limit of {limit} bytes "
        "(mcp.max_read_bytes); read parts of it with run_command (head, tail, split) instead"
    )


class WriteArgs(_Args):
    path: Path
    content: str = Field(description="The file's new content (replacing what it held).")
    encoding: Literal["utf-8", "base64"] = Field(
        "utf-8", description='"utf-8" (default) for text; "base64" for binary content.'
    )
    sandbox_id: SandboxId = None


class Written(_Result):
    sandbox_id: str
    path: str
    size: int = Field(description="Bytes written.")


async def write_file(call: Call, args: WriteArgs) -> Written:
    """Write a file in the sandbox, making its parent directories; it replaces any file there."""
    limit = call.session.settings.max_write_bytes
    if args.encoding == "base64":
        if len(args.content) * 3 // 4 > limit:
            _too_big("content", len(args.content) * 3 // 4, limit, "mcp.max_write_bytes")
        try:
            data = base64.b64decode(args.content, validate=True)
        except binascii.Error:
            raise InvalidArgument("content: not valid base64 (encoding is base64)") from None
    else:
        data = args.content.encode("utf-8", "surrogatepass")
    if len(data) > limit:
        _too_big("content", len(data), limit, "mcp.max_write_bytes")
    slot = await call.session.sandbox(args.sandbox_id)
    await slot.handle().write_file(args.path, data)
    return Written(sandbox_id=slot.id, path=args.path, size=len(data))


class ListFilesArgs(_Args):
    path: Path = "."
    sandbox_id: SandboxId = None


class FileEntry(_Result):
    name: str
    path: str
    is_dir: bool
    size: int


class Listing(_Result):
    sandbox_id: str
    path: str
    entries: list[FileEntry]


async def list_files(call: Call, args: ListFilesArgs) -> Listing:
    """List a directory of the sandbox (default: its home directory): names, paths, sizes
    and which entries are directories."""
    slot = await call.session.sandbox(args.sandbox_id)
    found = await slot.handle().list_files(args.path)
    entries = [FileEntry(name=f.name, path=f.path, is_dir=f.is_dir, size=f.size) for f in found]
    return Listing(sandbox_id=slot.id, path=args.path, entries=entries)


class Removed(_Result):
    sandbox_id: str
    path: str
    removed: bool


async def remove_file(call: Call, args: PathArgs) -> Removed:
    """Remove a file, or a directory with everything in it, from the sandbox."""
    slot = await call.session.sandbox(args.sandbox_id)
    await slot.handle().remove(args.path)
    return Removed(sandbox_id=slot.id, path=args.path, removed=True)


# -- background processes and ports ----------------------------------------------
class StartArgs(_Args):
    command: str = Field(description="A shell command line to run in the background.")
    cwd: Cwd = None
    env: Env = None
    sandbox_id: SandboxId = None


class Started(_Result):
    sandbox_id: str
    process_id: str
    command: str


async def start_process(call: Call, args: StartArgs) -> Started:
    """Start a command in the background (a server, a watcher, a long build) and return at
    once with its process id. Read its output with read_process_output, stop it with
    kill_process; it ends with its sandbox."""
    _limit(call, "command", args.command)
    slot = await call.session.sandbox(args.sandbox_id)
    started = await call.session.start(slot, args.command, args.env, args.cwd)
    return Started(sandbox_id=slot.id, process_id=started.id, command=args.command)


class ReadOutputArgs(_Args):
    process_id: str = Field(description="The id start_process returned.")
    wait_seconds: float = Field(
        0.0,
        ge=0,
        le=300,
        description="When there is no new output yet, wait up to this long for some (or for "
        "the process to end) before answering.",
    )
    sandbox_id: str | None = Field(
        None, description="The process's sandbox; needed only when two sandboxes have the id."
    )


class ProcessOutput(_Result):
    sandbox_id: str
    process_id: str
    stdout: str = Field(description="Output since the previous read_process_output.")
    stderr: str
    running: bool
    exit_code: int | None
    error: str | None = Field(description="Why its output could no longer be followed, if so.")
    omitted_chars: int = Field(description="Older unread output dropped to stay within limits.")


async def read_process_output(call: Call, args: ReadOutputArgs) -> ProcessOutput:
    """Read what a background process printed since the last read, and whether it is still
    running (with its exit code once it ended)."""
    slot, background = call.session.process(args.process_id, args.sandbox_id)
    stdout, stderr, dropped = await background.read(args.wait_seconds)
    return ProcessOutput(
        sandbox_id=slot.id,
        process_id=background.id,
        stdout=stdout,
        stderr=stderr,
        running=not background.ended,
        exit_code=background.exit_code,
        error=background.error,
        omitted_chars=dropped,
    )


class ProcessArgs(_Args):
    process_id: str = Field(description="The id start_process returned.")
    sandbox_id: str | None = Field(
        None, description="The process's sandbox; needed only when two sandboxes have the id."
    )


class Killed(_Result):
    sandbox_id: str
    process_id: str
    killed: bool = Field(description="False when it had already ended.")


async def kill_process(call: Call, args: ProcessArgs) -> Killed:
    """Stop a background process (and what it started)."""
    slot, background = call.session.process(args.process_id, args.sandbox_id)
    killed = await background.process.kill()
    return Killed(sandbox_id=slot.id, process_id=background.id, killed=killed)


class ExposeArgs(_Args):
    port: int = Field(ge=1, le=65535, description="The port a server in the sandbox listens on.")
    sandbox_id: SandboxId = None


class Exposed(_Result):
    sandbox_id: str
    port: int
    url: str = Field(description="Where the port is reached from outside the sandbox.")
    headers: dict[str, str] = Field(
        description="Headers to send with each request to the URL: the access token the "
        "provider gives for this sandbox's port, where it wants one."
    )


async def expose_port(call: Call, args: ExposeArgs) -> Exposed:
    """Get a URL that reaches a port of the sandbox, for a server started with start_process
    (listening on 0.0.0.0 or localhost at that port). Needs the "port" capability."""
    slot = await call.session.sandbox(args.sandbox_id)
    exposed = await slot.handle().expose(args.port)
    return Exposed(
        sandbox_id=slot.id, port=exposed.port, url=exposed.url, headers=dict(exposed.headers)
    )


# -- the table -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    title: str
    run: Callable[[Call, Any], Awaitable[_Result]]
    args: type[_Args]
    result: type[_Result]
    annotations: ToolAnnotations

    @property
    def description(self) -> str:
        return " ".join((self.run.__doc__ or "").split())


def _hints(title: str, *, read_only: bool = False, destructive: bool = False) -> ToolAnnotations:
    return ToolAnnotations(
        title=title, read_only_hint=read_only, destructive_hint=destructive, open_world_hint=False
    )


def _tool(
    name: str,
    title: str,
    run: Callable[[Call, Any], Awaitable[_Result]],
    args: type[_Args],
    result: type[_Result],
    **hints: bool,
) -> Tool:
    return Tool(name, title, run, args, result, _hints(title, **hints))


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        _tool("open_sandbox", "Open a sandbox", open_sandbox, OpenArgs, Opened),
        _tool("run_command", "Run a command", run_command, RunArgs, CommandOutput),
        _tool("run_code", "Run code", run_code, CodeArgs, CodeOutput),
        _tool("read_file", "Read a file", read_file, PathArgs, FileContent, read_only=True),
        _tool("write_file", "Write a file", write_file, WriteArgs, Written),
        _tool("list_files", "List a directory", list_files, ListFilesArgs, Listing, read_only=True),
        _tool("remove_file", "Remove a file", remove_file, PathArgs, Removed, destructive=True),
        _tool("start_process", "Start a background process", start_process, StartArgs, Started),
        _tool(
            "read_process_output",
            "Read a process's output",
            read_process_output,
            ReadOutputArgs,
            ProcessOutput,
            read_only=True,
        ),
        _tool(
            "kill_process", "Kill a process", kill_process, ProcessArgs, Killed, destructive=True
        ),
        _tool("expose_port", "Expose a port", expose_port, ExposeArgs, Exposed),
        _tool("pause_sandbox", "Pause a sandbox", pause_sandbox, SandboxArgs, PauseState),
        _tool("resume_sandbox", "Resume a sandbox", resume_sandbox, SandboxArgs, PauseState),
        _tool(
            "close_sandbox", "Close a sandbox", close_sandbox, SandboxArgs, Closed, destructive=True
        ),
        _tool(
            "list_sandboxes", "List sandboxes", list_sandboxes, ListArgs, Sandboxes, read_only=True
        ),
    )
}


# -- helpers -----------------------------------------------------------------------
def clip(text: str, limit: int) -> tuple[str, int]:
    """``text`` within ``limit`` characters: its head and tail, the middle cut (and said so);
    and how many characters were cut."""
    if len(text) <= limit:
        return text, 0
    cut = len(text) - limit
    head = limit // 2
    marker = f"\n[... {cut} characters omitted ...]\n"
    return text[:head] + marker + text[len(text) - (limit - head) :], cut


def _limit(call: Call, argument: str, text: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    limit = call.session.settings.max_command_bytes
    if size > limit:
        _too_big(argument, size, limit, "mcp.max_command_bytes")


def _too_big(argument: str, size: int, limit: int, setting: str) -> None:
    raise InvalidArgument(
        f"{argument}: {size} bytes, over this server's limit of {limit} bytes ({setting}); "
        "send it in smaller parts (write_file, then run it from the file)"
    )


def dump(result: _Result) -> tuple[dict[str, Any], str]:
    """A result as structured content and as the JSON text beside it."""
    data = result.model_dump(mode="json")
    return data, json.dumps(data, ensure_ascii=False)
