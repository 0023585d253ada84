"""The recipe-key tables of docs/recipes.md and docs/mindformers.md, from the code that reads the keys.

    python tools/recipe_keys.py train      # train: keys and defaults (TrainConfig)
    python tools/recipe_keys.py data       # data: keys and defaults (generated data and conversations)
    python tools/recipe_keys.py refused    # MindFormers values train refuses, and what to give instead
    python tools/recipe_keys.py keys       # every key a recipe may hold at the top level and in strict sections
    python tools/recipe_keys.py metrics    # the keys of a metrics.jsonl line

Defaults and key lists are read from the dataclasses and schema (``tools/doc_numbers.py`` renders
these tables into the docs); only the one-line meanings are written here, and a key without one
fails the tool, so a new key cannot go undocumented.
"""
from __future__ import annotations

import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hyperparallel.data.conversations_config import ConversationsConfig  # noqa: E402
import hyperparallel.models  # noqa: E402,F401  (the model families register their data layouts and keys)
from hyperparallel.data.synthetic import DataConfig  # noqa: E402
from hyperparallel.recipe import schema  # noqa: E402
from hyperparallel.recipe.train import TRAIN_DEFAULTS, TrainConfig  # noqa: E402

TRAIN = {
    "seed": "initialisation and data seed (the top-level MindFormers `seed` is the same setting; give one)",
    "steps": "optimizer steps (`--steps` overrides; without both: `runner_config.epochs` over the data)",
    "lr": "constant learning rate (MindFormers' `lr_schedule:` instead for a schedule)",
    "optimizer": "`adam` (MindSpore nn.Adam) or `sgd` (nn.SGD, momentum 0.9); MindFormers' `optimizer:` instead "
                 "for AdamW and its fields",
    "save_every": "with `--save-dir`: a checkpoint every N steps (0: only after the last step)",
    "loss_normalization": "`tokens`: the step loss is the mean over every answer token of the global batch; "
                          "`micro_batch`: the mean of the micro-batches' own token means (docs/data.md, \"Balancing the "
                          "encoder's work\")",
    "hang_timeout_s": "seconds without progress on every rank before the job is ended as hung, naming the rank "
                      "(exit 124; the first step gets 5x)",
    "stop_grace_s": "after SIGTERM/SIGINT: seconds the ranks get to finish the step and save it (exit 75); then, "
                    "or on a second signal, they are killed at once",
    "optimizer_compile": "`jit`: MindSpore's optimizer Cell runs its update as its own compiled graph (one compile "
                         "per run, then fast steps); `eager`: the same update op by op, bit-identical, no compile "
                         "(short runs, the test suite)",
    "nonfinite": "a step whose loss or global grad norm is NaN or infinite, decided before its update on every "
                 "rank: `stop` (exit 65 naming the step; nothing of it saved) or `skip` (no rank updates in that "
                 "step, as MindSpore's loss-scale overflow check; logged and counted)",
    "zero": "ZeRO over the `data_parallel` replicas of every region: `0` none; `1` optimizer state sharded "
            "(MindFormers' `parallel_config.optimizer_shard: true` reads as 1); `2` gradients too (reduce-scatter); "
            "needs `data_parallel` >= 2 (docs/training.md)",
}

