"""Hugging Face model directories (pure Python): ``config.json`` plus ``model.safetensors`` or a
sharded ``model.safetensors.index.json``, as ``save_pretrained`` writes them."""
from __future__ import annotations

import json
import os
from typing import List

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"


def is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CONFIG)) and (
        os.path.isfile(os.path.join(path, WEIGHTS)) or os.path.isfile(os.path.join(path, INDEX)))


def weight_files(path: str) -> List[str]:
    """The directory's safetensors files; ValueError naming a missing shard or a bad index."""
    index = os.path.join(path, INDEX)
    if not os.path.isfile(index):
        return [os.path.join(path, WEIGHTS)]
    try:
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: not a safetensors index ({e})") from None
    files = [os.path.join(path, s) for s in shards]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ValueError(f"{index}: shard {os.path.basename(missing[0])} is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return files
