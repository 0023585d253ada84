"""Entry point run by msrun on every rank: ``msrun ... python -m hyperparallel.runtime.worker JOB.json``.

The job file (written by :mod:`hyperparallel.launch`) holds one or more cases,
each a recipe (raw dict, overrides applied), its derived plan (JSON), the step
range and output folders. Several cases per launch keep test suites fast
(msrun start-up costs ~10 s); their data-parallel degrees may differ. Every case runs on a
:class:`~.rank.RankRuntime`. Every rank keeps a heartbeat file beside the job file (:mod:`hyperparallel.watch`,
for the launcher's hang verdict) and stops after the current step on SIGTERM/SIGINT, saving it (:mod:`.stop`).
Rank 0 prints progress and writes ``RUN_DIR/metrics.jsonl`` (one line per step, :class:`StepLog`,
with every rank's memory record of the step, :mod:`.memory`, gathered); with ``dump_dir`` every rank
dumps its losses, the step-0 gradients it holds and its memory records, for equivalence and memory tests.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def open_metrics(path: str, start: int):
    """metrics.jsonl for appending, keeping only the lines of the ``start`` steps done before (a resumed
    run replaces what a failed run logged after its checkpoint; steps count from 1, as ``step_<N>``). A last
    line cut short (a full disk) is left out, a note printed; a bad line before it: SpecError (file, line)."""
    from hyperparallel.fileio import jsonl_rows
    kept = []
    if start > 0 and os.path.exists(path):
        rows, note = jsonl_rows(path)
        if note:
            print(f"note: {note}", flush=True)
        kept = [line for line, rec in rows if rec.get("step", 0) <= start]
    f = open(path, "w")
    f.writelines(kept)
    return f


def _resume(case: dict, rt, name: str) -> int:
    """The case's checkpoint (``resume_from``, resolved by the launcher, or with ``resume`` the newest
    complete step of ``save_dir``) restored; returns the first step. A checkpoint that does not fit
    stops every rank with exit status 2 and a ``REFUSED`` line."""
    from hyperparallel.runtime.ckpt_files import REFUSED, CheckpointError, Source, resolve
    try:
        if case.get("resume_from"):
            src = Source.from_json(case["resume_from"])
        elif case.get("resume") and case.get("save_dir"):
            src = resolve(case["save_dir"], digests=case.get("digests", True))
        else:
            return int(case.get("start_step", 0))
        step, with_state = rt.restore(src)
    except CheckpointError as e:
        print(REFUSED + str(e), flush=True)
        raise SystemExit(2) from None
    if rt.rank == 0:
        print(f"[{name}] resumed from {src.path} at step {step} "
              f"({'with its' if with_state else 'fresh'} optimizer state)", flush=True)
    return step


class StepLog:
    """The per-step log of a run: the console line and the ``metrics.jsonl`` record.

    ``step`` counts optimizer steps done (1 after the first update), as checkpoints ``step_<N>`` do;
    ``samples_per_s`` counts sequences, ``tokens_per_s`` every position of them (padding included);
    ``eta_s`` is the remaining steps at the mean step time of this run so far."""

    def __init__(self, name: str, schedule: str, steps: int, start: int, samples: int, seq_len: int,
                 compile_mode: str = "eager"):
        self.name, self.schedule, self.steps, self.start = name, schedule, steps, start
        self.compile_mode = compile_mode
        self.samples, self.tokens = samples, samples * seq_len
        self.total_s = 0.0
        self.steps_skipped = 0   # steps of this run without an update (train.nonfinite: skip)

    def record(self, res, skipped: int) -> dict:
        self.total_s += res.step_s
        done = res.step + 1
        mean = self.total_s / (done - self.start)
        self.steps_skipped += bool(getattr(res, "skipped", False))
        return {"step": done, "loss": res.loss, "lr": res.lr, "grad_norm": res.grad_norm, "step_time_s": res.step_s,
                "samples_per_s": self.samples / res.step_s if res.step_s > 0 else None,
                "tokens_per_s": self.tokens / res.step_s if res.step_s > 0 else None,
                "eta_s": mean * (self.steps - done), "schedule": self.schedule, "data_skipped": skipped,
                "compile": self.compile_mode, "compiles": res.compiles, "compile_s": res.compile_s,
                "skipped": bool(getattr(res, "skipped", False)), "steps_skipped": self.steps_skipped}

    def line(self, r: dict) -> str:
        skip = (f" skipped: not finite, no update (train.nonfinite: skip; {r['steps_skipped']} so far)"
                if r.get("skipped") else "")
        return (f"[{self.name}] step {r['step']}/{self.steps} loss {r['loss']:.6f} lr {r['lr']:.3e} "
                f"grad_norm {r['grad_norm']:.4f}{skip} step_time {r['step_time_s']:.3f}s "
                f"{r['samples_per_s'] or 0:.1f} samples/s {r['tokens_per_s'] or 0:.0f} tokens/s "
                f"eta {_clock(r['eta_s'])}")


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


SAVE_FAILED_EXIT = 74   # a rank's exit status when a checkpoint could not be written (EX_IOERR)


def run_case(case: dict, comm, stopper=None, beat_dir: str = "", pool=None) -> bool:
    """Train one case; True when it stopped early on a signal (the job's later cases are skipped).
    ``pool``: compiled chunks kept from the job's earlier cases (:class:`~.compiled.GraphPool`)."""
    from hyperparallel.runtime.checkpoint import SaveError, recipe_hash
    from hyperparallel.runtime.ckpt_files import step_dir
    from hyperparallel.runtime.hooks import Chain, FaultInjection, Progress
    from hyperparallel.runtime.job import case_runtime, encoder_record
    from hyperparallel.runtime.memory import rank_memory
    from hyperparallel.runtime.stop import STOPPED
    from hyperparallel.watch import Heartbeat

    from hyperparallel.runtime.ckpt_files import REFUSED_INPUT
    from hyperparallel.runtime.nonfinite import NONFINITE, NONFINITE_EXIT, NonFiniteStep, json_line
    from hyperparallel.errors import SpecError
    comm = comm.with_data_parallel(int(case["plan"].get("data_parallel", 1)))
    hb = Heartbeat(beat_dir, comm.rank, int(case.get("start_step", 0))) if beat_dir else None
    progress = Progress(hb, comm) if hb else None
    try:
        rc, rt = case_runtime(case, comm, Chain([progress, FaultInjection.from_env(comm.rank, stopper)]), pool)
    except SpecError as e:   # e.g. model.pretrained weights that do not fit the config
        print(REFUSED_INPUT + str(e).splitlines()[0], flush=True)
        raise SystemExit(2) from None
    name = case.get("name", "run")
    steps = int(case.get("steps", rc.train.steps))
    save_dir, save_every = case.get("save_dir"), int(case.get("save_every") or rc.train.save_every or 0)
    saver = rt.saver(save_dir, case.get("save_format") or "safetensors",
                     {"recipe_hash": recipe_hash(case["raw"]), "schedule": case.get("schedule")},
                     digests=case.get("digests", True)) if save_dir else None
    if hb:
        hb.beat(0, "restore")
    start = _resume(case, rt, name)
    if hb:
        hb.first_step = start
    run_dir, dump_dir = case.get("run_dir"), case.get("dump_dir")
    metrics = None
    if comm.rank == 0 and run_dir:
        os.makedirs(run_dir, exist_ok=True)
        try:
            metrics = open_metrics(os.path.join(run_dir, "metrics.jsonl"), start)
        except SpecError as e:   # checked before launch too; here when the file changed since
            print(REFUSED_INPUT + str(e), flush=True)
            raise SystemExit(2) from None
    losses, memory = [], []
    encoder_work = encoder_record(rc, rt, case["raw"]) if comm.rank == 0 and run_dir else None
    skipped = rt.source.skipped   # bad samples left out (data.on_bad_sample: skip)
    counts = None
    if run_dir:   # what trains, per region, exact: every rank's parameters to rank 0 (a collective)
        if progress:
            progress.phase(start, "gather")
        counts = comm.all_gather_object(rt.parameter_counts())
    if comm.rank == 0:
        print(f"[{name}] {rc.train.describe(int(case.get('schedule_steps') or steps))}", flush=True)
        if counts:
            from hyperparallel.runtime.rank import parameters_line
            print(f"[{name}] {parameters_line(counts, rt.plan.regions())}", flush=True)
        if skipped:
            print(f"[{name}] data: {skipped} bad sample(s) skipped (hyperparallel data check lists them)", flush=True)
    plan = rt.plan
    log = StepLog(name, case.get("schedule", name), steps, start,
                  plan.num_micro * plan.data_parallel * rc.data.micro_batch_size, rc.data.seq_len, rt.compile_mode)
    stopped = False

    def wants_stop() -> bool:   # asked at the step's last collectives: a signal during step k stops after k
        return bool(stopper and stopper.requested)

    for step in range(start, steps):
        try:
            res = rt.step(step, stop=wants_stop)
        except NonFiniteStep as e:   # every rank, at the same step: nothing of it is saved
            if metrics:
                metrics.close()
            kept = f"nothing saved for step {step + 1}" if save_dir else ""
            print(NONFINITE + e.describe(steps, kept), flush=True)
            raise SystemExit(NONFINITE_EXIT) from None
        losses.append(res.loss)
        # step: steps done, as metrics.jsonl and the console count them
        mem = dict(rank_memory(rt, res.grads), step=step + 1) if (run_dir or dump_dir) else None
        memory.append(mem)
        # every rank's record to rank 0 (after the step's programs: a collective every rank reaches here),
        # with every rank's stop wish: a signal after the all-reduce (the update, the records) still stops
        # after this step, the step whose line rank 0 has not printed yet, on every rank alike
        stop = res.stop
        mem_all = None
        if run_dir:
            if progress:
                progress.phase(step, "gather")
            gathered = comm.all_gather_object((mem, wants_stop()))
            mem_all = [m for m, _ in gathered]
            stop = stop or any(w for _, w in gathered)
        if dump_dir and step in (start, steps - 1):   # the first and the last step's gradients (tests)
            os.makedirs(dump_dir, exist_ok=True)
            kind = "grads" if step == start else "grads_last"
            np.savez(os.path.join(dump_dir, f"{kind}_rank{comm.rank}.npz"),
                     **{k: v.asnumpy() for k, v in res.grads.items()})
        if comm.rank == 0:
            rec = log.record(res, skipped)
            print(log.line(rec), flush=True)
            if metrics:
                rec["memory"] = mem_all
                if encoder_work is not None:
                    rec["encoder_work"] = encoder_work(step)
                metrics.write(json_line(rec) + "\n")   # strict JSON: a NaN is written as null
                metrics.flush()
        due = save_dir and ((save_every and (step + 1) % save_every == 0) or step + 1 == steps or stop)
        if due:
            if hb:
                hb.beat(step, "save")
            try:
                saver.save(step + 1)
            except SaveError:
                raise SystemExit(SAVE_FAILED_EXIT) from None
        if stop and step + 1 < steps:
            stopped = True
            if comm.rank == 0:
                kept = f"checkpoint {step_dir(save_dir, step + 1)} saved" if save_dir else "no --save-dir: nothing saved"
                who = stopper.name if stopper and stopper.requested else "a signal to another rank"
                print(f"{STOPPED}{who} after step {step + 1}/{steps}; {kept}", flush=True)
            break
    if metrics:
        metrics.close()
    if comm.rank == 0 and log.steps_skipped:
        print(f"[{name}] train.nonfinite: skip: {log.steps_skipped} of {steps - start} step(s) skipped (a "
              "non-finite loss or grad norm; no update)", flush=True)
    from hyperparallel.runtime.compiled import summary
    line = summary(rt.bodies, comm.rank)
    if line:
        print(f"[{name}] {line}", flush=True)
    if dump_dir:   # which ranks decoded pixels, and how; what each chunk compiled
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, f"compile_rank{comm.rank}.json"), "w") as f:
            json.dump(rt.compile_stats(), f)
        with open(os.path.join(dump_dir, f"data_rank{comm.rank}.json"), "w") as f:
            json.dump(rt.source.stats, f)
        with open(os.path.join(dump_dir, f"memory_rank{comm.rank}.json"), "w") as f:
            json.dump(memory, f)
    rt.close()
    if dump_dir and comm.rank == 0:
        with open(os.path.join(dump_dir, "losses.json"), "w") as f:
            json.dump({"start": start, "losses": losses}, f)
    if hb:
        # the job's end barrier (or the next case's set-up) follows: it waits on every other rank
        hb.beat(steps, "barrier", waits=[r for r in range(comm.world) if r != comm.rank])
        hb.close()
    return stopped


def main(argv=None) -> int:
    from hyperparallel.runtime.job import end_job, start_job
    from hyperparallel.runtime.stop import StopRequest
    argv = sys.argv[1:] if argv is None else argv
    job = start_job(argv)
    # the rank's own grace is the launcher's plus a margin: it matters only when the launcher is gone
    stopper = StopRequest(int(os.environ.get("RANK_ID", 0) or 0), float(job.get("stop_grace_s", 30.0)) + 5.0)
    stopper.install()   # a signal during init() is acted on after it (stop after the first step)
    from hyperparallel.runtime.comm import Comm
    comm = Comm(1)   # each case takes its own data-parallel view (Comm.with_data_parallel)
    stopper.rank = comm.rank
    stopper.install()   # again: init() may have set handlers of its own
    beat_dir = os.path.dirname(os.path.abspath(argv[0]))
    from hyperparallel.runtime.compiled import GraphPool
    pool = GraphPool()   # a later case of the same chunk runs the graphs an earlier one compiled
    for case in job["cases"]:
        if run_case(case, comm, stopper, beat_dir, pool):
            break
    return end_job(comm)


if __name__ == "__main__":
    sys.exit(main())
