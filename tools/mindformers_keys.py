"""List the MindFormers config keys of other releases (``hyperparallel.recipe.schema.OTHER_RELEASES``).

Reads every YAML config under ``configs/`` and ``research/`` of a MindFormers git clone at each given
release tag (``git show TAG:FILE``, no checkout) and prints the top-level keys, and the keys of the
sections MindFormers 1.9.0 checks strictly, that 1.9.0's template and hyperparallel's schema do not
define, each with the tags it was seen at::

    python tools/mindformers_keys.py /path/to/mindformers v1.0.0 v1.3.0 v1.5.0 v1.7.0 v1.9.0 HEAD
"""
import collections
import os
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hyperparallel.recipe.schema import OTHER_RELEASES, STRICT, TOP  # noqa: E402

#: a config file is a model config when it has one of these top-level keys
MODEL_CONFIG_KEYS = {"model", "runner_config", "parallel_config", "trainer"}


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def seen_keys(repo: str, tags):
    """{dotted key: [tags]} of the configs' top-level keys and their strict sections' keys."""
    seen = collections.defaultdict(list)
    for tag in tags:
        files = [f for f in _git(repo, "ls-tree", "-r", "--name-only", tag).split()
                 if f.endswith((".yaml", ".yml")) and f.split("/")[0] in ("configs", "research")]
        keys = set()
        for f in files:
            try:
                cfg = yaml.safe_load(_git(repo, "show", f"{tag}:{f}"))
            except (yaml.YAMLError, subprocess.CalledProcessError):
                continue
            if not isinstance(cfg, dict) or not MODEL_CONFIG_KEYS & set(cfg):
                continue
            keys |= set(map(str, cfg))
            keys |= {f"{s}.{k}" for s in STRICT if isinstance(cfg.get(s), dict) for k in cfg[s]}
        for k in keys:
            seen[k].append(tag)
    return seen


def main(argv) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    repo, tags = argv[0], argv[1:]
    for key, at in sorted(seen_keys(repo, tags).items()):
        sec, _, name = key.rpartition(".")
        known = name in STRICT[sec] if sec else key in TOP
        if not known:
            mark = "" if key in OTHER_RELEASES else "   <- not in OTHER_RELEASES"
            print(f"{key}: {', '.join(at)}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
