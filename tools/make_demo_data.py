"""Write the demo conversations data set (PNG images, train.jsonl, tokenizer.json) into a folder.

    python tools/make_demo_data.py data/demo            # what recipes/tiny_mllm_data.yaml reads
    python tools/make_demo_data.py /tmp/bad --broken    # plus one sample per kind of bad input

Deterministic: the same arguments write the same files (see hyperparallel/data/demo.py).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hyperparallel.data.demo import write_demo  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="data/demo", help="output folder (default data/demo)")
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--broken", action="store_true", help="add one bad sample of each kind")
    args = ap.parse_args()
    paths = write_demo(args.out, args.samples, args.seed, args.broken)
    n = len(os.listdir(os.path.join(args.out, "images")))
    print(f"wrote {paths['path']} ({args.samples} samples{' + broken ones' if args.broken else ''}), "
          f"{n} images, tokenizer {paths['tokenizer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
