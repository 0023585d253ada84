"""How a recipe's encoder time grows with the images of a micro-batch: fixed part and per-image part.

    python tools/encoder_scaling.py recipes/bench_skewed.yaml [--images 1 2 4 8 16 24] [--repeats 12]
        [--out docs/encoder_scaling_bench_skewed.json]

Builds the recipe's whole encoder (its first region, every layer, through the model adapter), pinned
to one core as an msrun rank is, and times forward plus backward under the runtime's tape for
micro-batches of N images (median of ``--repeats`` after two warm-ups). A least-squares line gives
``fixed_ms + per_image_ms x N``; ``fixed_share`` is the fixed part's share of the time at the data
set's mean images per micro-batch (its mean patches per sample x the micro-batch size), the value
a profile region's ``fixed_share`` takes for ``simulate --data-steps``. ViT-style encoders (tiny MLLM,
MindFormers Llama recipes); other model types are refused naming ``model.type``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def measure(recipe_path: str, images, repeats: int, overrides=()) -> dict:
    import numpy as np
    from hyperparallel.runtime import compat
    from hyperparallel.errors import SpecError
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.util import median
    recipe = load_parsed(recipe_path, list(overrides))
    rc = recipe.run
    vit = getattr(rc.model, "vit", None)
    if vit is None:
        raise SpecError("model.type", f"{type(rc.model).__name__} has no ViT-style encoder to time here "
                                      "(tiny_mllm and MindFormers Llama recipes have)")
    compat.setup_device(rc.device)
    import mindspore as ms
    from mindspore import ops
    region = rc.model.regions()[0]
    chunk = rc.model.build_chunk(region.name, 0, region.layers)
    params = chunk.trainable_params()
    rng = np.random.default_rng(0)
    points = []
    for n in images:
        x = ms.Tensor(rng.standard_normal((n, vit.num_patches, vit.patch_dim)).astype(np.float32))
        times = []
        for i in range(repeats + 2):
            t0 = time.perf_counter()
            out = compat.Tape.forward(chunk.forward, x)
            grads = compat.Tape.grad([out], [ops.ones_like(out)], params, False)
            grads[0].asnumpy()
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        points.append({"images": n, "median_ms": median(times), "min_ms": min(times), "max_ms": max(times)})
    xs = np.array([p["images"] for p in points], float)
    ys = np.array([p["median_ms"] for p in points], float)
    per_image, fixed = (float(v) for v in np.polyfit(xs, ys, 1))
    source = rc.source()
    try:
        per_micro = source.mean_patches() * rc.data.micro_batch_size / vit.num_patches
    finally:
        source.close()
    mean_ms = fixed + per_image * per_micro
    return {"recipe": os.path.relpath(os.path.abspath(recipe_path), ROOT), "overrides": list(overrides),
            "region": region.name, "layers": region.layers, "points": points, "fixed_ms": fixed,
            "per_image_ms": per_image, "mean_images_per_micro_batch": per_micro,
            "fixed_share": max(0.0, min(1.0, fixed / mean_ms)) if mean_ms > 0 else 0.0,
            "pinned_core": sorted(os.sched_getaffinity(0)), "repeats": repeats,
            "command": "python tools/encoder_scaling.py " + " ".join(sys.argv[1:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--images", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args(argv)
    if len(set(args.images)) < 2 or min(args.images) < 1:
        print("error: --images: give at least two different counts >= 1", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print(f"error: --repeats: must be >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # one core, as msrun binds a rank
    from hyperparallel.errors import SpecError
    try:
        res = measure(args.recipe, args.images, args.repeats, args.overrides)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in res["points"]:
        print(f"{p['images']:3d} images: forward + backward {p['median_ms']:7.1f} ms "
              f"(min {p['min_ms']:.1f}, max {p['max_ms']:.1f})")
    print(f"{res['region']}: {res['fixed_ms']:.1f} ms fixed + {res['per_image_ms']:.2f} ms per image; at the data's "
          f"mean {res['mean_images_per_micro_batch']:.2f} images per micro-batch the fixed share is "
          f"{res['fixed_share']:.2f}")
    if args.out:
        from tune_paper import write_json   # the tools' one JSON writer
        write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
