"""``hyperparallel train``: validate recipe and plan, then run the job with msrun.

Nothing here imports MindSpore at module import time: the launcher validates
the recipe, derives and checks the plan, writes a job file and starts msrun
(:mod:`hyperparallel.launch`). ``--reference`` trains the same model, data and
seed in this process without a pipeline (MindSpore imported only then).
"""
from __future__ import annotations

import os
import re
import sys
import time

from ..errors import PlanError, SpecError, whole
from ..recipe import schema
from ..util import error as _error, output_file, slug, writable_dir


def _prepare(args):
    """Everything checked before launch: recipe, run config, plan, flags. Raises SpecError/PlanError."""
    from ..recipe import checked_plan, refuse_over_memory_limit
    from ..runconfig import load_parsed

    from ..launch import preflight
    recipe = load_parsed(args.recipe, args.overrides)
    preflight(recipe.ranks, recipe.device)  # the device is here, HP_MSRUN_ARGS
    rc = recipe.run
    plan = checked_plan(recipe, args.schedule)
    refuse_over_memory_limit(recipe, plan)   # the predicted peak of every device within mpipe.memory_limit_gb
    rc.check_plan(plan)
    from ..recipe.train import MAX_STEPS
    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        raise SpecError("--steps", f"must be 1..{MAX_STEPS:,}, got {args.steps}")
    if args.save_every is not None and not 0 <= args.save_every <= MAX_STEPS:
        raise SpecError("--save-every", f"must be 0..{MAX_STEPS:,}, got {args.save_every}")
    args.source = _source(args)
    from .data import precheck
    line, usable = precheck(rc, args.recipe, args.overrides)   # the whole data set scanned: bad samples stop here, named
    if line:
        print(line, flush=True)
    args.total_steps, args.steps_from = run_steps(args.steps, recipe.raw, rc.train, usable,
                                                  plan.num_micro * plan.data_parallel * rc.data.micro_batch_size)
    _refuse_nothing_to_train(args.source, args.total_steps, args.steps_from)
    args.schedule_steps = schedule_steps(recipe.raw, rc.train, usable, args.total_steps, args.steps_from,
                                         plan.num_micro * plan.data_parallel * rc.data.micro_batch_size)
    if args.save_dir and not getattr(args, "reference", False):
        _check_save_dir(args.save_dir)   # last: a refused recipe leaves no folder behind
    return recipe, rc, plan


def run_steps(flag, raw: dict, train, usable, samples_per_step: int):
    """(steps of the run, the key that set them): ``--steps``, else ``train.steps``, else MindFormers'
    ``runner_config.epochs`` over the data set (``epochs x (usable samples // samples per step)``, the
    last partial step dropped as MindFormers' datasets do) capped by ``runner_config.stop_step``, else
    the default (``train.steps``' 20)."""
    if flag is not None:
        return flag, "--steps"
    if train.steps_given:
        return train.steps, "train.steps"
    rcfg = raw.get("runner_config") if isinstance(raw.get("runner_config"), dict) else {}
    stop = rcfg.get("stop_step") or 0
    whole("runner_config.stop_step", stop, 0)
    if "epochs" in rcfg:
        ep = rcfg["epochs"]
        whole("runner_config.epochs", ep)
        if usable is None:
            if stop:
                return stop, "runner_config.stop_step"
            raise SpecError("runner_config.epochs", "generated (synthetic) data has no epochs; give train.steps or "
                                                    "--steps")
        per_epoch = usable // samples_per_step
        if per_epoch < 1:
            raise SpecError("runner_config.epochs", f"the data set's {usable} usable samples make no full step of "
                                                    f"{samples_per_step} samples; give train.steps or --steps")
        steps = ep * per_epoch
        if stop and stop < steps:
            return stop, "runner_config.stop_step"
        return steps, f"runner_config.epochs: {ep} x {per_epoch} steps"
    if stop:
        return stop, "runner_config.stop_step"
    return train.steps, "default"


