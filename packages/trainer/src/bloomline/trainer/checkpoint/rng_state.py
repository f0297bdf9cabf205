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

__all__ = ["rng_problems", "rng_state", "set_rng_state"]

_WORD = 1 << 32  # Mersenne Twister state words are uint32


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _words(values, count: int) -> bool:
    return (isinstance(values, list) and len(values) == count
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _WORD
                    for v in values))


def _generator_bytes(text, size: int) -> bool:
    """A base64 string of ``size`` bytes (a torch generator's state)."""
    try:
        return isinstance(text, str) and len(base64.b64decode(text, validate=True)) == size
    except ValueError:
        return False


def rng_problems(state) -> list[str]:
    """Why ``state`` (``rng.json``'s object) is not what :func:`rng_state` writes, one line
    per field (empty: it is): the sizes and ranges the three generators' setters need, so
    that a bad file is refused in one line and not in a setter's traceback."""
    if not isinstance(state, dict):
        return [f"holds {type(state).__name__}, not a JSON object"]
    problems = []
    python, numpy_state = state.get("python"), state.get("numpy")
    if not (isinstance(python, dict) and python.get("version") == 3
            and _words(python.get("state"), 625) and python["state"][-1] <= 624
            and (python.get("gauss_next") is None
                 or isinstance(python.get("gauss_next"), float))):
        problems.append("python: not Python's Mersenne Twister state (version 3, 625 words "
                        "< 2**32 ending with a position <= 624, gauss_next)")
    if not (isinstance(numpy_state, dict) and numpy_state.get("name") == "MT19937"
            and _words(numpy_state.get("keys"), 624)
            and isinstance(numpy_state.get("pos"), int) and 0 <= numpy_state["pos"] <= 624
            and numpy_state.get("has_gauss") in (0, 1)
            and isinstance(numpy_state.get("cached_gaussian"), (int, float))):
        problems.append("numpy: not numpy's MT19937 state (624 keys < 2**32, pos <= 624, "
                        "has_gauss 0 or 1, cached_gaussian)")
    if not _generator_bytes(state.get("torch"), torch.get_rng_state().numel()):
        problems.append(f"torch: not base64 of torch's {torch.get_rng_state().numel()}-byte "
                        "CPU generator state")
    cuda = state.get("cuda", [])
    if not (isinstance(cuda, list) and all(isinstance(s, str) for s in cuda)):
        problems.append("cuda: not a list of base64 generator states")
    elif cuda and torch.cuda.is_available():
        # restored device by device: at most as many states as devices, of their size
        size, devices = torch.cuda.get_rng_state().numel(), torch.cuda.device_count()
        if len(cuda) > devices or not all(_generator_bytes(s, size) for s in cuda):
            problems.append(f"cuda: {len(cuda)} states for {devices} visible GPUs, or not "
                            f"base64 of a {size}-byte CUDA generator state")
    return problems


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
