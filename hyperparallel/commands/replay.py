"""``hyperparallel simulate RECIPE --data-steps N``: replay the per-step encoder work of the recipe's data.

For each of the first N steps, each micro-batch's encoder work (its samples' patches from the data
index, at least the filler image's) is set against the data set's mean per micro-batch, and the cost
model executes the plan with every task of the encoder region (the first region) scaled by that
ratio; of each task only the share that grows with the work is scaled (the region's profile
``fixed_share`` stays as it is: an encoder's per-micro-batch time on CPU is mostly fixed dispatch,
``tools/encoder_scaling.py``). Each ``--schedule`` may carry its own settings (``'transpose|data.balance=encoder'``: the
step's samples grouped by :func:`hyperparallel.data.balance.assign`, as the ranks do). Prints the
median, 90th percentile, mean and maximum step time per case (``--json``: the per-step times and the
encoder's ``fixed_share`` too).
With data parallelism a step takes its slowest replica. A next-step spill's work for the following
step is scaled with this step's micro-batches (an approximation).
"""
from __future__ import annotations

import json
from typing import List

from ..errors import SpecError
from ..mpipe.table import text_table
from ..util import median, quantile


def replay_case(recipe, rc, plan, steps: int) -> List[float]:
    """Predicted step time (ms) of each of the first ``steps`` steps of ``plan`` on ``rc``'s data."""
    from ..data.balance import owner_ranks
    from ..mpipe.cost import simulate
    source = rc.source()
    if not getattr(source, "has_encoder_work", False):
        raise SpecError("--data-steps", "needs a data source with per-sample encoder work (data.type: "
                                        "conversations); the synthetic generator has none")
    try:
        if rc.data.balance == "encoder":
            source.balance_by(owner_ranks(plan))
        B, M, D = rc.data.micro_batch_size, plan.num_micro, max(1, plan.data_parallel)
        mean = source.mean_patches() * B
        enc = plan.regions()[0]
        fixed = recipe.profile.region(enc).fixed_share
        out = []
        for s in range(steps):
            worst = 0.0
            for i in range(D):
                f = [fixed + (1.0 - fixed) * source.encoder_patches(sum(source.sample_patches(x) for x in
                                                                        source.batch_samples(s, i * M + m))) / mean
                     for m in range(M)]
                rep = simulate(plan, recipe.profile, 1,
                               work=lambda a: f[a.micro] if a.region == enc and a.micro is not None else 1.0)
                worst = max(worst, rep.step_ms)
            out.append(worst)
        return out
    finally:
        source.close()


def run_replay(args) -> int:
    from ..recipe import checked_plan
    from ..recipe.cases import split_case
    from ..recipe.train import MAX_STEPS
    from ..runconfig import load_parsed
    if not 1 <= args.data_steps <= min(MAX_STEPS, 10_000):
        raise SpecError("--data-steps", f"must be 1..10,000, got {args.data_steps}")
    for flag in ("trace", "png", "steps"):
        if getattr(args, flag) is not None:
            raise SpecError("--data-steps", f"replays step by step; leave out --{flag}")
    objs = []
    for spelling in args.schedule or [None]:
        sched, sets = split_case(spelling)
        recipe = load_parsed(args.recipe, list(args.overrides) + sets)
        rc = recipe.run
        plan = checked_plan(recipe, sched)
        rc.check_plan(plan)
        times = replay_case(recipe, rc, plan, args.data_steps)
        name = plan.meta["schedule_name"] + "".join(f"|{s}" for s in sets)
        objs.append({"schedule": name, "fixed_share": recipe.profile.region(plan.regions()[0]).fixed_share,
                     "median_step_ms": round(median(times), 6),
                     "p90_step_ms": round(quantile(times, 0.9), 6), "mean_step_ms": round(sum(times) / len(times), 6),
                     "max_step_ms": round(max(times), 6), "step_ms": [round(t, 6) for t in times]})
    base = objs[0]["mean_step_ms"]
    for o in objs:
        o["speedup_mean"] = round(base / o["mean_step_ms"], 6) if o["mean_step_ms"] > 0 else None
    if args.json:
        print(json.dumps(objs, indent=1))
        return 0
    shares = sorted({o["fixed_share"] for o in objs})
    but = ("" if shares == [0.0] else f", all but the fixed share {shares[0]:g}" if len(shares) == 1
           else ", all but each case's fixed share")
    print(f"recipe {args.recipe}: {args.data_steps} steps of its data replayed (encoder tasks scaled by each "
          f"micro-batch's patches over the mean{but})")
    print(text_table(["case", "median_ms", "p90_ms", "mean_ms", "max_ms", "speedup (mean)"],
                     [[o["schedule"], f"{o['median_step_ms']:.2f}", f"{o['p90_step_ms']:.2f}",
                       f"{o['mean_step_ms']:.2f}", f"{o['max_step_ms']:.2f}", f"{o['speedup_mean']:.2f}x"]
                      for o in objs]))
    return 0
