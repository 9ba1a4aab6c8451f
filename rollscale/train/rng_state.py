"""Python, numpy and torch RNG states as JSON-safe values (a resumed run samples what the straight run would)."""

from __future__ import annotations

import base64
import random

import numpy as np
import torch


def rng_state(cuda: bool) -> dict:
    """The RNG states; ``cuda`` adds the CUDA generators (False: CUDA is never asked)."""
    py_version, py_keys, py_gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py_version, list(py_keys), py_gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if cuda:
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict, cuda: bool) -> None:
    py_version, py_keys, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_keys), py_gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))

    def as_tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(as_tensor(state["torch"]))
    if cuda and "cuda" in state and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([as_tensor(s) for s in state["cuda"]])
