"""The README's numbers are docs/results.md's: the default study's answer, its key statuses and its C*, read from
both files (a rerun that changes results.md section 2d must change the README with it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _section(text: str, heading: str) -> str:
    """The text of the ``## heading...`` section, to the next ``## ``."""
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _default_study() -> dict:
    """results.md section 2d: C*, and each key's status and reward at C* from its table."""
    section = _section((REPO / "docs" / "results.md").read_text(), "2d.")
    c_star = re.search(r"C\* = ([\d,]+)", section).group(1)
    rows = re.findall(r"^\| n = (\d+) \| (\w[\w ]*?) \| ([^|]+?) \|", section, flags=re.M)
    assert len(rows) >= 2, "results.md section 2d: no decision table"
    return {"c_star": c_star, "status": {int(n): status for n, status, _ in rows},
            "reward": {int(n): reward for n, _, reward in rows}}


def _keys(text: str) -> list[int]:
    """``2, 8 and 16`` -> [2, 8, 16]."""
    return [int(k) for k in re.findall(r"\d+", text)]


def test_the_readme_first_line_is_results_md_default_study():
    study, readme = _default_study(), (REPO / "README.md").read_text()
    leader = next(n for n, status in study["status"].items() if status == "leader")
    first = _section(readme, "The report's first line")
    quote = " ".join(line[2:] for line in first.splitlines() if line.startswith("> "))
    said = re.match(r"Use n = (\d+) \(.*?\) at C\* = ([\d,]+) rollouts .*?:\s*validation avg@\d+ (\S+ \[[^\]]+\]); "
                    r"(.*?)\. ", quote)
    assert said, quote
    assert said.group(2) == study["c_star"] and f"target_budget` = {study['c_star']}" in first
    assert int(said.group(1)) == leader and said.group(3) == study["reward"][leader]
    # the settled keys: those that "cannot beat it by more than" epsilon and those that "are worse"
    settled = [k for part in re.findall(r"n = ([\d, and]+?) (?:cannot beat it|is worse|are worse)", said.group(4))
               for k in _keys(part)]
    assert sorted(settled) == sorted(n for n, s in study["status"].items() if s == "settled"), said.group(4)


def test_the_readme_query_section_names_results_md_statuses():
    study, readme = _default_study(), (REPO / "README.md").read_text()
    at = readme.index("on the default study (docs/results.md, section 2d)")
    sentence = readme[at:readme.index(".", at + 40)]
    named = {k: status for keys, status in re.findall(r"n = ([\d, and]+?) `(\w[\w ]*?)`", sentence)
             for k in _keys(keys)}
    assert named == study["status"], sentence