SYNTHETIC = {
    "type": "`synthetic` (default) or `conversations`",
    "micro_batch_size": "samples per micro-batch (MindFormers' `runner_config.batch_size` fills it when absent)",
    "text_len": "text tokens per sample",
    "vocab": "vocabulary size of the generated tokens",
    "image_size": "square image side in pixels",
    "channels": "image channels",
    "patch": "patch side in pixels",
    "num_classes": "classes the generated images show",
    "noise": "pixel noise of the generated images",
    "images_per_sample": "probabilities of 0, 1, 2, ... images per sample",
    "video_prob": "probability that a sample is a video",
    "video_frames": "frames of a video",
    "balance": "`none`, or `encoder`: each step's samples regrouped into micro-batches so every encoder owner "
               "gets even work (conversations only: the generator has no per-sample encoder work)",
}
CONVERSATIONS = {
    "type": "`conversations`",
    "path": "JSON Lines of LLaVA-style conversations (required)",
    "tokenizer": "a Hugging Face `tokenizer.json` (required)",
    "image_root": "folder image paths are relative to (default: the data file's folder)",
    "allow_outside_root": "`false`: an image name that resolves outside `image_root` (absolute, `..`, a symlink "
                          "out) is an `outside_image_root` bad sample, never read; `true` reads it",
    "max_line_bytes": "a `.jsonl` line (a `.json` list sample) longer than this is a `line_too_long` bad sample, "
                      "skipped unparsed in bounded memory (default: 64 x `seq_len` + 1 MiB)",
    "seq_len": "tokens per sample after padding/truncation",
    "micro_batch_size": "samples per micro-batch (MindFormers' `runner_config.batch_size` fills it when absent)",
    "image_size": "tiny-MLLM / MindFormers Llama layout: square side images are resized to",
    "patch": "patch side in pixels",
    "mean": "per-channel mean (tiny layout)",
    "std": "per-channel std (tiny layout)",
    "min_pixels": "Qwen layout: smallest image area after resizing (Qwen's image processor)",
    "max_pixels": "Qwen layout: largest image area after resizing",
    "image_mean": "Qwen layout: per-channel mean",
    "image_std": "Qwen layout: per-channel std",
    "preprocessor_config": "Qwen layout: a Hugging Face `preprocessor_config.json` to read the four above from",
    "system_prompt": "Qwen layout: the chat template's system message",
    "fps": "Qwen layout: frames sampled per second of a video file (Qwen's `smart_nframes`; a frame list's rate)",
    "min_frames": "Qwen layout: fewest frames sampled of a video file",
    "max_frames": "Qwen layout: most frames sampled of a video file; a frame list with more is a bad sample",
    "shuffle": "shuffle the samples each epoch (mindspore.dataset)",
    "seed": "shuffle seed (default: the run's seed)",
    "num_parallel_workers": "mindspore.dataset workers",
    "prefetch": "mindspore.dataset prefetch size",
    "on_bad_sample": "`error` (stop before launch, naming them) or `skip` (leave bad samples out, counted)",
    "vocab": "vocabulary size the model must cover (default: the tokenizer's)",
    "balance": "`none`, or `encoder`: each step's samples regrouped into micro-batches so every encoder owner "
               "(transpose) gets even work; needs `train.loss_normalization: tokens`",
    "shape_buckets": "`none`, or `pow2`: each micro-batch's image count and text length padded up to a power of "
                     "two with filler no position reads (loss exact), so compiled chunks (`mpipe.compile: jit`) "
                     "compile a few graphs instead of one per shape (tiny layout; not with `balance: encoder`)",
    "packing": "several samples per sequence up to `seq_len`, packed first-fit in data order, each attending only "
               "to itself with its positions restarting, the loss per token as unpacked (qwen_vl models with "
               "eager attention; not with `balance: encoder`)",
}

METRICS = {
    "step": "optimizer step, 1-based (as on the console)",
    "loss": "the step loss: mean over the step's answer tokens (`train.loss_normalization: tokens`) or of its "
            "micro-batches' means (`micro_batch`)",
    "lr": "learning rate of the step's update",
    "grad_norm": "global gradient norm before clipping (every parameter counted once over the ranks)",
    "step_time_s": "wall time of the step",
    "samples_per_s": "samples (sequences) per second: micro-batches x micro_batch_size / step_time_s",
    "tokens_per_s": "tokens per second, padding included: samples_per_s x sequence length",
    "eta_s": "remaining steps x the mean step time of this run so far",
    "samples": "conversations data: the samples the step trained on (with `data.packing` more than its sequences)",
    "real_tokens": "conversations data: the step's tokens that are not padding (its samples' lengths summed)",
    "real_tokens_per_s": "real_tokens / step_time_s: what `data.packing` raises (tokens_per_s counts padding too)",
    "schedule": "the schedule that ran the step",
    "data_skipped": "bad samples left out so far (`data.on_bad_sample: skip`)",
    "compile": "how rank 0's chunks ran: `jit` (compiled graphs, `mpipe.compile: jit`), `eager`, or `mixed` "
               "(some chunks eager: the log says which and why)",
    "compiles": "graphs rank 0 compiled in this step (first calls of a new input shape)",
    "compile_s": "time of those first calls (compile + one run), part of `step_time_s`",
    "skipped": "true when the step's loss or grad norm was not finite and no rank updated (`train.nonfinite: "
               "skip`); non-finite numbers are written as `null` (the file is strict JSON)",
    "steps_skipped": "steps of this run skipped so far (`train.nonfinite: skip`, or a loss-scale overflow)",
    "loss_scale": "the loss scale of the step (`runner_wrapper.scale_sense`; 1.0 without loss scaling)",
    "overflow": "true when, with a loss scale, the step's gradients overflowed (not finite, the loss finite): no "
                "rank updated and a dynamic scale was lowered (`skipped` is true too)",
    "memory": "every rank's memory record of the step, one object per rank (below)",
    "encoder_work": "with `data.balance: encoder`: the step's predicted encoder work per owner rank, "
                    "`patches` and `ms` (from the recipe's profile), and the same as position order would have "
                    "grouped it (`patches_unbalanced`, `ms_unbalanced`)",
}


def _default(v):
    if v is None:
        return "-"
    if v == "":
        return "(required)"
    return f"`{v}`"


