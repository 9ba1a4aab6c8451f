"""A user's own problem tables (rollscale.core.problems.sources, science §2):
TRL and verl layouts, files and column mappings, weighted mixes, verifiers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from rollscale.config import ParamsError, TableParams, parse_params
from rollscale.core.problems.sources import mix_problems, table_problems
from rollscale.core.problems.sets import gsm8k_problems, math_problems
from rollscale.core.problems.problem import DataRowError, compute_problem_id
from rollscale.core.problems.rewards import reward_fn
from tasks.problems import load_pool

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SYSTEM = "Put the final answer in \\boxed{}."


def user_verifier(completion: str, gold: str) -> float:
    """A user's verifier, referenced as tests.test_problem_sources:user_verifier."""
    return 1.0 if gold in completion else 0.0


def _shared(relative: str) -> Path:
    path = DATA / relative
    if not path.is_file():
        pytest.skip(f"reference data not found: {path}")
    return path


def _trl_rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {i} + {i}?"}],
             "solution": str(2 * i)} for i in range(1, n + 1)]


def _verl_rows(n: int) -> list[dict]:
    return [{"data_source": "toy", "prompt": [{"role": "user", "content": f"Compute {i} * 3."}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(3 * i)}, "extra_info": {"index": i}}
            for i in range(1, n + 1)]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_trl_conversational_parquet_and_jsonl_agree(tmp_path: Path) -> None:
    rows = _trl_rows(5)
    pd.DataFrame(rows).to_parquet(tmp_path / "trl.parquet")
    _write_jsonl(tmp_path / "trl.jsonl", rows)
    got = {}
    for suffix in ("parquet", "jsonl"):
        src = TableParams(path=tmp_path / f"trl.{suffix}", name="toy", answer="solution", reward="numeric")
        got[suffix] = table_problems(src)
    assert got["parquet"] == got["jsonl"] and len(got["jsonl"]) == 5
    first = got["jsonl"][0]
    assert first.prompt == f"{SYSTEM}\n\nWhat is 1 + 1?" and first.answer == "2" and first.source == "toy"
    assert first.problem_id == compute_problem_id("toy", first.prompt)
    assert reward_fn(first.reward)("so the answer is 2", first.answer) == 1.0


def test_verl_layout_nested_ground_truth_and_system_prompt(tmp_path: Path) -> None:
    pd.DataFrame(_verl_rows(4)).to_parquet(tmp_path / "verl_train.parquet")
    src = TableParams(path=tmp_path / "verl_train.parquet", answer="reward_model.ground_truth",
                      system_prompt="Think step by step.", reward="math")
    problems = table_problems(src)
    assert [p.answer for p in problems] == ["3", "6", "9", "12"]
    assert problems[1].prompt == "Think step by step.\n\nCompute 2 * 3." and problems[1].source == "verl_train"
    assert reward_fn("math")("\\boxed{6}", problems[1].answer) == 1.0


def test_csv_strings_exact_verifier_and_user_verifier(tmp_path: Path) -> None:
    pd.DataFrame({"question": ["Capital of France?", "Capital of Italy?"], "label": ["Paris", "Rome"]}).to_csv(
        tmp_path / "caps.csv", index=False)
    exact = table_problems(TableParams(path=tmp_path / "caps.csv", prompt="question", answer="label", reward="exact"))
    assert [p.answer for p in exact] == ["Paris", "Rome"]
    assert reward_fn("exact")("\\boxed{ Paris }", "Paris") == 1.0 and reward_fn("exact")("Paris, France", "Paris") == 0.0
    name = "tests.test_problem_sources:user_verifier"
    mine = table_problems(TableParams(path=tmp_path / "caps.csv", prompt="question", answer="label", reward=name))
    assert mine[0].reward == name and reward_fn(name)("It is Paris.", "Paris") == 1.0


