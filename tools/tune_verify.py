"""Measure the two bench recipes' profiles at every micro-batch size ``tune`` searches, then run
``hyperparallel tune --verify`` on each and keep the JSON (docs/results.md's ``numbers:tune-verify`` block is
rendered from it by ``tools/doc_numbers.py``).

    python tools/tune_verify.py --write              # verify with the kept profiles, write docs/tune_verify_*.json
    python tools/tune_verify.py --profile --write    # measure the profiles again first (recipes/profiles/)

A profile is measured at one micro-batch size; ``tune`` interpolates between the sizes it is given
(``--profile``, one file per size), so every size of the search space (the step's 16 samples split
into M = 16, 8, 4, 2, 1 micro-batches) is measured here rather than scaled from the recipe's. Not a
test: the figures depend on the machine and its load (the load average is kept in the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from tune_paper import write_json  # noqa: E402  (the tools' one JSON writer)
SAMPLES = 16   # micro_batch_num x micro_batch_size of both recipes
#: recipe stem, the keys that hold the micro-batch size, the JSON written
RUNS = (("bench_encoder_heavy", ("data.micro_batch_size",), "docs/tune_verify_encoder_heavy.json"),
        ("mf_llama_mllm_bench", ("data.micro_batch_size", "model.model_config.batch_size"),
         "docs/tune_verify_mf_llama.json"))
SIZES = (1, 2, 4, 8, 16)


def hp(*args: str, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hyperparallel", *args]
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {r.returncode}): {(r.stderr or '').strip()[-2000:]}")
    return r


def profile_path(stem: str, size: int) -> str:
    return f"recipes/profiles/{stem}.mbs{size}.profile.yaml"


def measure(stem: str, keys) -> None:
    for size in SIZES:
        sets = [a for k in keys for a in ("--set", f"{k}={size}")]
        hp("profile", f"recipes/{stem}.yaml", "--in-pipeline", *sets,
           "--set", f"parallel_config.micro_batch_num={SAMPLES // size}", "--out", profile_path(stem, size),
           "--run-dir", os.path.join("runs", f"profile_{stem}_mbs{size}"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true", help="measure the profiles again (recipes/profiles/)")
    ap.add_argument("--write", action="store_true", help="write docs/tune_verify_*.json")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16,
                    help="measured steps per case (tune's default is 8; near-equal candidates need more)")
    args = ap.parse_args(argv)
    for stem, keys, out in RUNS:
        if args.profile:
            measure(stem, keys)
        profs = [a for s in SIZES for a in ("--profile", profile_path(stem, s))]
        r = hp("tune", f"recipes/{stem}.yaml", *profs, "--top", str(args.top), "--verify", str(args.top),
               "--steps", str(args.steps), "--json",
               stdout=subprocess.PIPE)
        d = json.loads(r.stdout)
        v = d["verify"]
        print(f"{stem}: rank 1 {v['first']} {v['first_vs_fastest'] * 100:+.1f}% against the fastest measured "
              f"({v['fastest_measured']}), {v['first_vs_1f1b']:.2f}x over 1F1B")
        if args.write:
            write_json(out, d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