def _fields(cls):
    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(cls)}


def _meanings(table: dict, keys, what: str) -> dict:
    missing = [k for k in keys if k not in table]
    if missing:
        raise SystemExit(f"tools/recipe_keys.py: no meaning for {what} keys {missing}")
    return table


def train() -> str:
    _meanings(TRAIN, TrainConfig.TRAIN_KEYS, "train:")
    rows = ["| `train:` key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{k}` | {_default(TRAIN_DEFAULTS[k])} | {TRAIN[k]} |" for k in TrainConfig.TRAIN_KEYS]
    return "\n".join(rows)


def data() -> str:
    syn = _fields(DataConfig)
    conv = ConversationsConfig.defaults()   # the fields' and the registered layouts' keys
    syn_keys = ["type"] + list(syn)
    _meanings(SYNTHETIC, syn_keys, "synthetic data:")
    conv_keys = ConversationsConfig.recipe_keys()
    _meanings(CONVERSATIONS, conv_keys, "conversations data:")
    rows = ["| `data:` key | generated data (`type: synthetic`) | conversations (`type: conversations`) | meaning |",
            "|---|---|---|---|"]
    keys = syn_keys + [k for k in conv_keys if k not in syn_keys]
    for k in keys:
        s = "`synthetic`" if k == "type" else (_default(syn[k]) if k in syn else "not a key")
        c = "`conversations`" if k == "type" else (
            _default(conv[k]) if k in conv_keys else "not a key")
        a = SYNTHETIC.get(k) if k in syn_keys else None
        b = CONVERSATIONS.get(k) if k in conv_keys else None
        meaning = "the data source" if k == "type" else (
            a if b in (None, a) else b if a is None else f"{a}; conversations: {b}")
        rows.append(f"| `{k}` | {s} | {c} | {meaning} |")
    return "\n".join(rows)


def refused() -> str:
    rows = ["| key | refused when | give instead |", "|---|---|---|"]
    when = {"_more_than_one": "> 1", "_true": "true", "_on": "true, a list with a layer count or an op pattern",
            "_named": "true or a name", "_false": "false", "_not_off": "not `OFF`",
            "_nonzero": "> 0"}
    for key, bad, instead in schema._REFUSED:
        rows.append(f"| `{key}` | {when[bad.__name__]} | {instead} |")
    rows += ["| `run_mode` | not `train`/`finetune` | `train` |",
             "| `grouped_lr_schedule` | given | one `lr_schedule` |",
             "| `load_checkpoint`, `pretrained_model_dir` | given | `model.pretrained` (Hugging Face directory) or "
             "`train --resume-from` |",
             "| `remote_save_url` | given | `train --save-dir` |",
             "| `data_skip_steps` | given | `train --resume-from` (the data continue at the checkpoint) |",
             f"| `runner_wrapper.type` | not one of {', '.join(f'`{w}`' for w in schema.WRAPPERS)} | one of them |",
             "| `runner_wrapper.scale_sense` | not a number >= 1 or a `DynamicLossScaleUpdateCell` / "
             "`FixedLossScaleUpdateCell` mapping | one of them (docs/training.md, mixed precision) |",
             "| `context.mode` | not 1 | 1 (PYNATIVE_MODE: the runtime is PyNative) |",
             "| `context.device_target` | differs from `device` | the same device |",
             "| `train_dataset`, `train_dataset_task` | given | the `data:` section |",
             "| `optimizer.use_fused`, `.amsgrad`, `.maximize`, `.swap` | true | false |",
             "| `optimizer.loss_scale` | not 1 | 1.0 (the loss scale is `runner_wrapper.scale_sense`) |"]
    return "\n".join(rows)


def keys() -> str:
    rows = ["| where | keys |", "|---|---|"]
    rows.append(f"| top level: MindFormers' `GeneralConfig` | {', '.join(f'`{k}`' for k in schema.GENERAL)} |")
    rows.append(f"| top level: MindFormers' sections | {', '.join(f'`{k}`' for k in schema.SECTIONS)} |")
    rows.append(f"| top level: hyperparallel's | {', '.join(f'`{k}`' for k in schema.OURS)} |")
    for sec, ks in schema.STRICT.items():
        rows.append(f"| `{sec}` | {', '.join(f'`{k}`' for k in ks)} |")
    return "\n".join(rows)


def metrics() -> str:
    rows = ["| key | meaning |", "|---|---|"]
    rows += [f"| `{k}` | {v} |" for k, v in METRICS.items()]
    return "\n".join(rows)


TABLES = {"train": train, "data": data, "refused": refused, "keys": keys, "metrics": metrics}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TABLES:
        raise SystemExit(f"usage: tools/recipe_keys.py {{{'|'.join(TABLES)}}}")
    print(TABLES[sys.argv[1]]())
