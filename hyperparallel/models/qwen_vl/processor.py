"""The processor files of an exported Hugging Face directory (``ckpt --export-hf``): the tokenizer, the
chat template of the project's Qwen layout (:mod:`.chat`) and the image and video
preprocessor configs, so ``AutoProcessor.from_pretrained(OUT)`` lays a conversation out as training did.

At save time a run of a ``conversations`` recipe records in ``meta.json`` under ``processor``
(:func:`processor_record`) where its tokenizer came from and the image settings it used; the export
builds the processor from that record with transformers' / mindone's classes and their
``save_pretrained``. A step without the record (saved by an older release) exports without them, said.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import List, Optional, Tuple

# the arch -> mindone processor class that writes its files (Qwen2.5-VL: the layout's model)
PROCESSORS = {"Qwen2_5_VLForConditionalGeneration": "Qwen2_5_VLProcessor"}


def processor_record(cfg) -> Optional[dict]:
    """What ``meta.json`` records of a run's processor from its data config (a ``conversations``
    :class:`~hyperparallel.data.conversations_config.ConversationsConfig`, its values in effect: recipe keys over
    ``preprocessor_config`` over Qwen's defaults); None for data without a tokenizer (synthetic)."""
    from ...data.conversations_config import ConversationsConfig
    if not isinstance(cfg, ConversationsConfig):
        return None
    return {"tokenizer": os.path.abspath(cfg.tokenizer), "min_pixels": cfg.min_pixels, "max_pixels": cfg.max_pixels,
            "image_mean": [float(x) for x in cfg.image_mean], "image_std": [float(x) for x in cfg.image_std],
            "system_prompt": cfg.system_prompt, "fps": float(cfg.fps), "min_frames": int(cfg.min_frames),
            "max_frames": int(cfg.max_frames)}


def chat_template(system_prompt: Optional[str] = None) -> str:
    """A Jinja chat template laying messages out as :func:`~.chat.encode_chat`
    does: ``<|im_start|>ROLE\\n CONTENT <|im_end|>\\n`` per turn, an image part as
    ``<|vision_start|><|image_pad|><|vision_end|>`` (the processor repeats the pad per merged patch), a video
    part as ``<|vision_start|><|video_pad|><|vision_end|>`` (Qwen2.5-VL's one group), the
    recipe's ``system_prompt`` first when the messages have no system turn (no default one otherwise)."""
    head = ""
    if system_prompt is not None:
        head = ("{%- if messages[0]['role'] != 'system' -%}{{ '<|im_start|>system\\n' + " + repr(system_prompt)
                + " + '<|im_end|>\\n' }}{%- endif -%}")
    return head + (
        "{%- for message in messages -%}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
        "{%- elif part['type'] == 'video' -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{ '<|im_end|>\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


def write_processor(record: Optional[dict], cfg: dict, out: str) -> Tuple[List[str], str]:
    """Write the processor files of ``record`` (:func:`processor_record`) into ``out`` for the model of
    Hugging Face config ``cfg``. Returns (the files written, '') or ([], why none were written)."""
    arch = (cfg.get("architectures") or [None])[0]
    if not record:
        return [], ("the step's meta.json records no tokenizer (saved by an older hyperparallel, or its recipe's "
                    "data names none)")
    if arch not in PROCESSORS:
        return [], f"no processor is written for {arch} (only {', '.join(PROCESSORS)})"
    tok_file = record.get("tokenizer")
    if not tok_file or not os.path.isfile(tok_file):
        return [], f"the run's tokenizer {tok_file} is not there any more"
    with _sys_path_kept():
        return _write(record, cfg, out, arch, tok_file)


@contextlib.contextmanager
def _sys_path_kept():
    """mindone.transformers' processor classes put folders of mindone's own package at the front of
    ``sys.path`` (``processing_utils.get_possibly_dynamic_module``, the auto classes' ``*_class_from_name``);
    after that, ``import deprecated`` in the same process finds mindone's ``models/deprecated`` package
    instead of the PyPI ``deprecated`` MindFormers imports. ``sys.path`` is put back after using them."""
    saved = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = saved


def _write(record: dict, cfg: dict, out: str, arch: str, tok_file: str) -> Tuple[List[str], str]:
    import mindone.transformers as mt
    from transformers.models.qwen2.tokenization_qwen2_fast import Qwen2TokenizerFast
    from mindone.transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from mindone.transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    vis = cfg.get("vision_config") or {}
    geometry = {"patch_size": vis.get("patch_size", 14), "temporal_patch_size": vis.get("temporal_patch_size", 2),
                "merge_size": vis.get("spatial_merge_size", 2)}
    # the layout's tokens: <|endoftext|> pads (as the data pads), <|im_end|> ends an answer
    tok = Qwen2TokenizerFast(tokenizer_file=tok_file, eos_token="<|im_end|>",
                             pad_token="<|endoftext|>")
    image = Qwen2VLImageProcessor(min_pixels=record["min_pixels"], max_pixels=record["max_pixels"],
                                  image_mean=record["image_mean"], image_std=record["image_std"], **geometry)
    frames = {k: record[k] for k in ("fps", "min_frames", "max_frames") if k in record}   # older records: defaults
    video = Qwen2VLVideoProcessor(image_mean=record["image_mean"], image_std=record["image_std"],
                                  min_pixels=record["min_pixels"], max_pixels=record["max_pixels"],
                                  size={"shortest_edge": record["min_pixels"], "longest_edge": record["max_pixels"]},
                                  **frames, **geometry)
    proc = getattr(mt, PROCESSORS[arch])(image_processor=image, tokenizer=tok, video_processor=video,
                                         chat_template=chat_template(record.get("system_prompt")))
    before = set(os.listdir(out))
    proc.save_pretrained(out)
    return sorted(set(os.listdir(out)) - before), ""
