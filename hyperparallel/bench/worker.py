"""msrun entry of ``hyperparallel profile`` and ``hyperparallel bench``:
``msrun ... hyperparallel/bench/worker.py JOB.json``.

``JOB.json`` (written by :mod:`hyperparallel.bench.profile` or :mod:`hyperparallel.bench.bench`):
``{"mode": "profile" | "bench", "device": "CPU", "out_dir": DIR, ...}``; every rank writes
``DIR/rank_N.json`` with its measurements (:mod:`hyperparallel.bench.measure`).
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # msrun runs this file as a script: import the package from the repository root instead
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_here)))

import json


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(f"hyperparallel worker rank {os.environ.get('RANK_ID', '?')} pid {os.getpid()}", flush=True)
    with open(argv[0]) as f:
        job = json.load(f)
    from hyperparallel.mindspore import compat
    compat.setup_device(job.get("device", "CPU"))
    from hyperparallel.mindspore.comm import Comm
    from hyperparallel.bench import measure
    comm = Comm(int(job.get("data_parallel", 1)))
    if job["mode"] == "profile":
        res = measure.profile_rank(job, comm)
    elif job["mode"] == "bench":
        res = measure.bench_rank(job, comm)
    else:
        raise SystemExit(f"unknown mode {job['mode']!r}")
    os.makedirs(job["out_dir"], exist_ok=True)
    with open(os.path.join(job["out_dir"], f"rank_{comm.rank}.json"), "w") as f:
        json.dump(res, f)
    comm.barrier()  # a peer's in-flight send fails if its receiver exits first
    if comm.rank == 0:
        print("job finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
