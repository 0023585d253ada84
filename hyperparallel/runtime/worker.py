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
from typing import Optional, Tuple

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
    where the data source knows its samples (:meth:`~hyperparallel.data.source.DataSource.step_counts`:
    conversations) the record adds the step's ``samples`` and ``real_tokens`` (positions that are not padding)
    and ``real_tokens_per_s``, which is what ``data.packing`` raises, and the console line ends with them;
    ``eta_s`` is the remaining steps at the mean step time of this run so far."""

    def __init__(self, name: str, schedule: str, steps: int, start: int, samples: int, seq_len: int,
                 compile_mode: str = "eager"):
        self.name, self.schedule, self.steps, self.start = name, schedule, steps, start
        self.compile_mode = compile_mode
        self.samples, self.tokens = samples, samples * seq_len
        self.total_s = 0.0
        self.steps_skipped = 0   # steps of this run without an update (train.nonfinite: skip)

    def record(self, res, skipped: int, counts: Optional[dict] = None) -> dict:
        self.total_s += res.step_s
        done = res.step + 1
        mean = self.total_s / (done - self.start)
        self.steps_skipped += bool(getattr(res, "skipped", False))
        return {"step": done, "loss": res.loss, "lr": res.lr, "grad_norm": res.grad_norm, "step_time_s": res.step_s,
                "samples_per_s": self.samples / res.step_s if res.step_s > 0 else None,
                "tokens_per_s": self.tokens / res.step_s if res.step_s > 0 else None,
                "eta_s": mean * (self.steps - done), "schedule": self.schedule, "data_skipped": skipped,
                "compile": self.compile_mode, "compiles": res.compiles, "compile_s": res.compile_s,
                "skipped": bool(getattr(res, "skipped", False)), "steps_skipped": self.steps_skipped,
                "loss_scale": getattr(res, "loss_scale", 1.0), "overflow": bool(getattr(res, "overflow", False)),
                **self.real(res, counts)}

    @staticmethod
    def real(res, counts: Optional[dict]) -> dict:
        """The step's ``samples``, ``real_tokens`` and ``real_tokens_per_s`` (none without ``counts``)."""
        if not counts:
            return {}
        n, t = int(counts["samples"]), int(counts["real_tokens"])
        return {"samples": n, "real_tokens": t, "real_tokens_per_s": t / res.step_s if res.step_s > 0 else None}

    def line(self, r: dict) -> str:
        skip = (f" skipped: not finite, no update (train.nonfinite: skip; {r['steps_skipped']} so far)"
                if r.get("skipped") else "")
        if r.get("overflow"):
            skip = (f" skipped: gradient overflow at loss scale {r['loss_scale']:g}, no update "
                    f"(runner_wrapper.scale_sense; {r['steps_skipped']} so far)")
        return (f"[{self.name}] step {r['step']}/{self.steps} loss {r['loss']:.6f} lr {r['lr']:.3e} "
                f"grad_norm {r['grad_norm']:.4f}{skip} step_time {r['step_time_s']:.3f}s "
                f"{r['samples_per_s'] or 0:.1f} samples/s {r['tokens_per_s'] or 0:.0f} tokens/s "
                f"eta {_clock(r['eta_s'])}" + (f" | {r['samples']} samples {r['real_tokens']} real tokens "
                                               f"{r['real_tokens_per_s'] or 0:.0f} real tokens/s"
                                               if "real_tokens" in r else ""))


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


SAVE_FAILED_EXIT = 74   # a rank's exit status when a checkpoint could not be written (EX_IOERR)


def run_case(case: dict, comm, stopper=None, beat_dir: str = "", pool=None) -> bool:
    """Train one case; True when it stopped early on a signal (the job's later cases are skipped).
    ``pool``: compiled chunks kept from the job's earlier cases (:class:`~.compiled.GraphPool`)."""
    run = _CaseRun(case, comm, stopper, beat_dir, pool)
    stopped = run.loop()
    run.finish()
    return stopped


