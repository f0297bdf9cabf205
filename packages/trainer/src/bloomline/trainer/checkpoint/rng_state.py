"""The generator states a checkpoint carries (``rng.json``), as plain JSON.

Apart from the save and the load because it is a format of its own with one invariant, a
round trip bit for bit without pickle (loading a checkpoint must not run code from it), and
both halves of it live here side by side.
"""

from __future__ import annotations

import base64
import random

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state"]


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_state() -> dict:
    """This process's generator states as plain JSON values (ints, lists, strings): Python's
    Mersenne Twister, numpy's legacy global generator, torch's CPU (and CUDA) generators.
    Floats (the cached Gaussians) survive JSON exactly: ``json`` writes their shortest
    round-tripping repr."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {"python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
             "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": _b64(torch.get_rng_state())}
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned, bit for bit."""
    python, numpy_state = state["python"], state["numpy"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
    np.random.set_state((numpy_state["name"], np.array(numpy_state["keys"], dtype=np.uint32),
                         numpy_state["pos"], numpy_state["has_gauss"],
                         numpy_state["cached_gaussian"]))
    torch.set_rng_state(_from_b64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_from_b64(s) for s in state["cuda"]])
