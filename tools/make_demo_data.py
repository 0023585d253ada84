"""Write the demo conversations data set (PNG images, train.jsonl, tokenizer.json) into a folder.

    python tools/make_demo_data.py data/demo            # what recipes/tiny_mllm_data.yaml reads
    python tools/make_demo_data.py /tmp/bad --broken    # plus one sample per kind of bad input

Deterministic: the same arguments write the same files. The set is in the ``conversations``
format. Images are PNG renderings of the synthetic source's class prototypes (see
``hyperparallel/data/synthetic.py``), upsampled to 16 or 24 pixels with noise; a sample holds 0 to 3
images or a "video" of 4 to 6 frames (the prototype shifted frame by frame), and a
conversation whose answer names the classes shown, so the answer needs the images.
A tiny word-level tokenizer (Hugging Face ``tokenizers`` JSON) is trained on the
conversations. ``broken=True`` adds one sample per kind of bad input, for tests and
for trying ``hyperparallel data check``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hyperparallel.data.synthetic import DataConfig, _prototypes  # noqa: E402
from hyperparallel.data.text import ROLES  # noqa: E402

CLASSES = ("alpha", "beta", "gamma", "delta")
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six")
SPECIAL = ["<pad>", "<unk>", "</s>", "<image>", "<video>"]

# kinds of bad samples ``broken=True`` adds (one each), as ``data check`` names them
BROKEN_KINDS = ("missing_image", "unreadable_image", "malformed_json", "placeholder_mismatch",
                "placeholder_mismatch", "too_long")


def _png(path: str, arr: np.ndarray) -> None:
    from PIL import Image
    Image.fromarray(arr).save(path, format="PNG")


def _render(proto: np.ndarray, scale: int, rng: np.random.Generator, shift: int = 0) -> np.ndarray:
    img = np.roll(proto, shift, axis=-1).transpose(1, 2, 0)            # HWC
    img = np.repeat(np.repeat(img, scale, 0), scale, 1)
    img = 128 + 60 * img + 12 * rng.standard_normal(img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _sample(i: int, rng: np.random.Generator, protos, img_dir: str) -> dict:
    u = rng.random()
    rec: dict = {"id": f"s{i:04d}"}

    def image(c, tag, shift=0):
        name = f"images/{rec['id']}_{tag}.png"
        _png(os.path.join(img_dir, os.path.basename(name)), _render(protos[c], int(rng.choice([2, 3])), rng, shift))
        return name

    if u < 0.1:
        a, b = sorted(int(x) for x in rng.choice(len(NUMBERS) - 1, 2, replace=False))
        rec["conversations"] = [{"from": "human", "value": f"count from {NUMBERS[a]} to {NUMBERS[b]} ."},
                                {"from": "gpt", "value": " ".join(NUMBERS[a:b + 1]) + " ."}]
    elif u < 0.85:
        n = 1 if u < 0.45 else (2 if u < 0.7 else 3)
        cs = [int(c) for c in rng.integers(len(CLASSES), size=n)]
        rec["image"] = image(cs[0], 0) if n == 1 else [image(c, j) for j, c in enumerate(cs)]
        names = [CLASSES[c] for c in cs]
        if n == 1:
            q, a = "<image>\nwhat is this ?", f"this is {names[0]} ."
        else:
            q = " ".join(["<image>"] * n) + f"\nname the {NUMBERS[n]} pictures ."
            a = (" , ".join(names[:-1]) + " and " + names[-1] + " .")
        rec["conversations"] = [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
    else:
        c, f = int(rng.integers(len(CLASSES))), int(rng.integers(4, 7))
        rec["video"] = [image(c, f"f{j}", shift=j) for j in range(f)]
        rec["conversations"] = [{"from": "human", "value": "<video>\nwhat moves in the video ?"},
                                {"from": "gpt", "value": f"a {CLASSES[c]} moves ."}]
        if rng.random() < 0.5:
            rec["conversations"] += [{"from": "human", "value": "how many frames ?"},
                                     {"from": "gpt", "value": f"{NUMBERS[f]} frames ."}]
    return rec


def _broken(img_dir: str, good_image: str) -> List[str]:
    """One JSON line per BROKEN_KINDS entry (a malformed line is returned as is)."""
    with open(os.path.join(img_dir, "broken.png"), "wb") as f:
        f.write(b"this is not an image at all")
    ask = [{"from": "human", "value": "<image>\nwhat is this ?"}, {"from": "gpt", "value": "this is alpha ."}]
    return [json.dumps({"id": "bad_missing", "image": "images/no_such_file.png", "conversations": ask}),
            json.dumps({"id": "bad_unreadable", "image": "images/broken.png", "conversations": ask}),
            '{"id": "bad_json", "image": "images/x.png", "conversations": [',
            json.dumps({"id": "bad_more_placeholders", "image": good_image,
                        "conversations": [{"from": "human", "value": "<image> <image>\nname them ."},
                                          {"from": "gpt", "value": "alpha ."}]}),
            json.dumps({"id": "bad_fewer_placeholders", "image": [good_image, good_image],
                        "conversations": ask}),
            json.dumps({"id": "bad_too_long", "image": good_image,
                        "conversations": [ask[0], {"from": "gpt", "value": " ".join(["alpha"] * 80)}]})]


def train_tokenizer(texts: List[str], path: str) -> int:
    """A word-level tokenizer over ``texts`` (whitespace and punctuation split); returns its size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=SPECIAL, min_frequency=1))
    tk.save(path)
    return tk.get_vocab_size()


def write_demo(out: str, num_samples: int = 160, seed: int = 0, broken: bool = False) -> Dict[str, str]:
    """Write ``out/train.jsonl``, ``out/images/*.png`` and ``out/tokenizer.json``; returns their paths.
    With ``broken``, the bad samples are interleaved (every 7th line from line 3)."""
    img_dir = os.path.join(out, "images")
    os.makedirs(img_dir, exist_ok=True)
    protos = _prototypes(DataConfig(num_classes=len(CLASSES), image_size=8, channels=3), 1234)
    rng = np.random.default_rng([int(seed), 31337])
    recs = [_sample(i, rng, protos, img_dir) for i in range(num_samples)]
    lines = [json.dumps(r) for r in recs]
    if broken:
        good = next(r["image"] for r in recs if isinstance(r.get("image"), str))
        for j, line in enumerate(_broken(img_dir, good)):
            lines.insert(2 + 7 * j, line)
    path = os.path.join(out, "train.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    texts = [ROLES[t["from"]] + t["value"].replace("<image>", " ").replace("<video>", " ")
             for r in recs for t in r["conversations"]]
    tok = os.path.join(out, "tokenizer.json")
    train_tokenizer(texts, tok)
    return {"path": path, "image_root": out, "tokenizer": tok}


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
