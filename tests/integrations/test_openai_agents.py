"""The OpenAI Agents SDK's own agent loop (``Runner`` with a ``SandboxAgent``, the SDK's
``ScriptedModel``: no network) on `RouterSandboxClient`, over ``local`` and each vendor's adapter
on its emulator; and the backend held to what the SDK's vendor backends do (exit codes,
timeouts, path rules, error types, the workspace as a tar stream, resume)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "agents",
    reason="the OpenAI Agents SDK tests need openai-agents "
    '(pip install "sandbox-router[openai-agents]")',
)

from agents import Runner
from agents.run import RunConfig
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Shell
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExposedPortUnavailableError,
    InvalidManifestPathError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.session import SandboxSession
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from emulators import emulator_class
from emulators.harness import Emulator
from router import Event, NoProviderAvailable, Router
from router.integrations.openai_agents import (
    RouterSandboxClient,
    RouterSandboxClientOptions,
    RouterSandboxSession,
)
from tests.mcp.conftest import local_entry, vendor_entry

ROOT = Path(__file__).resolve().parents[2]
PROVIDERS = ("local", "daytona", "e2b", "modal", "runloop")
VENDORS = PROVIDERS[1:]


@pytest.fixture(scope="module")
def emulated(request: pytest.FixtureRequest) -> Iterator[Emulator | None]:
    """The provider's emulator, shared by the module's tests (None for ``local``)."""
    if request.param == "local":
        yield None
        return
    with emulator_class(request.param)() as emu:
        yield emu


@pytest.fixture
def make_router(
    emulated: Emulator | None,
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., Router]]:
    """Routers (replicas: one store) whose chain is the provider's entry, then ``local`` when
    ``fallback``; every sandbox the test left is checked for at the end."""
    chain: list[dict[str, Any]] = []
    if emulated is not None:
        entry, _ = vendor_entry(emulated)
        if emulated.name == "modal":
            for key, value in emulated.sdk_env().items():
                monkeypatch.setenv(key, value)
        chain.append(entry)
    made: list[Router] = []

    def make(*, fallback: bool = False, events: list[Event] | None = None, **kw: Any) -> Router:
        entries = [*chain, local_entry(tmp_path / "sb")] if fallback or not chain else chain
        config = {"state_url": redis_url, "key_prefix": key_prefix, "chain": entries,
                  "retry": {"attempts": 1}, **kw}  # fmt: skip
        made.append(Router.from_config(config, hooks=[] if events is None else [events.append]))
        return made[-1]

    yield make
    for router in made:
        router.close()
    if emulated is not None:
        emulated.clear_faults()
        assert emulated.alive() == [], "a sandbox outlived its test"


def _agent(model: ScriptedModel) -> SandboxAgent[Any]:
    return SandboxAgent(name="coder", model=model, instructions="Use the shell.",
                        capabilities=[Shell()])  # fmt: skip


def _shell(cmd: str, call_id: str) -> dict[str, Any]:
    return {"output": [function_call("exec_command", {"cmd": cmd}, call_id=call_id)]}


def _outputs(model: ScriptedModel) -> list[str]:
    """What each tool call gave back to the model, in order."""
    last = model.calls[-1].input
    assert isinstance(last, list)
    return [str(item["output"]) for item in last if item.get("type") == "function_call_output"]


def _run_config(router: Router, **options: Any) -> RunConfig:
    options_model = RouterSandboxClientOptions(**options)
    sandbox = SandboxRunConfig(client=RouterSandboxClient(router), options=options_model)
    return RunConfig(sandbox=sandbox, tracing_disabled=True)  # no trace export: no network


def _fired(events: list[Event], name: str) -> list[dict[str, object]]:
    return [e.fields for e in events if e.name == name]


@pytest.mark.parametrize("emulated", PROVIDERS, indirect=True, ids=lambda p: f"agents-{p}")
async def test_the_agents_tool_calls_run_in_the_routers_sandbox(
    emulated: Emulator | None, make_router: Callable[..., Router]
) -> None:
    events: list[Event] = []
    router = make_router(events=events)
    model = ScriptedModel([
        _shell("echo made > note.txt; echo $(cat note.txt) in $PWD; exit 3", "one"),
        _shell("ls; cat missing.txt", "two"),
        {"output": [assistant_message("done")]},
    ])  # fmt: skip
    result = await Runner.run(_agent(model), "go", run_config=_run_config(router))
    assert result.final_output == "done"
    first, second = _outputs(model)
    assert "Process exited with code 3" in first
    assert "made in /" in first
    assert first.rstrip().endswith("/workspace")
    assert "Process exited with code 1" in second
    assert "note.txt" in second
    [acquired] = _fired(events, "acquired")
    assert acquired["entry"] == (emulated.name if emulated else "local")
    [view] = (await router.astatus()).entries
    assert (view.used["sessions"], view.live_leases) == (1, 0)  # one unit, nothing held


def _stdin(chars: str, call_id: str) -> Any:
    """A write_stdin to the session the last tool output named (the model reads its id)."""

    def respond(call: ModelCall) -> dict[str, Any]:
        given = [i for i in call.input if i.get("type") == "function_call_output"]
        found = re.search(r"session ID (\d+)", str(given[-1]["output"]))
        assert found, given[-1]
        arguments = {"session_id": int(found.group(1)), "chars": chars, "yield_time_ms": 2000}
        return {"output": [function_call("write_stdin", arguments, call_id=call_id)]}

    return ModelStep.respond(respond)


@pytest.mark.parametrize("emulated", PROVIDERS[:-1], indirect=True, ids=lambda p: f"agents-{p}")
async def test_the_model_talks_to_a_terminal_and_not_to_a_plain_process(
    emulated: Emulator | None, make_router: Callable[..., Router]
) -> None:
    """``tty`` commands run typed into a shell on a terminal (``pty``) whose stdin the model
    writes; a plain background process refuses stdin with the SDK's own message, as on E2B."""
    router = make_router()
    tty = {"cmd": "read x; echo got-$x", "tty": True, "yield_time_ms": 1000}
    plain = {"cmd": "sleep 2; echo late", "yield_time_ms": 250}
    model = ScriptedModel([
        {"output": [function_call("exec_command", tty, call_id="one")]},
        _stdin("hello\n", "two"),
        _stdin("exit\n", "three"),
        {"output": [function_call("exec_command", plain, call_id="four")]},
        _stdin("ignored", "five"),
        {"output": [assistant_message("done")]},
    ])  # fmt: skip
    result = await Runner.run(_agent(model), "go", run_config=_run_config(router))
    assert result.final_output == "done"
    started, answered, ended, running, refused = _outputs(model)
    assert "Process running with session ID" in started
    assert "got-hello" in answered
    assert "Process exited with code 0" in ended
    assert "Process running with session ID" in running
    assert "stdin is not available for this process" in refused
    [view] = (await router.astatus()).entries
    assert view.live_leases == 0


