"""What the checkpoint integrity check costs: SHA-256 of the tiny MLLM's checkpoint and of a ~1 GB file.

Writes the tiny MLLM's checkpoint once in-process (2 pipeline devices, no msrun), then times
``ckpt_files.verdict`` (what ``--resume`` and ``hyperparallel ckpt`` run) with and without the digests
(median of 5), and the SHA-256 of one file of ``--gb`` GiB of random bytes (median of 3; the file
is written to ``--tmp`` and removed). docs/checkpoints.md quotes its output.

    python tools/digest_cost.py [--gb 1] [--tmp /tmp] [--json docs/digest_cost.json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def _median_s(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of the large file, GiB (default 1)")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the large file is written")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    from hyperparallel.runtime import ckpt_files as cf
    from hyperparallel.testing import write_checkpoint   # the in-process save of the layout tests
    with tempfile.TemporaryDirectory() as d:
        path, _ = write_checkpoint(RECIPE, d, 1)
        size = sum(os.path.getsize(os.path.join(path, f)) for f in cf.read_meta(path)["files"])
        with_digest = _median_s(lambda: cf.verdict(path, True), 5)
        without = _median_s(lambda: cf.verdict(path, False), 5)
    big = os.path.join(args.tmp, "hp_digest_cost.bin")
    n = int(args.gb * (1 << 30))
    try:
        with open(big, "wb") as f:
            block = os.urandom(1 << 24)
            for _ in range(n // len(block)):
                f.write(block)
        big_s = _median_s(lambda: cf.file_digest(big), 3)
    finally:
        if os.path.exists(big):
            os.remove(big)
    out = {"tiny_bytes": size, "tiny_verify_s": round(with_digest, 5), "tiny_verify_no_digest_s": round(without, 5),
           "big_bytes": n // (1 << 24) * (1 << 24), "big_sha256_s": round(big_s, 3),
           "big_gb_per_s": round(n / (1 << 30) / big_s, 2), "command": "python tools/digest_cost.py --gb %g" % args.gb}
    print(f"tiny MLLM checkpoint ({size:,} bytes, 2 files): verify {out['tiny_verify_s'] * 1e3:.2f} ms with "
          f"SHA-256, {out['tiny_verify_no_digest_s'] * 1e3:.2f} ms without (--no-digest)")
    print(f"one {out['big_bytes'] / (1 << 30):.2f} GiB file: SHA-256 {out['big_sha256_s']:.2f} s "
          f"({out['big_gb_per_s']} GiB/s, one core)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
