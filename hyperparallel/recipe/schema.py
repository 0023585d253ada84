"""Every key a recipe may hold, and what hyperparallel does with each (pure Python, no MindFormers import).

A recipe is a MindFormers config plus hyperparallel's sections. Its keys fall in four kinds:

* **unknown**: not a MindFormers key (1.9.0's template, or another release's, :data:`OTHER_RELEASES`) nor one
  of ours: refused everywhere (``plan`` too, and
  through ``--set``), naming the nearest known key (:func:`check_keys`);
* **honoured**: read and applied with MindFormers' meaning (``seed``, ``parallel_config``'s pipeline
  keys, ``optimizer``, ``lr_schedule``, ``runner_wrapper``'s clipping, ``runner_config.batch_size``...);
* **refused for training**: read, but the runtime cannot do what the value asks (tensor parallelism,
  recompute, ...): ``train``/``profile``/``bench`` refuse them before launch naming the
  key and the value it can run (:func:`train_refusals`); ``plan`` and ``simulate`` still work;
* **not used**: MindFormers keys that change nothing in a hyperparallel run (graph-mode, logging,
  evaluation and prediction settings): ``train`` names them once (:func:`unused_keys`).

The key lists are MindFormers 1.9.0's own config template (``mindformers/tools/register/template.py``:
``GeneralConfig``, ``ParallelConfig``, ``RunnerConfig``, ...); ``tests/unit/test_recipe_schema.py`` checks
them against the installed MindFormers.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..errors import SpecError, unknown_key
from ..mpipe.derive import check_zero

#: top-level scalar keys of MindFormers' ``GeneralConfig``
GENERAL = ("seed", "output_dir", "run_mode", "use_parallel", "resume_training", "print_separate_loss",
           "load_checkpoint", "load_ckpt_format", "auto_trans_ckpt", "transform_process_num",
           "src_strategy_path_or_dir", "only_save_strategy", "load_ckpt_async", "use_legacy", "use_legacy_format",
           "pretrained_model_dir", "balanced_load", "reshard_worker_num", "do_eval", "eval_step_interval",
           "eval_epoch_interval", "ignore_data_skip", "data_skip_steps", "profile", "profile_communication",
           "profile_memory", "init_start_profile", "profile_start_step", "profile_stop_step", "profile_rank_ids",
           "profile_pipeline", "profile_level", "mstx", "layer_scale", "layer_decay", "lr_scale",
           "lr_scale_factor", "micro_batch_interleave_num", "remote_save_url", "save_file", "input_data",
           "predict_batch_size", "adapter_id", "exclude_cann_cpu", "train_precision_sync", "infer_precision_sync",
           "postprocess_use_numpy",
           # read by MindFormers' trainer from the top level, outside the template
           "calculate_per_token_loss", "use_skip_data_by_global_norm", "grouped_lr_schedule")
#: MindFormers' sections (``CONFIG_NAME_TO_CLASS`` of the template)
SECTIONS = ("parallel_config", "recompute_config", "swap_config", "moe_config", "runner_config", "parallel",
            "context", "train_dataset", "train_dataset_task", "processor", "eval_dataset", "eval_dataset_task",
            "trainer", "model", "runner_wrapper", "optimizer", "lr_schedule", "metric", "callbacks",
            "monitor_config", "eval_callbacks")
#: hyperparallel's own top-level keys
OURS = ("base_config", "device", "mpipe", "data", "train")

#: MindFormers keys outside 1.9.0's template: in the public configs (``configs/``, ``research/``) or the config
#: templates of other MindFormers releases, with the releases they were seen in (``tools/mindformers_keys.py``
#: lists them from a MindFormers git clone's release tags). MindFormers 1.9.0 warns a top-level one "useless"
#: and ignores it; its strict sections (``runner_config``) refuse theirs. Accepted by every command; ``plan``,
#: ``check`` and ``simulate`` name them once; ``train`` names the top-level ones as not used and refuses the
#: section ones (:data:`_OLD_SECTION_KEYS`).
OTHER_RELEASES: Dict[str, str] = {
    "auto_tune": "1.7-1.9 configs", "filepath_prefix": "1.7-1.9 configs", "autotune_per_step": "1.7-1.9 configs",
    "profiler_level": "1.7-1.9 configs", "generation_config": "1.9 configs", "remove_redundancy": "1.9 configs",
    "ckpt_use_legacy_format": "the 1.7 template", "top_k": "1.0-1.5 configs", "infer": "1.0-1.3 configs",
    "pipeline": "1.0 configs", "kernel_launch_group": "1.5 configs",
    "recompute": "1.0-1.2 configs (top level)", "parallel_optimizer_comm_recompute": "1.0-1.2 configs (top level)",
    "mp_comm_recompute": "1.0-1.2 configs (top level)", "recompute_slice_activation": "1.0-1.2 configs (top level)",
    "runner_config.image_size": "1.0-1.5 configs", "runner_config.initial_epoch": "1.0 configs",
    "runner_config.has_trained_epoches": "1.0 configs", "runner_config.has_trained_steps": "1.0 configs",
    "runner_config.per_epoch_size": "1.0-1.2 configs", "runner_wrapper.sens": "1.0-1.5 configs",
    "runner_wrapper.enable_global_norm": "1.0-1.1 configs", "runner_wrapper.enable_check_overflow": "1.1-1.5 configs",
    "eval": "0.6-0.7 configs", "run_status": "0.3-0.7 configs", "no_decay_params": "0.3-0.7 configs",
    "resume_checkpoint_path": "0.3 configs", "resume_or_finetune_checkpoint": "0.2-0.3 configs",
    "runner_config.layer_decay": "0.2-0.3 configs", "runner_wrapper.clip_norm": "0.2 configs",
}
_OTHER_TOP = tuple(k for k in OTHER_RELEASES if "." not in k)
TOP = GENERAL + SECTIONS + OURS

#: sections whose keys MindFormers' template fixes (it refuses others); hyperparallel adds
#: ``parallel_config.pp_interleave_num`` (its older spelling of MindFormers 1.9's
#: ``model.model_config.pp_interleave_num``)
STRICT: Dict[str, Tuple[str, ...]] = {
    "parallel_config": ("data_parallel", "model_parallel", "context_parallel", "expert_parallel", "pipeline_stage",
                        "micro_batch_num", "seq_split_num", "use_seq_parallel", "optimizer_shard",
                        "gradient_aggregation_group", "vocab_emb_dp", "context_parallel_algo", "ulysses_degree_in_cp",
                        "mem_coeff", "pp_interleave_num"),
    "recompute_config": ("recompute", "select_recompute", "parallel_optimizer_comm_recompute",
                         "select_comm_recompute", "mp_comm_recompute", "recompute_slice_activation",
                         "select_recompute_exclude", "select_comm_recompute_exclude"),
    "swap_config": ("swap", "layer_swap", "op_swap", "default_prefetch"),
    "runner_config": ("batch_size", "epochs", "sink_mode", "sink_size", "gradient_accumulation_steps", "num_classes",
                      "stop_step"),
    "monitor_config": ("monitor_on", "dump_path", "target", "invert", "step_interval", "local_loss_format",
                       "local_norm_format", "device_local_norm_format", "device_local_loss_format",
                       "optimizer_state_format", "weight_state_format", "max_attention_logit_format",
                       "throughput_baseline", "print_struct", "check_for_global_norm", "global_norm_spike_threshold",
                       "global_norm_spike_count_threshold", "stable_rank_config", "health_checkpoint"),
    # the keys of MindFormers' train-one-step wrappers (MFTrainOneStepCell, MFPipelineWithLossScaleCell)
    "runner_wrapper": ("type", "scale_sense", "use_clip_grad", "max_grad_norm", "local_norm",
                       "calculate_per_token_loss", "use_skip_data_by_global_norm", "global_norm_spike_threshold"),
}

#: the generated data's image mix when ``data:`` does not give it (``data/synthetic.py`` defaults; the cost
#: estimate reads them too)
SYNTHETIC_IMAGES = {"images_per_sample": (0.2, 0.4, 0.3, 0.1), "video_prob": 0.1, "video_frames": 6}

#: MindFormers' train-step wrappers; hyperparallel's step does what they do (update, clipping)
WRAPPERS = ("MFTrainOneStepCell", "MFPipelineWithLossScaleCell", "TrainOneStepCell", "TrainOneStepWithLossScaleCell",
            "PipelineCellWithTwoOutput")


def _section(raw: dict, name: str):
    v = raw.get(name)
    return v if isinstance(v, dict) else {}


def check_keys(raw: dict) -> None:
    """Refuse an unknown key at the top level or in a section MindFormers' template fixes (the nearest
    known key suggested). ``model``, ``data``, ``train`` and ``mpipe`` are checked by their own readers."""
    if set(raw) - set(TOP) - set(_OTHER_TOP):
        raise unknown_key("", {k: v for k, v in raw.items() if k not in _OTHER_TOP}, TOP,
                          "at the top level of the recipe")
    for sec, known in STRICT.items():
        v = raw.get(sec)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise SpecError(sec, f"must be a mapping (keys: {', '.join(known)}), got {v!r}")
        other = {k for k in v if f"{sec}.{k}" in OTHER_RELEASES}
        if set(v) - set(known) - other:
            raise unknown_key(sec, {k: x for k, x in v.items() if k not in other}, known)


def other_release_keys(raw: dict) -> List[str]:
    """The keys of this recipe that only other MindFormers releases define (:data:`OTHER_RELEASES`)."""
    def present(path):
        *parents, last = path.split(".")
        node = value_at(raw, ".".join(parents)) if parents else raw
        return isinstance(node, dict) and last in node
    return [k for k in OTHER_RELEASES if present(k)]


def other_release_note(raw: dict) -> str:
    """The one line ``plan``, ``check`` and ``simulate`` print for them ('' when there are none)."""
    keys = other_release_keys(raw)
    if not keys:
        return ""
    return ("note: keys of other MindFormers releases, without effect on the plan: "
            + ", ".join(f"{k} ({OTHER_RELEASES[k]})" for k in keys))


# -- what the runtime cannot do -----------------------------------------------------------------

def value_at(raw, path: str):
    """The value at a dotted key (``runner_wrapper.max_grad_norm``), None when any part is absent."""
    node = raw
    for p in path.split("."):
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def _true(v) -> bool:
    return v is True or (isinstance(v, str) and v.lower() == "true")


def _more_than_one(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1


def _on(v) -> bool:
    """A recompute setting that asks for something: true, a per-stage layer count list with a count
    (``[1, 1]``, ``[[1], [0]]``), a list of op patterns, a non-empty mapping of patterns."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        return v.strip().lower() not in ("", "false")
    if isinstance(v, (int, float)):
        return v != 0
    if isinstance(v, (list, tuple)):
        return any(isinstance(x, str) or _on(x) for x in v)
    if isinstance(v, dict):
        return bool(v)
    return v is not None


