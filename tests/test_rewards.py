"""Tests for rollscale.core.problems.rewards: the 0/1 verifiers (science §2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import pytest

from rollscale.core.problems import rewards
from rollscale.core.problems.rewards import (
    canonical_number,
    extract_number,
    last_boxed,
    math_reward,
    normalize_number,
    numeric_reward,
    reward_fn,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _jsonl(relative: str) -> list[dict]:
    path = DATA / relative
    if not path.is_file():
        pytest.skip(f"reference data not found: {path}")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --- numeric_reward --------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("The answer is 1,234", "1234", 1.0),
        ("The answer is 1234", "1,234", 1.0),
        ("It costs $1,234.50 in total", "1234.5", 1.0),
        ("She pays $18.", "18", 1.0),
        ("The change is -3", "-3", 1.0),
        ("The change is -3", "3", 0.0),
        ("It rose by +3", "3", 1.0),
        ("A loss of -$5", "-5", 1.0),
        ("x = \u22124", "-4", 1.0),  # unicode minus
        ("3.50", "3.5", 1.0),
        ("3.5", "7/2", 1.0),
        ("3/4", "0.75", 1.0),
        ("3/4", "0.7500", 1.0),
        ("1/3", "0.333333", 0.0),  # exact, no float tolerance
        ("0.30000000000000004", "0.3", 0.0),
        ("0.3", "0.3", 1.0),
        ("So the total is 42.", "42", 1.0),
        ("So the total is 42.", "42.0", 1.0),
        ("No idea.", "42", 0.0),
        ("", "42", 0.0),
        ("#### 7\nActually it might be 9", "7", 1.0),  # #### beats later numbers
        ("#### 7\nActually it might be 9", "9", 0.0),
        ("I think 5 or 9 #### 5", "5", 1.0),
        ("#### 5 then #### 6", "6", 1.0),  # the last ####
        ("counted 12 #### none", "12", 0.0),  # a declared answer with no number
        ("5-3", "3", 1.0),  # a minus between operands is not a sign
        ("5-3", "-3", 0.0),
        ("the answer is 10", "Step 1 ... #### 10", 1.0),  # gold as a GSM8K answer string
        ("12 apples and 5 pears", "5", 1.0),  # last number
        ("12 apples and 5 pears", "12", 0.0),
        ("1,2345", "2345", 1.0),  # not a thousands-separated number
    ],
)
def test_numeric_reward_cases(completion: str, gold: str, expected: float) -> None:
    assert numeric_reward(completion, gold) == expected


def test_numeric_reward_is_binary_and_gold_must_hold_a_number() -> None:
    assert numeric_reward("about 17.9", "18") == 0.0
    with pytest.raises(ValueError, match="gold"):
        numeric_reward("42", "no number here")
    with pytest.raises(ValueError, match="completion"):
        numeric_reward(None, "42")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,234", "1234"),
        ("$1,234.50", "1234.5"),
        ("-3", "-3"),
        ("+3", "3"),
        ("3.50", "3.5"),
        ("3/4", "0.75"),
        ("1/3", "1/3"),
        ("-2/6", "-1/3"),
        (".5", "0.5"),
        ("42.", "42"),
        ("0.0", "0"),
        ("-0", "0"),
        ("nothing", None),
        ("3/0", None),
        ("1" * 5000, None),  # over Python's int-conversion digit limit
    ],
)
def test_extract_number_canonical_form(text: str, expected: str | None) -> None:
    assert extract_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,234", Fraction(1234)),
        (" $-5 ", Fraction(-5)),
        ("-$5", Fraction(-5)),
        ("3.50", Fraction(7, 2)),
        ("3/4", Fraction(3, 4)),
        ("42.", Fraction(42)),
        ("42 dollars", None),  # one number, nothing else
        ("1 2", None),
        ("", None),
    ],
)
def test_normalize_number(text: str, expected: Fraction | None) -> None:
    assert normalize_number(text) == expected


def test_canonical_number_round_trips_and_is_unique() -> None:
    values = {Fraction(n, d) for n in range(-40, 41) for d in range(1, 41)}
    strings = {canonical_number(v) for v in values}
    assert len(strings) == len(values)
    for v in values:
        assert normalize_number(canonical_number(v)) == v
    assert canonical_number(Fraction(1, 1024)) == "0.0009765625"
    with pytest.raises(ValueError, match="Fraction"):
        canonical_number(0.5)  # type: ignore[arg-type]


def test_gsm8k_solutions_score_one_against_their_gold_and_zero_when_changed() -> None:
    rows = _jsonl("gsm8k/test.jsonl")
    assert len(rows) == 1319
    for row in rows:
        solution = row["answer"]
        gold = solution.rsplit("####", 1)[1].strip()
        assert numeric_reward(solution, gold) == 1.0, gold
        changed = normalize_number(gold) + 1
        wrong = solution.rsplit("####", 1)[0] + f"#### {canonical_number(changed)}"
        assert numeric_reward(wrong, gold) == 0.0, gold
        assert numeric_reward(solution, canonical_number(changed)) == 0.0, gold


# --- math_reward -----------------------------------------------------------


def test_last_boxed() -> None:
    assert last_boxed(r"so \boxed{1} and then \boxed{\frac{\sqrt{3}}{2}}.") == r"\frac{\sqrt{3}}{2}"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"\boxed {x+1}") == "x+1"
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{\frac{1}{2}") is None  # never closes


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"Thus \boxed{\frac{1}{2}}.", r"\frac{1}{2}", 1.0),
        (r"Thus \boxed{0.5}.", r"\frac12", 1.0),
        (r"Thus \boxed{\frac{1}{2}}.", r"The answer is $\boxed{\frac{1}{2}}$", 1.0),
        (r"Thus \fbox{\frac{\sqrt{3}}{2}}.", r"\frac{\sqrt3}{2}", 1.0),
        (r"Thus \boxed{\frac{1}{3}}.", r"\frac{1}{2}", 0.0),
        (r"First \boxed{2}, no wait: \boxed{3}", "3", 1.0),  # the last box counts
        (r"First \boxed{3}, no wait: \boxed{2}", "3", 0.0),
        (r"\boxed{x^2+2x+1}", r"(x+1)^2", 1.0),
        (r"\boxed{(1, 2)}", r"(2, 1)", 0.0),
        ("So the answer is 1/2", r"\frac{1}{2}", 1.0),  # no box: math-verify's extraction
        ("So the answer is 41", "42", 0.0),
        ("I do not know.", "42", 0.0),
        (r"\boxed{", "42", 0.0),
        (r"\boxed{\frac{1}{}}", "42", 0.0),
    ],
)
def test_math_reward_cases(completion: str, gold: str, expected: float) -> None:
    assert math_reward(completion, gold) == expected


def test_math_reward_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="gold"):
        math_reward(r"\boxed{1}", "  ")
    with pytest.raises(ValueError, match="completion"):
        math_reward(None, "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        math_reward(r"\boxed{1}", "1", timeout_s=0)


def test_math500_solutions_score_one_and_wrong_boxes_zero() -> None:
    rows = _jsonl("math500/test.jsonl")
    assert len(rows) == 500
    failed = [i for i, row in enumerate(rows) if math_reward(row["solution"], row["answer"]) != 1.0]
    print(f"MATH-500: {len(rows) - len(failed)}/{len(rows)} solutions verified; failed rows: {failed}")
    assert len(failed) <= 0.05 * len(rows), [(i, rows[i]["answer"]) for i in failed]
    wrong = [
        i
        for i, row in enumerate(rows)
        if math_reward(r"So the answer is \boxed{" + row["answer"] + "+1}", row["answer"]) != 0.0
    ]
    assert wrong == []


def test_math_reward_in_worker_threads_matches_main_thread() -> None:
    cases = [
        (r"\boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{3}", "4"),
        (r"\boxed{\sqrt{2}}", r"2^{1/2}"),
        ("the answer is 7", "7"),
    ] * 5
    in_main = [math_reward(c, g) for c, g in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        in_threads = list(pool.map(lambda cg: math_reward(*cg), cases))
    assert in_threads == in_main == [1.0, 0.0, 1.0, 1.0] * 5


def test_math_reward_pathological_answer_is_bounded_in_a_worker_thread() -> None:
    # In-process with math-verify's timeout off, this never returns and holds
    # the GIL; the worker process keeps it bounded.
    result: list[float] = []
    start = time.monotonic()
    thread = threading.Thread(target=lambda: result.append(math_reward(r"\boxed{9^{9^{9^{9}}}}", "3", timeout_s=2)))
    thread.start()
    thread.join(30)
    assert result == [0.0]
    assert time.monotonic() - start < 15
    assert math_reward(r"\boxed{3}", "3") == 1.0


def test_timed_worker_kills_an_overrunning_call_and_restarts() -> None:
    worker = rewards.TimedWorker()
    try:
        assert worker.call(time.sleep, (0.0,), timeout_s=10, default="timed out") is None
        first = worker._proc
        start = time.monotonic()
        assert worker.call(time.sleep, (30,), timeout_s=0.5, default="timed out") == "timed out"
        assert time.monotonic() - start < 5 and worker._proc is None  # killed, not left computing
        assert first.poll() is not None
        assert worker.call(time.sleep, (0.0,), timeout_s=10, default="timed out") is None  # a fresh worker
        assert worker._proc is not first
        # a call that raises scores the default; a function the worker cannot import is refused at once
        assert worker.call(int, ("x",), timeout_s=10, default=-1) == -1
        with pytest.raises(ValueError, match="cannot be sent to the worker process"):
            worker.call(lambda: 1, (), timeout_s=10, default=-1)
        assert worker.call(time.sleep, (0.0,), timeout_s=10, default="timed out") is None
    finally:
        worker.stop()


def test_math_reward_from_a_script_without_a_main_guard(tmp_path) -> None:
    """Issue 23: a plain reward script (no `if __name__ == "__main__":`, as most TRL scripts are)
    hung 120 s, then "worker process did not start": the spawned worker re-imported the script."""
    script = tmp_path / "score.py"
    script.write_text("from rollscale.core.problems.rewards import math_reward\n"
                      "print(math_reward(r'\\boxed{\\frac{1}{2}}', '0.5'), math_reward(r'\\boxed{3}', '4'))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(rewards.__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=90)
    assert r.returncode == 0 and r.stdout.split() == ["1.0", "0.0"], r.stderr[-2000:]
    assert time.monotonic() - start < 60


# --- reward_fn -------------------------------------------------------------


def test_reward_fn() -> None:
    assert reward_fn("numeric") is numeric_reward
    assert reward_fn("math") is math_reward
    with pytest.raises(ValueError, match="numeric, math"):
        reward_fn("partial")
