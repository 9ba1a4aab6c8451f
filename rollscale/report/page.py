"""The study report: Altair charts, one offline HTML page, PNGs and a Markdown summary.

Inputs are the study tables of the design (``profile``, ``buckets``,
``noise_prompts``, ``noise_steps``, ``runs``, ``steps``, ``evals``, ``fits``,
``frontier``, ``steps_to_target``, ``crs_prediction``, ``epoch_transitions``)
as pandas DataFrames; any of them may be missing (None). A missing or too
small table never fails the report: the chart or table in its place says
which stage to run.

* :func:`build_charts` draws the figures (science §2, §5, §6.2, §6.3, §7).
* :func:`summary_tables` gives the tables (bucket counts, K_sat with its null,
  fits with standard errors, steps to target, CRS prediction, runs).
* :func:`write_report` writes ``index.html`` (one self-contained file: the
  Vega / Vega-Lite / vega-embed JavaScript comes inline from vl-convert's
  bundle, so the page opens with no network), ``charts/<name>.png`` and
  ``summary.md``; every file is written atomically.

Chart data is embedded as inline records (NaN and infinities turned into
null) rather than DataFrames, so the charts serialise whatever their size.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from rollscale.files import cache_dir, write_bytes_atomic, write_text_atomic
from rollscale.report.answer import Answer, study_answer
from rollscale.report.base import ChartSpec, ReportPaths, StageNotRun, TableSpec, check_tables, stages_not_run
from rollscale.report.charts import build_charts
from rollscale.report.tables import summary_tables


def _md_table(df: pd.DataFrame) -> str:
    # a "|" inside a cell (|G|^2) would end it: escape it, and keep each row on one line
    cells = df.astype(str).map(lambda v: v.replace("|", "\\|").replace("\n", " "))
    return cells.to_markdown(index=False, tablefmt="pipe", disable_numparse=True)


def _absence(spec: ChartSpec | TableSpec) -> str:
    """"Missing" only where the stage has not run; an empty or too-thin result says what it is."""
    return "Missing" if isinstance(spec.missing, StageNotRun) else "Not shown"


def _not_run_text(not_run: list[str]) -> str:
    return (f"Stages not run yet: {', '.join(not_run)}. Each part they write says which to run "
            f"(`rollscale run {not_run[0]}`).")


def _summary_markdown(charts: list[ChartSpec], tables: list[TableSpec], answer: Answer, not_run: list[str]) -> str:
    out = ["# rollscale study report", "", f"**{answer.headline}**", ""]
    out += [f"![{c.title}](charts/{c.name}.png)" for c in charts if c.name == ANSWER_CHART and c.chart is not None]
    out += [""] if out[-1] != "" else []
    if answer.fixes:
        out += [("What would sharpen it:" if answer.answered else "What to change:"), ""]
        out += [f"- {fix}" for fix in answer.fixes] + [""]
    for spec in (answer.decision, answer.claims, answer.observations):
        if spec is None:
            continue
        out += [f"## {spec.title}", "", spec.caption, ""]
        out += [_md_table(spec.frame), ""] if spec.frame is not None else [f"> {spec.missing}", ""]
    if not_run:
        out += [_not_run_text(not_run), ""]
    ahead = [c for c in charts if c.name == MORE_COMPUTE and c.chart is not None]
    if ahead:  # science §10.5: the forecast past the data, its chart and its table, right after the answer
        out += [f"## {MORE_COMPUTE_SECTION}", "", f"![{ahead[0].title}](charts/{MORE_COMPUTE}.png)", "",
                ahead[0].caption, ""]
        tables = [s for s in tables if s.name == MORE_COMPUTE] + [s for s in tables if s.name != MORE_COMPUTE]
    for spec in tables:
        out += [f"## {spec.title}", "", spec.caption, ""]
        if spec.frame is not None:
            out += [_md_table(spec.frame), ""]
        else:
            out += [f"> **{_absence(spec)}:** {spec.missing}", ""]
    out += ["## Charts", ""]
    for i, c in enumerate(charts, 1):
        if c.chart is not None:
            out.append(f"{i}. [{c.title}](charts/{c.name}.png): {c.caption}")
        else:
            out.append(f"{i}. {c.title}: **{_absence(c).lower()}**. {c.missing}")
    return "\n".join(out) + "\n"


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1240px;
       padding: 1.5em 2em 4em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
nav ol { columns: 2; }
figure { margin: 1.5em 0 2.5em; } figcaption { color: #444; max-width: 60em; margin-top: 0.5em; }
.chart { overflow-x: auto; }
.missing { border: 1px solid #e0b252; background: #fff8e6; padding: 0.8em 1em; border-radius: 4px; }
.empty { border: 1px solid #ccc; background: #f7f7f7; padding: 0.8em 1em; border-radius: 4px; }
#answer { border-left: 6px solid #2ca02c; padding: 0.2em 1.2em 0.6em; margin: 1em 0 1.5em; background: #f4fbf4; }
#answer.no-answer { border-left-color: #e0b252; background: #fffaf0; }
#answer .verdict { font-size: 1.25em; margin: 0.6em 0; }
#answer figure { margin: 0.4em 0 1em; }
#answer ul.fixes { margin: 0.3em 0 0.8em; }
#answer table.data td { text-align: left; }
.error { border: 1px solid #d62728; background: #fdecec; padding: 0.8em 1em; }
table.data { border-collapse: collapse; font-size: 0.9em; margin: 0.6em 0 1.2em; }
table.data th, table.data td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
table.data th { background: #f3f3f3; } table.data td:first-child, table.data th:first-child { text-align: left; }
.caption { color: #444; }
code { background: #f3f3f3; padding: 0 0.25em; border-radius: 3px; }
"""


