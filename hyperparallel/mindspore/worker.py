"""Entry point run by msrun on every rank: ``msrun ... hyperparallel/mindspore/worker.py JOB.json``.

The job file (written by :mod:`hyperparallel.launch`) holds one or more cases,
each a recipe (raw dict, overrides applied), its derived plan (JSON), the step
range and output folders. Several cases per launch keep test suites fast
(msrun start-up costs ~10 s). Rank 0 prints progress and writes
``RUN_DIR/metrics.jsonl``; with ``dump_dir`` every rank dumps its losses and the
step-0 gradients it holds, for equivalence tests.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # msrun runs this file as a script: drop its folder from sys.path (its module names
    # must not shadow anything) and import the package from the repository root instead.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_here)))

import json
import signal
import time

import numpy as np


def fault_hook(rank: int):
    """Fault injection for tests: ``HP_FAULT=RANK:STEP[:kill]`` makes that rank die in the
    middle of that step: ``os._exit(13)`` after a log line, or with ``kill`` a silent SIGKILL.
    (``HP_FAULT=RANK:save:N[:kill]``, dying while saving step N, is handled by the checkpoint saver.)"""
    spec = os.environ.get("HP_FAULT", "").split(":")
    if spec[0] != str(rank) or len(spec) < 2 or spec[1] == "save":
        return None
    step_k, kill = int(spec[1]), spec[2:] == ["kill"]

    def hook(step: int, index: int, length: int) -> None:
        if step == step_k and index == length // 2:
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            print(f"fault injection: rank {rank} exits at step {step}, action {index}/{length}", flush=True)
            os._exit(13)
    return hook


def open_metrics(path: str, start: int):
    """metrics.jsonl for appending, keeping only the lines of steps before ``start`` (a resumed
    run replaces what a failed run logged after its checkpoint)."""
    kept = []
    if start > 0 and os.path.exists(path):
        with open(path) as f:
            kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) < start]
    f = open(path, "w")
    f.writelines(kept)
    return f


def setup_case(case: dict, comm):
    """(plan, run config, this rank's chunk cells, interpreter) for one case; creates the groups."""
    from hyperparallel.mpipe import ir
    from hyperparallel.mindspore.config import RunConfig, check_regions
    from hyperparallel.mindspore.data import data_source
    from hyperparallel.mindspore.interpreter import Interpreter

    plan = ir.Plan.from_json(case["plan"])
    rc = RunConfig.from_raw(case["raw"])
    check_regions(rc.model, plan_regions(plan), where="plan")
    create_groups(plan, comm)
    chunks = {(c.region, c.index): rc.model.build_chunk(c.region, c.start, c.stop)
              for c in plan.chunks_on(comm.device)}
    return plan, rc, chunks, Interpreter(plan, comm, rc.model, data_source(rc), chunks)


def create_groups(plan, comm) -> None:
    """Create every communication group of the plan (all ranks, one order)."""
    from hyperparallel.mpipe import ir
    # every rank lists every group of every dp index, so all members create them in one order
    all_groups = set()
    for i in range(plan.data_parallel):
        for p in plan.programs.values():
            for a in p:
                if a.group is not None and a.group != ir.DP_GROUP:
                    all_groups.add(tuple(sorted(d * plan.data_parallel + i for d in a.group)))
    for d in range(plan.num_devices):
        all_groups.add(tuple(d * plan.data_parallel + j for j in range(plan.data_parallel)))
    comm.ensure_groups(all_groups)


def plan_regions(plan):
    """(name, layers) of every region of a plan, from its chunks, for :func:`check_regions`."""
    from types import SimpleNamespace
    return [SimpleNamespace(name=r, layers=max(c.stop for c in plan.chunks if c.region == r))
            for r in plan.regions()]


def run_case(case: dict, comm) -> None:
    from hyperparallel.mindspore import checkpoint
    from hyperparallel.mindspore.optim import Optimizer

    plan, rc, chunks, interp = setup_case(case, comm)
    name = case.get("name", "run")
    interp.hook = fault_hook(comm.rank)
    opt = Optimizer(interp.updated, rc.train)

    start = int(case.get("start_step", 0))
    steps = int(case.get("steps", rc.train.steps))
    save_dir, save_every = case.get("save_dir"), int(case.get("save_every") or rc.train.save_every or 0)
    saver = checkpoint.Saver(case, comm, plan, chunks, opt, case.get("save_format") or "safetensors",
                              source=interp.source) if save_dir else None
    start = checkpoint.restore_case(case, comm, chunks, opt, name, start, data=interp.source)
    run_dir, dump_dir = case.get("run_dir"), case.get("dump_dir")
    metrics = None
    if comm.rank == 0 and run_dir:
        os.makedirs(run_dir, exist_ok=True)
        metrics = open_metrics(os.path.join(run_dir, "metrics.jsonl"), start)
    losses = []
    skipped = int(getattr(interp.source, "skipped", 0))   # bad samples left out (data.on_bad_sample: skip)
    if skipped and comm.rank == 0:
        print(f"[{name}] data: {skipped} bad sample(s) skipped (hyperparallel data check lists them)", flush=True)
    interp.run_prologue(start)  # next-step (spill) work for the first step; nothing for most plans
    for step in range(start, steps):
        t0 = time.perf_counter()
        part = interp.run_step(step)
        grads = interp.step_grads()
        opt.step(grads)
        loss = comm.all_reduce_scalar(part)
        dt = time.perf_counter() - t0
        losses.append(loss)
        if dump_dir and step == start:
            os.makedirs(dump_dir, exist_ok=True)
            np.savez(os.path.join(dump_dir, f"grads_rank{comm.rank}.npz"),
                     **{k: v.asnumpy() for k, v in grads.items()})
        if comm.rank == 0:
            print(f"[{name}] step {step + 1}/{steps} loss {loss:.6f} step_time {dt:.3f}s", flush=True)
            if metrics:
                metrics.write(json.dumps({"step": step, "loss": loss, "step_time_s": dt,
                                          "schedule": case.get("schedule", name),
                                          "data_skipped": skipped}) + "\n")
                metrics.flush()
        if save_dir and ((save_every and (step + 1) % save_every == 0) or step + 1 == steps):
            saver.save(step + 1)
    if metrics:
        metrics.close()
    if dump_dir and hasattr(interp.source, "stats"):   # which ranks decoded pixels, and how
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, f"data_rank{comm.rank}.json"), "w") as f:
            json.dump(interp.source.stats, f)
    if hasattr(interp.source, "close"):
        interp.source.close()   # stop the decode pipeline's threads
    if dump_dir and comm.rank == 0:
        with open(os.path.join(dump_dir, "losses.json"), "w") as f:
            json.dump({"start": start, "losses": losses}, f)


def start_job(argv) -> dict:
    """Common start of every msrun entry: announce rank and pid, load the job, set up the device."""
    # the launcher maps msrun's "Worker process PID exit" reports to ranks with this line
    print(f"hyperparallel worker rank {os.environ.get('RANK_ID', '?')} pid {os.getpid()}", flush=True)
    with open(argv[0]) as f:
        job = json.load(f)
    from hyperparallel.mindspore import compat
    compat.setup_device(job.get("device", "CPU"))
    return job


def end_job(comm) -> int:
    """Common end of every msrun entry."""
    comm.barrier()  # a peer's in-flight send fails if its receiver exits first
    if comm.rank == 0:
        print("job finished", flush=True)
    return 0


def main(argv=None) -> int:
    job = start_job(sys.argv[1:] if argv is None else argv)
    from hyperparallel.mindspore.comm import Comm
    D = {int(c["plan"].get("data_parallel", 1)) for c in job["cases"]}
    if len(D) != 1:
        raise SystemExit("all cases of one launch must share data_parallel")
    comm = Comm(D.pop())
    for case in job["cases"]:
        run_case(case, comm)
    return end_job(comm)


if __name__ == "__main__":
    sys.exit(main())
