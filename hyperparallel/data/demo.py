"""Write the demo conversations data set (PNG images, train.jsonl, tokenizer.json) into a folder.

Run through its launcher in a checkout (or as ``python -m hyperparallel.data.demo``):

    python tools/make_demo_data.py data/demo            # what recipes/tiny_mllm_data.yaml reads
    python tools/make_demo_data.py /tmp/bad --broken    # plus one sample per kind of bad input
    python tools/make_demo_data.py data/skewed --skewed 0.15   # a skewed image mix (data.balance)

Deterministic: the same arguments write the same files. The set is in the ``conversations``
format. Images are PNG renderings of the synthetic source's class prototypes (see
``hyperparallel/data/synthetic.py``), upsampled to 16x16 or 24x24 pixels with noise, and about a
third of the still images non-square (16x24 or 32x16, height x width; chosen by a second random
stream, so the square ones are the same files as before); a sample holds 0 to 3 images or a
"video" of 4 to 6 frames of one size (the prototype shifted frame by frame), and a conversation whose answer
names the classes shown, so the answer needs the images. ``videos=False`` (``--no-video``)
writes single-image samples instead of videos. ``video_files=True`` (``--video-files``) writes the
video samples of odd index as one video file instead of its frame images (lossless FFV1 in Matroska at 4 frames
per second, written with PyAV; the ``qwen_vl`` layout reads both,
``merge_index`` frame lists only); the frames' pixels and every other file are the same.
``skewed=p`` (``--skewed P``) writes a skewed image mix instead: a sample has 4 to 6 images of 16 to
48 pixels with probability ``p`` and none otherwise (a counting question), so the encoder's work per
micro-batch ranges from the filler image to a few dozen images (``data.balance: encoder``).

A tiny word-level tokenizer (Hugging Face ``tokenizers`` JSON) is trained on the
conversations and the role words of both layouts; its special tokens have fixed ids, Qwen's
included (``SPECIAL``: ``<|endoftext|>`` 5, ``<|im_start|>`` 6, ``<|im_end|>`` 7,
``<|vision_start|>`` 8, ``<|vision_end|>`` 9, ``<|image_pad|>`` 10, ``<|video_pad|>`` 11), so a
tiny Qwen config can name them. ``broken=True`` adds one sample per kind of bad input, for
tests and for trying ``hyperparallel data check``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from .synthetic import DataConfig, _prototypes
from .text import ROLES

CLASSES = ("alpha", "beta", "gamma", "delta")
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six")
SPECIAL = ["<pad>", "<unk>", "</s>", "<image>", "<video>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
           "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]   # ids 0..11
QWEN_ROLES = ("system", "user", "assistant")   # Qwen's chat layout: each a single known token
NON_SQUARE = ((2, 3), (4, 2))   # (row, column) upsampling of an 8x8 prototype: 16x24 and 32x16 pixels

# kinds of bad samples ``broken=True`` adds (one each), as ``data check`` names them
BROKEN_KINDS = ("missing_image", "unreadable_image", "malformed_json", "placeholder_mismatch",
                "placeholder_mismatch", "too_long")


def _png(path: str, arr: np.ndarray) -> None:
    from PIL import Image
    Image.fromarray(arr).save(path, format="PNG")


def _render(proto: np.ndarray, scale, rng: np.random.Generator, shift: int = 0) -> np.ndarray:
    """``scale``: an int (square) or (rows, columns)."""
    sy, sx = (scale, scale) if isinstance(scale, int) else scale
    img = np.roll(proto, shift, axis=-1).transpose(1, 2, 0)            # HWC
    img = np.repeat(np.repeat(img, sy, 0), sx, 1)
    img = 128 + 60 * img + 12 * rng.standard_normal(img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


VIDEO_FPS = 4   # --video-files: the frame rate the files are written at


def _sample(i: int, rng: np.random.Generator, protos, img_dir: str, shape_rng: np.random.Generator,
            videos: bool = True, video_file: bool = False) -> dict:
    u = rng.random()
    rec: dict = {"id": f"s{i:04d}"}

    frames = []

    def image(c, tag, shift=0, still=True):
        name = f"images/{rec['id']}_{tag}.png"
        square = _render(protos[c], int(rng.choice([2, 3])), rng, shift)   # drawn always: the main stream
        if still and shape_rng.random() < 1 / 3:                           # stays that of square images
            arr = _render(protos[c], NON_SQUARE[int(shape_rng.integers(len(NON_SQUARE)))], shape_rng, shift)
        else:
            arr = square
        if not still:   # a video's frames share the first frame's size (a frame drawn at the other scale is
            if frames and arr.shape != frames[0].shape:   # resized to it: the random streams stay as they were)
                from PIL import Image
                h, w = frames[0].shape[:2]
                arr = np.asarray(Image.fromarray(arr).resize((w, h), Image.NEAREST))
            frames.append(arr)
        if not (video_file and not still):
            _png(os.path.join(img_dir, os.path.basename(name)), arr)
        return name

    if u >= 0.85 and not videos:
        u = 0.1 + (u - 0.85) * (0.35 / 0.15)   # a one-image sample instead of a video
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
        rec["video"] = [image(c, f"f{j}", shift=j, still=False) for j in range(f)]
        if video_file:
            from .video import write_video
            rec["video"] = f"images/{rec['id']}.mkv"
            write_video(os.path.join(img_dir, f"{rec['id']}.mkv"), frames, VIDEO_FPS)
        rec["conversations"] = [{"from": "human", "value": "<video>\nwhat moves in the video ?"},
                                {"from": "gpt", "value": f"a {CLASSES[c]} moves ."}]
        if rng.random() < 0.5:
            rec["conversations"] += [{"from": "human", "value": "how many frames ?"},
                                     {"from": "gpt", "value": f"{NUMBERS[f]} frames ."}]
    return rec


HEAVY_SCALES = (2, 3, 4, 6)   # --images: 16, 24, 32 or 48 pixels (the prototypes are 8 x 8)


def _multi_image_sample(i: int, k: int, rng: np.random.Generator, protos, img_dir: str) -> dict:
    """A sample with ``k`` to ``k + 2`` images of different sizes whose answer names them all."""
    rec: dict = {"id": f"s{i:04d}"}
    n = k + int(rng.integers(3))
    cs = [int(c) for c in rng.integers(len(CLASSES), size=n)]
    rec["image"] = []
    for j, c in enumerate(cs):
        name = f"images/{rec['id']}_{j}.png"
        _png(os.path.join(img_dir, os.path.basename(name)), _render(protos[c], int(rng.choice(HEAVY_SCALES)), rng))
        rec["image"].append(name)
    names = [CLASSES[c] for c in cs]
    q = " ".join(["<image>"] * n) + f"\nname the {NUMBERS[min(n, len(NUMBERS) - 1)]} pictures ."
    rec["conversations"] = [{"from": "human", "value": q},
                            {"from": "gpt", "value": " , ".join(names[:-1]) + " and " + names[-1] + " ."}]
    return rec


def _skewed_sample(i: int, heavy_prob: float, rng: np.random.Generator, protos, img_dir: str) -> dict:
    """With probability ``heavy_prob`` a sample of 4 to 6 images of different sizes, else text only."""
    if rng.random() < heavy_prob:
        return _multi_image_sample(i, 4, rng, protos, img_dir)
    a, b = sorted(int(x) for x in rng.choice(len(NUMBERS) - 1, 2, replace=False))
    return {"id": f"s{i:04d}", "conversations": [
        {"from": "human", "value": f"count from {NUMBERS[a]} to {NUMBERS[b]} ."},
        {"from": "gpt", "value": " ".join(NUMBERS[a:b + 1]) + " ."}]}


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


def token_ids(tokenizer: str) -> Dict[str, int]:
    """Ids of the special tokens and Qwen's role words in a written tokenizer."""
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(tokenizer)
    return {t: tk.token_to_id(t) for t in SPECIAL + list(QWEN_ROLES)}


