"""What the tests share: the checkout's paths, the CLI in process (:func:`run_main`) and as a subprocess
(:func:`run_cli`), and small builders. Fixtures and process set-up stay in ``conftest.py``."""
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from typing import NamedTuple

from hyperparallel.mpipe import parse_profile
from hyperparallel.testing import job_case  # noqa: F401  (the tests import it from here)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "recipes")


def recipe(name: str) -> str:
    """The path of ``recipes/NAME``."""
    return os.path.join(RECIPES, name)


def run_cli(*args, timeout=120, env=None):
    """Run ``python -m hyperparallel ARGS`` from the checkout; returns the CompletedProcess. For what launches
    ranks, and for the smoke tests of the command itself; a refusal (it exits before any launch) is checked in
    process with :func:`run_main`."""
    return subprocess.run([sys.executable, "-m", "hyperparallel", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


class Ran(NamedTuple):
    """What :func:`run_main` returns: the fields a test reads of a CompletedProcess."""
    returncode: int
    stdout: str
    stderr: str


def _exit_code(e: SystemExit, err) -> int:
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=err)   # sys.exit("message"): printed, status 1, as the interpreter does
    return 1


def _handlers():
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [h for lg in loggers for h in lg.handlers if isinstance(h, logging.StreamHandler)]


def run_main(*args, env=None, cwd=ROOT) -> Ran:
    """``hyperparallel ARGS`` in this process (``hyperparallel.cli.main``), from ``cwd`` (the checkout, as
    :func:`run_cli`), with ``env`` added to the environment; returns (returncode, stdout, stderr).

    Only for commands that launch nothing (a refusal, plan, check, simulate, data check): the environment,
    ``sys.path``, ``sys.argv`` and the working directory are put back afterwards, and a logging handler made
    during the call is pointed back at the real stderr (it was made on the captured one)."""
    from hyperparallel import cli
    saved_env, saved_path, saved_argv, saved_cwd = dict(os.environ), list(sys.path), list(sys.argv), os.getcwd()
    before = set(map(id, _handlers()))
    out, err = io.StringIO(), io.StringIO()
    try:
        os.chdir(cwd)
        os.environ.update(env or {})
        sys.argv = ["hyperparallel", *map(str, args)]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main([str(a) for a in args])
            except SystemExit as e:   # argparse's usage errors and --help
                rc = _exit_code(e, err)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        sys.argv = saved_argv
        for h in _handlers():
            if id(h) not in before and h.stream in (out, err):
                h.setStream(sys.stderr)
    return Ran(rc, out.getvalue(), err.getvalue())


def profile(*regions, link=None):
    """regions: (name, layers, trainable[, forward_ms, backward_ms, weight_ms])."""
    out = []
    for r in regions:
        name, layers, trainable = r[:3]
        f, b, w = (list(r[3:]) + [1.0, 1.0, 1.0][len(r[3:]):])[:3]
        out.append({"name": name, "layers": layers, "trainable": trainable, "forward_ms": f, "backward_ms": b,
                    "weight_ms": w, "activation_mb": 1.0, "output_mb": 1.0, "param_mb": 1.0})
    obj = {"regions": out}
    if link:
        obj["link"] = link
    return parse_profile(obj)


def mllm(trained_encoder: bool, enc_layers: int = 2, llm_layers: int = 8, enc_ms: float = 3.0):
    return profile(("vision", enc_layers, trained_encoder, enc_ms, enc_ms, enc_ms), ("llm", llm_layers, True))


def dumped(dump_dir: str, grads_of: str = "first"):
    """What a worker case with ``dump_dir`` wrote: (losses.json as a dict, {param name: [grad of every rank
    holding it]} of the case's first step, or with ``grads_of="last"`` of its last step)."""
    import json
    import os

    import numpy as np
    with open(os.path.join(dump_dir, "losses.json")) as f:
        got = json.load(f)
    prefix = "grads_rank" if grads_of == "first" else "grads_last_rank"
    grads = {}
    for fn in sorted(os.listdir(dump_dir)):
        if fn.startswith(prefix):
            for k, v in np.load(os.path.join(dump_dir, fn)).items():
                grads.setdefault(k, []).append(v)
    return got, grads


def reference_run(recipe, steps: int):
    """(per-step losses, first step's grads by name, [every step's grads by name]) of the single-process
    reference of a loaded recipe."""
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import RunConfig
    from hyperparallel.runtime.reference import Reference
    compat.setup_device("CPU")
    ref = Reference(RunConfig.from_raw(recipe.raw), recipe.micro_batch_num * recipe.data_parallel,
                    {r.name: r.trainable for r in recipe.profile.regions})
    losses, per_step = [], []
    for s in range(steps):
        loss, g = ref.step(s)
        losses.append(loss)
        per_step.append(g)
    return losses, per_step[0], per_step


# -- msrun job cases (the worker's job file), shared by the equivalence and checkpoint suites ------

def case_name(text: str) -> str:
    """A case name (a dump folder) from a schedule spelling and its settings. Long settings (data paths
    under pytest's temporary folder) are cut to 80 characters plus a hash of the whole text, so the
    folder name stays far below the file systems' 255-byte limit and distinct cases stay distinct."""
    import hashlib
    import re
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    if len(name) <= 96:
        return name
    return name[:80].rstrip("_") + "_" + hashlib.sha1(text.encode()).hexdigest()[:12]


def launch_cases(tmp: str, cases, world: int, timeout: float = 400):
    """Run the cases in one msrun launch of ``world`` ranks; fails the test on a non-zero exit."""
    import os
    from hyperparallel.launch import launch
    dumps = [c["dump_dir"] for c in cases if c.get("dump_dir")]
    assert len(set(dumps)) == len(dumps), f"two cases share a dump folder: {sorted(d for d in dumps if dumps.count(d) > 1)}"
    res = launch({"cases": list(cases), "device": "CPU"}, world, os.path.join(tmp, "log"), timeout_s=timeout,
                 echo=False)
    assert res.returncode == 0, res.message + "\n" + "\n".join(res.lines[-30:])
    return res


#: the last step's gradients follow updates of the weights: Adam divides each moment by its root, so the
#: float32 rounding of two summation orders (pipeline vs one process) in the first step's gradients comes
#: back larger. Measured over the equivalence suites after 2-11 updates: up to 2.5e-5 of a gradient's
#: scale; a wrong gradient (a missed micro-batch, an unsummed copy) is off by whole parts of itself.
LAST_STEP_TOL = 1e-4


def _assert_grads(name: str, grads: dict, want_by_name: dict, when: str, tol: float = 1e-5) -> None:
    import numpy as np
    assert set(grads) == set(want_by_name), f"{name}: {when} grads held {sorted(set(grads) ^ set(want_by_name))[:5]}"
    for pname, got_list in grads.items():
        want = want_by_name[pname]
        scale = max(float(np.abs(want).max()), 1e-12)
        assert np.abs(want).max() > 0, f"{name}: {when} grad {pname} is zero in the reference"
        for g in got_list:   # every rank holding this parameter (replicas, data-parallel peers) agrees
            np.testing.assert_allclose(g, want, rtol=tol, atol=tol * scale, err_msg=f"{name}: {when} grad {pname}")


def assert_equivalent(case: dict, ref_losses, ref_grads, ref_step_grads=None) -> dict:
    """The case ran exactly the steps it asked for, from step 0, and they equal the reference's first
    steps: every loss (1e-5 relative), and every rank's gradient of every parameter at the first step and,
    for a case of more than one step, at its last step (:data:`LAST_STEP_TOL` of its scale; ``ref_step_grads``: the
    reference's gradients of every step, as :func:`reference_run` returns them); the same parameters are
    trained, and none has a zero gradient. Returns the first step's dumped gradients."""
    import numpy as np
    got, grads = dumped(case["dump_dir"])
    name, steps = case["name"], case["steps"]
    assert got.get("start", 0) == 0, f"{name}: resumed at step {got['start']}; compare it with a reference of its steps"
    assert len(got["losses"]) == steps, f"{name}: {len(got['losses'])} losses dumped, {steps} steps asked for"
    assert len(ref_losses) >= steps, f"{name}: the reference ran {len(ref_losses)} steps, the case {steps}"
    np.testing.assert_allclose(got["losses"], ref_losses[:steps], rtol=1e-5, err_msg=f"{name}: losses")
    _assert_grads(name, grads, ref_grads, "first-step")
    if steps > 1:
        assert ref_step_grads is not None, f"{name}: {steps} steps: give the reference's gradients of every step"
        _, last = dumped(case["dump_dir"], grads_of="last")
        assert last, f"{name}: no last-step gradients dumped"
        _assert_grads(name, last, ref_step_grads[steps - 1], f"step-{steps}", LAST_STEP_TOL)
    return grads


# -- per-rank memory: the cost model's prediction against what the ranks measured (issue 23) -------

_CHUNK_BYTES = {}


def _chunk_params(raw: dict, plan) -> dict:
    """{(region, chunk): (bytes of its parameters, {weight decay: bytes of its trained parameters in that
    weight-decay group})} of a plan's chunks, built here by the recipe's model adapter; the groups are the
    run's optimizer's (hyperparallel.runtime.optim.decay_groups: None for the train: section's one group)."""
    import json as _json
    from hyperparallel.runconfig import RunConfig
    key = _json.dumps([raw.get("model"), raw.get("optimizer"), raw.get("train")], sort_keys=True, default=str)
    out = {}
    for c in plan.chunks:
        k = (key, c.region, c.start, c.stop)
        if k not in _CHUNK_BYTES:
            from hyperparallel.models.lora import trained
            from hyperparallel.runtime import compat
            from hyperparallel.runtime.optim import decay_groups
            compat.setup_device("CPU")
            rc = RunConfig.from_raw(raw)
            params = list(rc.model.build_chunk(c.region, c.start, c.stop).get_parameters())
            groups = {}
            for wd, ps in decay_groups(trained(params), rc.train):
                groups[wd] = groups.get(wd, 0) + sum(int(p.nbytes) for p in ps)
            _CHUNK_BYTES[k] = (sum(int(p.nbytes) for p in params), groups)
        out[(c.region, c.index)] = _CHUNK_BYTES[k]
    return out


def chunk_param_bytes(raw: dict, plan) -> dict:
    """{(region, chunk): bytes of its parameters} of a plan's chunks, built here by the recipe's model adapter."""
    return {k: v[0] for k, v in _chunk_params(raw, plan).items()}


def chunk_param_groups(raw: dict, plan) -> dict:
    """{(region, chunk): {weight decay: bytes}}: a chunk's trained parameters by the run's weight-decay group
    (what the runtime's ZeRO / sharded flat shares lay out per region and group)."""
    return {k: v[1] for k, v in _chunk_params(raw, plan).items()}


def measured_memory(dump_dir: str) -> dict:
    """{rank: [memory record of every step]} a worker case dumped."""
    import json
    import os
    out = {}
    for fn in sorted(os.listdir(dump_dir)):
        if fn.startswith("memory_rank"):
            with open(os.path.join(dump_dir, fn)) as f:
                out[int(fn[len("memory_rank"):-len(".json")])] = json.load(f)
    return out


def boundary_bytes(raw: dict, plan, dp_index: int, step: int):
    """(held, kept) byte sizes of the plan's tasks for one data-parallel replica and step, keyed as
    :func:`hyperparallel.mpipe.cost.activation_events` asks (step, region, chunk, micro): a held forward keeps
    its input and output, a recomputed chunk's forward its input; sizes from the recipe's model adapter (the
    boundary specs of the step's micro-batches, the model input built from them, a float32 loss)."""
    from hyperparallel.runconfig import RunConfig
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.memory import nbytes
    compat.setup_device("CPU")
    rc = RunConfig.from_raw(raw)
    model, src = rc.model, rc.source()
    regions = plan.regions()
    chunks = {(c.region, c.index): c for c in plan.chunks}
    last = (regions[-1], max(c.index for c in plan.chunks if c.region == regions[-1]))
    out_b, in_b = {}, {}
    try:
        for m in range(plan.num_micro):
            mb = src.micro_batch(step, dp_index * plan.num_micro + m)
            for (r, i), c in chunks.items():
                out_b[(r, i, m)] = 4 if (r, i) == last else model.boundary(r, c.stop, mb).nbytes
            first = model.model_input(model.tensors(mb, 1.0))
            for (r, i), c in chunks.items():
                prev = (r, i - 1) if i else ((regions[regions.index(r) - 1],
                                              max(x.index for x in plan.chunks if x.region == regions[regions.index(r) - 1]))
                                             if regions.index(r) else None)
                in_b[(r, i, m)] = nbytes(first) if prev is None else out_b[prev + (m,)]
    finally:
        src.close()
    return (lambda k: in_b[k[1:]] + out_b[k[1:]]), (lambda k: in_b[k[1:]])


def chunk_split_bytes(raw: dict, plan) -> dict:
    """{(region, chunk): ((bytes, slices[, rows]), ...)} of a plan's chunks under its T: the whole bytes of the
    chunk's weights that the model adapter splits over the T ranks (``tensor_parallel_split``), by their slice
    count (T, or the key/value heads' count when T exceeds it; with the rows of a padded vocabulary), as
    ``static_memory``'s ``split`` reads them."""
    import json as _json
    from hyperparallel.runconfig import RunConfig
    from hyperparallel.runtime.tensor_group import length_of, split_of
    T = plan.tensor_parallel
    rc = RunConfig.from_raw(raw)
    spec = rc.model.tensor_parallel_split(T)
    key = _json.dumps(raw.get("model"), sort_keys=True, default=str)
    out = {}
    for c in plan.chunks:
        k = ("split", T, key, c.region, c.start, c.stop)
        if k not in _CHUNK_BYTES:
            from hyperparallel.runtime import compat
            compat.setup_device("CPU")
            parts = {}
            for p in rc.model.build_chunk(c.region, c.start, c.stop).get_parameters():
                if p.name in spec:   # by (slices,) or, a padded vocabulary, (slices, rows)
                    n = split_of(spec[p.name], T)[1]
                    rows = length_of(spec[p.name])
                    key_n = (n,) if rows is None else (n, rows)
                    parts[key_n] = parts.get(key_n, 0) + int(p.nbytes)
            _CHUNK_BYTES[k] = tuple(sorted(parts.items()))
        out[(c.region, c.index)] = tuple((b,) + n for n, b in _CHUNK_BYTES[k])
    return out


def assert_memory_predicted(case: dict, recipe) -> None:
    """On every rank and step of the case: the measured peak held forwards (per region and in all) equal the
    cost model's for the rank's device, and its parameter, grad and optimizer bytes equal
    ``static_memory`` over the chunks' real parameter bytes (``recipe``: the case's, loaded; under T, each
    rank's share of them: :func:`chunk_split_bytes`). Without next-step spill, the measured peak held bytes
    equal the cost model's held-activation peak over the step's boundary tensors (:func:`boundary_bytes`;
    recomputed chunks' kept inputs included; under T whole on every rank of the group)."""
    from hyperparallel.mpipe.cost import (activation_events, grad_peak, peak_of, share_bytes, simulate, static_memory,
                                          zero_level)
    from hyperparallel.mpipe.ir import Plan
    plan = Plan.from_json(case["plan"])
    spill = any(a.step for p in plan.programs.values() for a in p)
    rep = simulate(plan, recipe.profile, steps=3 if spill else 1)
    size, groups = chunk_param_bytes(case["raw"], plan), chunk_param_groups(case["raw"], plan)
    T = plan.tensor_parallel
    split = chunk_split_bytes(case["raw"], plan) if T > 1 else None
    # a sharded region's share: per weight-decay group, ceil(N / P) float32 elements of its N
    # (hyperparallel.runtime.sharded), as the cost model counts it
    static = static_memory(plan, lambda r, c: size[(r, c)], recipe.profile.optimizer_factor,
                           shard=share_bytes, groups=lambda r, c: groups[(r, c)],
                           split=(lambda r, c: split[(r, c)]) if split else None)
    # ZeRO-2: the peak gradient bytes held during the step (each region's whole gradients until the plan's
    # reduce-scatter of the region, then its share)
    peak_grads = grad_peak(plan, lambda r, c: size[(r, c)], share_bytes, lambda r, c: groups[(r, c)]) \
        if zero_level(plan) == 2 and T == 1 else None
    got = measured_memory(case["dump_dir"])
    assert sorted(got) == list(range(plan.num_devices * plan.data_parallel * T)), case["name"]
    for rank, steps in got.items():
        d = rank // (plan.data_parallel * T)
        want = rep.devices[d]
        assert len(steps) == case["steps"], case["name"]
        for m in steps:
            where = f"{case['name']} rank {rank} step {m['step']}"
            assert (m["rank"], m["device"]) == (rank, d), where
            assert (m["peak_held"], m["peak_held_total"]) == (want.peak_held, want.peak_held_total), where
            assert (m["peak_held_bytes"] > 0) == (want.peak_held_total > 0), where
            if not spill:
                # the record's step counts the steps done: its micro-batches are those of step index step - 1
                held, kept = boundary_bytes(case["raw"], plan, m["dp_index"], m["step"] - 1)
                events = activation_events(plan, rep.execution, d, held, kept, lambda k: 0)
                assert m["peak_held_bytes"] == peak_of(events), where
            assert (m["params_bytes"], m["grads_bytes"], m["optimizer_bytes"]) == static[d], where
            assert peak_grads is None or m["peak_grad_bytes"] == peak_grads[d], where
            assert m["optimizer_global_bytes"] >= 0, where


def compile_stats(case: dict, ranks=(0, 1)) -> list:
    """The compile records (``compile_rank{R}.json``: each chunk body's mode and compile count) of a case's ranks."""
    out = []
    for rank in ranks:
        with open(os.path.join(case["dump_dir"], f"compile_rank{rank}.json")) as f:
            out += json.load(f)
    return out
