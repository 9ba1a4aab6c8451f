"""`rollscale init`: params from a model's files and a sample of the data (issue: a real user's
first study). The SmolLM2 GGUF end to end is in tests/test_smoke_study.py; here a tiny model
folder keeps it to seconds."""

from __future__ import annotations

from dataclasses import replace

import json
import math
import struct
from pathlib import Path

import pytest
import yaml

from rollscale.config import load_params, parse_params
from rollscale.pipeline.check.memory import full_finetune_gb, micro_batch_gb
from rollscale.pipeline.init.values import Machine, render, suggest
from rollscale.core.fit import power
from rollscale.core.problems.data_sample import count_rows, inspect_rows, read_sample
from rollscale.lm.model_info import ModelInfo, inspect_model, resolve_model
from rollscale.pipeline import cli
from rollscale.pipeline.check.findings import known_data, study_findings
from tests.verl_data import write_verl_table

LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model(n_params: float, vocab: int = 151936, template: str | None = "{{ messages }}") -> ModelInfo:
    return ModelInfo("org/model", None, "qwen3", int(n_params), True, 1024, 28, vocab, 40960, template, LINEAR)


@pytest.fixture
def verl(tmp_path) -> Path:
    return write_verl_table(tmp_path / "data" / "arith.parquet", rows=120)


