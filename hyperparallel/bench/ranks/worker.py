"""msrun entry of ``hyperparallel profile`` and ``hyperparallel bench``:
``msrun ... python -m hyperparallel.bench.ranks.worker JOB.json``.

``JOB.json`` (written by :mod:`hyperparallel.bench.profile` or :mod:`hyperparallel.bench.bench`):
``{"mode": "profile" | "bench", "device": "CPU", "out_dir": DIR, ...}``, or
``{"mode": "rotation", "profile": PROFILE_JOB | null, "cases": [BENCH_CASE, ...]}`` (the cases
stepped in rotation in one launch); every rank writes ``DIR/rank_N.json`` per job or case with its
measurements (:mod:`hyperparallel.bench.ranks.measure`).
"""
from __future__ import annotations

import json
import os
import sys


def main(argv=None) -> int:
    from hyperparallel.runtime.job import end_job, start_job
    job = start_job(sys.argv[1:] if argv is None else argv)
    from hyperparallel.runtime.comm import Comm
    from hyperparallel.bench.ranks import measure
    comm = Comm(int(job.get("data_parallel", 1)))
    if job["mode"] == "profile":
        write(job["out_dir"], comm.rank, measure.profile_rank(job, comm))
    elif job["mode"] == "bench":
        write(job["out_dir"], comm.rank, measure.bench_rotation([job], comm)[0])
    elif job["mode"] == "rotation":   # optional tight-loop profile first, then the cases in step rotation
        if job.get("profile"):
            write(job["profile"]["out_dir"], comm.rank, measure.profile_rank(job["profile"], comm))
        for case, res in zip(job["cases"], measure.bench_rotation(job["cases"], comm)):
            write(case["out_dir"], comm.rank, res)
    else:
        raise SystemExit(f"unknown mode {job['mode']!r}")
    return end_job(comm)


def write(out_dir: str, rank: int, res: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    sys.exit(main())
