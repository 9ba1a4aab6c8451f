"""Stage ``report``: one self-contained HTML page, PNG charts and a Markdown summary.

Every study table that exists is read through the DuckDB views: the
difficulty profile and buckets (science §2), the gradient-noise measurements
(§6.2, §6.3), the sweep's runs, steps and evaluations (§1, §5), and the fits
of the frontier, steps to target and the CRS check (§7). It opens with the
answer: the claims the data supports, each with its bootstrap interval over seeds
("not distinguishable" where the interval of a difference holds zero), or "no
answer yet" and the params to change; then it draws
them, with the bucket bounds of params on the difficulty chart, and states
for every chart and table that cannot be made yet which stage to run: a study
with a stage missing still gets its report.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rollscale.config import StudyParams
from rollscale.pipeline.check.answerable import cannot_answer
from rollscale.report import TABLE_NAMES, ReportPaths, write_report
from rollscale.train.trackers import log_report, tracker_targets
from tasks.common import ARTIFACTS, read_params, transient
from tasks.fit import read_tables


# not cached: its result is the files it writes, which DVC tracks
@task(name="write-report", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2, retry_condition_fn=transient)
def render_report(root: Path, out: Path, params: StudyParams) -> ReportPaths:
    tables = read_tables(root, list(TABLE_NAMES))
    # a study `rollscale init --force` wrote though it cannot answer says so first (the verdict check gives)
    return write_report(tables, out, params, cannot_answer(params, root))


@flow(name="report")
def report_flow(params_path: str = "params.yaml", artifacts: str = str(ARTIFACTS)) -> ReportPaths:
    params = read_params(params_path)
    root = Path(artifacts)
    paths = render_report(root, root / "report", params)
    log_report(tracker_targets(params.tracking, root / "trackers"), root / "report")
    print(f"report: {paths.headline}")
    print(f"report: {paths.html} ({len(paths.pngs)} charts drawn), {paths.summary}")
    for name, why in paths.missing.items():
        print(f"report: chart {name!r} missing: {why}")
    return paths


if __name__ == "__main__":
    report_flow()