def _vl_version() -> str:
    """altair's schema "v6.4.1" as vl-convert names it, "v6_4" (as altair's own inline template and save() do)."""
    return "_".join(alt.SCHEMA_VERSION.split(".")[:2])


def _vega_lite_specs(charts: list[ChartSpec]) -> dict[str, dict]:
    """Each drawn chart's Vega-Lite spec, made and validated once: the page embeds it and its PNG is drawn from
    it (altair's ``save`` made and validated every chart's spec a second time: ~40 % of a report's CPU). The data
    inlined whole, as ``save`` does."""
    with alt.data_transformers.enable("default"), alt.data_transformers.disable_max_rows():
        return {c.name: c.chart.to_dict() for c in charts if c.chart is not None}


@functools.cache
def _vega_embed_bundle() -> str:
    """vega + vega-lite + vega-embed as one script, from vl-convert (what altair's inline=True uses). Built once per
    machine and vl-convert version (~1.9 s of a report stage's ~7 s on a 2-core VM), then read from the
    cache folder; a cache that cannot be written is skipped."""
    import vl_convert

    vl_version = _vl_version()
    cached = cache_dir("vega") / f"vl-convert-{vl_convert.__version__}-{vl_version}.js"
    try:
        return cached.read_text()
    except OSError:
        pass
    js = vl_convert.javascript_bundle(vl_version=vl_version)
    if "</script" in js.lower():  # would end the inline <script> early
        raise RuntimeError("the vl-convert JavaScript bundle contains '</script'; cannot inline it")
    try:
        write_text_atomic(js, cached)  # makes the folder; whole or absent: a reader never gets half a script
    except OSError:
        pass
    return js


def _script_json(obj: Any) -> str:
    # "</" inside a <script> would close it; "<\/" is the same string to JSON
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _html_text(text: str) -> str:
    """Escape for HTML, with `code` spans as <code>."""
    return re.sub(r"`([^`<>]+)`", r"<code>\1</code>", html.escape(text))


def _html_spec_table(s: TableSpec, heading: str = "h3") -> list[str]:
    esc = html.escape
    out = [f'<{heading} id="table-{esc(s.name)}">{esc(s.title)}</{heading}><p class="caption">{_html_text(s.caption)}</p>']
    if s.frame is not None:
        out.append(s.frame.to_html(index=False, escape=True, border=0, classes="data", na_rep="—"))
    else:
        kind = "missing" if isinstance(s.missing, StageNotRun) else "empty"
        out.append(f'<div class="{kind}"><strong>{_absence(s)}:</strong> {_html_text(s.missing or "")}</div>')
    return out


