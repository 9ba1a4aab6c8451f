"""The production run's page: its reward against the study's band at every C up to C*, the expected reward at
C*, and a flag when the run left the band, with what the study suggests (artifacts/production/index.html).

One self-contained file, as the report's: Altair's HTML with vega, vega-lite and vega-embed inlined from
vl-convert (``inline=True``), so it opens offline.
"""

from __future__ import annotations

import html
import math

import altair as alt
import numpy as np
import pandas as pd

from rollscale.integrations.track.band import Band

__all__ = ["expected_line", "production_chart", "production_page"]


def production_chart(rows: pd.DataFrame, band: Band, c_star: float, metric: str) -> alt.LayerChart:
    """The run's points (red where below the band) over the band, the forecast line and C*."""
    shade = band.frame().dropna()
    x = alt.X("c:Q", scale=alt.Scale(type="log"), title="rollouts C")
    base = alt.Chart(shade)
    area = base.mark_area(opacity=0.25, color="#4c78a8").encode(x=x, y=alt.Y("forecast_lo:Q", title=metric),
                                                              y2="forecast_hi:Q")
    line = base.mark_line(color="#4c78a8", strokeDash=[4, 3]).encode(x=x, y="forecast:Q")
    run = rows[["c", "reward", "below", "step"]].assign(where=np.where(rows["below"], "below the band", "in or above"))
    run_line = alt.Chart(run).mark_line(color="#333333").encode(x=x, y="reward:Q")
    run_points = alt.Chart(run).mark_point(filled=True, size=40).encode(
        x=x, y="reward:Q", tooltip=["step:Q", "c:Q", "reward:Q"],
        color=alt.Color("where:N", scale=alt.Scale(domain=["in or above", "below the band"], range=["#333333", "#d62728"]),
                        title="the run"))
    star = alt.Chart(pd.DataFrame({"c": [c_star]})).mark_rule(color="#888888").encode(x=x)
    return (area + line + run_line + run_points + star).properties(width=640, height=320,
                                                                   title="The production run against the study's band")


def _fmt(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def production_page(chart: alt.TopLevelMixin, lines: list[str], flag: str | None, advice: list[str]) -> str:
    """The page: the summary ``lines``, the flag and what the study suggests, then the chart."""
    parts = ["<h1>Production run</h1>"]
    parts += [f"<p>{html.escape(line)}</p>" for line in lines]
    if flag:
        parts.append(f'<p class="flag" style="color:#d62728;font-weight:bold">{html.escape(flag)}</p>')
        if advice:
            parts.append("<p>What the study suggests (its settings against the run's):</p><ul>" +
                         "".join(f"<li>{html.escape(a)}</li>" for a in advice) + "</ul>")
    summary = "\n".join(parts)
    # the page's own <body> is the last one (the inlined JavaScript holds the string too)
    head, body, tail = chart.to_html(inline=True).rpartition("<body>")
    return f'{head}{body}\n<div id="summary">\n{summary}\n</div>{tail}'


def expected_line(band: Band, c_star: float, eval_k: int) -> str:
    reward, lo, hi = (float(v[0]) for v in band.at(np.array([c_star])))
    return (f"Expected at C* = {c_star:,.0f} rollouts: validation avg@{eval_k} {_fmt(reward)} "
            f"[{_fmt(lo)}, {_fmt(hi)}] ({band.source}).")