@pytest.fixture
def tiny_folder(tmp_path) -> Path:
    from rollscale.lm.models import char_tokenizer, tiny_llama

    tok = char_tokenizer()
    folder = tmp_path / "tiny"
    tiny_llama(len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_inspect_rows_reads_verl_trl_gsm8k_and_math_layouts(verl):
    v = inspect_rows(read_sample(str(verl)))
    assert (v.prompt, v.prompt_kind, v.answer, v.answer_format, v.reward) == \
        ("prompt", "messages", "reward_model.ground_truth", "raw", "numeric")
    assert v.solution_tokens == [] and v.rows == 120
    gsm = inspect_rows([{"question": "Q?", "answer": "She has 3 + 4 = 7 apples.\n#### 7"}] * 3)
    assert (gsm.prompt, gsm.prompt_kind, gsm.answer_format, gsm.reward, gsm.solution_column) == \
        ("question", "string", "gsm8k", "numeric", "answer")
    boxed = inspect_rows([{"problem": "x?", "solution": "We find " + "x " * 60 + "so \\boxed{\\frac{1}{2}}."}])
    assert (boxed.prompt, boxed.answer, boxed.answer_format, boxed.reward) == ("problem", "solution", "boxed", "math")
    # a short expression answer with a worked solution beside it: math verifier, lengths from the solution
    both = inspect_rows([{"problem": "x?", "answer": "\\frac{1}{2}", "solution": "Since " + "y " * 60}])
    assert (both.answer, both.answer_format, both.reward, both.solution_column) == ("answer", "raw", "math", "solution")
    assert both.solution_tokens == [round(len("Since " + "y " * 60) / 4)]
    with pytest.raises(ValueError, match=r"no answer column: .*\(the table has prompt, text\)"):
        inspect_rows([{"prompt": "p", "text": "a long text " * 20}])
    with pytest.raises(ValueError, match="no prompt column"):
        inspect_rows([{"body": "p", "answer": "1"}])


def test_gsm8k_and_math500_files(shared_data):
    gsm = inspect_rows(read_sample(str(shared_data / "gsm8k" / "test.jsonl")))
    assert (gsm.answer_format, gsm.reward) == ("gsm8k", "numeric") and len(gsm.solution_tokens) == 200
    math500 = inspect_rows(read_sample(str(shared_data / "math500" / "test.jsonl")))
    assert math500.prompt == "problem" and math500.reward == "math" and math500.solution_column == "solution"


def test_count_rows_without_parsing(verl, tmp_path):
    assert count_rows(verl) == 120
    (tmp_path / "a.jsonl").write_text('{"q": 1}\n\n{"q": 2}\n')
    (tmp_path / "a.csv").write_text("q,a\n1,2\n3,4\n")
    assert count_rows(tmp_path / "a.jsonl") == 2 and count_rows(tmp_path / "a.csv") == 2
    assert count_rows(tmp_path / "missing.parquet") is None


def test_lora_and_its_learning_rate_follow_the_model_size_and_machine(verl):
    sample = inspect_rows(read_sample(str(verl)))
    h100 = Machine("H100", 80, 16)
    small, _ = suggest(model(0.6e9), sample, str(verl), 120, h100)
    large, why = suggest(model(8e9), sample, str(verl), 120, h100)
    # docs/gpu.md: 0.6B trains in full on one H100, at the largest micro-batch that fits half of it (the update's
    # micro-batch measured on an H100: 22 B a token and vocabulary entry, 16,384 tokens would need ~60 GB); 8B with LoRA
    assert small["model.lora.enabled"] is False and small["sweep.train.lr_base"] == 1e-6
    assert small["sweep.train.micro_batch_tokens"] == 8192
    assert full_finetune_gb(int(6e8), "bfloat16", 8192, 151936, kl_reference=True) <= 40 < \
        full_finetune_gb(int(6e8), "bfloat16", 16384, 151936)
    assert large["model.lora.enabled"] is True and large["sweep.train.lr_base"] == 1e-5
    assert large["sweep.train.micro_batch_tokens"] == 4096  # LoRA: the frozen 16 GB + one micro-batch within 40 GB
    assert "LoRA" in why["model.lora.enabled"] and "10 x" in why["sweep.train.lr_base"]
    assert "measured on an H100" in why["model.lora.enabled"] and "measured on an H100" in \
        why["sweep.train.micro_batch_tokens"]
    assert full_finetune_gb(int(8e9), "bfloat16", 2048, 151936) > 40
    # a 40 GB A100 (20 GB for training): 0.6B in full at 4,096 tokens; 8B's LoRA does not fit even at 2,048, and says so
    a100 = Machine.from_arg("A100-40GB")
    small40, _ = suggest(model(0.6e9), sample, str(verl), 120, a100)
    large40, why40 = suggest(model(8e9), sample, str(verl), 120, a100)
    assert (small40["model.lora.enabled"], small40["sweep.train.micro_batch_tokens"]) == (False, 4096)
    assert (large40["model.lora.enabled"], large40["sweep.train.micro_batch_tokens"]) == (True, 2048)
    assert "more than the budget too" in why40["model.lora.enabled"]
    assert (small["sampling.backend"], small["workers"], small["model.dtype"]) == ("vllm", 1, "bfloat16")
    cpu, _ = suggest(model(0.6e9), sample, str(verl), 120, Machine(None, 24, 2))
    assert (cpu["sampling.backend"], cpu["model.dtype"], cpu["profile.k_extreme"]) == ("hf", "float32", 0)
    assert cpu["sweep.train.micro_batch_tokens"] == 2048
    assert cpu["bucket.extremely_hard"] is False
    # issue 32: on CPU a profile unit is a few problems (an interrupt keeps the rest, progress comes often)
    assert (cpu["profile.chunk_size"], small["profile.chunk_size"]) == (4, 100)
    for v in (small, cpu):  # the widest batch of the grid still gets the evaluations a fit needs
        b = max(v["sweep.n"]) * v["sweep.b_problem"][0]
        steps = power.steps_per_run(v["sweep.c_max"], b)
        assert power.evaluations_per_run(steps, v["sweep.eval_every"]) >= power.EVALS_COMFORTABLE
    thinking, why = suggest(model(0.6e9, template="{% if enable_thinking %}"), sample, str(verl), 120, h100)
    assert thinking["sampling.chat_template_kwargs"] == {"enable_thinking": False}


def test_a_node_of_gpus_shards_full_fine_tuning_where_only_the_shards_fit(verl, tiny_folder, tmp_path):
    """--gpu H100 --gpus 8: a 7.6B model, LoRA on one GPU, trains in full sharded over 8 (~9.5 GB of
    state and KL reference per GPU + ~27 GB for a micro-batch of 8,192 tokens, the micro-batch's cost measured
    on an H100); 2 GPUs are not enough (~45 GB per GPU even at 2,048 tokens); check says what a rank holds."""
    sample = inspect_rows(read_sample(str(verl)))
    one, _ = suggest(model(7.6e9), sample, str(verl), 120, Machine.from_arg("H100"))
    node, why = suggest(model(7.6e9), sample, str(verl), 120, Machine.from_arg("H100", gpus=8))
    two, _ = suggest(model(7.6e9), sample, str(verl), 120, Machine.from_arg("H100", gpus=2))
    assert one["model.lora.enabled"] is True and "sweep.devices_per_run" not in one
    assert node["model.lora.enabled"] is False and node["sweep.train.lr_base"] == 1e-6
    assert (node["sweep.devices_per_run"], node["workers"], node["sampling.backend"]) == (8, 8, "vllm")
    assert (node["sweep.train.micro_batch_tokens"], one["sweep.train.micro_batch_tokens"]) == (8192, 4096)
    assert "sharded over the node's 8 GPUs" in why["model.lora.enabled"] and "estimates" in why["model.lora.enabled"]
    assert two["model.lora.enabled"] is True and "sweep.devices_per_run" not in two
    assert full_finetune_gb(int(7.6e9), "bfloat16", 8192, 151936, ranks=8, kl_reference=True) <= 40 < \
        full_finetune_gb(int(7.6e9), "bfloat16", 16384, 151936, ranks=8)
    assert full_finetune_gb(int(7.6e9), "bfloat16", 2048, 151936, ranks=2, kl_reference=True) > 40
    with pytest.raises(ValueError, match="--gpus 8: needs --gpu"):
        Machine.from_arg("none", gpus=8)
    params = parse_params({"model": {"kind": "hf", "name_or_path": str(tiny_folder)}, "workers": 2,
                           "sweep": {"devices_per_run": 2}})
    [note] = [f for f in study_findings(params) if f.keys == ("sweep.devices_per_run",)]
    assert note.level == "note" and "per rank of 2 (estimates" in note.message and "AdamW state" in note.message
    assert "measured on an H100" in note.message


def test_the_micro_batch_cost_covers_the_h100_measurements():
    """benchmarks/gpu_check.py on an H100 80GB (2026-11-26; bf16, autocast, gradient checkpointing, 256-token
    completions; docs/gpu.md): the update's allocated peak at the first step, less the weights and gradients
    (AdamW's moments do not exist yet), is one micro-batch. The constant covers each, by under 5 %."""
    mib = 2**20 / 1e9
    for peak_mib, before_mib, tokens in ((53172.5, 1168.9, 16384), (14847.7, 1168.9, 4096),  # Qwen3-0.6B
                                         (19385.8, 3314.3, 4096)):  # Qwen3-1.7B
        measured = (peak_mib - 2 * before_mib) * mib
        assert measured <= micro_batch_gb(tokens, 151936) <= 1.05 * measured


def test_max_new_tokens_from_reference_solutions():
    rows = [{"question": "Q?", "answer": "w " * n + "\n#### 7"} for n in range(10, 410, 4)]
    sample = inspect_rows(rows)
    values, why = suggest(model(0.6e9), sample, "x.jsonl", 100, Machine(None, 24, 2))
    p95 = sorted(sample.solution_tokens)[94]
    assert values["sampling.max_new_tokens"] >= 2 * p95 and values["sampling.max_new_tokens"] % 64 == 0
    assert "95th percentile of the reference solutions" in why["sampling.max_new_tokens"]


def test_render_writes_every_section_with_reasons(verl, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    values, why = suggest(model(0.135e9, vocab=49152), inspect_rows(read_sample(str(verl))), "data/arith.parquet", 120,
                          Machine(None, 24, 2))
    text = render(values, why, ["header"])
    raw = yaml.safe_load(text)
    assert set(raw) >= {"data", "model", "base", "sampling", "profile", "bucket", "measure", "sweep", "fit", "report"}
    assert raw["sweep"]["train"]["lr_base"] == 1e-6 and raw["model"]["lora"]["enabled"] is False
    lines = text.splitlines()
    i = lines.index("  backend: hf")
    assert lines[i - 1].startswith("  # transformers generate on CPU")
    # issue 32: only what a table study with a real model reads (no reasoning-gym generator, no tiny warm start)
    assert raw["data"]["source"] == "table" and not {"name", "config", "size", "prompt_style"} & set(raw["data"])
    j = lines.index("base: {}")
    assert raw["base"] == {} and "# the tiny model's warm start" in "\n".join(lines[j - 3:j])


def test_cli_init_writes_params_the_check_passes_and_refuses_to_overwrite(tiny_folder, verl, tmp_path,
                                                                          monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert resolve_model(str(tiny_folder)) == (str(tiny_folder), None)
    info = inspect_model(str(tiny_folder))
    assert info.n_params_exact and info.chat_template is None and info.num_layers == 2
    # 120 problems hold no validation split that settles a key at the tolerance: refused in one line, nothing written
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--pilot", "0"]) == 2
    err = capsys.readouterr().err
    assert "no study resolves 0.02: the one it fits resolves" in err and "init: nothing written (--force writes it anyway): " in err, err
    assert not Path("params.yaml").exists()
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--pilot", "0", "--force"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("init: cannot answer (written: --force; `rollscale study --no-check` runs it): "), out
    verdict = first.split("runs it): ")[1]
    assert "init: wrote params.yaml" in out and f"error   study.tolerance, bucket.val_size, sweep.eval_k, " \
        f"sweep.seeds: {verdict}" in out and "1 error(s)" in out, out  # the check's verdict is init's
    assert Path("params.yaml").read_text().startswith(f"# It cannot answer: {verdict}")
    params = load_params("params.yaml")
    assert params.model.chat_template is False  # the tiny tokenizer has no template
    assert str(params.data.tables[0].path) == "data/arith.parquet"  # relative to the project folder
    assert [f.message for f in study_findings(params, known_data(params, None)) if f.level == "error"] == [verdict]
    assert cli.main(["check"]) == 2 and verdict in capsys.readouterr().out  # `rollscale check`: the same verdict
    before = Path("params.yaml").read_text()
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl)]) == 2
    assert "params.yaml exists: pass --force" in capsys.readouterr().err
    assert Path("params.yaml").read_text() == before
    # a template with a thinking switch, and --force
    cfg = tiny_folder / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "chat_template": "{{ enable_thinking }}"}))
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--gpu", "H100", "--force"]) == 0
    params = load_params("params.yaml")
    assert params.sampling.backend == "vllm" and params.sampling.chat_template_kwargs == {"enable_thinking": False}
    # --engine: the sampler, whatever the machine
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--engine", "vllm", "--force"]) == 0
    assert load_params("params.yaml").sampling.backend == "vllm" and "--engine vllm" in Path("params.yaml").read_text()
    # a model that is not there is a typo in the input: exit 2 (issue 42, case 6; was 1, as for the machine)
    assert cli.main(["init", "--model", "not/a/model/path", "--data", str(verl), "--out", "x.yaml"]) == 2
    assert "neither a model folder" in capsys.readouterr().err
    # --budget: the decision at C* (science §9), c_max sized so that C* <= eta c_max
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--budget", "1000000", "--force"]) == 0
    params = load_params("params.yaml")
    assert params.study.target_budget == 1_000_000 and params.sweep.c_max == 709_220  # C* / eta = 1,000,000 / 1.41, rounded up
    assert "--budget 1000000" in Path("params.yaml").read_text()


