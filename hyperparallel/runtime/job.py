"""The msrun side of a job file (written by :mod:`hyperparallel.launch`): the start and end every msrun
entry shares (the training worker, the bench worker, tools), and a job case's rank runtime."""
from __future__ import annotations

import json
import os


def start_job(argv) -> dict:
    """Announce rank and pid, load the job file ``argv[0]``, set up the device. A worker (not msrun's
    scheduler, which runs the same script) gets SIGHUP when msrun dies (:func:`.stop.follow_parent`)."""
    # the launcher maps msrun's "Worker process PID exit" reports to ranks with this line
    print(f"hyperparallel worker rank {os.environ.get('RANK_ID', '?')} pid {os.getpid()}", flush=True)
    if os.environ.get("MS_ROLE") != "MS_SCHED":
        from .stop import follow_parent
        follow_parent()
    global _JOB_DIR
    _JOB_DIR = os.path.dirname(os.path.abspath(argv[0]))
    with open(argv[0]) as f:
        job = json.load(f)
    from . import compat
    compat.setup_device(job.get("device", "CPU"))
    return job


#: the job file's folder (the launcher's log folder), set by :func:`start_job`
_JOB_DIR = ""


def done_file(log_dir: str, rank: int) -> str:
    """``LOG_DIR/done_<rank>``: the rank finished its job (written by :func:`end_job`, read by the launcher)."""
    return os.path.join(log_dir, f"done_{rank}")


def end_job(comm) -> int:
    """Wait for every rank (a peer's in-flight send fails if its receiver exits first), then leave
    ``done_<rank>`` beside the job file as the rank's last act: once every rank of the node has it, the
    launcher ends msrun and the ranks at once instead of waiting for MindSpore's teardown (1-2 s a rank)
    and msrun's scheduler, which polls for the ranks' exit only every 5 s (MindSpore 2.9,
    ``meta_server_node.cc`` Finalize). Everything the job writes is written before this."""
    comm.barrier()
    if comm.rank == 0:
        print("job finished", flush=True)
    if _JOB_DIR:
        with open(done_file(_JOB_DIR, comm.rank), "w") as f:
            f.write(str(os.getpid()))
    return 0


def case_runtime(case: dict, comm, hooks=None, pool=None):
    """(run config, :class:`~.rank.RankRuntime`) of one job case (``raw`` recipe, ``plan`` JSON); ``pool``:
    the compiled chunks of this process's earlier cases (:class:`~.compiled.GraphPool`)."""
    from hyperparallel.mpipe import ir
    from hyperparallel.runconfig import parse_recipe
    from .rank import RankRuntime

    rc = parse_recipe(case["raw"]).run   # the one parse the front end made of the same raw recipe
    plan = ir.Plan.from_json(case["plan"])
    source = rc.source()
    if balancing(rc):   # data.balance: encoder: every step's samples grouped by the plan's encoder owners
        from hyperparallel.data.balance import owner_ranks
        source.balance_by(owner_ranks(plan))
    return rc, RankRuntime(plan, rc.model, source, rc.train, comm, hooks,
                           total_steps=int(case.get("schedule_steps") or case.get("steps") or rc.train.steps), compile=rc.compile,
                           compile_fallback=rc.compile_fallback, log=_rank_log(case.get("name", "run")),
                           pool=pool, pool_model=(_pooled_model(case, plan, comm), rc.data.shapes(), rc.train.seed))


def _pooled_model(case: dict, plan, comm):
    """What a pooled chunk was built from besides the data and seed: the model section, and under tensor
    parallelism the slice this rank holds (a sharded chunk is never another layout's)."""
    model = case["raw"].get("model")
    return model if plan.tensor_parallel == 1 else [model, plan.tensor_parallel, comm.tp_index]


def _rank_log(name: str):
    def log(line: str) -> None:
        print(f"[{name}] {line}", flush=True)
    return log


def balancing(rc) -> bool:
    return rc.data.balance == "encoder"


def encoder_record(rc, rt, raw: dict):
    """``step -> metrics entry`` of the predicted encoder work per owner (:class:`~hyperparallel.data.balance.StepRecord`;
    milliseconds from the recipe's ``mpipe.profile`` when it has one), or None when not balancing."""
    if not balancing(rc):
        return None
    from hyperparallel.data.balance import StepRecord
    from hyperparallel.mpipe.profile import parse_profile
    prof = (raw.get("mpipe") or {}).get("profile") if isinstance(raw.get("mpipe"), dict) else None
    return StepRecord(rt.source, rt.plan, parse_profile(prof) if isinstance(prof, dict) else None)
