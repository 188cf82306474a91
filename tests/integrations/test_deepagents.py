"""`RouterSandbox` under deepagents' own agent loop (``create_deep_agent``), with a chat model
that replays tool calls, on `local` and each vendor's emulator; and held to what deepagents'
vendor backends (langchain-e2b, -modal, -daytona, -runloop) give the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "deepagents", reason='needs deepagents (pip install "sandbox-router[deepagents]")'
)

from deepagents import create_deep_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from router import LeaseError
from router.integrations.deepagents import RouterSandbox
from tests.integrations.conftest import PROVIDERS, VENDORS, MakeRouter, doc_example, gone, used

Step = AIMessage | Callable[[list[BaseMessage]], AIMessage]


class Replay(BaseChatModel):
    """A chat model that answers with the next scripted message (or what a step makes of
    the conversation so far), recording each conversation it was shown."""

    steps: list[Any]
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "replay"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Replay:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        step = self.steps[len(self.seen) - 1]
        made = step(messages) if callable(step) else step
        return ChatResult(generations=[ChatGeneration(message=made)])


def call(name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{name}"}])


def session() -> Replay:
    """One session's tool calls: the model learns the home directory from a command, then
    writes, reads, edits, searches and lists files there, and runs a command on them."""

    def at(name: str, **args: Any) -> Step:
        return lambda m: call(name, **{k: v.format(home=_home(m)) for k, v in args.items()})

    return Replay(
        steps=[
            call("execute", command="pwd"),
            at("write_file", file_path="{home}/notes/a.txt", content="alpha\nbeta\n"),
            at("read_file", file_path="{home}/notes/a.txt"),
            at("edit_file", file_path="{home}/notes/a.txt", old_string="beta", new_string="gamma"),
            at("grep", pattern="gamma", path="{home}/notes", output_mode="content"),
            at("glob", pattern="*.txt", path="{home}/notes"),
            at("ls", path="{home}/notes"),
            call("execute", command="cat notes/a.txt; echo oops >&2; exit 3"),
            AIMessage(content="done"),
        ]
    )


def _home(messages: list[BaseMessage]) -> str:
    first = next(m for m in messages if isinstance(m, ToolMessage))
    return str(first.content).splitlines()[0]


def tool_outputs(model: Replay) -> list[str]:
    return [str(m.content) for m in model.seen[-1] if isinstance(m, ToolMessage)]


def check_session(model: Replay) -> None:
    """Every tool call's result came back to the model, from the sandbox."""
    home = _home(model.seen[-1])
    pwd, wrote, read, edited, grep, glob, ls, ran = tool_outputs(model)
    assert home.startswith("/")
    assert "exit code 0" in pwd
    assert f"{home}/notes/a.txt" in wrote
    assert "alpha\nbeta" in read.replace("     ", "")
    assert "Successfully replaced 1" in edited
    assert "a.txt" in grep
    assert "gamma" in grep
    assert "a.txt" in glob
    assert "a.txt" in ls
    assert ran.startswith("alpha\ngamma\n\noops")
    assert "exit code 3" in ran


@pytest.mark.parametrize("emulated", PROVIDERS, indirect=True, ids=lambda p: f"deepagents-{p}")
def test_the_agents_tool_calls_run_in_the_routers_sandbox(
    emulated: tuple[str, Any], make_router: MakeRouter, tmp_path: Path
) -> None:
    name, _ = emulated
    router = make_router()
    model = session()
    with RouterSandbox(router) as backend:
        agent = create_deep_agent(model=model, backend=backend)
        out = agent.invoke({"messages": [{"role": "user", "content": "take notes"}]})
        assert (backend.lease.entry, backend.lease.failovers) == (name, [])
        sandbox_id = backend.id
    assert out["messages"][-1].content == "done"
    check_session(model)
    assert used(router, name)["sessions"] == 1
    assert used(router, name)["concurrent"] == 0
    assert gone(tmp_path, sandbox_id)