def test_budget_keeps_a_larger_c_max_and_refuses_nonsense():
    from rollscale.pipeline.init.command import budget_values

    values, why = {"sweep.c_max": 4000}, {}
    budget_values(values, why, 6000, 2.0)
    assert values == {"sweep.c_max": 4000, "study.target_budget": 6000} and "study.target_budget" in why
    budget_values(values, why, 9001, 2.0)
    assert values["sweep.c_max"] == 4501 and "C* / eta" in why["sweep.c_max"]
    with pytest.raises(ValueError, match="--budget: expected"):
        budget_values(values, why, 0, 2.0)


def test_init_counts_the_problems_as_the_loader_does(tiny_folder, tmp_path, monkeypatch, capsys):
    """Issue 31, part 3: a 300-row table with repeated prompts has fewer problems (the loader drops the
    duplicates), so init's data.limit is what the pool fills, not 300."""
    import pandas as pd

    from rollscale.core.problems.sources import table_problems

    path = write_verl_table(tmp_path / "data" / "arith.parquet", rows=300)
    table = pd.read_parquet(path)
    pd.concat([table.iloc[:299], table.iloc[[0]]]).to_parquet(path)  # row 0 again as row 300
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(path), "--force"]) == 0
    assert "1 error(s)" in capsys.readouterr().out  # the verdict: 300 problems settle no key at 0.02
    params = load_params("params.yaml")
    problems = len(table_problems(params.data.tables[0]))  # as the stages load the pool
    assert problems < 300 and params.data.limit == problems


