"""`RouterExecutor` under smolagents' own agent loop (``CodeAgent``), with a model that
replays code steps, on `local` and each vendor's emulator (E2B's code interpreter template:
E2B's own kernel); and held to what smolagents' ``E2BExecutor`` gives the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "smolagents", reason='needs smolagents (pip install "sandbox-router[smolagents]")'
)

from smolagents import CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.utils import AgentError

from router import LeaseError
from router.integrations.smolagents import RouterExecutor
from tests.integrations.conftest import (
    CODE_TEMPLATE,
    PROVIDERS,
    VENDORS,
    MakeRouter,
    doc_example,
    gone,
    used,
)

QUIET = AgentLogger(LogLevel.OFF)


class Replay(Model):
    """A model whose every answer is the next scripted code step, recording what it was shown."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="replay")
        self.steps = steps
        self.seen: list[list[Any]] = []

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        self.seen.append(list(messages))
        step = self.steps[len(self.seen) - 1]
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=f"Thought: next.\n<code>\n{step}\n</code>"
        )


def observations(model: Replay) -> list[str]:
    """What the agent told the model after each step (observations and errors)."""
    told = []
    for message in model.seen[-1]:
        if message.role in (MessageRole.TOOL_RESPONSE, "tool-response"):
            told.append(" ".join(str(part.get("text", "")) for part in message.content))
    return told


STEPS = [
    "import os\nrows = [3, 4]\nprint('cwd', os.getcwd())",
    "total = sum(rows)\ntotal * 10",  # rows from the step before: the kernel kept it
    "missing_name + 1",
    "final_answer({'total': total, 'rows': rows})",
]


def check_run(model: Replay, answer: Any) -> None:
    first, second, failed = observations(model)
    assert "cwd /" in first
    assert "Last output from code snippet:\n70" in second
    assert "NameError" in failed
    assert "missing_name" in failed
    assert answer == {"total": 7, "rows": [3, 4]}


@pytest.mark.parametrize("emulated", PROVIDERS, indirect=True, ids=lambda p: f"smolagents-{p}")
def test_the_agents_code_runs_in_the_routers_sandbox(
    emulated: tuple[str, Any], make_router: MakeRouter, tmp_path: Path
) -> None:
    name, _ = emulated
    router = make_router(template=CODE_TEMPLATE.get(name))
    model = Replay(STEPS)
    executor = RouterExecutor(router, logger=QUIET)
    with CodeAgent(tools=[], model=model, executor=executor, verbosity_level=LogLevel.OFF) as agent:
        assert (executor.lease.entry, executor.lease.failovers) == (name, [])
        sandbox_id = executor.lease.sandbox_id
        answer = agent.run("add the rows up")
    check_run(model, answer)
    assert used(router, name)["sessions"] == 1
    assert used(router, name)["concurrent"] == 0
    assert gone(tmp_path, sandbox_id)
    with pytest.raises(LeaseError):
        executor.run_code_raise_errors("1")


@pytest.mark.parametrize(
    "emulated", VENDORS, indirect=True, ids=lambda p: f"smolagents-{p}-failover"
)
def test_the_run_fails_over_when_the_first_entry_is_down(
    emulated: tuple[str, Any], make_router: MakeRouter, tmp_path: Path
) -> None:
    name, _ = emulated
    router = make_router(failover=True, template=CODE_TEMPLATE.get(name))
    model = Replay(STEPS)
    executor = RouterExecutor(router, logger=QUIET)
    with CodeAgent(tools=[], model=model, executor=executor, verbosity_level=LogLevel.OFF) as agent:
        assert (executor.lease.entry, executor.lease.failovers) == ("next", [name])
        sandbox_id = executor.lease.sandbox_id
        answer = agent.run("add the rows up")
    check_run(model, answer)
    assert (used(router, name)["sessions"], used(router, "next")["sessions"]) == (0, 1)
    assert gone(tmp_path, sandbox_id)


class Broken(Model):
    def __init__(self) -> None:
        super().__init__(model_id="broken")

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        raise KeyboardInterrupt  # smolagents turns an Exception into a step error; this ends it


@pytest.mark.parametrize(
    "emulated", ["local", "e2b"], indirect=True, ids=lambda p: f"smolagents-{p}"
)
def test_a_run_that_raises_leaves_nothing_alive(
    emulated: tuple[str, Any], make_router: MakeRouter, tmp_path: Path
) -> None:
    name, _ = emulated
    router = make_router(template=CODE_TEMPLATE.get(name))
    executor = RouterExecutor(router, logger=QUIET)
    sandbox_id = executor.lease.sandbox_id

    def run() -> None:  # the model's interrupt leaves the agent's block
        with CodeAgent(
            tools=[], model=Broken(), executor=executor, verbosity_level=LogLevel.OFF
        ) as agent:
            agent.run("anything")

    with pytest.raises(KeyboardInterrupt):
        run()
    assert used(router, name) == {**used(router, name), "sessions": 1, "concurrent": 0}
    assert gone(tmp_path, sandbox_id)


@pytest.mark.parametrize("emulated", PROVIDERS, indirect=True, ids=lambda p: f"smolagents-{p}")
def test_what_the_agent_gets_matches_e2b_executor(
    emulated: tuple[str, Any], make_router: MakeRouter
) -> None:
    """Output, logs and errors as ``E2BExecutor`` gives them; pip for a distribution the
    sandbox lacks, none for one it has; the app's own lease left live."""
    name, _ = emulated
    router = make_router(template=CODE_TEMPLATE.get(name))
    with router.acquire(requires=("run_code.stateful",)) as lease:
        executor = RouterExecutor(lease, ["pip"], logger=QUIET, timeout=30)
        ran = executor("print('hi')\n'text'")
        assert (ran.output, ran.logs, ran.is_final_answer) == ("text", "hi\n", False)
        assert executor("x = 1").output is None
        with pytest.raises(
            AgentError, match=r"(?s)Executing code yielded an error:\nValueError\nbad"
        ):
            executor("raise ValueError('bad')")
        executor.timeout = 2  # the other cells get time to spare on a loaded machine
        with pytest.raises(AgentError, match=r"(TimeoutError|KeyboardInterrupt)"):
            executor("import time\ntime.sleep(10)")
        executor.timeout = 30
        assert executor("x + 1").output in (2, "2")  # the kernel kept x through the timeout
        executor.cleanup()
        assert lease.sandbox.run("true").exit_code == 0  # still the app's


def test_the_docs_example_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Replay(["a, b = 0, 1\nfor _ in range(20):\n    a, b = b, a + b", "final_answer(a)"])
    exec(doc_example("smolagents", monkeypatch), {"model": model})
    assert "local 6765" in capsys.readouterr().out.splitlines()
