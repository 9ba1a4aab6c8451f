"""Models: the tiny from-scratch Llama (embedded default) and any HF causal LM.

Both end up as a ``transformers`` model and tokenizer, so every stage after
``base`` loads them the same way (:func:`load_model`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from rollscale.lm import gguf as gguf_cache

log = logging.getLogger("rollscale.lm.models")

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Characters of arithmetic expressions and answers (chain_sum, basic_arithmetic).
TINY_ALPHABET = "0123456789+-*/=(). "


def char_tokenizer(alphabet: str = TINY_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level tokenizer (one id per character) wrapped for transformers."""
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *alphabet])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # join characters back without spaces ("12", not "1 2")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    fast.padding_side = "left"
    return fast


def tiny_llama(
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 384,
    max_positions: int = 64,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A small ``LlamaForCausalLM`` (about 0.5-2 M parameters at the defaults)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def n_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclass
class SupervisedStats:
    steps: int
    final_loss: float
    seconds: float
    n_parameters: int


def train_supervised(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[str, str]],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    label_smoothing: float = 0.0,
) -> SupervisedStats:
    """Teacher-forced training on (prompt, answer) pairs; loss on answer + EOS only.

    The warm start of the tiny model: it learns the task to a partial skill so
    that pass rates spread over [0, 1] (what profiling and bucketing need).
    Label smoothing caps each token's probability near ``1 - label_smoothing``,
    so even learned problems keep a sampling error rate at temperature 1 that
    grows with answer length: pass rates spread into the Easy band, and RL has
    a sharpening gain to find.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if not pairs:
        raise ValueError("train_supervised: no training pairs")
    gen = torch.Generator().manual_seed(seed)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in pairs]
    answer_ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for _, a in pairs]
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    max_pos = model.config.max_position_embeddings
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # cosine decay: a short run needs the tail of low lr to settle
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    start, loss_value = time.perf_counter(), float("nan")
    for step in range(steps):
        idx = torch.randint(len(pairs), (batch_size,), generator=gen).tolist()
        seqs = [[bos, *prompt_ids[i], *answer_ids[i], eos][:max_pos] for i in idx]
        n_prompt = [1 + len(prompt_ids[i]) for i in idx]
        width = max(map(len, seqs))
        input_ids = torch.full((batch_size, width), pad)
        labels = torch.full((batch_size, width), -100)
        attn = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (s, n_p) in enumerate(zip(seqs, n_prompt)):
            input_ids[row, : len(s)] = torch.tensor(s)
            attn[row, : len(s)] = 1
            labels[row, n_p : len(s)] = torch.tensor(s[n_p:])
        logits = model(input_ids=input_ids, attention_mask=attn).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100, label_smoothing=label_smoothing,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = loss.item()
        if on_step is not None:
            on_step(step, loss_value)
    model.eval()
    return SupervisedStats(steps, loss_value, time.perf_counter() - start, n_parameters(model))


@dataclass(frozen=True)
class ModelRef:
    """Where a stage finds the base model, and a fingerprint of its weights.

    The fingerprint keys caches and resumable work, so a retrained model at the
    same path never reuses stale results.
    """

    name_or_path: str
    gguf_file: str | None = None
    dtype: str = "float32"
    chat_template: bool = True
    fingerprint: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelRef":
        return cls(**json.loads(text))

    @classmethod
    def read(cls, path: str | Path) -> "ModelRef":
        """The base stage's record (``<artifacts>/base/model_ref.json``). Its own model folder is recorded as the
        path base ran with (``<artifacts>/base/model``); where the artifacts folder has moved since (or is named
        otherwise, ``rollscale --artifacts``), that folder is the one beside the record."""
        path = Path(path)
        ref = cls.from_json(path.read_text())
        recorded, beside = Path(ref.name_or_path), path.parent / "model"
        if recorded.parts[-2:] == ("base", "model") and not recorded.is_dir() and beside.is_dir():
            return dataclasses.replace(ref, name_or_path=str(beside))
        return ref


def fingerprint_files(folder: str | Path) -> str:
    """sha256 over the files of a local model folder (names and bytes)."""
    h = hashlib.sha256()
    folder = Path(folder)
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def gguf_unreadable(path: str | Path, err: BaseException) -> str:
    """The one line for a GGUF file that cannot be read: a truncated download ends in numpy's index or
    reshape errors, which name neither the file nor the cause."""
    path = Path(path)
    size = f"{path.stat().st_size:,} bytes" if path.is_file() else "missing"
    return (f"{path}: cannot read this GGUF file ({size}; {type(err).__name__}: {str(err)[:80]}): it is truncated "
            "or damaged; download it again")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(ref: ModelRef, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load any causal LM (local folder, hub id, or a GGUF file in a folder). A model that is not there
    (a folder moved or deleted since the base stage recorded it) is bad input, named: ValueError."""
    from rollscale.config.checks import model_path_problem

    if ref.name_or_path != "tiny" and (problem := model_path_problem(ref.name_or_path, ref.gguf_file)):
        raise ValueError(f"cannot load the model: {problem}")
    gguf = Path(ref.name_or_path) / ref.gguf_file if ref.gguf_file else None
    entry, cached = gguf_cache.lookup(gguf, ref.dtype) if gguf is not None else (None, False)
    if entry is None or cached:
        return _load_model(ref, entry, cached, gguf, device)
    with gguf_cache.one_load_at_a_time(entry) as stored_meanwhile:  # one process dequantises, the others wait
        return _load_model(ref, entry, stored_meanwhile, gguf, device)