def schedule_steps(raw: dict, train, usable, steps: int, steps_from: str, samples_per_step: int) -> int:
    """The steps a MindFormers learning-rate schedule with ``total_steps: -1`` spans: the run's, except
    where ``runner_config.stop_step`` cut the run short in a MindFormers training recipe: there
    MindFormers' trainer still sizes the schedule to ``runner_config.epochs`` (default 1) x the data
    set's steps (``BaseTrainer.create_lr_scheduler``), and stop_step only ends the run early."""
    from ..recipe.train import mindformers_training
    if steps_from != "runner_config.stop_step" or train.schedule.type is None or not mindformers_training(raw):
        return steps
    if dict(train.schedule.kwargs).get("total_steps") not in (None, -1):
        return steps
    if usable is None:
        raise SpecError("lr_schedule.total_steps", "-1 with runner_config.stop_step: MindFormers sizes the schedule "
                                                   "to runner_config.epochs x the data set's steps, which generated "
                                                   "data has not; give lr_schedule.total_steps")
    epochs = (raw.get("runner_config") or {}).get("epochs", 1)
    return max(steps, epochs * (usable // samples_per_step))


def _refuse_nothing_to_train(src, steps: int, steps_from: str) -> None:
    """A checkpoint to continue from that is already at (or past) the run's last step: SpecError naming
    ``--steps`` (the ranks would launch, train nothing and exit)."""
    if src is not None and src.meta and src.step >= steps:
        raise SpecError("--steps", f"the run ends at step {steps} ({steps_from}), but {src.path} is already at step "
                                   f"{src.step}: nothing left to train; give --steps above {src.step}")


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def _names(steps) -> str:
    names = [os.path.basename(p) for _, p in steps]
    return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")


def _guard_save_dir(args, node0: bool) -> None:
    """Another run's checkpoints in ``--save-dir`` are never mixed with this run's (a later ``--resume``
    would take the newest of either). Complete steps this run does not continue (``--resume``: all of
    them; ``--resume-from`` a step of this save dir: it and older ones) are refused, before launch, unless
    ``--overwrite-save-dir`` is given: then every step directory this run does not continue is removed
    (on the node of rank 0; the save dir's other files are left alone)."""
    from ..runtime.ckpt_files import MARKER, list_steps, step_dirs
    over = getattr(args, "overwrite_save_dir", False)
    if not args.save_dir or args.reference or (args.resume and not over):
        return
    if args.resume:
        raise SpecError("--overwrite-save-dir", "give either --resume (continue the run in --save-dir) or "
                                                "--overwrite-save-dir (replace it)")
    src = args.source
    start = src.step if src is not None and _inside(src.path, args.save_dir) else None

    def foreign(steps):
        return [(s, p) for s, p in steps if start is None or s > start]
    if not over:
        old = foreign(list_steps(args.save_dir)[0])
        if not old:
            return
        if start is None:
            raise SpecError("--save-dir", f"{args.save_dir} already holds complete checkpoints ({_names(old)}) that "
                                          f"this run would mix with its own; continue them with --resume, give "
                                          f"--overwrite-save-dir to remove them first, or give another --save-dir")
        raise SpecError("--save-dir", f"{args.save_dir} holds complete checkpoints after step {start}, where "
                                      f"--resume-from starts ({_names(old)}): a later --resume would take them for "
                                      f"this run's; give --overwrite-save-dir to remove them first, or another "
                                      f"--save-dir")
    doomed = foreign(step_dirs(args.save_dir))
    for _, p in doomed:
        if src is not None and _inside(src.path, p):
            raise SpecError("--overwrite-save-dir", f"would remove {p}, which --resume-from reads; give another "
                                                    f"--save-dir")
    if not doomed or not node0:
        return
    import shutil
    for _, p in doomed:
        try:
            if os.path.exists(os.path.join(p, MARKER)):
                os.remove(os.path.join(p, MARKER))   # first: a removal cut short leaves no complete-looking step
            shutil.rmtree(p)
        except OSError as e:
            raise SpecError("--overwrite-save-dir", f"{e.filename or p} cannot be removed: {e.strerror}") from None
    print(f"--overwrite-save-dir: removed {len(doomed)} step director{'y' if len(doomed) == 1 else 'ies'} of "
          f"an earlier run from {args.save_dir} ({_names(doomed)})", flush=True)


def _check_metrics(run_dir: str) -> None:
    """A resumed run keeps the lines of ``RUN_DIR/metrics.jsonl`` up to its checkpoint: checked before
    launch (a partial last line noted, the ranks drop it; a bad line before it: SpecError, file and line)."""
    from ..fileio import jsonl_rows
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(path):
        _, note = jsonl_rows(path)
        if note:
            print(f"note: {note}", flush=True)


def _check_save_dir(path: str) -> None:
    """``--save-dir`` can be created and written (a probe file), before any rank is launched: SpecError
    naming the path and the OS error (a read-only folder or file system, a file in the way)."""
    probe = os.path.join(path, f".hp_write_probe_{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "w") as f:
            f.write("probe")
        os.remove(probe)
    except OSError as e:
        import errno
        name = errno.errorcode.get(e.errno, str(e.errno))
        raise SpecError("--save-dir", f"{e.filename or path} cannot be written: {e.strerror} ({name})") from None


def _source(args):
    """The checkpoint to start from (resolved and its files checked here, before launch), or None."""
    from ..runtime.ckpt_files import CheckpointError, resolve

    resume, resume_from = getattr(args, "resume", False), getattr(args, "resume_from", None)
    if resume and resume_from:
        raise SpecError("--resume-from", "give either --resume (newest in --save-dir) or --resume-from PATH")
    if resume and not args.save_dir:
        raise SpecError("--resume", "needs --save-dir (where the checkpoints are)")
    if not (resume or resume_from):
        return None
    flag, path = ("--resume", args.save_dir) if resume else ("--resume-from", resume_from)
    try:
        return resolve(path, digests=not getattr(args, "no_digest", False))
    except CheckpointError as e:
        raise SpecError(flag, str(e)) from None


def run(args) -> int:
    try:
        recipe, rc, plan = _prepare(args)
    except (SpecError, PlanError) as e:
        return _error(str(e).splitlines()[0])
    for line in rc.model.notes():   # said once here; the ranks build the same model silently
        print(f"note: {line}", flush=True)
    steps = args.total_steps
    sched_name = str(plan.meta.get("schedule_name", args.schedule or recipe.schedule))
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    run_dir = args.run_dir or os.path.join("runs", slug(f"{stem}_{'reference' if args.reference else sched_name}"))
    os.makedirs(run_dir, exist_ok=True)
    from .. import runlock
    if args.reference:
        with runlock.holding([("--run-dir", run_dir)], echo=_note):
            return _run_reference(recipe, rc, steps, run_dir, getattr(args, "schedule_steps", steps), args.source)
    from ..launch import local_ranks, msrun_overrides
    world = plan.ranks
    overrides = msrun_overrides(world)
    node0 = 0 in local_ranks(world, overrides)
    with runlock.holding([("--run-dir", run_dir), ("--save-dir", args.save_dir)], int(overrides.get("node_rank", 0)),
                         echo=_note):   # another run into either directory: refused here, naming it
        _guard_save_dir(args, node0)
        if args.source is not None and args.source.step > 0:   # the ranks keep its lines up to that step
            _check_metrics(run_dir)
        return _launch(args, recipe, rc, plan, run_dir, world, node0)


def _note(line: str) -> None:
    print(line, flush=True)


def _launch(args, recipe, rc, plan, run_dir: str, world: int, node0: bool) -> int:
    """Start msrun on the job and report how it ended (exit status)."""
    steps = args.total_steps
    sched_name = str(plan.meta.get("schedule_name", args.schedule or recipe.schedule))
    stem = os.path.splitext(os.path.basename(args.recipe))[0]
    case = dict(name=sched_name, raw=recipe.raw, plan=plan.to_json(), steps=steps, schedule=sched_name,
                schedule_steps=getattr(args, "schedule_steps", steps),
                run_dir=os.path.abspath(run_dir),
                save_dir=os.path.abspath(args.save_dir) if args.save_dir else None,
                save_every=args.save_every, save_format=args.save_format, resume=bool(args.resume),
                digests=not args.no_digest)
    if args.no_digest:
        print("checkpoint digests: skipped (--no-digest): files are saved and resumed without their SHA-256 "
              "(sizes and headers still checked)", flush=True)
    src = args.source
    if src is not None:
        case["resume_from"] = src.to_json()
        for path in src.ignored:
            print(f"ignoring incomplete checkpoint {path} ({src.why.get(path, 'not every rank finished writing it')})",
                  flush=True)
        print(f"resuming from {src.path} at step {src.step}" + _position_note(src, plan), flush=True)
    tp = f" T={plan.tensor_parallel}" if plan.tensor_parallel > 1 else ""   # parallel_config.model_parallel
    print(f"train {stem}: schedule {sched_name}, P={plan.num_devices} D={plan.data_parallel}{tp} "
          f"M={plan.num_micro} on {world} {rc.device} ranks, {steps} steps ({args.steps_from}); run dir {run_dir}",
          flush=True)
    if plan.meta.get("zero"):   # train.zero / parallel_config.optimizer_shard (true: level 1)
        print(plan.meta["zero"]["line"], flush=True)
    print(compile_line(rc.model, rc.compile), flush=True)
    notes = schema.unused_keys(recipe.raw)
    if notes:
        print(f"not used by hyperparallel's runtime (no effect on this run): {', '.join(notes)}", flush=True)
    if recipe.estimated:
        print(f"note: {recipe.costs}", flush=True)
    from ..launch import HUNG, NONFINITE, PREEMPTED, SAVE_FAILED, launch
    res = launch({"device": rc.device, "cases": [case]}, world, os.path.join(run_dir, "logs"),
                 timeout_s=args.timeout, hang_timeout_s=rc.train.hang_timeout_s, stop_grace_s=rc.train.stop_grace_s)
    if res.returncode == PREEMPTED:
        print(f"stopped (exit {PREEMPTED}): {res.stopped}" + ("; continue with --resume" if args.save_dir else ""),
              file=sys.stderr, flush=True)
        return PREEMPTED
    if res.returncode != 0:
        refused = _refusal(res.log_dir, world, "--resume" if args.resume else "--resume-from")
        if refused:
            return _error(refused)
        what = {HUNG: "job hung" if res.hung else "job timed out", SAVE_FAILED: "job failed",
                NONFINITE: "training stopped"}.get(res.returncode, "job stopped" if res.killed else "job failed")
        print(f"error: {what} (exit {res.returncode}): {res.message}" + _newest(args), file=sys.stderr)
        return res.returncode
    where = (f"metrics in {os.path.join(run_dir, 'metrics.jsonl')}" if node0 else
             "this node has no rank 0: node 0's run directory has the metrics")
    print(f"done in {res.wall_s:.1f} s; {where}", flush=True)
    return 0


def compile_line(model, mode: str) -> str:
    """The start banner's compile line (pure Python, before launch): per region, whether its chunks run
    compiled (``jit``) or op by op (``eager``) and why, as the model adapter says it
    (``ModelAdapter.compile_reason``, the answer the ranks then follow)."""
    if mode != "jit":
        return f"compile: every chunk eager (mpipe.compile: {mode})"
    said = {}   # the adapter's answer -> its regions, in data-flow order (regions alike said once)
    for region in model.region_names():
        said.setdefault(model.compile_reason(region), []).append(region)
    parts = [", ".join(regions) + (" jit" if why == "" else f" eager ({why})" if why else
                                   " as its chunk Cells give (jit with a tensor-only body; the ranks' logs say which)")
             for why, regions in said.items()]
    return "compile (mpipe.compile: jit): " + "; ".join(parts)


def _newest(args) -> str:
    """``; newest complete checkpoint: PATH`` of ``--save-dir`` after a failed run ('' without one)."""
    if not args.save_dir:
        return ""
    from ..runtime.ckpt_files import list_steps
    complete, _ = list_steps(args.save_dir)
    return f"; newest complete checkpoint: {complete[0][1]}" if complete else "; no complete checkpoint"


def _position_note(src, plan) -> str:
    pos = (src.meta or {}).get("data_position") or {}
    per = pos.get("micro_batches_per_step")
    if per and per != plan.num_micro * plan.data_parallel:
        return (f" (note: the checkpoint's run took {per} micro-batches per step, this one "
                f"{plan.num_micro * plan.data_parallel}; data continue at step {src.step})")
    return ""


def _refusal(log_dir: str, world: int, flag: str):
    """A rank's checkpoint refusal (``checkpoint refused: ...`` in its log), or None."""
    from ..runtime.ckpt_files import REFUSED, REFUSED_INPUT

    for r in range(world):
        try:
            with open(os.path.join(log_dir, f"worker_{r}.log"), errors="replace") as f:
                for line in f:
                    if line.startswith(REFUSED):
                        return f"{flag}: " + line[len(REFUSED):].strip()
                    if line.startswith(REFUSED_INPUT):
                        return line[len(REFUSED_INPUT):].strip()
        except OSError:
            continue
    return None


def _run_reference(recipe, rc, steps: int, run_dir: str, schedule_steps: int = 0, source=None) -> int:
    """The single-process reference: the console shows the project's lines; what MindSpore, MindFormers and
    mindone print (warnings, their logs) goes to ``RUN_DIR/logs/reference.log``, as a pipeline run's worker
    logs hold theirs. ``source`` (``--resume-from``): the reference starts from that checkpoint as the
    pipeline run does (weights, optimizer state when saved, data position, step), so a resumed pipeline is
    compared with a resumed reference."""
    from ..util import LibraryOutput
    os.environ.setdefault("GLOG_v", "3")
    os.environ.setdefault("LOCAL_DEFAULT_PATH", os.path.join(os.path.abspath(run_dir), "mindformers"))
    path = os.path.join(run_dir, "logs", "reference.log")
    with LibraryOutput(path) as con:
        con.say(f"[reference] other libraries' output (warnings, MindSpore, mindone): {path}")
        from ..runtime import compat
        from ..runtime.reference import Reference
        compat.setup_device(rc.device)
        ref = Reference(rc, recipe.micro_batch_num * recipe.data_parallel,
                        {r.name: r.trainable for r in recipe.profile.regions}, total_steps=schedule_steps or steps)
        from ..runtime.nonfinite import NONFINITE_EXIT, NonFiniteStep, json_line
        from ..runtime.worker import StepLog
        from ..runtime.rank import StepResult
        start = 0
        if source is not None:
            from ..runtime.ckpt_files import CheckpointError
            try:
                start, with_state = ref.restore(source)
            except CheckpointError as e:
                con.say(f"error: --resume-from: {str(e).splitlines()[0]}", err=True)
                return 2
            con.say(f"[reference] resumed from {source.path} at step {start} "
                    f"({'with its' if with_state else 'fresh'} optimizer state)")
        log = StepLog("reference", "reference", steps, start,
                      recipe.micro_batch_num * recipe.data_parallel * rc.data.micro_batch_size, rc.data.seq_len)
        con.say(f"[reference] {rc.train.describe(schedule_steps or steps)}")
        from ..runtime.worker import open_metrics
        with open_metrics(os.path.join(run_dir, "metrics.jsonl"), start) as f:
            for step in range(start, steps):
                t0 = time.perf_counter()
                try:
                    loss, _ = ref.step(step)
                except NonFiniteStep as e:   # train.nonfinite: stop, before the update (as the pipeline's ranks)
                    con.say(f"error: training stopped (exit {NONFINITE_EXIT}): non-finite {e.describe(steps)}",
                            err=True)
                    return NONFINITE_EXIT
                dt = time.perf_counter() - t0
                rec = log.record(StepResult(step, loss, {}, dt, 0.0, 0.0, ref.grad_norm, ref.lr,
                                            skipped=ref.skipped, loss_scale=ref.loss_scale, overflow=ref.overflow), 0,
                                 ref.source.step_counts(step))
                con.say(log.line(rec))
                f.write(json_line(rec) + "\n")
    return 0


def _ckpt_source(path: str, digests: bool):
    """The checkpoint at ``path`` (verified) with MindSpore set up on CPU to read it, or the exit status of
    its refusal."""
    from ..runtime.ckpt_files import CheckpointError, resolve
    try:
        src = resolve(path, digests)
    except CheckpointError as e:
        return _error(f"ckpt: {e}")
    os.environ.setdefault("GLOG_v", "3")
    from ..runtime import compat
    compat.setup_device("CPU")
    return src


def _export_hf(path: str, out: str, digests: bool, merge_lora: bool = False) -> int:
    """``ckpt PATH --export-hf OUT``: the console shows the project's lines; what mindone and transformers
    print while the model is built and saved (warnings, their logs) goes to ``OUT.log``, beside the
    directory (not in it: the directory is what ``from_pretrained`` and the hub read)."""
    from ..runtime.ckpt_files import CheckpointError, resolve
    from ..util import LibraryOutput
    try:
        src = resolve(path, digests)
    except CheckpointError as e:
        return _error(f"ckpt: {e}")
    log = os.path.abspath(out).rstrip(os.sep) + ".log"
    try:
        with LibraryOutput(log) as con:
            con.say(f"other libraries' output (warnings, MindSpore, mindone): {log}")
            os.environ.setdefault("GLOG_v", "3")
            from ..runtime import compat
            compat.setup_device("CPU")
            from ..runtime.checkpoint import export_hf
            n = export_hf(src, out, con.say, merge_lora)
    except CheckpointError as e:
        return _error(f"ckpt: {e}")
    adapter = os.path.isfile(os.path.join(src.path, "lora.json")) and not merge_lora   # a model.lora run
    print(f"wrote {out}: {n} tensors from {src.path} "
          f"({'a PEFT adapter: PeftModel.from_pretrained' if adapter else 'Hugging Face format'})")
    return 0


def check_ckpt_output(args) -> None:
    """``--merge OUT`` / ``--export-hf OUT_DIR`` checked before anything is read (SpecError naming the flag):
    never inside a step directory (its files are what its digests cover, and a later ``--resume`` reads
    them; not even with ``--force``) nor onto the checkpoint being read; without ``--force`` not inside a
    save directory, not over an existing file, and (``--export-hf``) not into a non-empty folder."""
    from ..runtime.ckpt_files import checkpoint_holding
    from ..models import hf_dir
    if args.export_hf and args.merge:
        raise SpecError("--export-hf", "give either --merge or --export-hf")
    if getattr(args, "merge_lora", False) and not args.export_hf:
        raise SpecError("--merge-lora", "only with --export-hf (it merges a model.lora run's adapters into the "
                                        "exported model)")
    flag, out = ("--merge", args.merge) if args.merge else ("--export-hf", args.export_hf)
    if out is None:
        if args.force:
            raise SpecError("--force", "only with --merge or --export-hf")
        return
    if flag == "--merge" and not out.endswith((".safetensors", ".ckpt")):
        raise SpecError("--merge", f"{out} must end with .safetensors or .ckpt")
    if flag == "--export-hf" and os.path.isfile(out):
        raise SpecError("--export-hf", f"{out} is a file; give a directory")
    kind, where = checkpoint_holding(out)
    if kind == "step":
        raise SpecError(flag, f"{out} is inside the checkpoint step directory {where}, whose files its digests "
                              "cover; write it elsewhere (not even --force writes there)")
    target, src = os.path.realpath(out), os.path.realpath(args.path)
    if (os.path.isfile(src) and target == src) or (os.path.isdir(src) and hf_dir.is_hf_dir(src)
                                                   and (target + os.sep).startswith(src + os.sep)):
        raise SpecError(flag, f"{out} is the checkpoint being read ({args.path}); write it elsewhere")
    if flag == "--export-hf" and kind == "save" and target == where:
        raise SpecError(flag, f"{out} is the save directory itself: a model directory there would be taken for "
                              "its checkpoint (--resume would start from it at step 0); write it elsewhere")
    if flag == "--merge":
        output_file("--merge", out)
    else:
        writable_dir("--export-hf", out)
    if args.force:
        return
    if kind == "save":
        raise SpecError(flag, f"{out} is inside the save directory {where}; write it elsewhere, or give --force")
    if flag == "--merge" and os.path.exists(out):
        raise SpecError(flag, f"{out} exists; give a new file name, or --force to replace it")
    if flag == "--export-hf" and os.path.isdir(out) and os.listdir(out):
        names = sorted(os.listdir(out))
        raise SpecError(flag, f"{out} is not empty ({len(names)} entries: {', '.join(names[:3])}"
                              f"{', ...' if len(names) > 3 else ''}); give a new or empty folder, or --force to "
                              "replace the model there (its config.json and weights; other files are kept)")


def run_ckpt(args) -> int:
    """``hyperparallel ckpt``: the step directories of a save directory (complete or not),
    ``--merge OUT``: one MindSpore file of a step for single-process use, or ``--export-hf OUT_DIR``: a
    Hugging Face model directory of a step."""
    from ..runtime.ckpt_files import read_meta, step_dirs, verdict

    digests = not args.no_digest
    check_ckpt_output(args)
    if args.export_hf:
        return _export_hf(args.path, args.export_hf, digests, getattr(args, "merge_lora", False))

    if args.merge:
        src = _ckpt_source(args.path, digests)
        if isinstance(src, int):
            return src
        from ..runtime.checkpoint import merge
        n = merge(src, args.merge, args.with_optimizer)
        print(f"wrote {args.merge}: {n} names from {src.path}")
        return 0
    path = os.path.normpath(args.path)
    only = None
    if os.path.isdir(path) and re.fullmatch(r"step_\d+", os.path.basename(path)):
        path, only = os.path.dirname(path) or ".", os.path.basename(path)   # one step directory: list that step
    steps = step_dirs(path)
    if only is not None:
        steps = [(s, p) for s, p in steps if os.path.basename(p) == only]
    if not steps:
        return _error(f"ckpt: no step directories in {args.path}")
    if not digests:
        print("not checking the files' SHA-256 (--no-digest): sizes and headers only")
    chosen = None
    for step, path in sorted(steps):
        bad = verdict(path, digests)   # the verdict --resume gives
        if not bad:
            m = read_meta(path)
            size = sum(os.path.getsize(os.path.join(path, f)) for f in m["files"])
            checked = ("SHA-256 verified" if digests else "sizes checked (--no-digest)") if m.get("digests") else \
                "no digests recorded (an older checkpoint)"
            print(f"{os.path.basename(path)}: complete, {m.get('schedule')} P={m.get('P')} V={m.get('V')} "
                  f"D={m.get('D')}, {len(m['files'])} {m.get('format')} files, {size / 1024:.0f} KiB, {checked}")
            chosen = path
        else:
            print(f"{os.path.basename(path)}: incomplete (ignored by --resume): {bad}")
    if chosen is not None and only is None:
        print(f"--resume would use {os.path.basename(chosen)}")
    return 0