def _nonzero(v) -> bool:
    return v not in (None, 0, False)


def _named(v) -> bool:
    """true, or a string naming something (``resume_training: checkpoint_name``); not false or empty."""
    return v is True or (isinstance(v, str) and v.strip().lower() not in ("", "false"))


def _false(v) -> bool:
    return v is False or (isinstance(v, str) and v.lower() == "false")


def _not_off(v) -> bool:
    """A MindSpore on/off switch other than its default "OFF" (``context.deterministic: ON``)."""
    return not (v is False or (isinstance(v, str) and v.strip().upper() in ("OFF", "FALSE", "")))


#: (key, refused when, what to give instead)
_REFUSED = (
    ("parallel_config.context_parallel", _more_than_one, "1: no context parallelism"),
    ("parallel_config.expert_parallel", _more_than_one, "1: no expert parallelism"),
    ("parallel_config.use_seq_parallel", _true, "false: no sequence parallelism"),
    ("parallel.enable_parallel_optimizer", _true, "false; shard the optimizer state with "
                                                  "parallel_config.optimizer_shard: true or train.zero: 1 or 2"),
    ("micro_batch_interleave_num", _more_than_one, "1: no micro-batch interleaving"),
    ("recompute_config.select_recompute", _on, "false: no selective recompute"),
    ("recompute_config.select_comm_recompute", _on, "false: no selective recompute"),
    ("swap_config.swap", _true, "false: no activation swapping"),
    ("runner_config.gradient_accumulation_steps", _more_than_one,
     "1: raise parallel_config.micro_batch_num instead (a pipeline step already accumulates its micro-batches)"),
    ("runner_wrapper.calculate_per_token_loss", _true, "false; give the top-level calculate_per_token_loss (MindFormers' "
                                                        "trainer sets the wrapper's from it)"),
    ("runner_wrapper.use_skip_data_by_global_norm", _true, "false: steps are never skipped"),
    ("use_skip_data_by_global_norm", _true, "false: steps are never skipped"),
    ("resume_training", _named, "false: resume with hyperparallel train --resume / --resume-from"),
    ("use_legacy", _false, "true or leave it out: hyperparallel builds MindFormers' legacy model (or a mindone "
                           "model), not the mcore one"),
    ("context.deterministic", _not_off, "OFF: hyperparallel's runtime does not set MindSpore's deterministic mode"),
    ("parallel.strategy_ckpt_load_file", _named, "none: graph-mode strategy files are not read (the plan comes from "
                                                 "parallel_config and mpipe)"),
    ("do_eval", _true, "false: no evaluation during training"),
    ("layer_scale", _true, "false: no layer-wise learning-rate scale"),
    ("lr_scale", _true, "false: no batch-size learning-rate scale"),
    ("profile", _true, "false: measure with hyperparallel profile / bench"),
    ("moe_config.expert_num", _more_than_one, "1: no mixture-of-experts models"),
    ("model.model_config.mtp_depth", _nonzero,
     "0: no multi-token-prediction layers (plan counts them in the layout, as MindFormers does; no model here "
     "builds them)"),
    ("recompute", _on, "false: no recompute (and MindFormers 1.9.0 reads recompute_config.recompute, not this "
                       "1.0-1.2 top-level key)"),
)

