"""report.html: the same content as report.md, escaped, with each plot beside its table.

The browser's view of the page (no console error, no request, screenshots) is
tests/integration/test_report_browser.py; these check the HTML itself, without plots drawn.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.report import html, markdown
from planner.report.fleet import plan_fleet
from planner.report.load import load_results
from planner.report.view import ReportData, build

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"


def _data(kind: str) -> ReportData:
    return build(*load_results(FIXTURES / kind))


def _fake_pngs(names: list[str]) -> dict[str, bytes]:
    return {name: name.encode() for name in names}


@pytest.mark.parametrize("kind", ["sweep", "replay"])
def test_every_markdown_table_row_and_section_is_in_the_page(kind: str) -> None:
    data = _data(kind)
    plan = plan_fleet(data.points, target_rps=20.0, target_concurrency=None)
    page = html.render(data, plan, {})
    sections = markdown.sections(data, plan)
    md_rows = sum(1 for _, lines in sections for line in lines if line.startswith("|") and not line.startswith("|---"))
    assert page.count("<tr>") == md_rows
    assert re.findall(r'<section id="(\w+)"', page) == [key for key, _ in sections]
    # Nothing the page could fetch or run.
    assert "<script" not in page and "src=\"http" not in page and "href=\"http" not in page
    assert html.CSP in page


def test_text_from_the_results_is_escaped() -> None:
    data = _data("replay")
    page = html.render(ReportData(**{**data.__dict__, "model": "<img src=x onerror=alert(1)>"}), None, {})
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_inline_code_is_literal_and_bold_is_not() -> None:
    assert html.inline("**a** `x**y**<z>` b&c") == "<strong>a</strong> <code>x**y**&lt;z&gt;</code> b&amp;c"


def test_a_pipe_inside_a_cell_stays_in_its_cell() -> None:
    (kind, table), = html.blocks(markdown.table(["a", "b"], [("x|y", "z")]))
    assert kind == "table" and "<td>x|y</td><td>z</td>" in table


def test_step_verdicts_are_coloured_by_their_first_word_whatever_it_is() -> None:
    lines = markdown.table(["load", "SLOs"], [("1", "pass"), ("2", "fail: ttft_p99_ms"), ("3", "unresolved: itl_p99_ms")])
    (_, table), = html.blocks(lines)
    assert '<td class="verdict-pass">pass</td>' in table
    assert '<td class="verdict-fail">fail: ttft_p99_ms</td>' in table
    assert '<td class="verdict-other">unresolved: itl_p99_ms</td>' in table


def test_each_points_latency_plot_sits_with_its_own_steps_table() -> None:
    data = _data("sweep")
    measured = [p for p in data.points if p.steps]
    names = [f"latency-{p.id}.png" for p in measured] + ["throughput.png", "safe-concurrency-heatmap.png"]
    page = html.render(data, None, _fake_pngs(names))
    steps = page[page.index('<section id="steps"'):]
    steps = steps[:steps.index("</section>")]
    for p in measured:
        group = steps[steps.index(f"<h3><code>{p.id}</code></h3>"):]
        nxt = group.find("<h3>", 1)
        group = group[: nxt if nxt != -1 else len(group)]
        assert f"<figcaption>latency-{p.id}.png</figcaption>" in group, p.id
    # The heatmap, which marks the recommended point, sits beside the recommendation.
    first = page[page.index('<section id="recommendation"'):]
    assert first.index("safe-concurrency-heatmap.png") < first.index("</section>")
    # Every plot once, none left over for a catch-all section.
    assert all(page.count(f"<figcaption>{n}</figcaption>") == 1 for n in names)
    assert 'id="plots"' not in page


def test_a_plot_no_section_claims_still_appears() -> None:
    page = html.render(_data("replay"), None, _fake_pngs(["new-kind-of-plot.png"]))
    assert '<section id="plots">' in page and "new-kind-of-plot.png" in page


def test_no_recommendation_is_boxed_as_such() -> None:
    data = _data("replay")
    assert '<section id="recommendation" class="recommendation">' in html.render(data, None, {})
    page = html.render(ReportData(**{**data.__dict__, "best_id": None}), None, {})
    assert '<section id="recommendation" class="recommendation none">' in page
    assert "No configuration met the SLOs" in page
