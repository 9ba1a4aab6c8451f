"""Stage ``base``: the base model every later stage loads.

For the embedded default (``model.kind: tiny``) a small Llama is trained from
scratch, with supervised learning on the procedural task family (problems
disjoint from the profiled pool), to a partial skill, and saved with
``save_pretrained``. For a real model (``model.kind: hf``) the stage records
which model to load.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from prefect import flow
from transformers import LlamaConfig, LlamaForCausalLM

from rollscale.lm.models import ModelRef, char_tokenizer, fingerprint_files
from rollscale.files import write_text_atomic
from tasks.base import train_tiny_model
from tasks.common import ARTIFACTS, model_ref_path, read_params
from tasks.problems import problem_pool


def save_model_dir(weights: dict, out: Path) -> None:
    """save_pretrained into a temporary folder, then swap it in (never half a model)."""
    tmp = Path(tempfile.mkdtemp(prefix=".model.", dir=out.parent))
    model = LlamaForCausalLM(LlamaConfig.from_dict(weights["config"]))
    model.load_state_dict(weights["state_dict"])
    model.save_pretrained(tmp)
    char_tokenizer().save_pretrained(tmp)
    (tmp / "training_stats.json").write_text(json.dumps(weights["stats"], indent=2))
    old = out.with_name(out.name + ".old")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


@flow(name="base")
def base_flow(params_path: str = "params.yaml", artifacts: str = str(ARTIFACTS)) -> ModelRef:
    params = read_params(params_path)
    out = Path(artifacts) / "base"
    out.mkdir(parents=True, exist_ok=True)
    if params.model.kind == "tiny":
        # train on problems disjoint from the ones we will profile
        pool = problem_pool(params.data)
        weights = train_tiny_model(params.base, params.data, frozenset(p.problem_id for p in pool))
        save_model_dir(weights, out / "model")
        ref = ModelRef(str(out / "model"), None, "float32", False, fingerprint_files(out / "model"))
        print(f"base: tiny Llama with {weights['stats']['n_parameters']:,} parameters, "
              f"final loss {weights['stats']['final_loss']:.3f}, {weights['stats']['seconds']:.0f} s")
    else:
        m = params.model
        local = Path(m.name_or_path)
        # a hub id is its own fingerprint (pin a revision in the id to make it exact)
        fp = fingerprint_files(local) if local.is_dir() else m.name_or_path
        ref = ModelRef(m.name_or_path, m.gguf_file, m.dtype, m.chat_template, fp)
        print(f"base: using {m.name_or_path}" + (f" ({m.gguf_file})" if m.gguf_file else ""))
    write_text_atomic(ref.to_json(), model_ref_path(Path(artifacts)))
    return ref


if __name__ == "__main__":
    base_flow()