#: keys of other releases that would change the training (in sections MindFormers 1.9.0 checks, or top-level
#: ones that load weights or set weight decay), refused for training with what 1.9.0 reads
_OLD_SECTION_KEYS = {
    "resume_checkpoint_path": "not read; start from weights with model.pretrained or train --resume-from",
    "resume_or_finetune_checkpoint": "not read; start from weights with model.pretrained or train --resume-from",
    "no_decay_params": "not read; MindFormers 1.9.0's trainer leaves 1-D parameters and biases out of weight decay "
                       "by its own rule (as the runtime does); remove it",
    "runner_config.layer_decay": "not a runner_config key of MindFormers 1.9.0; layer-wise learning rates are not "
                                 "supported; remove it",
    "runner_wrapper.clip_norm": "MindFormers 1.9.0 spells clipping use_clip_grad (with max_grad_norm); give those",
    "runner_config.image_size": "not a runner_config key of MindFormers 1.9.0 (its RunnerConfig refuses it); "
                                "remove it",
    "runner_config.initial_epoch": "not read; resume with hyperparallel train --resume / --resume-from",
    "runner_config.has_trained_epoches": "not read; resume with hyperparallel train --resume / --resume-from",
    "runner_config.has_trained_steps": "not read; resume with hyperparallel train --resume / --resume-from",
    "runner_config.per_epoch_size": "not a runner_config key of MindFormers 1.9.0; the steps come from "
                                    "runner_config.epochs and the data set (or train.steps)",
    "runner_wrapper.sens": "MindFormers 1.9.0 spells the loss scale scale_sense; give runner_wrapper.scale_sense",
    "runner_wrapper.enable_global_norm": "MindFormers 1.9.0 spells clipping use_clip_grad (with max_grad_norm); "
                                         "give those",
    "runner_wrapper.enable_check_overflow": "overflow checks come with the loss scale (runner_wrapper.scale_sense); "
                                            "remove it",
}