def test_hours_shrinks_the_study_to_fit_and_says_what_it_gave_up(tiny_folder, verl, tmp_path, monkeypatch, capsys):
    """Issue 32, "time first": `init --hours H` sizes the study from a calibration of this machine (here a
    stored one: 20 ms per rollout and new token, so the suggested study takes hours) and names each
    setting it gave up; the check's estimate of what it wrote is within H."""
    from rollscale.pipeline.check import calibration
    from rollscale.pipeline.check.calibration import Calibration
    from rollscale.pipeline.check.timing import stage_times

    import pandas as pd

    from rollscale.pipeline.init import pilot
    from rollscale.pipeline.init.pilot import share_low

    # issue 43: the learning-rate probe at the suggested lr_base (1e-6, full fine-tuning) moved the policy by a KL
    # of 1e-6 a step: too little for the planned steps
    cal = Calibration("stored", 0.0, 0.02, 0.0, 1e-3, 0.0, 0.0, 20.0, 5.0, 5.0, 1.0, probe_lr=1e-6,
                      probe_kl=(1e-6, 2e-6, 3e-6))
    monkeypatch.setattr(calibration, "calibrate", lambda p, artifacts, reuse=True, **kw: cal)
    # a pilot with 9 of its 32 problems in Easy (84 % lower bound 21 %, the default study's share): the bucket
    # needs no more than the 60-problem floor of the pool
    some = pd.DataFrame({"avg_at_k": [0.5] * 9 + [0.0] * 23, "k": 16})
    monkeypatch.setattr(pilot, "pilot_profile", lambda p, count=32, k=None, **kw: some)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--force"]) == 0
    capsys.readouterr()
    full = load_params("params.yaml")
    assert stage_times(full, cal, full.data.limit).total > 3 * 3600  # the suggested study: hours
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--hours", "1", "--force"]) == 0
    out = capsys.readouterr().out
    sized = load_params("params.yaml")
    assert stage_times(sized, cal, sized.data.limit).total <= 3600
    assert "init --hours 1: about" in out and "gave up data.limit: 120 -> 60" in out
    assert sized.data.limit == 60 and sized.sampling.max_new_tokens < full.sampling.max_new_tokens
    assert "--hours 1: 120 -> 60" in Path("params.yaml").read_text()  # the reason beside the value
    # issue 43: the split's comment says the pool it was sized from (it said 300 beside limit: 60)
    comments = " ".join(line.strip().removeprefix("# ") for line in Path("params.yaml").read_text().splitlines())
    expected = share_low(9, 32) * 60  # the pilot's share, its 84 % lower bound
    assert f"a third of the ~{expected:.0f} problems expected in the used bucket of 60 " in comments
    assert "of 120 " not in comments and sized.bucket.val_size == int(expected // 3)
    assert sized.bucket.expected_share == round(share_low(9, 32), 3)  # what check sizes its fixes by (issue 43)
    assert "1 error(s)" in out and "init: cannot answer" in out  # 120 problems: no key settled at 0.02
    # issue 43, part 2: init writes the rate the probe says moves the policy, says why, and the check agrees
    rate = sized.sweep.train.lr_base
    assert rate > 1e-6 and f"init: sweep.train.lr_base 1e-06 -> {rate:g}: " in out
    assert "the learning-rate probe: at 1e-06 the slowest run" in comments
    assert "warning sweep.train.lr_base" not in out, out
    # a probe that moved the policy enough: the suggested rate stays, and init says why
    moving = replace(cal, probe_kl=(1e-2, 4e-2, 9e-2))
    monkeypatch.setattr(calibration, "calibrate", lambda p, artifacts, reuse=True, **kw: moving)
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--hours", "1", "--force"]) == 0
    out = capsys.readouterr().out
    assert load_params("params.yaml").sweep.train.lr_base == 1e-6
    assert "init: sweep.train.lr_base 1e-06 moves the policy: the learning-rate probe expects the slowest run" in out
    monkeypatch.setattr(calibration, "calibrate", lambda p, artifacts, reuse=True, **kw: cal)
    # hours no study fits: the smallest one, and that it does not fit
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--hours", "0.01", "--force"]) == 0
    out = capsys.readouterr().out
    assert "more than 0.01 h even at the smallest study" in out
    # issue 43: past 10 x the time asked it is an error, unless --force writes it anyway
    assert "warning: the study takes about" in out and "more than 10 x the 0.01 h asked (--hours)" in out
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--hours", "0.01", "--out",
                     "new.yaml"]) == 2
    err = capsys.readouterr().err
    assert "more than 10 x the 0.01 h asked (--hours): a GPU (--gpu), or --hours " in err
    assert "nothing written (--force writes it anyway)" in err and not Path("new.yaml").exists()
    # --budget alone: the time asked is the check's 12 h; 1,000,000 rollouts at 20 ms a token take far longer
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--budget", "1000000", "--out",
                     "new.yaml"]) == 2
    err = capsys.readouterr().err
    assert "more than 10 x 12 h (the check's limit; --hours sets yours)" in err
    assert "or a smaller --budget than 1,000,000 would fit it" in err
    tiny = load_params("params.yaml")
    assert tiny.sweep.seeds == [0, 1] and len(tiny.sweep.n) == 2 and tiny.sweep.b_problem == [2]
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--hours", "-1", "--force"]) == 2
    assert "--hours: expected the hours" in capsys.readouterr().err
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(verl), "--pilot", "-1", "--force"]) == 2
    assert "--pilot: expected the problems of the pilot profile" in capsys.readouterr().err


