"""The documentation is held to the code.

README.md's example runs as written against the ``local`` provider; in
README.md and every docs/ page each Python block compiles, each YAML block
loads (and one holding a ``chain`` is a valid router config), each
``sandbox-router`` command shown names a real subcommand of the CLI's parser,
and each relative link (and its ``#anchor``) resolves. The README stays a
front page: short, its fresh-machine commands as the CI and the hooks expect
them, every docs/ page linked from it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from router.cli import _parser
from router.config import load_config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_LINES = 200
VENV = "python3 -m venv .venv && . .venv/bin/activate && "
FRESH_MACHINE = [  # .ci/run and the hooks look for these, as they are
    VENV + 'pip install -e ".[all]" && sandbox-router demo',
    VENV + 'pip install -e ".[test]" && pytest',
]


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # of its first line of code, 1-based
    code: str


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text."""
    found, lang, start, code = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, code = line[3:].strip(), number + 1, []
            else:
                found.append(Block(lang, start, "\n".join(code) + "\n"))
                lang = None
        elif lang is not None:
            code.append(line)
    assert lang is None, f"a code block opened at line {start - 1} is never closed"
    return found


def prose(text: str) -> str:
    """``text`` without its fenced blocks (their lines kept, blank, for the numbering)."""
    fenced = False
    kept = []
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            kept.append("")
        else:
            kept.append("" if fenced else line)
    return "\n".join(kept)


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_python_block_compiles(page: Path) -> None:
    # compile() rather than ast.parse: the same syntax check, without building the
    # Python AST objects that CPython 3.11.7 can fail to build late in a long session.
    errors = []
    for block in blocks(page.read_text()):
        if block.lang in ("python", "py"):
            try:
                compile(block.code, f"{name(page)}:{block.line}", "exec", dont_inherit=True)
            except SyntaxError as exc:
                errors.append(f"{name(page)}:{block.line - 1 + (exc.lineno or 1)}: {exc.msg}")
    assert errors == []


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_yaml_block_loads(page: Path, tmp_path: Path) -> None:
    errors = []
    for block in blocks(page.read_text()):
        if block.lang not in ("yaml", "yml"):
            continue
        where = f"{name(page)}:{block.line}"
        try:
            documents = list(yaml.safe_load_all(block.code))
        except yaml.YAMLError as exc:
            errors.append(f"{where}: {exc}")
            continue
        if any(isinstance(doc, dict) and "chain" in doc for doc in documents):
            config = tmp_path / f"block-{block.line}.yaml"
            config.write_text(block.code)
            try:
                load_config(config, env={})
            except Exception as exc:
                errors.append(f"{where}: not a valid router config: {exc}")
    assert errors == []


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def check_command(words: list[str]) -> str | None:
    """Why ``sandbox-router <words>`` names no real command, or None when it does."""
    parser = _parser()
    while words and words[0].startswith("-"):  # the options before the command
        option = parser._option_string_actions.get(words[0].split("=")[0])
        if option is None:
            return f"no option {words[0]}"
        words = words[1 + (option.nargs != 0 and "=" not in words[0]) :]
    shown = []
    while (known := subcommands(parser)) and words:
        if words[0] not in known:
            return f"no command {' '.join([*shown, words[0]])} (known: {', '.join(known)})"
        shown.append(words[0])
        parser, words = known[words[0]], words[1:]
    return None


COMMAND = re.compile(r"(?:^|(?<=[\s(]))sandbox-router[ \t]+([^\n`#|]*)")


def commands(page: Path) -> list[tuple[int, str]]:
    """Each ``sandbox-router ...`` shown as code: in a shell block or an inline span."""
    text = page.read_text()
    shown = []
    for block in blocks(text):
        if block.lang in ("sh", "bash", "console", "shell"):
            for offset, line in enumerate(block.code.splitlines()):
                shown += [(block.line + offset, m.group(1)) for m in COMMAND.finditer(line)]
    inline = prose(text)
    for span in re.finditer(r"`([^`]+)`", inline):
        code = " ".join(span.group(1).split())
        line = inline.count("\n", 0, span.start()) + 1
        shown += [(line, m.group(1)) for m in COMMAND.finditer(code)]
    return shown


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_command_shown_is_a_real_subcommand(page: Path) -> None:
    errors = []
    for line, command in commands(page):
        why = check_command(command.split())
        if why is not None:
            errors.append(f"{name(page)}:{line}: sandbox-router {command.strip()}: {why}")
    assert errors == []


def test_the_command_check_reads_the_parser() -> None:
    assert check_command(["quota", "set", "POOL", "UNIT", "VALUE"]) is None
    assert check_command(["--log-format", "json", "exec", "--", "ls"]) is None
    assert check_command(["config", "check", "FILE"]) is None
    assert check_command(["config", "lint"]) is not None
    assert check_command(["serve"]) is not None
    shown = {command.split()[0] for _, command in commands(ROOT / "docs" / "cli.md")}
    assert shown - {"--help"} == set(subcommands(_parser())), "docs/cli.md shows every command"


def anchors(page: Path) -> set[str]:
    """The ``#anchor`` of each heading, as GitHub makes them."""
    found = set()
    for line in prose(page.read_text()).splitlines():
        if match := re.match(r"#+\s+(.*)", line):
            found.add(re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_resolves(page: Path) -> None:
    errors = []
    for match in re.finditer(r"\]\(([^)\s]+)\)", prose(page.read_text())):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            errors.append(f"{name(page)}: {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            errors.append(f"{name(page)}: {target}: no such heading")
    assert errors == []


def test_the_readme_is_a_front_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES, "move the detail to a docs/ page"
    shell = [block.code.strip() for block in blocks(text) if block.lang == "sh"]
    for command in FRESH_MACHINE:
        assert command in shell
    unlinked = [p.name for p in PAGES[1:] if f"](docs/{p.name})" not in text]
    assert unlinked == [], "every docs/ page is linked from the README"


def test_the_readme_s_framework_examples_are_the_ones_run() -> None:
    """docs/frameworks.md's examples run in tests/integrations (each against its framework's
    own agent loop); the README shows the same blocks, letter for letter."""
    section = README.read_text().split("## Use it from your agent framework", 1)[1]
    section = section.split("\n## ", 1)[0]
    shown = [b.code for b in blocks(section) if b.lang == "python"]
    run = [b.code for b in blocks((ROOT / "docs" / "frameworks.md").read_text())]
    assert len(shown) == 3
    assert [code in run for code in shown] == [True, True, True]


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    """On a machine with no cloud keys and no Redis, as a newcomer runs it: the default
    chain serves from ``local`` on the embedded SQLite store."""
    [example, *_] = [b.code for b in blocks(README.read_text()) if b.lang == "python"]
    script = tmp_path / "example.py"
    script.write_text(example)
    for directory in ("home", "state", "tmp"):
        (tmp_path / directory).mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "TMPDIR": str(tmp_path / "tmp"),
        "PYTHONPATH": str(ROOT),
    }
    ran = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("local 0 test\n2\n"), ran.stdout
    assert "b'\\x00\\x01'" in ran.stdout
    assert ran.stdout.rstrip().endswith("45")
    assert (tmp_path / "state" / "sandbox-router" / "state.db").exists()
