"""Tests for rollscale.core.problems.problem and problem_sets: problem sources with stable ids (science §2)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from rollscale.core.problems.sets import gsm8k_problems, math_problems, reasoning_gym_problems
from rollscale.core.problems.problem import DataRowError, Problem, compute_problem_id, disjoint
from rollscale.core.problems.rewards import math_reward, numeric_reward

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

SMALL_CHAIN_SUM = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}


def _data_file(relative: str) -> Path:
    path = DATA / relative
    if not path.is_file():
        pytest.skip(f"reference data not found: {path}")
    return path


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _gsm8k_row(i: int) -> str:
    return json.dumps({"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"})


# --- Problem and ids -------------------------------------------------------


def test_problem_id_is_stable_and_depends_on_source_and_prompt() -> None:
    expected = hashlib.sha256(b"gsm8k\nWhat is 2+2?").hexdigest()[:16]
    assert compute_problem_id("gsm8k", "What is 2+2?") == expected
    a = Problem.create("gsm8k", "What is 2+2?", "4", "numeric")
    b = Problem.create("gsm8k", "What is 2+2?", "4", "numeric", {"row": 9})
    assert a.problem_id == b.problem_id == expected
    assert a == b and hash(a) == hash(b)  # meta takes no part
    assert Problem.create("math", "What is 2+2?", "4", "math").problem_id != a.problem_id
    assert Problem.create("gsm8k", "What is 2+3?", "5", "numeric").problem_id != a.problem_id


def test_problem_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="problem_id"):
        Problem("0" * 16, "gsm8k", "What is 2+2?", "4", "numeric")
    with pytest.raises(ValueError, match="reward"):
        Problem.create("gsm8k", "What is 2+2?", "4", "partial")
    with pytest.raises(ValueError, match="answer"):
        Problem.create("gsm8k", "What is 2+2?", " ", "numeric")
    with pytest.raises(ValueError, match="JSON"):
        Problem.create("gsm8k", "What is 2+2?", "4", "numeric", {"bad": object()})


def test_disjoint() -> None:
    problems = [Problem.create("gsm8k", f"q{i}", str(i), "numeric") for i in range(5)]
    exclude = {problems[1].problem_id, problems[3].problem_id, "not-an-id"}
    assert disjoint(problems, exclude) == [problems[0], problems[2], problems[4]]
    with pytest.raises(ValueError, match="exclude"):
        disjoint(problems, [problems[0].problem_id])  # type: ignore[arg-type]


# --- reasoning-gym ---------------------------------------------------------


def test_reasoning_gym_chain_sum_question_style() -> None:
    problems = reasoning_gym_problems("chain_sum", 50, seed=3)
    assert 0 < len(problems) <= 50
    assert len({p.problem_id for p in problems}) == len(problems)
    for p in problems:
        assert p.source == "reasoning_gym:chain_sum"
        assert p.reward == "numeric"
        assert p.meta["metadata"]["expression"] in p.prompt
        assert numeric_reward(p.answer, p.answer) == 1.0
        # the gold is the value of the expression the prompt shows
        assert int(p.answer) == eval(p.meta["metadata"]["expression"])  # noqa: S307 (digits, + and - only)
        json.dumps(p.meta)


def test_reasoning_gym_chain_sum_expression_style_and_dedup(caplog: pytest.LogCaptureFixture) -> None:
    tiny = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    with caplog.at_level(logging.INFO, logger="rollscale.core.problems.problem"):
        problems = reasoning_gym_problems("chain_sum", 300, seed=0, config=tiny, prompt_style="expression")
    # 1-digit a±b has at most 10 * 10 * 2 = 200 distinct prompts, so 300 draws repeat
    assert len(problems) <= 200
    assert len({p.prompt for p in problems}) == len(problems)
    assert "duplicate" in caplog.text
    for p in problems:
        assert " " not in p.prompt and p.prompt.endswith("=")
        assert p.prompt == p.meta["metadata"]["expression"].replace(" ", "") + "="
        assert int(p.answer) == eval(p.prompt[:-1])  # noqa: S307
        assert numeric_reward(p.answer, p.answer) == 1.0


def test_reasoning_gym_is_seeded() -> None:
    a = reasoning_gym_problems("chain_sum", 40, seed=11, config=SMALL_CHAIN_SUM)
    b = reasoning_gym_problems("chain_sum", 40, seed=11, config=SMALL_CHAIN_SUM)
    c = reasoning_gym_problems("chain_sum", 40, seed=12, config=SMALL_CHAIN_SUM)
    assert [p.problem_id for p in a] == [p.problem_id for p in b]
    assert [p.answer for p in a] == [p.answer for p in b]
    assert [p.problem_id for p in a] != [p.problem_id for p in c]


def test_reasoning_gym_bad_arguments() -> None:
    with pytest.raises(ValueError, match="chain_sum"):  # a close match is suggested
        reasoning_gym_problems("chain_summ", 5, seed=0)
    with pytest.raises(ValueError, match="'bogus_key'"):
        reasoning_gym_problems("chain_sum", 5, seed=0, config={"bogus_key": 1})
    with pytest.raises(ValueError, match="size argument"):
        reasoning_gym_problems("chain_sum", 5, seed=0, config={"size": 9})
    with pytest.raises(ValueError, match="max_terms"):
        reasoning_gym_problems("chain_sum", 5, seed=0, config={"min_terms": 4, "max_terms": 2})
    with pytest.raises(ValueError, match="size"):
        reasoning_gym_problems("chain_sum", 0, seed=0)
    with pytest.raises(ValueError, match="prompt_style"):
        reasoning_gym_problems("chain_sum", 5, seed=0, prompt_style="latex")
    with pytest.raises(ValueError, match="expression"):
        reasoning_gym_problems("gcd", 5, seed=0, prompt_style="expression")
    with pytest.raises(ValueError, match="non-numeric"):
        reasoning_gym_problems("word_ladder", 2, seed=0)


# --- GSM8K and MATH from the shared files ----------------------------------


def test_gsm8k_from_shared_file() -> None:
    path = _data_file("gsm8k/test.jsonl")
    problems = gsm8k_problems(path, limit=300)
    assert len(problems) == 300
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:300]]
    for p, row in zip(problems, rows):
        assert p.source == "gsm8k" and p.reward == "numeric"
        assert p.prompt == row["question"]
        assert numeric_reward(row["answer"], p.answer) == 1.0
    assert "," not in "".join(p.answer for p in problems)  # canonical: no separators
    assert gsm8k_problems(str(path), limit=300) == problems  # stable across calls


def test_math_from_shared_file() -> None:
    path = _data_file("math500/test.jsonl")
    problems = math_problems(path, limit=200)
    assert len(problems) == 200
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:200]]
    for p, row in zip(problems, rows):
        assert p.source == "math" and p.reward == "math"
        assert p.prompt == row["problem"]
        assert p.answer == row["answer"].strip()
        assert p.meta["subject"] == row["subject"] and p.meta["level"] == row["level"]
    assert sum(math_reward(row["solution"], p.answer) for p, row in zip(problems[:50], rows)) >= 48


def test_math_gold_from_boxed_solution_when_answer_absent(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "math.jsonl",
        [json.dumps({"problem": "Compute 1/2 + 1/4.", "solution": r"We get $\boxed{\frac{3}{4}}$."})],
    )
    (p,) = math_problems(path)
    assert p.answer == r"\frac{3}{4}"
    assert math_reward(r"\boxed{0.75}", p.answer) == 1.0


# --- malformed rows --------------------------------------------------------


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ('{"question": "What is 1 + 1?", "answer": ', "bad JSON"),
        (json.dumps({"question": "What is 1 + 1?"}), "missing field 'answer'"),
        (json.dumps({"question": "What is 1 + 1?", "answer": ""}), "'answer' is empty"),
        (json.dumps({"question": "What is 1 + 1?", "answer": 2}), "must be a string"),
        (json.dumps({"question": "What is 1 + 1?", "answer": "1 + 1 = 2"}), "####"),
        (json.dumps({"question": "What is 1 + 1?", "answer": "#### two"}), "expected a number"),
        (json.dumps(["question", "answer"]), "JSON object"),
    ],
)
def test_gsm8k_malformed_row_names_file_and_line(tmp_path: Path, bad_line: str, reason: str) -> None:
    path = _write_jsonl(tmp_path / "gsm8k_bad.jsonl", [_gsm8k_row(1), _gsm8k_row(2), bad_line, _gsm8k_row(4)])
    with pytest.raises(DataRowError) as info:
        gsm8k_problems(path)
    message = str(info.value)
    assert "gsm8k_bad.jsonl line 3:" in message
    assert reason in message


def test_math_malformed_row_names_file_and_line(tmp_path: Path) -> None:
    good = json.dumps({"problem": "What is 1+1?", "answer": "2"})
    no_answer = json.dumps({"problem": "What is 2+2?", "solution": "It is four."})
    path = _write_jsonl(tmp_path / "math_bad.jsonl", [good, "", no_answer])
    with pytest.raises(DataRowError, match=r"math_bad\.jsonl line 3: .*boxed"):
        math_problems(path)
    path = _write_jsonl(tmp_path / "math_bad2.jsonl", [good, json.dumps({"answer": "2"})])
    with pytest.raises(DataRowError, match=r"math_bad2\.jsonl line 2: missing field 'problem'"):
        math_problems(path)


def test_skip_malformed_counts_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = [_gsm8k_row(i) for i in range(1, 11)]
    lines[2] = "{not json"  # line 3
    lines[4] = json.dumps({"question": "What is 5 + 1?"})  # line 5
    lines[7] = json.dumps({"question": "What is 8 + 1?", "answer": "   "})  # line 8
    lines[9] = _gsm8k_row(1)  # line 10: a duplicate of line 1
    path = _write_jsonl(tmp_path / "gsm8k_mixed.jsonl", lines)
    with caplog.at_level(logging.INFO, logger="rollscale.core.problems.problem"):
        problems = gsm8k_problems(path, skip_malformed=True)
    assert [p.meta["row"] for p in problems] == [1, 2, 4, 6, 7, 9]
    assert "skipped 3 malformed rows" in caplog.text
    assert "line 3" in caplog.text and "line 5" in caplog.text and "line 8" in caplog.text
    assert "dropped 1 duplicate" in caplog.text
    assert len(gsm8k_problems(path, skip_malformed=True, limit=2)) == 2


def test_missing_file_and_bad_limit(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        gsm8k_problems(missing)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        math_problems(missing)
    with pytest.raises(ValueError, match="limit"):
        gsm8k_problems(missing, limit=0)


# --- hub path (no network here: datasets.load_dataset is replaced) ---------


def test_gsm8k_and_math_from_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load_dataset(path: str, name: str | None = None, split: str | None = None) -> list[dict]:
        calls.append((path, name, split))
        if path == "openai/gsm8k":
            return [json.loads(_gsm8k_row(i)) for i in range(3)]
        return [
            {"problem": "What is 1/2 + 1/2?", "solution": r"\boxed{1}", "answer": "1", "subject": "Algebra",
             "level": 1, "unique_id": "test/algebra/1.json"},
            {"problem": "What is 2 * 3?", "solution": r"\boxed{6}", "answer": "6", "subject": "Algebra", "level": 1},
        ]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    gsm8k = gsm8k_problems(split="train")
    assert calls[-1] == ("openai/gsm8k", "main", "train")
    assert [p.answer for p in gsm8k] == ["1", "2", "3"]
    assert gsm8k[0] == Problem.create("gsm8k", "What is 0 + 1?", "1", "numeric")

    math = math_problems()
    assert calls[-1] == ("HuggingFaceH4/MATH-500", None, "test")
    assert [p.answer for p in math] == ["1", "6"]
    assert math[0].meta["unique_id"] == "test/algebra/1.json"
    math_problems(hub_id="someone/MATH-full", split="train")
    assert calls[-1] == ("someone/MATH-full", None, "train")


def test_hub_malformed_row_names_dataset_and_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [{"question": "q?", "answer": "#### 1"}, {"question": "q2?"}])
    with pytest.raises(DataRowError, match=r"openai/gsm8k \(main\) split test row 2: missing field 'answer'"):
        gsm8k_problems()


def test_bad_json_message_reads_once(tmp_path: Path) -> None:
    """json's own message can end in "at" ("Invalid control character at"): no "at at"."""
    path = _write_jsonl(tmp_path / "cut.jsonl", [_gsm8k_row(1), '{"question": "What is'])
    with pytest.raises(DataRowError) as info:
        gsm8k_problems(path)
    assert "cut.jsonl line 2: bad JSON (Invalid control character at column 22)" in str(info.value)
    assert "at at" not in str(info.value)