def test_init_foresees_a_model_too_weak_for_the_default_buckets(tiny_folder, tmp_path, monkeypatch, capsys):
    """Issue 43, part 1: the first study died at the bucket stage (3 problems in Easy [0.3, 0.6] of 60). On a
    table of our own in TRL's conversational layout the untrained tiny model solves a few samples of some problems
    and none of most: init's pilot profile sees it, widens Easy to pass rates it saw and sizes the split; a profile
    of the whole pool the study will profile (the profile stage's function, at profile.k) then lays the buckets out
    without an error, where the default bounds hold too few."""
    from rollscale.pipeline.check.findings import DataKnown
    from rollscale.pipeline.init.pilot import pilot_profile
    from tests.word_problems import write_word_problems

    from rollscale.pipeline.init import clock

    data = write_word_problems(tmp_path / "words.jsonl", 60)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(clock, "DEFAULT_BUDGET_S", 3600.0)  # the whole pilot, however busy the machine
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(data), "--force"]) == 0
    out = capsys.readouterr().out
    assert "init: pilot profile of 32 problems" in out, out
    assert "the default [0.3, 0.6] would hold too few" in out and "1 error(s)" in out, out  # 60 settle no key
    params = load_params("params.yaml")
    lo, hi = params.bucket.easy
    assert lo < 0.3 and "Easy's [0.3, 0.6] held too few" in Path("params.yaml").read_text()
    assert len(pilot_profile(params, seconds=0)) == 8  # one chunk past its time: slow generation stops it early
    profile = pilot_profile(params, count=params.data.limit or 60, seconds=math.inf)
    assert len(profile) == 60 and int(profile["avg_at_k"].between(0.3, 0.6).sum()) <= params.bucket.val_size
    found = study_findings(params, DataKnown(len(profile), True, profile))
    errors = [f for f in found if f.level == "error" and "no study resolves" not in f.message]
    assert not errors, [f.text() for f in errors]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json writes a float NaN as NaN
    return path