def write_demo(out: str, num_samples: int = 160, seed: int = 0, broken: bool = False,
               videos: bool = True, images: int = 0, skewed: float = 0.0,
               video_files: bool = False) -> Dict[str, str]:
    """Write ``out/train.jsonl``, ``out/images/*.png`` and ``out/tokenizer.json``; returns their paths
    (as ``data:`` keys). With ``broken``, the bad samples are interleaved (every 7th line from line 3);
    ``videos=False``: no video samples; ``video_files``: the video samples of odd index as video files; ``images=k``: an encoder-heavy set instead, every sample with
    ``k`` to ``k + 2`` images of 16 to 48 pixels; ``skewed=p``: a skewed image mix (module docstring)."""
    img_dir = os.path.join(out, "images")
    os.makedirs(img_dir, exist_ok=True)
    protos = _prototypes(DataConfig(num_classes=len(CLASSES), image_size=8, channels=3), 1234)
    rng = np.random.default_rng([int(seed), 31337])
    shape_rng = np.random.default_rng([int(seed), 4242])
    if skewed:
        recs = [_skewed_sample(i, skewed, rng, protos, img_dir) for i in range(num_samples)]
    else:
        recs = [_multi_image_sample(i, images, rng, protos, img_dir) if images else
                _sample(i, rng, protos, img_dir, shape_rng, videos, video_files and i % 2 == 1)
                for i in range(num_samples)]
    lines = [json.dumps(r) for r in recs]
    if broken:
        good = next(r["image"] for r in recs if isinstance(r.get("image"), str))
        for j, line in enumerate(_broken(img_dir, good)):
            lines.insert(2 + 7 * j, line)
    path = os.path.join(out, "train.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    texts = [ROLES[t["from"]] + t["value"].replace("<image>", " ").replace("<video>", " ")
             for r in recs for t in r["conversations"]] + [" ".join(QWEN_ROLES)]
    tok = os.path.join(out, "tokenizer.json")
    train_tokenizer(texts, tok)
    return {"path": path, "image_root": out, "tokenizer": tok}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="make_demo_data.py", description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="data/demo", help="output folder (default data/demo)")
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--broken", action="store_true", help="add one bad sample of each kind")
    ap.add_argument("--no-video", action="store_true", help="single-image samples instead of videos")
    ap.add_argument("--video-files", action="store_true",
                    help="the video samples of odd index as video files (FFV1 .mkv) instead of frame images")
    ap.add_argument("--images", type=int, default=0, metavar="K",
                    help="an encoder-heavy set: every sample shows K to K+2 images of 16 to 48 pixels")
    ap.add_argument("--skewed", type=float, default=0.0, metavar="P",
                    help="a skewed image mix: 4 to 6 images of different sizes with probability P, else none")
    args = ap.parse_args(argv)
    if not 0 <= args.skewed <= 1:
        print(f"error: --skewed: a probability in [0, 1], got {args.skewed}", file=sys.stderr)
        return 2
    if args.skewed and args.images:
        print("error: --skewed: give --skewed or --images, not both", file=sys.stderr)
        return 2
    paths = write_demo(args.out, args.samples, args.seed, args.broken, videos=not args.no_video, images=args.images,
                       skewed=args.skewed, video_files=args.video_files)
    n = len(os.listdir(os.path.join(args.out, "images")))
    print(f"wrote {paths['path']} ({args.samples} samples{' + broken ones' if args.broken else ''}"
          f"{', no videos' if args.no_video else ''}{f', {args.images}+ images each' if args.images else ''}"
          f"{f', skewed: {args.skewed:g} with 4-6 images, the rest none' if args.skewed else ''}), "
          f"{n} images, tokenizer {paths['tokenizer']}")
    print("token ids: " + ", ".join(f"{t} {i}" for t, i in token_ids(paths["tokenizer"]).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