def _scale_sense_ok(v) -> bool:
    """A loss scale the runtime applies: a number or a loss-scale update cell (its fields are checked by
    :func:`hyperparallel.recipe.train.loss_scale_of`)."""
    return v is None or isinstance(v, dict) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def train_refusals(raw: dict, device: str) -> List[Tuple[str, str]]:
    """(key, why) of every value the runtime cannot train with, in a stable order."""
    out = []
    for key, bad, instead in _REFUSED:
        v = value_at(raw, key)
        if v is not None and bad(v):
            out.append((key, f"{v!r} is not supported; give {instead}"))
    for key, why in _OLD_SECTION_KEYS.items():
        if value_at(raw, key) is not None:
            out.append((key, f"a key of MindFormers {OTHER_RELEASES[key]}: {why}"))
    pc = _section(raw, "parallel_config")
    if pc.get("optimizer_shard") is True and "zero" not in _section(raw, "train"):
        try:   # the plan reads it as no sharding over a single replica; a run would not be what it asks
            check_zero(1, pc.get("data_parallel", 1), "parallel_config.optimizer_shard")
        except SpecError as e:
            out.append((e.field, str(e)[len(e.field) + 2:]))
    rm = raw.get("run_mode")
    if rm is not None and rm not in ("train", "finetune"):
        out.append(("run_mode", f"{rm!r}: hyperparallel trains (allowed: train, finetune)"))
    if raw.get("grouped_lr_schedule") is not None:
        out.append(("grouped_lr_schedule", "per-group learning rates are not supported; give one lr_schedule"))
    for key in ("load_checkpoint", "pretrained_model_dir", "remote_save_url", "data_skip_steps"):
        v = raw.get(key)
        if v not in (None, "", False):
            instead = {"load_checkpoint": "model.pretrained (a Hugging Face directory) or train --resume-from",
                       "pretrained_model_dir": "model.pretrained",
                       "remote_save_url": "train --save-dir",
                       "data_skip_steps": "train --resume-from (the data continue at the checkpoint)"}[key]
            out.append((key, f"{v!r} is not read by hyperparallel's runtime; use {instead}"))
    rw = _section(raw, "runner_wrapper")
    if rw.get("type") is not None and rw["type"] not in WRAPPERS:
        out.append(("runner_wrapper.type", f"{rw['type']!r} unknown; allowed: {', '.join(WRAPPERS)}"))
    if not _scale_sense_ok(rw.get("scale_sense")):
        out.append(("runner_wrapper.scale_sense", f"{rw['scale_sense']!r}: give a number (a static scale; 1.0: none) "
                                                  "or {type: DynamicLossScaleUpdateCell | FixedLossScaleUpdateCell, "
                                                  "loss_scale_value, ...}"))
    ctx = _section(raw, "context")
    if "mode" in ctx and ctx["mode"] not in (1, "PYNATIVE_MODE"):
        out.append(("context.mode", f"{ctx['mode']!r}: hyperparallel's runtime runs PyNative; give 1 (PYNATIVE_MODE)"))
    if "device_target" in ctx and ctx["device_target"] != device:
        out.append(("context.device_target", f"{ctx['device_target']!r} differs from device: {device}; give the same"))
    for sec in ("train_dataset", "train_dataset_task"):
        if raw.get(sec) is not None:
            out.append((sec, "hyperparallel reads its data from the data: section (docs/data.md, 'Your own data'); move the "
                             "data set there"))
    return out