ANSWER_CHART = "answer"  # the figure drawn right under the first line (report/charts/answer.py)
# the forecast past the data (science §10.5): its chart and table make one section after the answer
MORE_COMPUTE, MORE_COMPUTE_SECTION = "more_compute", "With 2x, 4x, 8x more compute"


def _html_figure(c: ChartSpec, i: int) -> list[str]:
    esc = html.escape
    parts = [f'<figure id="fig-{esc(c.name)}">']
    if c.chart is not None:
        parts.append(f'<div class="chart" id="chart-{esc(c.name)}" data-chart="{esc(c.name)}"></div>')
    else:
        kind = "missing" if isinstance(c.missing, StageNotRun) else "empty"
        parts.append(f"<h3>{esc(c.title)}</h3>")
        parts.append(f'<div class="{kind}" data-missing="{esc(c.name)}"><strong>{_absence(c)}:</strong> '
                     f"{_html_text(c.missing or '')}</div>")
    parts.append(f"<figcaption><strong>Figure {i}.</strong> {_html_text(c.caption)}</figcaption></figure>")
    return parts


def _html_answer(answer: Answer, charts: list[ChartSpec]) -> list[str]:
    """The first screen: the verdict, the answer drawn (figure 1), what to change, the decision and the claims
    (then what one seed showed)."""
    esc = html.escape
    parts = [f'<section id="answer" class="{"answered" if answer.answered else "no-answer"}">',
             f'<p class="verdict"><strong>{esc(answer.headline)}</strong></p>']
    for i, c in enumerate(charts, 1):
        if c.name == ANSWER_CHART and c.chart is not None:
            parts += _html_figure(c, i)
    if answer.fixes:
        parts.append(f"<p>{'What would sharpen it' if answer.answered else 'What to change'}:</p>")
        parts.append('<ul class="fixes">' + "".join(f"<li>{_html_text(f)}</li>" for f in answer.fixes) + "</ul>")
    if answer.decision is not None:
        parts += _html_spec_table(answer.decision)
    parts += _html_spec_table(answer.claims)
    if answer.observations is not None:
        parts += _html_spec_table(answer.observations)
    parts.append("</section>")
    return parts


def _drawn(charts: list[ChartSpec], name: str) -> bool:
    return any(c.name == name and c.chart is not None for c in charts)


def _html_more_compute(charts: list[ChartSpec], tables: list[TableSpec]) -> list[str]:
    """The section "with 2x, 4x, 8x more compute" (science §10.5): the chart, then the table; nothing when the
    study has no forecast to draw (the chart's absence is listed with the figures)."""
    if not _drawn(charts, MORE_COMPUTE):
        return []
    parts = [f'<section id="more-compute"><h2>{html.escape(MORE_COMPUTE_SECTION)}</h2>']
    parts += [p for i, c in enumerate(charts, 1) if c.name == MORE_COMPUTE for p in _html_figure(c, i)]
    parts += [p for s in tables if s.name == MORE_COMPUTE for p in _html_spec_table(s)]
    return parts + ["</section>"]


