"""Hugging Face model directories (pure Python): ``config.json`` plus ``model.safetensors`` or a
sharded ``model.safetensors.index.json``, as ``save_pretrained`` writes them."""
from __future__ import annotations

import json
import os
from typing import List

from ..fileio import inside

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"


def is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CONFIG)) and (
        os.path.isfile(os.path.join(path, WEIGHTS)) or os.path.isfile(os.path.join(path, INDEX)))


def weight_files(path: str) -> List[str]:
    """The directory's safetensors files; ValueError naming a missing shard, a bad index, or a shard that
    leaves the directory (:func:`shard_leaves`: refused before the file is looked at)."""
    index = os.path.join(path, INDEX)
    if not os.path.isfile(index):
        return [os.path.join(path, WEIGHTS)]
    try:
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: not a safetensors index ({e})") from None
    if not all(isinstance(s, str) for s in shards):
        raise ValueError(f"{index}: not a safetensors index (weight_map values must be file names)")
    outside = [s for s in shards if shard_leaves(path, s)]
    if outside:
        raise ValueError(f"{index}: shard {outside[0]!r} resolves outside the model directory {path} (an absolute "
                         "path, '..' or a symlink out); refused")
    files = [os.path.join(path, s) for s in shards]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ValueError(f"{index}: shard {os.path.basename(missing[0])} is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return files


def shard_leaves(path: str, shard: str) -> bool:
    """True if the index's shard name leaves the model directory ``path``: an absolute name or ``..`` out
    of it, or (symlinks resolved) a file outside both ``path`` and the folder the index file really lives
    in. The second folder keeps the Hugging Face cache working: a snapshot's files are links into its
    ``blobs/`` folder, the index's among them."""
    lexical = os.path.normpath(shard)
    if os.path.isabs(shard) or lexical == ".." or lexical.startswith(".." + os.sep):
        return True
    real_index_dir = os.path.dirname(os.path.realpath(os.path.join(path, INDEX)))
    joined = os.path.join(os.path.abspath(path), shard)
    return inside(path, shard) is None and inside(real_index_dir, joined) is None


def weight_set(path: str) -> List[str]:
    """The names of the files in ``path`` a loader reads weights from: ``model.safetensors``, the index and
    the shards it names (those that are there)."""
    names = [n for n in (WEIGHTS, INDEX) if os.path.isfile(os.path.join(path, n))]
    try:
        with open(os.path.join(path, INDEX)) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        shards = []
    return names + [s for s in shards if isinstance(s, str) and os.path.basename(s) == s
                    and os.path.isfile(os.path.join(path, s)) and s not in names]


def install(new: str, out: str) -> List[str]:
    """Move the model directory ``new`` (just written, e.g. by ``save_pretrained``) to ``out``, which may
    hold other files: the weights there (:func:`weight_set`: a loader would read a stale index or single
    file before or beside the new ones) are removed first, then each file of ``new`` replaces the one of
    its name; every other file of ``out`` stays. Returns the names removed."""
    os.makedirs(out, exist_ok=True)
    stale = weight_set(out)
    for name in stale:
        os.remove(os.path.join(out, name))
    for name in sorted(os.listdir(new)):
        os.replace(os.path.join(new, name), os.path.join(out, name))
    return stale
