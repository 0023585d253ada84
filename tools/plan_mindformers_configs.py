"""Run ``hyperparallel plan`` on every model config of a MindFormers git clone at the given branches or tags.

Each ref's ``configs/`` and ``research/`` are extracted (``git archive``) into a temporary folder, so a
config's relative ``base_config`` resolves as in a checkout; a YAML file is a model config when it has one of
the top-level keys below. Prints, per ref and in total, how many plan and how many are refused, then the
refusals grouped by message (one example file each): what a user with a public MindFormers config meets::

    python tools/plan_mindformers_configs.py /path/to/mindformers dev master r1.8.0 r1.5.0 r1.3.0 r1.0
"""
import collections
import contextlib
import glob
import io
import os
import subprocess
import sys
import tarfile
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hyperparallel import cli  # noqa: E402

#: a config file is a model config when it has one of these top-level keys
MODEL_CONFIG_KEYS = {"model", "runner_config", "parallel_config", "trainer"}


def _extract(repo: str, ref: str, into: str) -> None:
    tar = subprocess.run(["git", "-C", repo, "archive", ref, "configs", "research"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(into, filter="data")


def _is_model_config(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError):
        return False
    return isinstance(cfg, dict) and bool(MODEL_CONFIG_KEYS & set(cfg))


def plan_one(path: str):
    """(exit code, the last stderr line) of ``hyperparallel plan PATH``, in process."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(["plan", path])
        except SystemExit as e:
            rc = e.code
    lines = err.getvalue().strip().splitlines()
    return rc or 0, (lines[-1] if lines else "")


def main(argv) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    repo, refs = argv[0], argv[1:]
    refused = collections.defaultdict(list)
    total = collections.Counter()
    for ref in refs:
        with tempfile.TemporaryDirectory() as tmp:
            _extract(repo, ref, tmp)
            counts = collections.Counter()
            for f in sorted(glob.glob(os.path.join(tmp, "**", "*.y*ml"), recursive=True)):
                if not _is_model_config(f):
                    continue
                rc, msg = plan_one(f)
                counts["planned" if rc == 0 else "refused"] += 1
                if rc:
                    refused[msg.replace(tmp, ref + ":")[:240]].append(f"{ref}:{os.path.relpath(f, tmp)}")
            print(f"{ref}: {counts['planned']} planned, {counts['refused']} refused")
            total.update(counts)
    print(f"all: {total['planned']} planned, {total['refused']} refused")
    for msg, files in sorted(refused.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(files):4d}  {msg}  (e.g. {files[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