def _html_page(charts: list[ChartSpec], specs: dict[str, dict], tables: list[TableSpec], answer: Answer,
               not_run: list[str]) -> str:
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>rollscale study report</title>",
        f"<style>{_CSS}</style>",
        f'<script type="text/javascript">\n{_vega_embed_bundle()}\n</script>',
        "</head><body>",
        "<h1>rollscale study report</h1>",
        *_html_answer(answer, charts),
    ]
    if not_run:
        parts.append(f'<p class="missing" id="not-run">{_html_text(_not_run_text(not_run))}</p>')
    parts += _html_more_compute(charts, tables)
    parts.append('<p class="caption">How to spend rollouts in RLVR: difficulty, gradient noise, the compute '
                 "frontier and critical batch sizes. Every chart and table below is in this one file; it needs no "
                 "network.</p>")
    parts.append('<nav><h2>Contents</h2><ol>')
    for i, c in enumerate(charts, 1):
        suffix = "" if c.chart is not None else " (missing)"
        parts.append(f'<li><a href="#fig-{esc(c.name)}">Figure {i}. {esc(c.title)}</a>{suffix}</li>')
    parts.append('<li><a href="#tables">Tables</a></li></ol></nav>')
    parts.append('<section id="figures"><h2>Figures</h2>')
    for i, c in enumerate(charts, 1):
        if not (c.name in (ANSWER_CHART, MORE_COMPUTE) and c.chart is not None):  # drawn in their sections
            parts += _html_figure(c, i)
    parts.append("</section>")
    parts.append('<section id="tables"><h2>Tables</h2>')
    for s in tables:
        if not (s.name == MORE_COMPUTE and _drawn(charts, MORE_COMPUTE)):  # in its section
            parts += _html_spec_table(s)
    parts.append("</section>")
    parts.append(
        '<script type="text/javascript">\n'
        f"const specs = {_script_json(specs)};\n"
        "const embedOpt = {actions: false, renderer: 'svg'};\n"
        "for (const [name, spec] of Object.entries(specs)) {\n"
        "  const el = document.getElementById('chart-' + name);\n"
        "  vegaEmbed(el, spec, embedOpt).catch(function (err) {\n"
        "    el.classList.add('error');\n"
        "    el.textContent = 'This chart could not be drawn: ' + err;\n"
        "    console.error(err);\n"
        "  });\n"
        "}\n"
        "</script>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _png_bytes(spec: dict) -> bytes:
    """A chart's PNG at 2x, by vl-convert (as altair's ``save(format="png", scale_factor=2)``)."""
    import vl_convert

    return vl_convert.vegalite_to_png(spec, vl_version=_vl_version(), scale=2)


def write_report(
    tables: Mapping[str, pd.DataFrame | None],
    out_dir: str | os.PathLike[str],
    params: Mapping[str, Any] | None = None,
    cannot_answer: str | None = None,
) -> ReportPaths:
    """Write the study report into ``out_dir`` (science §2, §5, §6, §7).

    * ``index.html``: one self-contained page (vega, vega-lite and vega-embed
      inlined from vl-convert's bundle; no CDN) that opens with the answer
      (:func:`rollscale.report.answer.study_answer`: the claims, or "no answer
      yet" and what to change), then all charts with titles and captions (a
      "missing" box where the stage has not run, a grey one where its result
      is empty), and every table of :func:`summary_tables`.
    * ``charts/<name>.png`` for each drawn chart (vl-convert, 2× scale); the
      PNG of a chart that is now missing is removed so no stale figure stays.
    * ``summary.md``: the same tables in Markdown, missing sections saying
      which stage to run.

    ``cannot_answer``: why the study as written cannot settle a key at its tolerance (the first reason under the
    first line: :func:`rollscale.report.answer.study_answer`).

    Every file is written to a temporary file and renamed into place.
    """
    t = check_tables(tables)
    charts = build_charts(t, params)
    table_specs = summary_tables(t)
    answer, not_run = study_answer(t, params, cannot_answer), stages_not_run(t)
    out = Path(out_dir)
    chart_dir = out / "charts"
    chart_dir.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, Path] = {}
    specs = _vega_lite_specs(charts)
    for c in charts:
        path = chart_dir / f"{c.name}.png"
        if c.chart is not None:
            write_bytes_atomic(_png_bytes(specs[c.name]), path)
            pngs[c.name] = path
        elif path.exists():
            path.unlink()
    html_path, md_path = out / "index.html", out / "summary.md"
    write_text_atomic(_html_page(charts, specs, table_specs, answer, not_run), html_path)
    write_text_atomic(_summary_markdown(charts, table_specs, answer, not_run), md_path)
    return ReportPaths(
        out_dir=out,
        html=html_path,
        summary=md_path,
        pngs=pngs,
        missing={c.name: c.missing for c in charts if c.missing is not None},
        headline=answer.headline,
    )
