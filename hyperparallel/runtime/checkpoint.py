"""Save and restore on the ranks with MindSpore's own ``save_checkpoint`` / ``load_checkpoint``.

Layout, completeness and ownership are in :mod:`.ckpt_files`. Saving step N:

1. rank 0 removes an old ``step_<N>/`` (marker first);
2. every writing rank saves the names it owns to a temporary file, records its size and SHA-256
   (``.digest_<file>.json``, unless ``--no-digest``) and renames it;
3. rank 0 writes ``meta.json`` (the files' records gathered into ``digests``, with those of the
   step's other files, e.g. ``config.json``: every file of the step is covered) and the
   ``COMPLETE`` marker (with the SHA-256 of ``meta.json``).

Each phase ends with a one-float all-reduce of "did this rank fail" (the barrier between phases): a
rank whose write fails (no space, a read-only folder) prints a ``SAVE_FAILED`` line naming the path
and the OS error, and every rank raises :class:`SaveError` together, so the job ends at once (no
rank left waiting in a barrier) and the older complete steps stay as they were.
A rank that dies in between leaves a directory without the marker, which ``--resume`` ignores.
Restoring loads by global name (``Parameter.name``) into whatever chunks this rank holds, so a
checkpoint saved under one (schedule, P, V, D, T) resumes under any other; names and shapes are
checked against the whole model (all ranks' names, gathered) before anything is loaded.
Tensor parallelism (T > 1): files hold whole tensors, as an unsharded run's. The T ranks of a writing stage
gather each split parameter (and its optimizer state) in the write phase and tp index 0 writes; a restoring
rank reads the whole tensor and keeps its slice.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
from typing import Dict, Optional, Tuple

import mindspore as ms

from .ckpt_files import (FORMAT_VERSION, MARKER, SAVE_FAILED, CheckpointError, Source, check_names, chunk_owners,
                         file_record, rank_file, safetensors_header, scalar_owner, seal_step, step_dir, write_json,
                         writers)
from hyperparallel.models.lora import trained
from .compat import load_optimizer_state, write_param
from .optim import HYPER_PARAMS


def recipe_hash(raw: dict) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:16]


SAVE_FAULTS = ("exit", "kill", "enospc")


class SaveError(RuntimeError):
    """A checkpoint could not be written (every rank raises it together; see the module docstring)."""


def save_fault(rank: int) -> Optional[Tuple[int, str]]:
    """``HP_FAULT=RANK:save:N[:kill|:enospc]``: (N, mode) when this rank must fail while saving step N: die
    (``exit``, default), be SIGKILLed (``kill``), or get "No space left on device" writing its file
    (``enospc``, a full disk)."""
    spec = os.environ.get("HP_FAULT", "").split(":")
    if len(spec) < 3 or spec[0] != str(rank) or spec[1] != "save":
        return None
    mode = spec[3] if len(spec) > 3 else "exit"
    if mode not in SAVE_FAULTS:
        raise ValueError(f"HP_FAULT={os.environ['HP_FAULT']}: mode {mode!r} unknown; allowed: {', '.join(SAVE_FAULTS)}")
    return int(spec[2]), mode


def os_error_text(e: BaseException) -> str:
    """``PATH: strerror (ENAME)`` of an OSError; the first line of anything else (MindSpore's own errors)."""
    if isinstance(e, OSError) and e.strerror:
        name = errno.errorcode.get(e.errno, str(e.errno))
        return f"{e.filename}: {e.strerror} ({name})" if e.filename else f"{e.strerror} ({name})"
    cause = e.__cause__ or e.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return os_error_text(cause)
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


class Saver:
    """Writes this rank's part of each checkpoint (nothing when it owns no name).

    ``meta``: what ``meta.json`` records of the run besides the layout (``recipe_hash``,
    ``schedule``, ``optimizer``); ``source``: the data source, whose ``position`` goes there too."""

    def __init__(self, save_dir: str, comm, plan, chunks, opt, source, meta: dict, fmt: str = "safetensors",
                 extra_files: Optional[Dict[str, str]] = None, digests: bool = True,
                 tied: Optional[Dict[str, str]] = None, loss_scale=None,
                 sharded: Optional[Dict[str, int]] = None):
        self.comm, self.plan, self.fmt, self.digests = comm, plan, fmt, digests
        self.loss_scale = loss_scale   # the run's LossScale (.loss_scale): its state goes into meta.json
        self.extra_files = dict(extra_files or {})   # {name: text} rank 0 writes into every step directory
        self.save_dir = save_dir
        owners = chunk_owners(plan)
        mine = comm.dp_index == 0
        params = [p for key, cell in sorted(chunks.items()) if mine and owners[key] == comm.device
                  for p in trained(cell.get_parameters())]   # not a base weight LoRA froze (model.pretrained's)
        self.opt = opt
        per, glob = opt.state_groups()
        state = opt.state()
        # a tied weight (``tied``: {label: parameter name} held here) is written once, by the lowest device
        # holding a copy; every holder's copy (and its optimizer state) is checked equal first (:meth:`verify`)
        self.tied = {name: [name] + per.get(name, []) for name in (tied or {}).values()}
        not_mine = {tied[t.name] for t in plan.tied_on(comm.device) if comm.device != min(t.devices)} if tied else set()
        params = [p for p in params if p.name not in not_mine]
        self.tied_values = dict({p.name: p for cell in chunks.values() for p in cell.get_parameters()
                                 if p.name in self.tied}, **state)
        self.items = {p.name: p for p in params}
        for p in params:
            self.items.update({n: state[n] for n in per.get(p.name, [])})
        if mine and comm.device == scalar_owner(plan):
            self.items.update({n: state[n] for n in glob})
        from .tensor_group import with_state
        self.sharded = with_state(sharded or {}, per)   # {name: axis} split over the tensor-parallel group
        self.writes = bool(self.items) and getattr(comm, "tp_index", 0) == 0   # the T ranks gather, tp 0 writes
        self.files = [rank_file(r, fmt) for r in writers(plan)]
        self.fault = save_fault(comm.rank)
        self.source = source
        self.meta = {"format_version": FORMAT_VERSION, "format": fmt, "recipe_hash": meta.get("recipe_hash"),
                     "schedule": meta.get("schedule") or plan.meta.get("schedule_name"),
                     "P": plan.num_devices, "V": int(plan.meta.get("pp_interleave_num", 1)),
                     "D": plan.data_parallel, "M": plan.num_micro, "optimizer": meta.get("optimizer"),
                     "files": self.files}
        if meta.get("processor"):   # where the tokenizer came from (ckpt --export-hf writes the processor)
            self.meta["processor"] = meta["processor"]

    def save(self, step: int) -> float:
        """Write checkpoint ``step`` (steps done); every rank calls this at the same point.
        Returns the seconds it took (barriers included); rank 0 logs a ``saved`` line."""
        t0 = time.perf_counter()
        for phase in (self.verify, self.begin, self.write, self.finish):
            self._agreed(step, phase)
        dt = time.perf_counter() - t0
        if self.comm.rank == 0:
            d = step_dir(self.save_dir, step)
            size = sum(os.path.getsize(os.path.join(d, f)) for f in self.files
                       if os.path.exists(os.path.join(d, f)))
            note = "" if self.digests else " (no SHA-256 digests: --no-digest)"
            print(f"saved {d} ({len(self.files)} files, {size} bytes) in {dt:.4f}s{note}", flush=True)
        return dt

    def _agreed(self, step: int, phase) -> None:
        """Run one phase; then every rank learns whether any rank failed it (one all-reduce, the barrier)."""
        why = ""
        try:
            phase(step)
        except Exception as e:   # noqa: BLE001  an OSError, or what save_checkpoint raises over one (the
            # safetensors writer's SafetensorError "I/O error: No space left on device (os error 28) at path ...")
            why = os_error_text(e)
            if not isinstance(e, OSError):
                why = f"{step_dir(self.save_dir, step)}: {type(e).__name__}: {why}"
        failed = self.comm.all_reduce_values([1.0 if why else 0.0])[0]
        if why:
            print(f"{SAVE_FAILED}{why} (rank {self.comm.rank}, step {step})", flush=True)
        if failed:
            raise SaveError(why or f"another rank could not write step {step}")

    def verify(self, step: int) -> None:
        """Phase 0 (every rank): the copies of every tied weight, and their optimizer state, are bit-equal on
        every rank holding one (else a checkpoint would keep one of two diverged copies): SHA-256s gathered.
        Nothing when the plan ties nothing (every rank reads the same plan: all skip alike)."""
        if not self.plan.tied:
            return
        # a sharded optimizer's state of a tied weight (a shape here): the gathered full state (kept for write)
        self._fresh = (step, self._gathered())
        values = dict(self.tied_values, **{n: v for n, v in self._fresh[1].items() if n in self.tied_values})
        mine = {name: [tied_digest(values[n]) for n in names if n in values] for name, names in self.tied.items()}
        seen: Dict[str, Tuple[int, list]] = {}
        for rank, theirs in enumerate(self.comm.all_gather_object(mine)):
            for name, digests in theirs.items():
                if name in seen and seen[name][1] != digests:
                    raise CheckpointError(f"tied weight {name}: the copies on ranks {seen[name][0]} and {rank} differ "
                                          "(value or optimizer state); not saved")
                seen.setdefault(name, (rank, digests))

    def _gathered(self) -> dict:
        """A sharded optimizer's state under the global names, full shape (a collective: every rank calls it)."""
        return self.opt.before_save() if hasattr(self.opt, "before_save") else {}

    def begin(self, step: int) -> None:
        """Phase 1 (rank 0): a fresh step directory (an old one's marker removed first)."""
        d = step_dir(self.save_dir, step)
        if self.comm.rank == 0:
            if os.path.exists(os.path.join(d, MARKER)):
                os.remove(os.path.join(d, MARKER))
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)

    def write(self, step: int) -> None:
        """Phase 2 (every writing rank): its file, and its size and SHA-256 beside it (the ranks hash in
        parallel, each its own file) for rank 0 to gather."""
        d = step_dir(self.save_dir, step)
        # a sharded optimizer's state under the global names, gathered now (every rank calls write), or by verify
        kept = getattr(self, "_fresh", None)
        fresh = kept[1] if kept is not None and kept[0] == step else self._gathered()
        self._fresh = None
        if self.items and self.sharded:   # every rank of the tensor-parallel group, in name order
            from .tensor_group import gather_whole
            fresh = gather_whole(self.comm, {n: fresh.get(n, p) for n, p in self.items.items()}, self.sharded)
        if self.writes:
            name = rank_file(self.comm.rank, self.fmt)
            tmp = os.path.join(d, f".tmp_{name}")
            if self.fault and self.fault == (step, "enospc"):   # a full disk, simulated
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
            ms.save_checkpoint([{"name": n, "data": fresh.get(n, p)} for n, p in self.items.items()], tmp,
                               format=self.fmt)
            if self.fault and self.fault[0] == step and self.fault[1] != "enospc":
                self._die(step)
            write_json(os.path.join(d, f".digest_{name}.json"), file_record(tmp, self.digests))
            os.replace(tmp, os.path.join(d, name))
        if self.comm.rank == 0:
            for name, text in self.extra_files.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)

    def finish(self, step: int) -> None:
        """Phase 3 (rank 0, every file written): ``meta.json`` with every file's record (the weight files'
        from their ranks, the others' such as ``config.json`` made here), then the marker with the SHA-256
        of ``meta.json`` (:func:`~.ckpt_files.seal_step`)."""
        if self.comm.rank != 0:
            return
        d = step_dir(self.save_dir, step)
        records = {}
        for name in self.files:
            side = os.path.join(d, f".digest_{name}.json")
            with open(side) as f:
                records[name] = json.load(f)
            os.remove(side)
        scale = {"loss_scale": self.loss_scale.state()} if self.loss_scale is not None and self.loss_scale.on else {}
        seal_step(d, dict(self.meta, step=step, **scale,
                          data_position={"next_step": step, "micro_batch": 0,
                                         "micro_batches_per_step": self.plan.num_micro * self.plan.data_parallel,
                                         **self.source.position(step)}), records, self.digests)

    def _die(self, step: int) -> None:
        if self.fault[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        print(f"fault injection: rank {self.comm.rank} exits while saving step {step}", flush=True)
        os._exit(13)


def tied_digest(p) -> str:
    """SHA-256 of a parameter's (or optimizer state's) bytes: copies of a tied weight are compared by it."""
    return hashlib.sha256(p.asnumpy().tobytes()).hexdigest()


def _same(name: str) -> str:
    return name


def _index(src: Source, rename=_same) -> Tuple[Dict[str, Tuple[int, ...]], Dict[str, str], Dict[str, object]]:
    """({model name: shape}, {model name: file}, values already read) of the source's files; ``rename``
    maps a name in a file to the model's (e.g. a Hugging Face hub spelling)."""
    shapes, where, values = {}, {}, {}
    for f in src.files:
        if f.endswith(".safetensors"):
            names = {rename(n): s for n, (_, s) in safetensors_header(f).items()}
        else:
            try:
                got = {rename(n): v for n, v in ms.load_checkpoint(f).items()}
            except (ValueError, RuntimeError, OSError) as e:
                raise CheckpointError(f"{f}: corrupt checkpoint file ({str(e).splitlines()[0][:120]})") from None
            values.update(got)
            names = {n: tuple(v.shape) for n, v in got.items()}
        for n, s in names.items():
            shapes.setdefault(n, s)
            where.setdefault(n, f)
    return shapes, where, values


def _load_file(f: str, names=None) -> Dict[str, object]:
    """The tensors of one checkpoint file (only ``names`` when given)."""
    fmt = "safetensors" if f.endswith(".safetensors") else "ckpt"
    if names is None:
        return ms.load_checkpoint(f, format=fmt)
    return ms.load_checkpoint(f, format=fmt, choice_func=lambda n: n in names)


def check_one_value(src: Source) -> None:
    """A name in two of the step's files must hold one value in both (a tied weight saved by two ranks, as
    checkpoints written before tied weights were handled were): else CheckpointError naming it, since keeping
    either copy silently would pick one of two diverged weights."""
    import numpy as np
    if len(src.files) < 2:
        return
    seen: Dict[str, str] = {}
    twice = set()
    for f in src.files:
        names = set(safetensors_header(f)) if f.endswith(".safetensors") else set(_load_file(f))
        twice |= names & set(seen)
        for n in names:
            seen.setdefault(n, f)
    if not twice:
        return
    first: Dict[str, object] = {}
    for f in src.files:
        for n, v in _load_file(f, twice).items():
            if n in first and not np.array_equal(first[n][1].asnumpy(), v.asnumpy()):
                raise CheckpointError(f"{src.path}: {n} is in {os.path.basename(first[n][0])} and "
                                      f"{os.path.basename(f)} with different values (the two copies of a tied "
                                      "weight trained apart); no single value to keep")
            first.setdefault(n, (f, v))


def restore(src: Source, comm, chunks, opt, rename=_same, sharded: Optional[Dict[str, int]] = None) -> Tuple[int, bool]:
    """Load ``src`` into this rank's chunks (and optimizer state when the checkpoint has it), names
    mapped by ``rename`` (the model adapter's ``checkpoint_name``); ``sharded``: {parameter name: axis} split
    over the tensor-parallel group (the file's whole tensor is sliced).

    Returns (step to continue from, optimizer state loaded). Every rank reaches the same
    verdict (names gathered from all ranks), so a refused checkpoint stops all ranks alike.
    """
    from .tensor_group import my_slice, whole_shape, with_state
    check_one_value(src)
    shapes, where, values = _index(src, rename)
    T, t = int(getattr(comm, "T", 1)), int(getattr(comm, "tp_index", 0))
    split = with_state(sharded or {}, opt.state_groups()[0]) if T > 1 else {}

    def whole(n, shape):   # the shape in a file of a tensor this rank holds a slice of
        return whole_shape(shape, split[n], T) if n in split else tuple(shape)
    params = {p.name: whole(p.name, p.shape) for cell in chunks.values() for p in trained(cell.get_parameters())}
    state = {n: whole(n, p.shape) for n, p in opt.state().items()}
    gathered = comm.all_gather_object((params, state))
    all_params, all_state = {}, {}
    for p, s in gathered:
        all_params.update(p)
        all_state.update(s)
    problems, load_state = check_names(shapes, all_params, all_state, HYPER_PARAMS)
    if problems:
        raise CheckpointError(f"{src.path} does not fit this model: " + "; ".join(problems))
    need = set(params) | ({n for n in state if n not in HYPER_PARAMS} if load_state else set())
    for f in sorted({where[n] for n in need} - {None}):
        if f.endswith(".safetensors"):
            got = ms.load_checkpoint(f, format="safetensors",
                                     choice_func=lambda n, f=f: rename(n) in need and where[rename(n)] == f)
            values.update({rename(n): v for n, v in got.items()})
    values = {n: (ms.Parameter(my_slice(v, split[n], T, t), name=n) if n in split else v) for n, v in values.items()}
    for cell in chunks.values():  # every name of the cell is given; in place (compiled chunks read the buffers)
        for p in trained(cell.get_parameters()):
            write_param(p, values[p.name])
    if load_state and hasattr(opt, "load_state"):   # a sharded optimizer: its share of the global names
        opt.load_state({n: values[n] for n in need})
    elif load_state and opt.opt is not None:  # strict: hyper-parameters stay the recipe's
        load_optimizer_state(opt.opt, {n: values[n] for n in need})
    return (src.step if src.meta else 0), load_state


def restore_with_data(src: Source, comm, chunks, opt, data, rename=_same,
                      sharded: Optional[Dict[str, int]] = None) -> Tuple[int, bool]:
    """:func:`restore`, then the data source ``data`` continues at the checkpoint's saved data position
    (``data.seek``). Returns (step to continue from, optimizer state loaded); CheckpointError if the
    checkpoint does not fit this model or its data position this data set."""
    step, with_state = restore(src, comm, chunks, opt, rename, sharded)
    pos = dict((src.meta or {}).get("data_position") or {})
    for k in ("next_step", "micro_batch", "micro_batches_per_step"):
        pos.pop(k, None)
    if pos:
        try:
            data.seek(pos, step)
        except (KeyError, ValueError) as e:
            raise CheckpointError(f"{src.path}: data position {pos}: {str(e).splitlines()[0]}") from None
    return step, with_state


#: the resume scalars MindFormers' ``load_resume_context_from_checkpoint`` reads from a checkpoint
MINDFORMERS_RESUME_KEYS = ("step_num", "epoch_num", "loss_scale")


def mindformers_resume_values(src: Source) -> dict:
    """``step_num`` (the steps done), ``loss_scale`` (the loss scale then, ``meta.json``'s; 1: no loss scaling) and, where the data position is
    saved, ``epoch_num`` (the 1-based epoch of the last step done, as MindFormers' CheckpointMonitor saves
    it: its resume subtracts one when the step is inside an epoch), as int64/float32 scalar Parameters."""
    scale = float(((src.meta or {}).get("loss_scale") or {}).get("loss_scale", 1.0))   # the run's loss scale then
    values = {"step_num": ms.Tensor(int(src.step), ms.int64), "loss_scale": ms.Tensor(scale, ms.float32)}
    pos = (src.meta or {}).get("data_position") or {}
    if "epoch" in pos and "index" in pos:
        values["epoch_num"] = ms.Tensor(int(pos["epoch"]) + (1 if int(pos["index"]) else 0), ms.int64)
    # save_checkpoint writes a dict's Parameters only (bare Tensors are dropped)
    return {n: ms.Parameter(v, name=n, requires_grad=False) for n, v in values.items()}


def merge(src: Source, out: str, with_state: bool = False) -> int:
    """Write the step's files as one MindSpore checkpoint file (format from ``out``'s extension):
    the parameters, and the optimizer state too with ``with_state`` (with MindFormers' resume scalars,
    :func:`mindformers_resume_values`); written whole (a hidden file beside
    ``out``, renamed over it: a failed write leaves ``out`` as it was). Returns the number of names."""
    from .ckpt_files import optimizer_state_names
    check_one_value(src)
    params = {}
    for f in src.files:
        params.update(ms.load_checkpoint(f, format="safetensors" if f.endswith(".safetensors") else "ckpt"))
    if not with_state:
        for n in optimizer_state_names(params):
            params.pop(n)
    else:
        params.update(mindformers_resume_values(src))
    fmt = "safetensors" if out.endswith(".safetensors") else "ckpt"
    folder, name = os.path.split(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".tmp_{os.getpid()}_{name}")   # the file whole, then renamed over OUT
    try:
        ms.save_checkpoint(params, tmp, format=fmt)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return len(params)


def export_hf(src: Source, out: str, say=print, merge_lora: bool = False) -> int:
    """Write a step's parameters as a Hugging Face model directory (``save_pretrained``: config.json +
    model.safetensors with the hub's names) that ``from_pretrained`` loads; the step directory must carry
    the model's ``config.json`` (runs of Hugging Face models write it). ``out`` may hold other files (the
    command refuses that without ``--force``): the previous weights there are replaced
    (:func:`~hyperparallel.models.hf_dir.install`), the rest kept. The processor files (tokenizer, chat
    template, preprocessor configs) come too when ``meta.json`` records the run's tokenizer
    (the adapter's ``write_processor``; Qwen-VL: :mod:`~hyperparallel.models.qwen_vl.processor`); ``say`` tells
    which, or why none. A run with ``model.lora`` (its
    step carries ``lora.json``) writes PEFT's adapter directory (``adapter_model.safetensors`` +
    ``adapter_config.json``, ``base_model_name_or_path`` its ``model.pretrained``), or with ``merge_lora`` the
    merged whole model (PEFT's ``merge_and_unload``). Returns the number of tensors read from the step."""
    from hyperparallel.models import adapter_for
    cfg_path = os.path.join(src.path, "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"{src.path}: no config.json (only checkpoints of Hugging Face models, e.g. "
                              "mindone's Qwen2.5-VL / Qwen3-VL, export to a Hugging Face directory)")
    with open(cfg_path) as f:
        cfg = json.load(f)
    arch = (cfg.get("architectures") or [None])[0]
    section, seed = {"arch": {"type": arch}, "config": cfg_path}, 0
    lora = _lora_record(src)
    if merge_lora and lora is None:
        raise CheckpointError(f"{src.path}: --merge-lora: this checkpoint has no LoRA adapters (no lora.json: the "
                              "run had no model.lora)")
    if lora is not None:   # the base as the run built it (model.pretrained, else the seed's), then the adapters
        section.update(lora=lora["lora"], **({"pretrained": lora["pretrained"]} if lora.get("pretrained") else {}))
        seed = int(lora.get("seed", 0))
    try:
        adapter = adapter_for(section, {}, seed)
    except ValueError as e:   # SpecError: e.g. model.pretrained moved away since the run
        raise CheckpointError(f"{src.path}: {e}") from None
    net = adapter.network()
    check_one_value(src)
    values = {}
    for f in src.files:
        values.update(ms.load_checkpoint(f, format="safetensors" if f.endswith(".safetensors") else "ckpt"))
    names = [p.name for p in trained(net.get_parameters())]   # LoRA: the adapters (the base is model.pretrained's)
    missing = [n for n in names if n not in values]
    if missing:
        raise CheckpointError(f"{src.path}: parameters missing: {', '.join(missing[:4])} ({len(missing)} in all)")
    ms.load_param_into_net(net, {n: values[n] for n in names}, strict_load=True)
    if lora is not None and merge_lora:   # PEFT's merge: every adapter folded into its base weight
        net = adapter.peft.merge_and_unload()
    elif lora is not None:   # PEFT's adapter directory: adapter_model.safetensors + adapter_config.json
        net = adapter.peft
        net.peft_config["default"].base_model_name_or_path = os.path.abspath(lora["pretrained"]) \
            if lora.get("pretrained") else None
    from hyperparallel.models import hf_dir
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", suffix=".tmp", dir=parent)
    try:   # written whole beside OUT first: save_pretrained's clean-up sees no file of the user's
        net.save_pretrained(tmp)
        _write_processor(adapter, src, cfg, tmp, say)
        hf_dir.install(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(names)


def _lora_record(src: Source) -> Optional[dict]:
    """The step's ``lora.json`` (written by runs with ``model.lora``: the section, ``model.pretrained``, the
    seed), or None."""
    path = os.path.join(src.path, "lora.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write_processor(adapter, src: Source, cfg: dict, tmp: str, say) -> None:
    """The processor files of the step's recorded tokenizer into the export's folder ``tmp``, written by the
    model's adapter (``ModelAdapter.write_processor``); ``say`` names them, or says why none were written
    (the directory then lacks what ``AutoProcessor`` reads)."""
    try:
        names, why = adapter.write_processor((src.meta or {}).get("processor"), cfg, tmp)
    except (ImportError, OSError, ValueError, TypeError, KeyError) as e:   # e.g. a tokenizer file transformers refuses
        names, why = [], f"writing them failed: {os_error_text(e)}"
    if names:
        say(f"processor: wrote {', '.join(names)} (tokenizer {src.meta['processor']['tokenizer']})")
    else:
        say(f"processor files not written: {why}; AutoProcessor.from_pretrained will not load the export "
            "(save the recipe's tokenizer and image processor into it yourself)")
