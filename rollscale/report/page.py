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

import html
import io
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from rollscale.files import write_bytes_atomic, write_text_atomic
from rollscale.report.base import ChartSpec, ReportPaths, TableSpec
from rollscale.report.charts import build_charts
from rollscale.report.tables import summary_tables


def _md_table(df: pd.DataFrame) -> str:
    # a "|" inside a cell (|G|^2) would end it: escape it, and keep each row on one line
    cells = df.astype(str).map(lambda v: v.replace("|", "\\|").replace("\n", " "))
    return cells.to_markdown(index=False, tablefmt="pipe", disable_numparse=True)


def _summary_markdown(charts: list[ChartSpec], tables: list[TableSpec]) -> str:
    out = ["# rollscale study report", ""]
    missing = [s for s in tables if s.missing] + [c for c in charts if c.missing]
    if missing:
        out += ["Parts of the study are not there yet; each section below says which stage to run.", ""]
    for spec in tables:
        out += [f"## {spec.title}", "", spec.caption, ""]
        if spec.frame is not None:
            out += [_md_table(spec.frame), ""]
        else:
            out += [f"> **Missing:** {spec.missing}", ""]
    out += ["## Charts", ""]
    for i, c in enumerate(charts, 1):
        if c.chart is not None:
            out.append(f"{i}. [{c.title}](charts/{c.name}.png): {c.caption}")
        else:
            out.append(f"{i}. {c.title}: **missing**. {c.missing}")
    return "\n".join(out) + "\n"


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1240px;
       padding: 1.5em 2em 4em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
nav ol { columns: 2; }
figure { margin: 1.5em 0 2.5em; } figcaption { color: #444; max-width: 60em; margin-top: 0.5em; }
.chart { overflow-x: auto; }
.missing { border: 1px solid #e0b252; background: #fff8e6; padding: 0.8em 1em; border-radius: 4px; }
.error { border: 1px solid #d62728; background: #fdecec; padding: 0.8em 1em; }
table.data { border-collapse: collapse; font-size: 0.9em; margin: 0.6em 0 1.2em; }
table.data th, table.data td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
table.data th { background: #f3f3f3; } table.data td:first-child, table.data th:first-child { text-align: left; }
.caption { color: #444; }
code { background: #f3f3f3; padding: 0 0.25em; border-radius: 3px; }
"""


def _vega_embed_bundle() -> str:
    """vega + vega-lite + vega-embed as one script, from vl-convert (what altair's inline=True uses)."""
    import vl_convert

    # altair's schema "v6.4.1" -> vl-convert's "v6_4", as altair's own inline template asks for it
    vl_version = "_".join(alt.SCHEMA_VERSION.split(".")[:2])
    js = vl_convert.javascript_bundle(vl_version=vl_version)
    if "</script" in js.lower():  # would end the inline <script> early
        raise RuntimeError("the vl-convert JavaScript bundle contains '</script'; cannot inline it")
    return js


def _script_json(obj: Any) -> str:
    # "</" inside a <script> would close it; "<\/" is the same string to JSON
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _html_text(text: str) -> str:
    """Escape for HTML, with `code` spans as <code>."""
    return re.sub(r"`([^`<>]+)`", r"<code>\1</code>", html.escape(text))


def _html_page(charts: list[ChartSpec], tables: list[TableSpec]) -> str:
    esc = html.escape
    specs = {c.name: c.chart.to_dict() for c in charts if c.chart is not None}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>rollscale study report</title>",
        f"<style>{_CSS}</style>",
        f'<script type="text/javascript">\n{_vega_embed_bundle()}\n</script>',
        "</head><body>",
        "<h1>rollscale study report</h1>",
        '<p class="caption">How to spend rollouts in RLVR: difficulty, gradient noise, the compute frontier and '
        "critical batch sizes. Every chart and table below is in this one file; it needs no network.</p>",
    ]
    n_missing = sum(1 for c in charts if c.missing) + sum(1 for s in tables if s.missing)
    if n_missing:
        parts.append(
            f'<p class="missing">{n_missing} parts of the study are not there yet; '
            "each one says which stage to run.</p>"
        )
    parts.append('<nav><h2>Contents</h2><ol>')
    for i, c in enumerate(charts, 1):
        suffix = "" if c.chart is not None else " (missing)"
        parts.append(f'<li><a href="#fig-{esc(c.name)}">Figure {i}. {esc(c.title)}</a>{suffix}</li>')
    parts.append('<li><a href="#tables">Tables</a></li></ol></nav>')
    parts.append('<section id="figures"><h2>Figures</h2>')
    for i, c in enumerate(charts, 1):
        parts.append(f'<figure id="fig-{esc(c.name)}">')
        if c.chart is not None:
            parts.append(f'<div class="chart" id="chart-{esc(c.name)}" data-chart="{esc(c.name)}"></div>')
        else:
            parts.append(f"<h3>{esc(c.title)}</h3>")
            parts.append(f'<div class="missing" data-missing="{esc(c.name)}"><strong>Missing:</strong> '
                         f"{_html_text(c.missing or '')}</div>")
        parts.append(f"<figcaption><strong>Figure {i}.</strong> {_html_text(c.caption)}</figcaption></figure>")
    parts.append("</section>")
    parts.append('<section id="tables"><h2>Tables</h2>')
    for s in tables:
        parts.append(f'<h3 id="table-{esc(s.name)}">{esc(s.title)}</h3><p class="caption">{_html_text(s.caption)}</p>')
        if s.frame is not None:
            parts.append(s.frame.to_html(index=False, escape=True, border=0, classes="data", na_rep="—"))
        else:
            parts.append(f'<div class="missing"><strong>Missing:</strong> {_html_text(s.missing or "")}</div>')
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


def _png_bytes(chart: alt.TopLevelMixin) -> bytes:
    buf = io.BytesIO()
    chart.save(buf, format="png", scale_factor=2)  # rendered by vl-convert
    return buf.getvalue()


def write_report(
    tables: Mapping[str, pd.DataFrame | None],
    out_dir: str | os.PathLike[str],
    params: Mapping[str, Any] | None = None,
) -> ReportPaths:
    """Write the study report into ``out_dir`` (science §2, §5, §6, §7).

    * ``index.html``: one self-contained page (vega, vega-lite and vega-embed
      inlined from vl-convert's bundle; no CDN), all charts with titles and
      captions, a "missing" box for each chart that cannot be drawn yet, and
      every table of :func:`summary_tables`.
    * ``charts/<name>.png`` for each drawn chart (vl-convert, 2× scale); the
      PNG of a chart that is now missing is removed so no stale figure stays.
    * ``summary.md``: the same tables in Markdown, missing sections saying
      which stage to run.

    Every file is written to a temporary file and renamed into place.
    """
    charts = build_charts(tables, params)
    table_specs = summary_tables(tables)
    out = Path(out_dir)
    chart_dir = out / "charts"
    chart_dir.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, Path] = {}
    for c in charts:
        path = chart_dir / f"{c.name}.png"
        if c.chart is not None:
            write_bytes_atomic(_png_bytes(c.chart), path)
            pngs[c.name] = path
        elif path.exists():
            path.unlink()
    html_path, md_path = out / "index.html", out / "summary.md"
    write_text_atomic(_html_page(charts, table_specs), html_path)
    write_text_atomic(_summary_markdown(charts, table_specs), md_path)
    return ReportPaths(
        out_dir=out,
        html=html_path,
        summary=md_path,
        pngs=pngs,
        missing={c.name: c.missing for c in charts if c.missing is not None},
    )