def test_ids_stable_across_reordering_and_mix_is_order_free(tmp_path: Path) -> None:
    rows = _verl_rows(30)
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    a = table_problems(TableParams(path=_write_jsonl(tmp_path / "a.jsonl", rows), name="s", answer="reward_model.ground_truth"))
    b = table_problems(TableParams(path=_write_jsonl(tmp_path / "b.jsonl", shuffled), name="s", answer="reward_model.ground_truth"))
    assert {p.problem_id for p in a} == {p.problem_id for p in b}
    other = table_problems(TableParams(path=_write_jsonl(tmp_path / "t.jsonl", _trl_rows(10)), answer="solution"))
    mix_a = mix_problems([("s", a, 3.0), ("t", other, 1.0)], 12, seed=7)
    mix_b = mix_problems([("s", b, 3.0), ("t", other, 1.0)], 12, seed=7)
    assert {p.problem_id for p in mix_a} == {p.problem_id for p in mix_b} and len(mix_a) == 12
    assert sum(p.source == "s" for p in mix_a) == 9
    assert {p.problem_id for p in mix_problems([("s", a, 3.0), ("t", other, 1.0)], 12, seed=8)} != {
        p.problem_id for p in mix_a}
    assert len(mix_problems([("s", a, 1.0), ("t", other, 1.0)], None, seed=0)) == 20  # t (10) limits the mix
    with pytest.raises(ValueError, match="t has 10 problems"):
        mix_problems([("s", a, 1.0), ("t", other, 1.0)], 30, seed=0)


@pytest.mark.parametrize("bad, reason", [
    ('{"prompt": "1+1?", ', "bad JSON"),
    (json.dumps({"prompt": "1+1?"}), "missing field 'reward_model.ground_truth'"),
    (json.dumps({"prompt": [{"role": "assistant", "content": "hi"}], "reward_model": {"ground_truth": "2"}}), "roles"),
    (json.dumps({"prompt": "1+1?", "reward_model": {"ground_truth": "two"}}), "expected a number"),
    (json.dumps({"prompt": 3, "reward_model": {"ground_truth": "2"}}), "must be a string or a list"),
])
def test_malformed_rows_name_file_and_line_or_are_skipped(tmp_path: Path, bad: str, reason: str) -> None:
    rows = [json.dumps(r) for r in _verl_rows(2)] + [bad] + [json.dumps(r) for r in _verl_rows(4)[2:]]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    src = TableParams(path=path, answer="reward_model.ground_truth", reward="numeric")
    with pytest.raises(DataRowError) as info:
        table_problems(src)
    assert "bad.jsonl line 3:" in str(info.value) and reason in str(info.value)
    assert len(table_problems(src, skip_malformed=True)) == 4


def test_parquet_malformed_row_is_named(tmp_path: Path) -> None:
    pd.DataFrame({"prompt": ["a?", "b?", ""], "answer": ["1", "2", "3"]}).to_parquet(tmp_path / "p.parquet")
    with pytest.raises(DataRowError, match=r"p.parquet row 3: field 'prompt' is empty"):
        table_problems(TableParams(path=tmp_path / "p.parquet"))


def test_gsm8k_through_the_table_source_equals_the_dedicated_source() -> None:
    path = _shared("gsm8k/test.jsonl")
    dedicated = gsm8k_problems(path, limit=200)
    table = table_problems(TableParams(path=path, name="gsm8k", prompt="question", answer="answer",
                                       answer_format="gsm8k", reward="numeric"), limit=200)
    assert table == dedicated
    verify = reward_fn("numeric")
    for p in table[:50]:
        for completion in (f"so #### {p.answer}", "#### 123456789"):
            assert verify(completion, p.answer) == verify(completion, dedicated[table.index(p)].answer)


def test_math500_through_the_table_source_equals_the_dedicated_source() -> None:
    path = _shared("math500/test.jsonl")
    dedicated = math_problems(path)
    table = table_problems(TableParams(path=path, name="math", prompt="problem", answer="answer", reward="math"))
    assert table == dedicated and len(table) == 500
    boxed = table_problems(TableParams(path=path, name="math", prompt="problem", answer="solution",
                                       answer_format="boxed", reward="math"))
    assert [p.problem_id for p in boxed] == [p.problem_id for p in dedicated]
    # same (answer, verifier) per problem id, so every completion gets the same reward
    assert [(p.problem_id, p.answer, p.reward) for p in table] == [(q.problem_id, q.answer, q.reward) for q in dedicated]


