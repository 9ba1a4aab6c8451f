"""The study's report: charts, summary tables and the offline HTML page."""

from rollscale.report.page import (
    TABLE_NAMES,
    ChartSpec,
    ReportPaths,
    TableSpec,
    build_charts,
    quintile_tables,
    summary_tables,
    write_report,
)

__all__ = [
    "TABLE_NAMES",
    "ChartSpec",
    "ReportPaths",
    "TableSpec",
    "build_charts",
    "quintile_tables",
    "summary_tables",
    "write_report",
]