def test_init_refuses_a_table_too_small_to_bucket(tiny_folder, tmp_path, monkeypatch, capsys):
    """Issue 42, case 5: init on a one-row table wrote a study and exited 0."""
    from tests.test_errors import short

    monkeypatch.chdir(tmp_path)
    one = _jsonl(tmp_path / "one.jsonl", [{"question": "What is 2 + 2?", "answer": "4"}])
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(one)]) == 2
    assert "1 problem(s); a study needs at least 6 to bucket" in short(capsys.readouterr().err)
    assert not Path("params.yaml").exists()


def test_init_names_the_row_whose_answer_is_empty(tiny_folder, tmp_path, monkeypatch, capsys):
    """Issue 42, case 5: a NaN answer was reported as "no answer column" (and a JSON NaN read as the answer)."""
    from tests.test_errors import short

    monkeypatch.chdir(tmp_path)
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(30)]
    rows[7]["answer"] = float("nan")
    nan = _jsonl(tmp_path / "nan.jsonl", rows)
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(nan)]) == 2
    assert f"bad data row at {nan} line 8: field 'answer' is NaN" in short(capsys.readouterr().err)
    rows[7]["answer"] = None
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(_jsonl(nan, rows))]) == 2
    assert "line 8: field 'answer' is null" in capsys.readouterr().err
    assert not Path("params.yaml").exists()