def test_params_table_source_and_key_path_errors(tmp_path: Path) -> None:
    pd.DataFrame(_verl_rows(6)).to_parquet(tmp_path / "train.parquet")
    _write_jsonl(tmp_path / "trl.jsonl", _trl_rows(6))
    params = parse_params({"data": {"source": "table", "limit": 6, "tables": [
        {"path": str(tmp_path / "train.parquet"), "answer": "reward_model.ground_truth", "weight": 2},
        {"path": str(tmp_path / "trl.jsonl"), "answer": "solution", "reward": "numeric"}]}})
    pool = load_pool(params.data)
    assert [p.source for p in pool].count("train") == 4 and len(pool) == 6
    with pytest.raises(ParamsError, match=r"data.tables.0.path: .*file not found"):
        parse_params({"data": {"source": "table", "tables": [{"path": str(tmp_path / "none.parquet")}]}})
    with pytest.raises(ParamsError, match=r"data.tables.0.reward: .*cannot import verifier 'nope.mod:fn'"):
        parse_params({"data": {"source": "table", "tables": [{"hub_id": "x/y", "reward": "nope.mod:fn"}]}})
    with pytest.raises(ParamsError, match=r"data.tables.0: .*exactly one of path"):
        parse_params({"data": {"source": "table", "tables": [{"answer": "a"}]}})
    with pytest.raises(ParamsError, match=r"data.tables.0.answr: unknown key; did you mean 'data.tables.0.answer'\? \(valid keys here: answer,"):
        parse_params({"data": {"source": "table", "tables": [{"hub_id": "x/y", "answr": "a"}]}})
    typo = parse_params({"data": {"source": "table", "tables": [{"path": str(tmp_path / "trl.jsonl"), "reward": "numerc"}]}})
    with pytest.raises(ValueError, match=r"table trl: reward_fn: name must be one of numeric, math, exact"):
        load_pool(typo.data)
    with pytest.raises(ParamsError, match=r"data: .*needs at least one table"):
        parse_params({"data": {"source": "table"}})


def test_data_files_no_dvc_dep_holds_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DVC reruns a stage when a dep dvc.yaml lists changes: a clone lists data/, a study folder of the user's own
    its data file (issue 43: a file there was named "outside data/: DVC will not rerun" while DVC reran on it)."""
    from tasks.problems import unwatched_files

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    inside = _write_jsonl(tmp_path / "data" / "t.jsonl", _trl_rows(3))
    listed = _write_jsonl(tmp_path / "mine.jsonl", _trl_rows(3))
    outside = _write_jsonl(tmp_path / "elsewhere.jsonl", _trl_rows(3))
    tables = [{"path": str(p), "answer": "solution"} for p in (inside, listed, outside)]
    data = parse_params({"data": {"source": "table", "tables": tables}}).data
    assert unwatched_files(data) == []  # no dvc.yaml: nothing runs under DVC here
    (tmp_path / "dvc.yaml").write_text("stages:\n  base:\n    cmd: x\n    deps:\n      - data\n      - mine.jsonl\n")
    assert unwatched_files(data) == [str(outside)]


def test_hub_table_with_config_and_split(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load_dataset(path: str, name: str | None = None, split: str | None = None) -> list[dict]:
        calls.append((path, name, split))
        return _verl_rows(2) + [{"prompt": [{"role": "user", "content": "x"}]}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    src = TableParams(hub_id="me/rl-set", hub_config="default", split="validation", answer="reward_model.ground_truth")
    with pytest.raises(DataRowError, match=r"me/rl-set \(default\) split validation row 3: missing field"):
        table_problems(src)
    assert calls[-1] == ("me/rl-set", "default", "validation")
    problems = table_problems(src, skip_malformed=True)
    assert [p.source for p in problems] == ["me/rl-set"] * 2 and problems[0].answer == "3"