@pytest.mark.parametrize("emulated", VENDORS, indirect=True, ids=lambda p: f"agents-{p}-failover")
async def test_the_run_fails_over_when_the_first_entry_is_down(
    emulated: Emulator, make_router: Callable[..., Router]
) -> None:
    emulated.inject("create", status=503, times=None, message="service unavailable")
    events: list[Event] = []
    router = make_router(fallback=True, events=events)
    model = ScriptedModel([_shell("echo served", "one"), {"output": [assistant_message("ok")]}])
    result = await Runner.run(_agent(model), "go", run_config=_run_config(router))
    assert result.final_output == "ok"
    assert "served" in _outputs(model)[0]
    [acquired] = _fired(events, "acquired")
    assert (acquired["entry"], acquired["failovers"]) == ("local", 1)
    assert [(f["from_entry"], f["to_entry"]) for f in _fired(events, "failover")] == [
        (emulated.name, "local")]  # fmt: skip
    assert [v.live_leases for v in (await router.astatus()).entries] == [0, 0]


@pytest.mark.parametrize("emulated", ["local", "e2b"], indirect=True, ids=lambda p: f"agents-{p}")
async def test_a_run_that_raises_leaves_nothing_alive(
    emulated: Emulator | None, make_router: Callable[..., Router]
) -> None:
    router = make_router()
    model = ScriptedModel([_shell("echo started", "one"),
                           ModelStep.raise_error(RuntimeError("the model broke"))])  # fmt: skip
    with pytest.raises(RuntimeError, match="the model broke"):
        await Runner.run(_agent(model), "go", run_config=_run_config(router))
    [view] = (await router.astatus()).entries
    assert (view.used["sessions"], view.live_leases) == (1, 0)


@pytest.mark.parametrize("emulated", PROVIDERS, indirect=True, ids=lambda p: f"agents-{p}")
async def test_the_backend_behaves_as_the_sdks_vendor_backends(
    emulated: Emulator | None, make_router: Callable[..., Router]
) -> None:
    """Exit codes, timeouts, path rules and error types as the SDK's E2B and Daytona backends
    give them; the workspace persisted as a tar stream and hydrated into another sandbox."""
    router = make_router()
    client = RouterSandboxClient(router)
    async with await client.create(options=RouterSandboxClientOptions()) as session:
        inner = session._inner
        assert isinstance(inner, RouterSandboxSession)
        ran = await session.exec("echo out; echo err >&2; exit 7")
        assert (ran.stdout, ran.stderr, ran.exit_code) == (b"out\n", b"err\n", 7)
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 5", timeout=0.5)
        await session.write(Path("src/app.py"), io.BytesIO(b"print('hi')\n"))
        assert (await session.read(Path("src/app.py"))).read() == b"print('hi')\n"
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("src/missing.py"))
        with pytest.raises(InvalidManifestPathError):
            await session.read(Path("../outside.txt"))
        with pytest.raises(ExposedPortUnavailableError):
            await session.resolve_exposed_port(8000)  # not in the options' ports
        archive = (await session.persist_workspace()).read()
    assert inner.lease.released

    async with await client.create(options=RouterSandboxClientOptions()) as other:
        await other.hydrate_workspace(io.BytesIO(archive))
        assert (await other.read(Path("src/app.py"))).read() == b"print('hi')\n"
    [view] = (await router.astatus()).entries
    assert (view.used["sessions"], view.live_leases) == (2, 0)


