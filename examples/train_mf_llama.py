"""Train recipes/mf_llama_mllm.yaml (the project's ViT + MindFormers' LlamaForCausalLM) from your own
script through the Python API, feeding micro-batches from your own iterable.

    msrun --worker_num=2 --local_worker_num=2 --master_port=8123 --join=True --log_dir=runs/example_logs \
        examples/train_mf_llama.py --steps 30 --save-dir runs/example_ckpt

Every rank runs this script and iterates the same batches; ``--resume`` continues from
``--save-dir``. Rank 0 prints the loss per step (and writes them to ``--out`` as JSON).
"""
import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hyperparallel.api import Runtime  # noqa: E402
from hyperparallel.data import make_micro_batch  # noqa: E402

RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "recipes", "mf_llama_mllm.yaml")


def my_batches(data_cfg, seed, micro_batches, start=0):
    """Your own data: here the project's synthetic image-text generator, one list per step."""
    for step in itertools.count(start):
        yield [make_micro_batch(data_cfg, seed, step, m) for m in range(micro_batches)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=RECIPE)
    ap.add_argument("--schedule", default=None, help="e.g. transpose, 1f1b (default: the recipe's)")
    ap.add_argument("--steps", type=int, default=30, help="train up to this step")
    ap.add_argument("--save-dir", default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", default=None, help="rank 0 writes {step: loss} here")
    args = ap.parse_args()

    rt = Runtime.from_recipe(args.recipe, schedule=args.schedule)
    start = rt.load(args.save_dir) if args.resume else 0
    losses = {}
    batches = my_batches(rt.data, rt.train.seed, rt.micro_batches, start)
    for step, batch in zip(range(start, args.steps), batches):
        losses[step] = rt.step(batch)
        if rt.rank == 0:
            print(f"step {step + 1}/{args.steps} loss {losses[step]:.6f}", flush=True)
    if args.save_dir:
        rt.save(args.save_dir)
    if rt.rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(losses, f)
    rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