@pytest.mark.parametrize("emulated", PROVIDERS, indirect=True, ids=lambda p: f"deepagents-{p}")
async def test_an_async_run_that_raises_leaves_nothing_alive(
    emulated: tuple[str, Any], make_router: MakeRouter, tmp_path: Path
) -> None:
    name, _ = emulated
    router = make_router()

    def broken(messages: list[BaseMessage]) -> AIMessage:
        raise RuntimeError("the model's service went away")

    model = Replay(steps=[call("execute", command="echo $((6 * 7))"), broken])
    backend = RouterSandbox(router)
    ids: list[str] = []

    async def run() -> None:  # the model's error leaves the backend's block
        async with backend:
            ids.append(backend.id)
            agent = create_deep_agent(model=model, backend=backend)
            await agent.ainvoke({"messages": [{"role": "user", "content": "compute"}]})

    with pytest.raises(RuntimeError, match="went away"):
        await run()
    [sandbox_id] = ids
    assert tool_outputs(model)[0].startswith("42\n")
    assert used(router, name)["sessions"] == 1
    assert used(router, name)["concurrent"] == 0
    assert gone(tmp_path, sandbox_id)
    with pytest.raises(LeaseError, match="enter it first"):
        backend.execute("true")


@pytest.mark.parametrize(
    "emulated", VENDORS, indirect=True, ids=lambda p: f"deepagents-{p}-failover"
)
def test_the_run_fails_over_when_the_first_entry_is_down(
    emulated: tuple[str, Any], make_router: MakeRouter, tmp_path: Path
) -> None:
    name, _ = emulated
    router = make_router(failover=True)
    model = session()
    with RouterSandbox(router) as backend:
        create_deep_agent(model=model, backend=backend).invoke(
            {"messages": [{"role": "user", "content": "take notes"}]}
        )
        assert (backend.lease.entry, backend.lease.failovers) == ("next", [name])
        sandbox_id = backend.id
    check_session(model)
    assert used(router, name)["sessions"] == 0
    assert used(router, "next")["sessions"] == 1
    assert gone(tmp_path, sandbox_id)


@pytest.mark.parametrize("emulated", PROVIDERS, indirect=True, ids=lambda p: f"deepagents-{p}")
async def test_what_the_model_sees_matches_the_vendor_backends(
    emulated: tuple[str, Any], make_router: MakeRouter
) -> None:
    """Exit codes, stdout then stderr, timeouts (124), and the per-file errors of
    langchain-e2b / langchain-modal: relative path, missing file, directory."""
    router = make_router()
    async with router.aacquire() as lease:
        backend = RouterSandbox(lease)  # the app's lease: the backend leaves it live
        home = (await backend.aexecute("pwd")).output.strip()
        ran = await backend.aexecute("echo out; echo err >&2; exit 7")
        # stdout, a newline, stderr: as langchain-e2b, -modal and -runloop join them
        assert (ran.output, ran.exit_code, ran.truncated) == ("out\n\nerr\n", 7, False)
        assert (await backend.aexecute("echo err >&2")).output == "err\n"
        slow = await backend.aexecute("echo started; sleep 5", timeout=1)
        assert slow.exit_code == 124
        assert slow.output.startswith("Command timed out after 1 seconds")
        with pytest.raises(ValueError, match="non-negative"):
            await backend.aexecute("true", timeout=-1)

        up = await backend.aupload_files(
            [(f"{home}/d/x.bin", b"\x00\xff"), ("rel.txt", b"r"), (f"{home}/d", b"dir")]
        )
        assert [u.error for u in up] == [None, "invalid_path", "is_directory"]
        down = await backend.adownload_files(
            [f"{home}/d/x.bin", "rel.txt", f"{home}/nope", f"{home}/d"]
        )
        assert [(d.content, d.error) for d in down] == [
            (b"\x00\xff", None),
            (None, "invalid_path"),
            (None, "file_not_found"),
            (None, "is_directory"),
        ]
        sync = backend.download_files([f"{home}/d/x.bin", f"{home}/nope"])
        assert [(d.content, d.error) for d in sync] == [
            (b"\x00\xff", None),
            (None, "file_not_found"),
        ]
        assert backend.execute("exit 5").exit_code == 5
        assert backend.id == lease.sandbox_id
    assert lease.released


def test_the_docs_example_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Replay(steps=[call("execute", command="ls ~ | wc -l"), AIMessage(content="0 files")])
    exec(doc_example("LangChain Deep Agents", monkeypatch), {"model": model})
    assert capsys.readouterr().out == "local 0 files\n"
    assert tool_outputs(model)[0].startswith("0\n")
