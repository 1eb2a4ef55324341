"""report.html: the report as one page a browser opens, for people who will not run the planner.

The content is report.md's: markdown.sections() gives each section's lines, and this module turns
the few forms they use (headings, tables, bullet lists, paragraphs, **bold** and `code`) into HTML,
so a section added to the markdown appears here without a second copy of its wording. What HTML
adds is layout: the recommendation first in a box, a table of contents, wide tables that scroll
on their own, and each plot beside the table it illustrates, embedded as a data: URI.

The page is self-contained: no script, no font or stylesheet from elsewhere, and a
Content-Security-Policy that lets it load nothing but its own inline style and images.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence

from planner.report import markdown
from planner.report.fleet import FleetPlan
from planner.report.pass_plots import pass_plot_name
from planner.report.plots import point_plot_name
from planner.report.view import ReportData

HTML_FILE = "report.html"

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
:root { --ink: #1d2430; --muted: #5b6575; --line: #d8dde6; --band: #f4f6f9; --accent: #1f5fbf;
        --pass: #1e7b34; --fail: #b3261e; --other: #8a5a00; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1500px; margin: 0 auto; padding: 20px 28px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 16px; margin: 20px 0 8px; }
h3 code { font-size: 15px; }
p, li { max-width: 100ch; }
.source { color: var(--muted); margin: 0 0 12px; }
code { font: 0.87em/1.3 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; background: var(--band);
       padding: 1px 4px; border-radius: 3px; overflow-wrap: anywhere; }
nav { font-size: 14px; color: var(--muted); margin: 8px 0 4px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 14px; white-space: nowrap; }
.recommendation { border: 2px solid var(--accent); background: #f3f7fd; border-radius: 8px;
                  padding: 4px 20px 10px; margin-top: 12px; }
.recommendation.none { border-color: var(--fail); background: #fdf3f2; }
.recommendation h2 { border: none; margin-top: 12px; }
.recommendation li { margin: 3px 0; }
.recommendation .with-plots { flex-wrap: nowrap; }
.recommendation .with-plots > .tables { flex: 1 1 auto; }
.recommendation figure { flex: 0 0 460px; margin-bottom: 8px; }
@media (max-width: 1100px) { .recommendation .with-plots { flex-wrap: wrap; } }
.interrupted { border-left: 4px solid var(--fail); padding: 4px 12px; background: #fdf3f2; }
.scroll { overflow-x: auto; margin: 4px 0 12px; border: 1px solid var(--line); border-radius: 4px;
          width: fit-content; max-width: 100%; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { padding: 5px 9px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--band); font-weight: 600; position: sticky; top: 0; }
td { max-width: 46ch; }
tbody tr:nth-child(even) td { background: #fafbfc; }
td.verdict-pass { color: var(--pass); font-weight: 600; }
td.verdict-fail { color: var(--fail); font-weight: 600; }
td.verdict-other { color: var(--other); font-weight: 600; }
td code { white-space: nowrap; overflow-wrap: normal; }
/* A plot sits beside its table when both fit across the window, below it when they do not. */
.with-plots { display: flex; flex-wrap: wrap; gap: 12px 24px; align-items: flex-start; }
.with-plots > .tables { flex: 0 1 auto; max-width: 100%; min-width: 0; }
figure { margin: 0; flex: 1 1 440px; max-width: 640px; }
figure img { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { font-size: 12px; color: var(--muted); }
@media print {
  body { font-size: 11px; }
  main { max-width: none; padding: 0; }
  nav { display: none; }
  .scroll { overflow: visible; border: none; }
  table { font-size: 9px; width: 100%; }
  td { max-width: none; }
  th, td { padding: 2px 4px; }
  td code { white-space: normal; overflow-wrap: anywhere; }
  th { position: static; }
  h2, h3 { break-after: avoid; }
  figure, tr, .recommendation { break-inside: avoid; }
  figure { flex-basis: 100%; max-width: 16cm; }
}
"""

SECTION_TITLES = {
    "recommendation": "Recommendation",
    "slo": "SLOs",
    "fleet": "Fleet sizing",
    "cost": "Cost",
    "points": "Every point",
    "gpu_models": "By GPU model",
    "nodes": "Across nodes",
    "answers": "How points were answered",
    "failures": "Failures",
    "measured_vs_estimated": "Measured vs estimated",
    "steps": "Steps",
    "sessions": "Sessions",
    "server": "Server view",
}


# --- the markdown forms report.md uses, as HTML -----------------------------------------------

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def inline(text: str) -> str:
    """Escape the text, then turn `code` and **bold** into elements (code first: it is literal)."""
    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(_BOLD.sub(r"<strong>\1</strong>", html.escape(text[last:match.start()], quote=False)))
        out.append(f"<code>{html.escape(match[1], quote=False)}</code>")
        last = match.end()
    out.append(_BOLD.sub(r"<strong>\1</strong>", html.escape(text[last:], quote=False)))
    return "".join(out)


def _cells(row: str) -> list[str]:
    # markdown.table() escapes a pipe inside a cell as \|.
    inner = row.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _verdict_class(header: str, cell: str) -> str:
    """A step's SLO cell, coloured by its verdict word, whatever that word is."""
    if header != "SLOs" or not cell:
        return ""
    word = re.match(r"[a-z]+", cell)
    kind = word[0] if word and word[0] in ("pass", "fail") else "other"
    return f' class="verdict-{kind}"'


