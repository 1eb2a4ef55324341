"""replay/'s stages, read from its source: data flows corpus -> load -> client -> prefix -> server ->
SLOs -> step -> search -> runner (ARCHITECTURE.md), and imports follow it. A module may import
from its own stage and the ones before it, never from a later one; the shared schema at replay/'s
top level imports no stage at all. test_imports.py checks circles; this checks direction."""

from __future__ import annotations

from tests.unit.test_imports import ROOT, _imports

# In flow order. The shared modules come first: every stage may use them.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("shared", (
        "replay", "replay.errors", "replay.atomic", "replay.model", "replay.records", "replay.identity", "replay.results",
    )),
    ("stats", ("replay.stats",)),
    ("corpus", ("replay.corpus",)),
    ("load", ("replay.load",)),
    ("client", ("replay.client",)),
    ("prefix", ("replay.prefix",)),
    ("server", ("replay.server",)),
    ("slo", ("replay.slo",)),
    ("step", ("replay.step",)),
    ("search", ("replay.search",)),
    ("run", ("replay.run",)),
]


def stage_of(module: str) -> int | None:
    """The index in STAGES of a replay module's stage (None outside replay/)."""
    for i, (_, prefixes) in enumerate(STAGES):
        if any(module == p or (i > 0 and module.startswith(p + ".")) for p in prefixes):
            return i
    return None


def later_imports(imports: dict[str, list[tuple[str, list[str]]]]) -> list[str]:
    """Every import, by a replay module, of a module in a later stage than its own."""
    wrong = []
    for module, deps in sorted(imports.items()):
        here = stage_of(module)
        if here is None:
            continue
        for dep, _ in deps:
            there = stage_of(dep)
            if there is not None and there > here:
                wrong.append(f"{module} ({STAGES[here][0]}) imports {dep} ({STAGES[there][0]})")
    return wrong


def test_every_replay_module_has_a_stage():
    modules = [m for m in _imports() if m.split(".")[0] == "replay"]
    assert [m for m in modules if stage_of(m) is None] == []
    # Every stage is a package with a docstring that says its job.
    for name, prefixes in STAGES[1:]:
        init = ROOT / prefixes[0].replace(".", "/") / "__init__.py"
        assert init.read_text().startswith('"""'), f"{name}: {init} has no docstring"


def test_no_import_runs_against_the_flow():
    assert later_imports(_imports()) == []


def test_the_check_catches_an_import_against_the_flow():
    # A step module importing the search, and the shared schema importing a stage: both fail.
    imports = {
        "replay.step.run": [("replay.search.policy", ["next_probe"])],
        "replay.results": [("replay.corpus.jsonl", ["Corpus"])],
        "replay.search.policy": [("replay.step.window", ["Window"]), ("replay.results", ["StepResult"])],
    }
    assert later_imports(imports) == [
        "replay.results (shared) imports replay.corpus.jsonl (corpus)",
        "replay.step.run (step) imports replay.search.policy (search)",
    ]