def check_trainable(raw: dict, device: str) -> None:
    """Refuse, before launch, the first value the runtime cannot train with (one line naming the key)."""
    found = train_refusals(raw, device)
    if found:
        key, why = found[0]
        more = f" ({len(found) - 1} more: {', '.join(k for k, _ in found[1:])})" if len(found) > 1 else ""
        raise SpecError(key, why + more)


#: MindFormers keys that change nothing in a hyperparallel run
_UNUSED_SECTIONS = ("callbacks", "eval_callbacks", "eval_dataset", "eval_dataset_task", "metric", "processor",
                    "trainer", "monitor_config")
_UNUSED_KEYS = ("output_dir", "use_parallel", "print_separate_loss", "load_ckpt_format", "auto_trans_ckpt",
                "transform_process_num", "src_strategy_path_or_dir", "only_save_strategy", "load_ckpt_async",
                "use_legacy_format", "balanced_load", "reshard_worker_num", "eval_step_interval",
                "eval_epoch_interval", "ignore_data_skip", "profile_communication", "profile_memory",
                "init_start_profile", "profile_start_step", "profile_stop_step", "profile_rank_ids",
                "profile_pipeline", "profile_level", "mstx", "layer_decay", "lr_scale_factor", "save_file",
                "input_data", "predict_batch_size", "adapter_id", "exclude_cann_cpu", "train_precision_sync",
                "infer_precision_sync", "postprocess_use_numpy", "runner_config.sink_mode", "runner_config.sink_size",
                "runner_config.num_classes", "runner_wrapper.local_norm", "parallel_config.vocab_emb_dp",
                "parallel_config.gradient_aggregation_group", "parallel_config.mem_coeff",
                "parallel_config.context_parallel_algo", "parallel_config.ulysses_degree_in_cp",
                "parallel.parallel_mode", "parallel.full_batch", "parallel.search_mode", "parallel.gradients_mean",
                "parallel.enable_alltoall", "parallel.strategy_ckpt_save_file", "parallel.strategy_ckpt_config",
                "parallel.parallel_optimizer_config", "parallel.dataset_strategy", "context.device_id",
                "context.max_device_memory", "context.max_call_depth", "context.jit_config",
                "context.memory_optimize_level", "context.save_graphs", "context.save_graphs_path",
                "context.runtime_num_threads", "context.ascend_config", "context.affinity_cpu_list")


