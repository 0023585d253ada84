"""Per-rank checkpoints: parameters, optimizer state and the next step, as .npz.

Each rank writes ``SAVE_DIR/rank_<r>.npz`` (write to a temp file, then rename,
so a crash never leaves a half-written checkpoint) and ``--resume`` loads it
back with ``Parameter.set_data`` (never in-place tensor ops, see compat).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np
from mindspore import Parameter, Tensor


def _path(save_dir: str, rank: int) -> str:
    return os.path.join(save_dir, f"rank_{rank}.npz")


def save(save_dir: str, rank: int, next_step: int, params: Dict[str, Parameter],
         opt_state: Dict[str, Parameter]) -> str:
    os.makedirs(save_dir, exist_ok=True)
    arrays = {f"param/{k}": v.asnumpy() for k, v in params.items()}
    arrays.update({f"opt/{k}": v.asnumpy() for k, v in opt_state.items()})
    arrays["next_step"] = np.array(next_step)
    tmp = _path(save_dir, rank) + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, _path(save_dir, rank))
    return _path(save_dir, rank)


def load(save_dir: str, rank: int, params: Dict[str, Parameter],
         opt_state: Dict[str, Parameter]) -> Optional[int]:
    """Restore into params/opt_state; returns the step to continue from (None: no checkpoint)."""
    path = _path(save_dir, rank)
    if not os.path.exists(path):
        return None
    data = np.load(path)
    for prefix, target in (("param/", params), ("opt/", opt_state)):
        for name, p in target.items():
            key = prefix + name
            if key not in data:
                raise ValueError(f"checkpoint {path} has no {key!r} (different recipe or plan?)")
            p.set_data(Tensor(data[key]))
    return int(data["next_step"])
