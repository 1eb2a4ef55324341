"""The reference pages (docs/reference/) are the code's own words: generated from it, never stale,
and nothing in the code without its entry there."""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"

_spec = importlib.util.spec_from_file_location("gen_docs_reference", ROOT / "scripts" / "gen_docs_reference.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def _sections(page: str, level: str) -> dict[str, str]:
    """The page's text under each heading of this level, by heading."""
    parts = re.split(rf"^{level} (.+)$", (REFERENCE / page).read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_reference_pages_are_up_to_date():
    stale = gen.stale_pages()
    assert not stale, f"stale reference pages {stale}: run `{gen.COMMAND}` (or make docs-ref) and commit them"


def test_every_command_and_flag_is_in_the_reference():
    text = (REFERENCE / "cli.md").read_text(encoding="utf-8")
    sections = {h.strip("`").split(" {")[0].strip("`"): body for h, body in re.findall(r"^#{2,3} (.+)\n((?:(?!^#{1,3} ).*\n?)*)", text, re.M)}
    missing = []
    for command, flags in gen.cli_flags().items():
        body = text if command == "planner" else sections.get(command)
        if body is None:
            missing.append(command)
            continue
        missing += [f"{command} {flag}" for flag in flags if flag not in ("-h", "--help") and f"`{flag}`" not in body]
    assert not missing, f"not in docs/reference/cli.md: {missing}; run `{gen.COMMAND}`"


def test_every_config_key_is_in_the_reference():
    sections = _sections("config.md", "##")
    tables = {h.split("`")[1].strip("[]") if "`" in h else "": body for h, body in sections.items()}
    missing = []
    for dotted in gen.config_keys():
        table, _, key = dotted.rpartition(".")
        if f"| `{key}` |" not in tables.get(table, ""):
            missing.append(dotted)
    assert len(gen.config_keys()) > 60
    assert not missing, f"not in docs/reference/config.md: {missing}; run `{gen.COMMAND}`"


def test_every_key_and_result_field_has_a_description():
    _, undocumented = gen.results_page()
    assert not undocumented, (
        f"result fields without a description: {undocumented}; add a comment above each (or Field(description=...))"
    )
    config = (REFERENCE / "config.md").read_text(encoding="utf-8")
    assert gen.UNDOCUMENTED not in config, "a config key has no description: add a comment above it in its model"


def test_every_error_class_says_what_to_do():
    classes = [c for root in gen._error_roots() for _, c in gen._tree(root)]
    assert len(classes) >= 15
    silent = [c.__name__ for c in classes if "What to do:" not in (inspect.getdoc(c) or "")]
    assert not silent, f"error classes whose docstring does not say what to do: {silent}"
    page = (REFERENCE / "errors.md").read_text(encoding="utf-8")
    assert all(f"## {c.__name__}\n" in page for c in classes)


def test_every_metric_is_in_the_reference():
    from planner.exporter import PlannerMetrics

    page = (REFERENCE / "metrics.md").read_text(encoding="utf-8")
    names = {m.name for m in PlannerMetrics().registry.collect()}
    assert len(names) >= 15
    assert [n for n in names if f"`{n}" not in page] == []


def test_check_mode_names_the_command_that_fixes_a_stale_page(tmp_path, monkeypatch):
    monkeypatch.setattr(gen, "OUT", tmp_path)
    (tmp_path / "cli.md").write_text("old\n", encoding="utf-8")
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def test_the_script_runs_on_its_own():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs_reference.py"), "--check"], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
