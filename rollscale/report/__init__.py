"""The study's report: charts, summary tables and the offline HTML page."""

from rollscale.report.answer import Answer, study_answer
from rollscale.report.base import TABLE_NAMES, ChartSpec, ReportPaths, TableSpec
from rollscale.report.charts import build_charts
from rollscale.report.charts.noise import quintile_tables
from rollscale.report.page import write_report
from rollscale.report.tables import summary_tables

__all__ = [
    "Answer",
    "TABLE_NAMES",
    "ChartSpec",
    "ReportPaths",
    "TableSpec",
    "build_charts",
    "quintile_tables",
    "study_answer",
    "summary_tables",
    "write_report",
]