def test_init_names_a_gguf_it_cannot_read(tmp_path, monkeypatch, capsys):
    """Issue 42, case 5: a truncated GGUF ended in numpy's "index 0 is out of bounds for axis 0 with size 0"."""
    from tests.test_errors import short

    monkeypatch.chdir(tmp_path)
    data = _jsonl(tmp_path / "t.jsonl", [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(9)])
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1))  # a download cut after its header (1 tensor, 1 key)
    assert cli.main(["init", "--model", str(gguf), "--data", str(data)]) == 2
    message = short(capsys.readouterr().err)
    assert f"{gguf}: cannot read this GGUF file (24 bytes; IndexError" in message and "download it again" in message
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # a header and nothing else: no model in it
    assert cli.main(["init", "--model", str(gguf), "--data", str(data)]) == 2
    assert "holds no tensors" in short(capsys.readouterr().err)
    assert not Path("params.yaml").exists()


def test_init_warns_on_prompts_longer_than_the_models_context(tiny_folder, tmp_path, monkeypatch, capsys):
    """Issue 42, case 5: a 5 MB prompt, far past the model's context, was taken without a word."""
    monkeypatch.chdir(tmp_path)
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
    rows[3]["question"] = "Add these: " + "1 + " * 5000 + "1?"
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(_jsonl(tmp_path / "long.jsonl", rows)),
                     "--force"]) == 0
    out = capsys.readouterr().out
    assert "warning data.tables: 1 of the 40 sampled prompts are longer than the model's context of 64 tokens" in out