class _CaseRun:
    """One case on this rank: set up (runtime, checkpoint restored, metrics file, header lines), then
    :meth:`loop` runs the steps, each step's hooks in order (memory record, the gather to rank 0, gradient
    dump, log line, checkpoint, stop), then :meth:`finish` (summaries, dumps, the end-of-case beat)."""

    def __init__(self, case: dict, comm, stopper, beat_dir: str, pool):
        from hyperparallel.runtime.checkpoint import recipe_hash
        from hyperparallel.runtime.ckpt_files import REFUSED_INPUT
        from hyperparallel.runtime.hooks import Chain, FaultInjection, Progress
        from hyperparallel.runtime.job import case_runtime, encoder_record
        from hyperparallel.errors import SpecError
        from hyperparallel.watch import Heartbeat
        self.case, self.stopper = case, stopper
        self.comm = comm = comm.with_data_parallel(int(case["plan"].get("data_parallel", 1)),
                                                   int(case["plan"].get("meta", {}).get("tensor_parallel", 1)))
        self.hb = hb = Heartbeat(beat_dir, comm.rank, int(case.get("start_step", 0))) if beat_dir else None
        self.progress = progress = Progress(hb, comm) if hb else None
        try:
            rc, rt = case_runtime(case, comm, Chain([progress, FaultInjection.from_env(comm.rank, stopper)]), pool)
        except SpecError as e:   # e.g. model.pretrained weights that do not fit the config
            print(REFUSED_INPUT + str(e).splitlines()[0], flush=True)
            raise SystemExit(2) from None
        self.rc, self.rt = rc, rt
        self.name = name = case.get("name", "run")
        self.steps = steps = int(case.get("steps", rc.train.steps))
        self.save_dir = save_dir = case.get("save_dir")
        self.save_every = int(case.get("save_every") or rc.train.save_every or 0)
        self.saver = rt.saver(save_dir, case.get("save_format") or "safetensors",
                              {"recipe_hash": recipe_hash(case["raw"]), "schedule": case.get("schedule")},
                              digests=case.get("digests", True)) if save_dir else None
        if hb:
            hb.beat(0, "restore")
        self.start = start = _resume(case, rt, name)
        if hb:
            hb.first_step = start
        self.run_dir = run_dir = case.get("run_dir")
        self.dump_dir = case.get("dump_dir")
        self.metrics = None
        if comm.rank == 0 and run_dir:
            os.makedirs(run_dir, exist_ok=True)
            try:
                self.metrics = open_metrics(os.path.join(run_dir, "metrics.jsonl"), start)
            except SpecError as e:   # checked before launch too; here when the file changed since
                print(REFUSED_INPUT + str(e), flush=True)
                raise SystemExit(2) from None
        self.losses, self.memory = [], []
        self.encoder_work = encoder_record(rc, rt, case["raw"]) if comm.rank == 0 and run_dir else None
        self.skipped = rt.source.skipped   # bad samples left out (data.on_bad_sample: skip)
        self._header()
        plan = rt.plan
        self.log = StepLog(name, case.get("schedule", name), steps, start,
                           plan.num_micro * plan.data_parallel * rc.data.micro_batch_size, rc.data.seq_len,
                           rt.compile_mode)

    def _header(self) -> None:
        """What trains, per region, exact (every rank's parameters to rank 0: a collective with a run
        folder), and rank 0's lines about the run and the bad samples skipped."""
        comm, name = self.comm, self.name
        counts = None
        if self.run_dir:
            if self.progress:
                self.progress.phase(self.start, "gather")
            counts = comm.all_gather_object(self.rt.parameter_counts())
        if comm.rank == 0:
            print(f"[{name}] {self.rc.train.describe(int(self.case.get('schedule_steps') or self.steps))}", flush=True)
            if counts:
                from hyperparallel.runtime.rank import parameters_line
                print(f"[{name}] {parameters_line(counts, self.rt.plan.regions())}", flush=True)
            if self.skipped:
                print(f"[{name}] data: {self.skipped} bad sample(s) skipped (hyperparallel data check lists them)",
                      flush=True)

    def wants_stop(self) -> bool:
        """Asked at the step's last collectives: a signal during step k stops after k."""
        return bool(self.stopper and self.stopper.requested)

    # -- the loop and its per-step hooks ----------------------------------------------------------------
    def loop(self) -> bool:
        """The case's steps; True when a signal stopped it before its last step."""
        for step in range(self.start, self.steps):
            res = self.train_step(step)
            self.losses.append(res.loss)
            mem = self.memory_record(step, res)
            stop, mem_all = self.gather(step, res, mem)
            self.dump_grads(step, res)
            self.log_step(step, res, mem_all)
            self.save_if_due(step, stop)
            if stop and step + 1 < self.steps:
                self.announce_stop(step)
                return True
        return False

    def train_step(self, step: int):
        """One optimizer step; a non-finite one stops every rank (at the same step: nothing of it saved)."""
        from hyperparallel.runtime.nonfinite import NONFINITE, NONFINITE_EXIT, NonFiniteStep
        try:
            return self.rt.step(step, stop=self.wants_stop)
        except NonFiniteStep as e:
            if self.metrics:
                self.metrics.close()
            kept = f"nothing saved for step {step + 1}" if self.save_dir else ""
            print(NONFINITE + e.describe(self.steps, kept), flush=True)
            raise SystemExit(NONFINITE_EXIT) from None

    def memory_record(self, step: int, res) -> Optional[dict]:
        """This rank's memory record of the step (with a run or dump folder); ``step``: steps done, as
        metrics.jsonl and the console count them."""
        from hyperparallel.runtime.memory import rank_memory
        mem = dict(rank_memory(self.rt, res.grads), step=step + 1) if (self.run_dir or self.dump_dir) else None
        self.memory.append(mem)
        return mem

    def gather(self, step: int, res, mem) -> Tuple[bool, Optional[list]]:
        """(stop, every rank's memory record). Every rank's record to rank 0 (after the step's programs: a
        collective every rank reaches here), with every rank's stop wish: a signal after the all-reduce (the
        update, the records) still stops after this step, the step whose line rank 0 has not printed yet,
        on every rank alike."""
        stop = res.stop
        mem_all = None
        if self.run_dir:
            if self.progress:
                self.progress.phase(step, "gather")
            gathered = self.comm.all_gather_object((mem, self.wants_stop()))
            mem_all = [m for m, _ in gathered]
            stop = stop or any(w for _, w in gathered)
        return stop, mem_all

    def dump_grads(self, step: int, res) -> None:
        """The first and the last step's gradients this rank holds (``dump_dir``, for the tests)."""
        if self.dump_dir and step in (self.start, self.steps - 1):
            os.makedirs(self.dump_dir, exist_ok=True)
            kind = "grads" if step == self.start else "grads_last"
            from hyperparallel.runtime.tensor_group import gather_whole
            grads = gather_whole(self.comm, self.rt.full_grads(res.grads), self.rt.sharded)   # ZeRO-2, TP: whole
            np.savez(os.path.join(self.dump_dir, f"{kind}_rank{self.comm.rank}.npz"),
                     **{k: v.asnumpy() for k, v in grads.items()})

    def log_step(self, step: int, res, mem_all) -> None:
        """Rank 0's console line and metrics.jsonl record of the step."""
        from hyperparallel.runtime.nonfinite import json_line
        if self.comm.rank != 0:
            return
        rec = self.log.record(res, self.skipped, self.rt.source.step_counts(step))
        print(self.log.line(rec), flush=True)
        if self.metrics:
            rec["memory"] = mem_all
            if self.encoder_work is not None:
                rec["encoder_work"] = self.encoder_work(step)
            self.metrics.write(json_line(rec) + "\n")   # strict JSON: a NaN is written as null
            self.metrics.flush()

    def save_if_due(self, step: int, stop: bool) -> None:
        """The checkpoint of the step when due (every save_every, the last step, a stop); a failed write
        exits with SAVE_FAILED_EXIT (the rank printed the path and the OS error)."""
        from hyperparallel.runtime.checkpoint import SaveError
        save_every = self.save_every
        due = self.save_dir and ((save_every and (step + 1) % save_every == 0) or step + 1 == self.steps or stop)
        if due:
            if self.hb:
                self.hb.beat(step, "save")
            try:
                self.saver.save(step + 1)
            except SaveError:
                raise SystemExit(SAVE_FAILED_EXIT) from None

    def announce_stop(self, step: int) -> None:
        """Rank 0's ``stopped on signal`` line: who asked, after which step, what was kept."""
        from hyperparallel.runtime.ckpt_files import step_dir
        from hyperparallel.runtime.stop import STOPPED
        if self.comm.rank == 0:
            save_dir, stopper = self.save_dir, self.stopper
            kept = f"checkpoint {step_dir(save_dir, step + 1)} saved" if save_dir else "no --save-dir: nothing saved"
            who = stopper.name if stopper and stopper.requested else "a signal to another rank"
            print(f"{STOPPED}{who} after step {step + 1}/{self.steps}; {kept}", flush=True)

    # -- the end of the case ----------------------------------------------------------------------------
    def finish(self) -> None:
        """Metrics closed, rank 0's summary lines, the dumps (compile, data, memory, losses), the runtime
        closed, and the beat before the job's end barrier (or the next case's set-up)."""
        comm, name, rt, dump_dir = self.comm, self.name, self.rt, self.dump_dir
        if self.metrics:
            self.metrics.close()
        if comm.rank == 0 and self.log.steps_skipped:
            print(f"[{name}] {self.log.steps_skipped} of {self.steps - self.start} step(s) skipped (a non-finite loss "
                  "or grad norm, or a loss-scale overflow; no update)", flush=True)
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
                json.dump(self.memory, f)
        rt.close()
        if dump_dir and comm.rank == 0:
            with open(os.path.join(dump_dir, "losses.json"), "w") as f:
                json.dump({"start": self.start, "losses": self.losses}, f)
        if self.hb:
            # the job's end barrier (or the next case's set-up) follows: it waits on every other rank
            self.hb.beat(self.steps, "barrier", waits=[r for r in range(comm.world) if r != comm.rank])
            self.hb.close()


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
