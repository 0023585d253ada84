"""How many input shapes a conversations recipe's compiled chunks meet, without and with shape buckets.

    python tools/shape_buckets.py recipes/tiny_mllm_data.yaml [--steps 40] [--set KEY=VALUE ...] [--demo]

A compiled chunk (``mpipe.compile: jit``) compiles one graph per distinct input shape (tested:
``compiles + reused == shapes``). The shapes that vary are the encoder's (images per micro-batch)
and the first LLM chunk's (images and text ids per micro-batch); every later LLM chunk has one.
This reads the recipe's data (only the index: no pixels, no MindSpore graph) for ``--steps`` steps
under ``data.shape_buckets: none`` and ``pow2`` and prints, per setting, the distinct shapes of each
and the padding's cost: the images the encoder runs per step (fillers included) and the text ids.
``--demo`` reads the demo set instead of the recipe's ``data.path``, written to a temporary folder
first (``tools/make_demo_data.py``, deterministic; what docs/training.md's table is made from on a fresh
checkout). ``--json`` prints the numbers instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def count(recipe_path: str, steps: int, overrides=()) -> dict:
    """{setting: {"encoder_shapes", "llm_first_shapes", "images_per_step", "real_images_per_step",
    "text_ids_per_step", "real_text_ids_per_step"}} over ``steps`` steps of the recipe's data."""
    from hyperparallel.runconfig import load_parsed
    out = {}
    for setting in ("none", "pow2"):
        rc = load_parsed(recipe_path, list(overrides) + [f"data.shape_buckets={setting}"]).run
        src = rc.source()
        try:
            mbs = [src.micro_batch(s, g) for s in range(steps) for g in range(src.cfg.micro_per_step)]
        finally:
            src.close()
        out[setting] = {"encoder_shapes": len({mb.num_images for mb in mbs}),
                        "llm_first_shapes": len({(mb.num_images, len(mb.text_ids)) for mb in mbs}),
                        "images_per_step": sum(mb.num_images for mb in mbs) / steps,
                        "real_images_per_step": sum(sum(mb.images_per_sample) for mb in mbs) / steps,
                        "text_ids_per_step": sum(len(mb.text_ids) for mb in mbs) / steps}
    for v in out.values():   # "none" pads no text id
        v["real_text_ids_per_step"] = out["none"]["text_ids_per_step"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--demo", action="store_true", help="read the demo set (written to a temporary folder)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        print(f"error: --steps: must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    from hyperparallel.errors import SpecError
    from hyperparallel.recipe import load_recipe
    data = load_recipe(args.recipe, overrides=args.overrides).raw.get("data") or {}
    if data.get("type") != "conversations":
        print(f"error: data.type: this tool reads conversations data, got {data.get('type')!r}", file=sys.stderr)
        return 2
    overrides = list(args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        if args.demo:
            from hyperparallel.data.demo import write_demo
            overrides += [f"data.{k}={v}" for k, v in sorted(write_demo(os.path.join(tmp, "demo")).items())]
        try:
            res = count(args.recipe, args.steps, overrides)
        except SpecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{args.recipe}{' on the demo set' if args.demo else ''}, {args.steps} steps:\n")
    print("| `data.shape_buckets` | encoder input shapes | first LLM chunk input shapes | images encoded per step "
          "(real) | text ids per step (real) |")
    print("|---|---|---|---|---|")
    for k, v in res.items():
        print(f"| `{k}` | {v['encoder_shapes']} | {v['llm_first_shapes']} | {v['images_per_step']:.1f} "
              f"({v['real_images_per_step']:.1f}) | {v['text_ids_per_step']:.1f} ({v['real_text_ids_per_step']:.1f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