@pytest.mark.parametrize("emulated", ["local", "e2b", "daytona"], indirect=True,
                         ids=lambda p: f"agents-{p}")  # fmt: skip
@pytest.mark.parametrize("how", ["session", "pause"])
async def test_another_replica_resumes_the_run_on_the_same_sandbox(
    emulated: Emulator | None, make_router: Callable[..., Router], how: str, key_prefix: str
) -> None:
    """The serialized state, resumed by another router on the same store, reaches the same
    sandbox (its files as left) through a sticky session or a pause token."""
    one, two = make_router(), make_router()
    options = RouterSandboxClientOptions(
        **({"session": f"agents-{key_prefix}"} if how == "session" else {"pause_on_exit": True})
    )
    first = RouterSandboxClient(one)
    session = await first.create(options=options)
    async with session:
        await session.write(Path("state.txt"), io.BytesIO(b"step 1"))
        sandbox_id = _inner(session).lease.sandbox_id
    payload = first.serialize_session_state(session.state)

    second = RouterSandboxClient(two)
    resumed = await second.resume(second.deserialize_session_state(payload))
    async with resumed:
        assert _inner(resumed).lease.sandbox_id == sandbox_id
        assert (await resumed.read(Path("state.txt"))).read() == b"step 1"
    if how == "session":
        assert await two.aclose_session(f"agents-{key_prefix}")
    else:  # paused again at its end: the app ends it with the token
        assert resumed.state.pause_token is not None
        await (await two.aresume(resumed.state.pause_token)).release()
    [view] = (await two.astatus()).entries
    assert (view.used["sessions"], view.live_leases) == (1, 0)


@pytest.mark.parametrize("emulated", ["local"], indirect=True, ids=lambda p: f"agents-{p}")
async def test_no_provider_is_the_sdks_start_error(make_router: Callable[..., Router]) -> None:
    client = RouterSandboxClient(make_router())
    with pytest.raises(WorkspaceStartError) as refused:
        await client.create(options=RouterSandboxClientOptions(requires=("gpu",)))
    assert isinstance(refused.value.cause, NoProviderAvailable)
    assert "lacks capability gpu" in str(refused.value)


def test_bad_options_are_refused_when_made_and_never_show_an_env_value() -> None:
    with pytest.raises(ValueError, match=r"SandboxSpec\(env=\.\.\.\): 'bad name'") as refused:
        RouterSandboxClientOptions(env={"bad name": "s3cr3t"})
    assert "s3cr3t" not in str(refused.value)
    with pytest.raises(ValueError, match=r"SandboxSpec\(cpu=-1.0\): expected a number > 0"):
        RouterSandboxClientOptions(cpu=-1)


def _inner(session: SandboxSession) -> RouterSandboxSession:
    inner = session._inner
    assert isinstance(inner, RouterSandboxSession)
    return inner


class _ResponsesAPI(BaseHTTPRequestHandler):
    """OpenAI's Responses endpoint, scripted: a shell call first, then the answer it gave."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        given = [i for i in body["input"] if i.get("type") == "function_call_output"]
        if not given:
            arguments = json.dumps({"cmd": "python3 --version"})
            item = {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "exec_command",
                "arguments": arguments,
                "status": "completed",
            }
        else:
            version = re.search(r"Python \S+", given[0]["output"])
            text = version.group(0) if version else "no version"
            item = {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                 "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
        answer = json.dumps({"id": "resp_1", "object": "response", "created_at": 0,
                             "model": body["model"], "status": "completed", "output": [item],
                             "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                             "usage": usage}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_documented_example_runs_as_written(tmp_path: Path) -> None:
    """docs/frameworks.md's example, unchanged, on a machine with no cloud keys: the default
    chain serves from ``local``; the model is the SDK's OpenAI client pointed at a scripted
    Responses endpoint (``OPENAI_BASE_URL``), tracing off (no network)."""
    page = (ROOT / "docs" / "frameworks.md").read_text()
    section = page.split("## OpenAI Agents SDK", 1)[1]
    [example] = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    script = tmp_path / "example.py"
    script.write_text(example)
    for directory in ("home", "state", "tmp"):
        (tmp_path / directory).mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ResponsesAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "TMPDIR": str(tmp_path / "tmp"),
        "PYTHONPATH": str(ROOT),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    try:
        ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
    finally:
        server.shutdown()
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("Python 3."), ran.stdout
