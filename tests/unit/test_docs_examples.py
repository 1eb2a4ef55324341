"""Every command the README, the docs' home, Get started and Guides pages show still works.

A code block whose title starts with "needs" (```sh title="needs a GPU"```) shows commands that
need something a test does not have (a GPU, a vLLM server, the Hugging Face Hub, a model folder):
each of its `planner` commands must still parse, flags and values, and the config file it names
must still validate; a `make` line's target must exist (those titled "needs a vLLM server" also run
against the fake server: tests/integration/test_docs_server_commands.py). Every other block's commands run here, in a
folder with the repository's prompts/ and tests/ and the input files the pages name (INPUTS), and
the output the page shows beside a command (`$ planner ...` then its lines; `...` elides) must be
in what the command prints now.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.cli import build_parser
from planner.sweep.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    *sorted((ROOT / "docs" / "get-started").glob("*.md")),
    *sorted((ROOT / "docs" / "guides").glob("*.md")),
]
# Programs of other projects that the pages show (a Ray cluster's set-up, `echo $?`); they are
# the reader's own, not checked here.
OTHER_PROGRAMS = {"ray", "pip", "docker", "kubectl", "echo"}
# The files the pages' examples read, by the name they give them: the repository's fixtures.
INPUTS = {
    "sharegpt.json": "tests/fixtures/corpus/sharegpt.json",
    "requests-log.jsonl": "tests/fixtures/corpus/chat-log.jsonl",
    "trace.jsonl": "tests/fixtures/corpus/mooncake-trace.jsonl",
}
FENCE = re.compile(r'^```(\w*)\s*(?:title="([^"]*)")?\s*$')


@dataclass
class Command:
    page: str
    line: int
    argv: list[str]
    needs: str | None
    shown_output: list[str]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.argv)}"


def _blocks(path: Path) -> list[tuple[int, str, str | None, list[str]]]:
    """(first line number, language, title, lines) of every fenced block."""
    blocks, current = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if current is None:
            m = FENCE.match(line)
            if m:
                current = (number + 1, m.group(1), m.group(2), [])
        elif line.startswith("```"):
            blocks.append(current)
            current = None
        else:
            current[3].append(line)
    assert current is None, f"{path}: a code block is not closed"
    return blocks


def _commands() -> list[Command]:
    out = []
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        for first, lang, title, lines in _blocks(path):
            needs = title if title and title.startswith("needs") else None
            i = 0
            while i < len(lines):
                line, number = lines[i], first + i
                i += 1
                if lang == "sh":
                    text = line
                elif line.startswith("$ "):
                    text = line[2:]
                else:
                    continue
                while text.rstrip().endswith("\\") and i < len(lines):
                    text = text.rstrip()[:-1] + " " + lines[i].strip()
                    i += 1
                argv = shlex.split(text, comments=True)
                if not argv:
                    continue
                shown = []
                if lang != "sh":
                    while i < len(lines) and not lines[i].startswith("$ "):
                        shown.append(lines[i])
                        i += 1
                out.append(Command(page, number, argv, needs, shown))
    return out


COMMANDS = _commands()


def test_the_pages_show_commands():
    # The extraction itself: a page rewritten into another shape must not silently check nothing.
    assert len(COMMANDS) >= 30
    assert sum(c.needs is None for c in COMMANDS) >= 3
    assert {c.argv[0] for c in COMMANDS} >= {"planner", "make"}


def _check_parses(command: Command) -> None:
    argv = command.argv
    if argv[0] == "make":
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        for target in argv[1:]:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{command}: no make target {target!r}"
        return
    if argv[0] in OTHER_PROGRAMS:
        return
    assert argv[0] == "planner", f"{command}: not a planner command; run it in a test, or add its program to OTHER_PROGRAMS"
    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{command}: does not parse (exit {exc.code}); argparse's message is above")
    config = getattr(args, "config", None)
    if config is not None and (ROOT / config).is_file():
        load_settings(ROOT / config)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.needs], ids=str)
def test_marked_commands_still_parse(command: Command):
    _check_parses(command)


@pytest.mark.parametrize("command", [c for c in COMMANDS if not c.needs], ids=str)
def test_unmarked_commands_run_and_print_what_the_page_shows(command: Command, tmp_path: Path):
    _check_parses(command)
    if command.argv[0] == "make":
        return  # the set-up targets: `make test` is what CI runs, so its target existing is the check here
    assert command.argv[0] == "planner", f"{command}: only planner commands run here; mark the block with what it needs"
    # In a folder of its own, with the repository's prompts/ and tests/ and the inputs the pages name.
    work = tmp_path / "work"
    work.mkdir()
    for folder in ("prompts", "tests"):
        (work / folder).symlink_to(ROOT / folder)
    for name, fixture in INPUTS.items():
        shutil.copy(ROOT / fixture, work / name)
    done = subprocess.run(
        [sys.executable, "-m", "planner", *command.argv[1:]],
        cwd=work, capture_output=True, text=True, timeout=100,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr}"
    printed = {line.rstrip() for line in done.stdout.splitlines()}
    missing = [line for line in command.shown_output if line.strip() and line.strip() != "..." and line.rstrip() not in printed]
    assert not missing, f"{command}: the page shows lines the command no longer prints:\n" + "\n".join(missing) + f"\n--- it printed:\n{done.stdout}"


TOML_FILES = [
    (str(path.relative_to(ROOT)), first, "\n".join(lines))
    for path in PAGES
    for first, lang, _, lines in _blocks(path)
    if lang == "toml" and any(line.startswith("[server]") for line in lines)
]


@pytest.mark.parametrize(("page", "line", "text"), TOML_FILES, ids=[f"{p}:{n}" for p, n, _ in TOML_FILES])
def test_sweep_files_shown_on_the_pages_validate(page: str, line: int, text: str, tmp_path: Path):
    # A whole sweep file shown as an example must load as written: every key known, every value valid.
    path = tmp_path / "sweep.toml"
    path.write_text(text, encoding="utf-8")
    load_settings(path)


def test_the_pages_show_a_sweep_file():
    assert TOML_FILES, "no sweep file ([server] table) found in a ```toml block of the pages"