def test_a_stop_time_holds_inside_a_batch_and_init_says_where_it_is(tiny_folder, tmp_path, monkeypatch, capsys):
    """A new user's study: the pilot's 60-second stop held at 2,384 s, since it was checked between batches and one
    batch took 40 minutes. Here each decoding step is made slow (0.05 s; the only fake: the model is the real tiny
    one): a generation of 256 tokens would take 13 s, and stops at its stop time, 1 s, inside the batch; the pilot
    sized to 3 s ends within it with the problems of the batches that finished, and a progress line names the step
    at least every interval."""
    import time

    from rollscale.core.rollouts import SamplingConfig
    from rollscale.lm.engines import hf
    from rollscale.lm.engines.hf import GenerationTimeUp, HFSampler, generation_deadline
    from rollscale.lm.models import ModelRef, load_model
    from rollscale.pipeline.init.clock import InitClock, calibration_budget_s
    from rollscale.pipeline.init.pilot import pilot_profile
    from tests.word_problems import write_word_problems

    step = hf.SeededSampling.__call__

    def slow(self, input_ids, scores):
        time.sleep(0.05)
        return step(self, input_ids, scores)

    monkeypatch.setattr(hf.SeededSampling, "__call__", slow)
    model, tokenizer = load_model(ModelRef(str(tiny_folder), chat_template=False))
    engine = HFSampler(model, tokenizer, batch_size=64)
    config = SamplingConfig(temperature=1.0, max_new_tokens=256)
    t0 = time.perf_counter()
    with pytest.raises(GenerationTimeUp), generation_deadline(t0 + 1.0):
        engine.sample(["1+1="] * 4, 4, config, seed=0)
    assert time.perf_counter() - t0 < 4.0  # 13 s of decoding asked; stopped at 1 s, within a few decoding steps
    assert len(engine.sample(["1+1="], 1, SamplingConfig(max_new_tokens=4), seed=0)[0]) == 1  # no stop time: as before

    data = write_word_problems(tmp_path / "words.jsonl", 60)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init", "--model", str(tiny_folder), "--data", str(data), "--pilot", "0", "--force"]) == 0
    params = load_params("params.yaml")
    capsys.readouterr()
    lines: list[str] = []
    clock = InitClock(3.0, every=0.5)
    clock.say = lines.append  # what it would print
    t0 = time.perf_counter()
    try:
        with clock.step("pilot profile") as end:
            pilot = pilot_profile(params, count=32, seconds=math.inf, deadline=end, say=clock.say)
    finally:
        clock.close()
    took = time.perf_counter() - t0
    assert took < 3.0 + 2.0, took  # the model's load and a decoding step past the stop time, no batch more
    assert len(pilot) < 32 and set(pilot.columns) >= {"avg_at_k", "k", "greedy"}
    ticks = [line for line in lines if "pilot profile:" in line and "stops within" in line]
    assert len(ticks) >= int(took / 0.5) - 2, lines  # a line at least every interval while it ran
    assert calibration_budget_s(1.0) == 180.0 and calibration_budget_s(None) == 180.0  # 5 % of an hour; 3 min
    # the calibration's timing holds its stop time too: it ends in one line, not minutes late
    from rollscale.pipeline.check.calibration import CalibrationTimeUp, calibrate

    t0 = time.perf_counter()
    with pytest.raises(CalibrationTimeUp, match="load|timing"):
        calibrate(params, None, reuse=False, deadline=t0 + 1.0)
    assert time.perf_counter() - t0 < 1.0 + 15.0  # the model's load, then a decoding step past the stop time


def test_init_moves_the_bucket_off_problems_solved_greedily():
    """A new user's study: the validation problems were solved greedily at step 0 in every run. From its pilot's
    greedy answers init moves the used bucket to the pass rates of problems with a reward signal that greedy
    decoding does not solve, and says why; where the pilot has too few of them it warns instead."""
    import pandas as pd

    from rollscale.pipeline.init.pilot import foresee

    # 14 of the 15 pilot problems in [0.3, 0.6] solved greedily; 6 between 1/8 and 5/16 are not
    avg = [0.5] * 10 + [0.4] * 4 + [0.125, 0.1875, 0.25, 0.25, 0.3125, 0.125] + [0.0] * 12
    greedy = [1.0] * 14 + [0.0] * 18
    pilot = pd.DataFrame({"avg_at_k": avg, "k": 16, "greedy": greedy})
    values, why = {"sampling.max_new_tokens": 256, "sweep.b_problem": [8]}, {}
    seen = foresee(values, why, pilot, 400)
    assert values["bucket.easy"] == [0.125, 0.3125], values
    assert "14 of the 15 pilot problems in the used bucket [0.3, 0.6] are solved greedily" in seen.lines[0]
    assert "greedy decoding does not solve" in why["bucket.easy"]
    # too few problems that greedy decoding leaves unsolved: the bounds stay, and init warns
    values, why = {"sampling.max_new_tokens": 256, "sweep.b_problem": [8]}, {}
    seen = foresee(values, why, pilot.assign(greedy=[1.0] * 20 + [0.0] * 12), 400)
    assert "bucket.easy" not in values and any(line.startswith("warning: 15 of the 15 pilot problems") for line in
                                                 seen.lines), seen.lines