def _load_model(ref: ModelRef, entry: Path | None, cached: bool, gguf: Path | None,
                device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if cached:  # dequantised by an earlier load on this machine (rollscale.lm.gguf): its folder, not the GGUF
        ref, entry = dataclasses.replace(ref, name_or_path=str(entry), gguf_file=None), None
    kwargs = {"gguf_file": ref.gguf_file} if ref.gguf_file else {}
    # a saved folder loads in about a second, and the sweep loads one each time a run resumes at a rung: its
    # "Loading weights" bar was one more line per run and rung in the stage's output. A GGUF's dequantisation
    # (tens of seconds) keeps its bar.
    bar = hf_logging.is_progress_bar_enabled()
    if not ref.gguf_file:
        hf_logging.disable_progress_bar()
    try:
        with gguf_cache.one_parse():
            tokenizer = AutoTokenizer.from_pretrained(ref.name_or_path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(ref.name_or_path, dtype=_DTYPES[ref.dtype], **kwargs)
    except OSError as err:
        raise OSError(
            f"could not load model {ref.name_or_path!r}"
            + (f" (gguf_file={ref.gguf_file!r})" if ref.gguf_file else "")
            + f": {err}"
        ) from err
    except (ValueError, IndexError, KeyError, struct.error) as err:
        if not ref.gguf_file:
            raise
        raise ValueError(gguf_unreadable(Path(ref.name_or_path) / ref.gguf_file, err)) from err
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    if tokenizer.pad_token_id is None:
        # causal LMs often ship without a pad token; EOS is the usual stand-in
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if getattr(model, "hf_quantizer", None) is not None:
        # a GGUF file is dequantized to float on load; drop the quantizer state
        # so the model can be trained and saved like any other
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if entry is not None:
        gguf_cache.store(model, tokenizer, entry, gguf)
    model.to(device)
    model.eval()
    return model, tokenizer


def add_lora(model: PreTrainedModel, r: int, alpha: int, dropout: float, target_modules: list[str]):
    """Wrap a model with LoRA adapters (peft); only the adapters are trainable."""
    from peft import LoraConfig, get_peft_model

    missing = [m for m in target_modules if not any(n.endswith(m) for n, _ in model.named_modules())]
    if missing:
        raise ValueError(f"model.lora.target_modules: no module named {missing} in this model")
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, bias="none")
    return get_peft_model(model, config)


def render_prompt(tokenizer: PreTrainedTokenizerBase, text: str, use_chat_template: bool = True,
                  chat_template_kwargs: dict | None = None) -> str:
    """The string the model is conditioned on: chat template when it has one, else BOS + text.

    ``chat_template_kwargs`` reach the template (e.g. Qwen3's ``enable_thinking``). The
    BOS is in the string: engines tokenize it without adding special tokens."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True,
            **(chat_template_kwargs or {}),
        )
    return (tokenizer.bos_token or "") + text
