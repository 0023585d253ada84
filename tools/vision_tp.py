"""What splitting the vision blocks over the tensor-parallel group too would change: the cost model's answer.

    python tools/vision_tp.py RECIPE[|KEY=VALUE,...] ...

Per recipe (``|`` then comma-separated ``--set`` overrides, e.g. ``recipes/qwen2_5_vl_7b.yaml|parallel_config.
model_parallel=2``): its plan under its own T (``parallel_config.model_parallel``), simulated twice by
``hyperparallel.mpipe.cost.simulate``: as the runtime runs it (the language model split over T, the vision
encoder whole on every rank of the group) and with the vision region split over T as well
(``meta["tensor_parallel_regions"]``: 1/T of its parameters and compute, 4 all-reduces per block, the
Korthikanti activation split). Printed as a Markdown table: the vision encoder's bytes on the device with
the largest peak (parameters + grads + optimizer state; a frozen encoder has parameters only), their share
of that peak, the largest peak and the step time both ways. A prediction from the recipe's profile (the
7B / 72B recipes' costs are estimated from the model config; ``qwen2_5_vl_bench`` carries a measured one).
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def row(spec: str) -> str:
    from hyperparallel.mpipe.cost import simulate, static_memory
    from hyperparallel.recipe import checked_plan, steady_steps
    from hyperparallel.runconfig import load_parsed
    path, _, sets = spec.partition("|")
    recipe = load_parsed(os.path.join(ROOT, path) if not os.path.isabs(path) else path,
                         [s for s in sets.split(",") if s])
    plan = checked_plan(recipe)
    T = plan.tensor_parallel
    steps = steady_steps([plan])
    kept = simulate(plan, recipe.profile, steps=steps)
    both = replace(plan, meta=dict(plan.meta, tensor_parallel_regions=list(plan.regions())))
    split = simulate(both, recipe.profile, steps=steps)
    d = max(kept.devices, key=lambda x: (x.peak_memory_mb, -x.device))
    vision = plan.regions()[0]
    prof = recipe.profile
    only = replace(plan, chunks=[c for c in plan.chunks if c.region == vision])   # its chunks alone
    mb = sum(static_memory(only, lambda r, c: prof.region(r).param_mb * next(
        x.layers for x in plan.chunks if (x.region, x.index) == (r, c)), prof.optimizer_factor)[d.device])
    d2 = split.devices[d.device]
    gb = lambda x: x / 1024.0  # noqa: E731
    trained = "trained" if plan.trainable.get(vision, True) else "frozen"
    label = os.path.basename(path) + (f" ({sets})" if sets else "")
    return (f"| `{label}` | {T} | {trained} | {gb(mb):.2f} | {mb / d.peak_memory_mb * 100:.1f}% | "
            f"{gb(d.peak_memory_mb):.2f} | {gb(d2.peak_memory_mb):.2f} | {kept.step_ms:.0f} | {split.step_ms:.0f} |")


def main(argv=None) -> int:
    specs = list(sys.argv[1:] if argv is None else argv)
    if not specs:
        print(__doc__, file=sys.stderr)
        return 2
    print("| recipe | T | vision | vision's bytes on the largest-peak device (GB) | share of its peak | "
          "largest peak, vision whole (GB) | vision split too (GB) | step, vision whole (ms) | split too (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in specs:
        print(row(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
