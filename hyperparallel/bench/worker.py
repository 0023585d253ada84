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
    from hyperparallel.mindspore.worker import end_job, start_job
    job = start_job(sys.argv[1:] if argv is None else argv)
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
    return end_job(comm)


if __name__ == "__main__":
    sys.exit(main())
