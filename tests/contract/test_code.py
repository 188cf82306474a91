"""The code interpreter (`Sandbox.run_code` in Python, `code_context`): state kept between
cells and across a failed one, independent contexts, rich results, interrupts and restarts,
on every provider: E2B's and Daytona's own interpreters, the router's kernel elsewhere."""

from __future__ import annotations

import signal
import time

import pytest

from providers.capabilities import Capability
from providers.errors import SandboxError
from tests.contract.conftest import Backend


async def test_state_survives_cells_and_a_failed_one(backend: Backend) -> None:
    assert Capability.STATEFUL_CODE in backend.provider.capabilities
    sbx = await backend.create(template=backend.code_template, env={"GLOBAL": "g"})
    try:
        first = await sbx.run_code("import os\nx = 41\nos.makedirs('work', exist_ok=True)")
        assert (first.stateful, first.restarted, first.error, first.results) == (
            True,
            False,
            None,
            (),
        )
        failed = await sbx.run_code("print('before')\nos.chdir('work')\n1 / 0")
        assert (failed.exit_code, failed.ok, failed.stdout) == (1, False, "before\n")
        assert failed.error is not None
        assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
        assert failed.error == "ZeroDivisionError: division by zero"
        assert "1 / 0" in failed.error.traceback
        kept = await sbx.run_code(
            "print(os.environ['GLOBAL'], os.path.basename(os.getcwd()))\nx + 1"
        )
        assert (kept.stdout, kept.text, kept.error, kept.stateful) == ("g work\n", "42", None, True)
        syntax = await sbx.run_code("def broken(:")
        assert syntax.error is not None
        assert syntax.error.name == "SyntaxError"
        assert (await sbx.run_code("x")).text == "41"
    finally:
        await sbx.kill()


async def test_env_is_set_for_one_call(backend: Backend) -> None:
    sbx = await backend.create(template=backend.code_template)
    try:
        code = "import os\nos.environ.get('ONCE', 'unset')"
        assert (await sbx.run_code(code, env={"ONCE": "set"})).text == "set"
        assert (await sbx.run_code(code)).text == "unset"
    finally:
        await sbx.kill()


async def test_contexts_do_not_see_each_other(backend: Backend) -> None:
    sbx = await backend.create(template=backend.code_template)
    try:
        await sbx.run(["mkdir", "-p", "placed"])
        one = await sbx.code_context()
        two = await sbx.code_context(cwd=f"{backend.home}/placed")
        assert (one.language, one.id != two.id) == ("python", True)
        await sbx.run_code("x = 'default'")
        await sbx.run_code("x = 'one'", context=one)
        assert (await sbx.run_code("x", context=one)).text == "one"
        unseen = await sbx.run_code("x", context=two)
        assert unseen.error is not None
        assert (unseen.error.name, unseen.error.value) == ("NameError", "name 'x' is not defined")
        # The directory as a command started there names it: without bubblewrap a `local`
        # sandbox's processes see the host's path for it (and no vendor path in their text).
        placed = (await sbx.run("pwd", cwd=f"{backend.home}/placed")).stdout.strip()
        assert placed.endswith("/placed")
        assert (await sbx.run_code("import os; os.getcwd()", context=two)).text == placed
        assert (await sbx.run_code("x")).text == "default"
        await sbx.remove_code_context(one)
        with pytest.raises(SandboxError):
            await sbx.run_code("x", context=one)
        assert (await sbx.run_code("x", context=two)).error is not None
    finally:
        await sbx.kill()


async def test_the_last_expression_is_the_main_result(backend: Backend) -> None:
    sbx = await backend.create(template=backend.code_template)
    try:
        ran = await sbx.run_code("print('out')\nvalue = [1, 2]\nvalue + [3]")
        assert ran.stdout == "out\n"
        (main,) = ran.results
        assert (main.is_main_result, main.text, main.formats()) == (True, "[1, 2, 3]", ["text"])
        assert ran.text == "[1, 2, 3]"
        assert (await sbx.run_code("'quoted'")).text == "quoted"  # as E2B gives a string
        assert (await sbx.run_code("None")).results == ()
        assert (await sbx.run_code("y = 1")).text is None
        html = await sbx.run_code(
            "class Table:\n"
            "    def _repr_html_(self):\n"
            "        return '<table></table>'\n"
            "    def __repr__(self):\n"
            "        return 'Table()'\n"
            "Table()"
        )
        assert (html.text, html.results[0].html) == ("Table()", "<table></table>")
    finally:
        await sbx.kill()


async def test_a_figure_comes_back_as_png(backend: Backend) -> None:
    sbx = await backend.create(template=backend.code_template)
    try:
        if not (await sbx.run(["python3", "-c", "import matplotlib"])).ok:
            pytest.skip("the sandbox's python3 has no matplotlib")
        shown = await sbx.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
        )
        (figure,) = shown.results
        assert figure.png is not None
        assert figure.png.startswith(b"\x89PNG\r\n\x1a\n")
        assert not figure.is_main_result
        left_open = await sbx.run_code("plt.figure()\nplt.plot([2, 1])\nprint('drawn')")
        assert left_open.stdout == "drawn\n"
        assert [r.png is not None for r in left_open.results] == [True]
    finally:
        await sbx.kill()


async def test_a_timeout_interrupts_the_cell_and_keeps_the_state(backend: Backend) -> None:
    sbx = await backend.create(template=backend.code_template)
    try:
        await sbx.run_code("count = 0")
        started = time.monotonic()
        looped = await sbx.run_code("while True:\n    count += 1", timeout=1)
        assert time.monotonic() - started < 10
        assert (looped.timed_out, looped.ok, looped.exit_code) == (True, False, -1)
        assert looped.error is not None
        assert looped.error.name == "TimeoutError"
        after = await sbx.run_code("count > 0", timeout=30)
        assert (after.text, after.stateful, after.restarted) == ("True", True, False)
    finally:
        await sbx.kill()


async def test_a_kernel_started_by_a_process_ignoring_sigint_is_still_interrupted(
    backend: Backend,
) -> None:
    """An app run as a shell's background job (``cmd &``, ``nohup``) ignores SIGINT, and
    its children inherit that: the kernel must still take its interrupt."""
    sbx = await backend.create(template=backend.code_template)
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        await sbx.run_code("count = 0")  # the kernel starts here
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        looped = await sbx.run_code("while True:\n    count += 1", timeout=1)
        assert looped.timed_out
        after = await sbx.run_code("count > 0", timeout=30)
        assert (after.text, after.stateful, after.restarted) == ("True", True, False)
    finally:
        await sbx.kill()


async def test_a_killed_kernel_is_restarted_and_says_its_state_is_lost(backend: Backend) -> None:
    sbx = await backend.create(template=backend.code_template)
    try:
        await sbx.run_code("x = 1")
        await backend.kill_kernel(sbx)
        lost = await sbx.run_code("x", timeout=30)
        assert lost.restarted is True
        assert lost.error is not None
        assert lost.error.name == "NameError"
        again = await sbx.run_code("x = 2\nx")
        assert (again.text, again.restarted, again.stateful) == ("2", False, True)
    finally:
        await sbx.kill()