def unused_keys(raw: dict) -> List[str]:
    """The MindFormers keys of this recipe that change nothing in a hyperparallel run (graph-mode,
    logging, evaluation, prediction), for the one line ``train`` prints."""
    out = [s for s in _UNUSED_SECTIONS if raw.get(s) is not None]
    out += [k for k in _UNUSED_KEYS if value_at(raw, k) is not None]
    out += [k for k in _OTHER_TOP if k in raw and k not in _OLD_SECTION_KEYS
            and not (k == "recompute" and _on(raw[k]))]
    return out


def batch_size_keys(raw: dict) -> List[Tuple[str, object]]:
    """(key, value) of the MindFormers batch-size keys the recipe gives: sequences per micro-batch."""
    out = []
    for key in ("runner_config.batch_size", "model.model_config.batch_size"):
        v = value_at(raw, key)
        if v is not None:
            out.append((key, v))
    return out


def check_batch_size(raw: dict, micro_batch_size: int, data_key: str = "data.micro_batch_size") -> None:
    """MindFormers' per-micro-batch batch size keys must equal the data's ``micro_batch_size``."""
    for key, v in batch_size_keys(raw):
        if v != micro_batch_size:
            raise SpecError(key, f"{v!r} but {data_key} is {micro_batch_size}; a micro-batch has one size "
                                 "(give the same value)")