def _table(lines: Sequence[str]) -> str:
    header = _cells(lines[0])
    rows = [_cells(line) for line in lines[2:]]
    head = "".join(f"<th>{inline(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td{_verdict_class(h, c)}>{inline(c)}</td>" for h, c in zip(header, row)) + "</tr>"
        for row in rows
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def blocks(lines: Sequence[str]) -> list[tuple[str, str]]:
    """Markdown lines as (kind, html) blocks; kind is "h1", "h2", "h3", "table", "list" or "p"."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif heading := re.match(r"(#{1,3}) (.*)", line):
            level = len(heading[1])
            out.append((f"h{level}", f"<h{level}>{inline(heading[2])}</h{level}>"))
            i += 1
        elif line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(("table", _table(lines[i:j])))
            i = j
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{inline(lines[i][2:])}</li>")
                i += 1
            out.append(("list", "<ul>" + "".join(items) + "</ul>"))
        else:
            j = i
            while j < len(lines) and lines[j].strip() and not re.match(r"#{1,3} |\||- ", lines[j]):
                j += 1
            out.append(("p", "<p>" + inline(" ".join(lines[i:j])) + "</p>"))
            i = j
    return out


# --- layout ----------------------------------------------------------------------------------


def _figure(name: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    alt = html.escape(name.removesuffix(".png").replace("-", " "))
    return f'<figure><img src="data:image/png;base64,{data}" alt="{alt}"><figcaption>{html.escape(name)}</figcaption></figure>'


# (section key, point id or None for the whole section) -> the plots shown there, in order.
Placement = dict[tuple[str, str | None], list[str]]


def _section_plots(data: ReportData) -> Placement:
    """Which plot goes beside which table."""
    per_point = data.kind == "sweep"
    placed: Placement = {
        # The heatmap marks the recommended point among all the others: the answer's picture.
        ("recommendation", None): ["safe-concurrency-heatmap.png"],
        ("measured_vs_estimated", None): ["kv-tokens.png"],
        ("steps", None): ["throughput.png", "kv-cache.png"],
    }
    for p in data.points:
        # A point's latency plot first: it shows where the SLOs broke.
        steps = placed.setdefault(("steps", p.id if per_point else None), [])
        steps.insert(0, point_plot_name(data, p, "latency"))
        # The knee read from every step: beside the recommendation for the best point.
        fit_plot = pass_plot_name(p.id if per_point else None)
        if p.id == data.best_id:
            placed[("recommendation", None)].append(fit_plot)
        else:
            steps.insert(1, fit_plot)
        placed.setdefault(("server", p.id if per_point else None), []).append(point_plot_name(data, p, "time-split"))
    return placed


def _point_of(h3: str) -> str:
    return re.sub(r"<[^>]+>", "", h3).strip()


def _with_plots(parts: Sequence[str], names: Sequence[str], pngs: Mapping[str, bytes], used: set[str]) -> str:
    figures = [_figure(n, pngs[n]) for n in names if n in pngs]
    used.update(n for n in names if n in pngs)
    if not figures:
        return "".join(parts)
    return '<div class="with-plots"><div class="tables">' + "".join(parts) + "</div>" + "".join(figures) + "</div>"


def _section_html(
    key: str, lines: Sequence[str], placed: Placement, pngs: Mapping[str, bytes], used: set[str], css: str
) -> str:
    parsed = blocks(lines)
    heading = parsed[0][1] if parsed and parsed[0][0] == "h2" else ""
    body = parsed[1:] if heading else parsed
    # The section's own text and tables, then one group per point (### heading) with its plots.
    groups: list[tuple[str | None, list[str]]] = [(None, [])]
    for kind, block in body:
        if kind == "h3":
            groups.append((_point_of(block), [block]))
        else:
            groups[-1][1].append(block)
    inner = "".join(_with_plots(parts, placed.get((key, point), []), pngs, used) for point, parts in groups)
    return f'<section id="{key}"' + (f' class="{css}"' if css else "") + f">{heading}{inner}</section>"


def render(data: ReportData, plan: FleetPlan | None, pngs: Mapping[str, bytes]) -> str:
    """The whole page; `pngs` maps each plot's file name to its bytes (written by plots.write_plots)."""
    head = blocks(markdown.header(data))
    title = re.sub(r"<[^>]+>", "", head[0][1])
    intro = "".join(
        f'<p class="source">{b[3:-4]}</p>' if i == 0 else b.replace("<p>", '<p class="interrupted">', 1)
        for i, (_, b) in enumerate(head[1:])
    )
    parts = markdown.sections(data, plan)
    placed = _section_plots(data)
    used: set[str] = set()
    boxed = "recommendation" if data.best is not None else "recommendation none"
    body = [_section_html(key, lines, placed, pngs, used, boxed if key == "recommendation" else "") for key, lines in parts]
    rest = [n for n in pngs if n not in used]
    if rest:
        body.append('<section id="plots"><h2>Plots</h2><div class="with-plots">'
                    + "".join(_figure(n, pngs[n]) for n in rest) + "</div></section>")
    links = [(key, SECTION_TITLES.get(key, key)) for key, _ in parts] + ([("plots", "Plots")] if rest else [])
    nav = "<nav>" + "".join(f'<a href="#{k}">{html.escape(t)}</a>' for k, t in links) + "</nav>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><main>{head[0][1]}{intro}{nav}{''.join(body)}</main></body></html>\n"
    )
