"""The fields a Hugging Face config class reads, and the refusal of every other field a recipe writes.

transformers' config classes take ``**kwargs`` and keep any unknown field as an attribute nobody reads,
so a misspelt field (``num_hiden_layers``) or a MindFormers spelling (``compute_dtype``,
``use_flash_attention``, ``pet_config``) would train the defaults without a word. The allowed set is
derived from the class itself (:func:`fields_of`), never typed by hand; only the MindFormers
spellings, which no class can tell, are tables here: :data:`MINDFORMERS_RENAMES` (a field of the class
under MindFormers' name, same meaning and value: read as that field, and said once on the console by
the front end; :func:`map_spellings`) and :data:`MINDFORMERS_SPELLINGS` (refused, with the reason).

Pure Python (the ``transformers`` config classes, no MindSpore): checked before launch by the
mindone adapter (:mod:`.qwen_vl.adapter`), for the fields the recipe writes inline (``model.model_config``).
A ``config.json`` (``model.config``, ``model.pretrained``) is the file Hugging Face wrote and reads,
older spellings included (the public Qwen2.5-VL files carry ``in_chans``): it is not checked.
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import FrozenSet, Iterable, List, Optional, Tuple

from ..errors import SpecError, nearest

_PRECISION = ("MindFormers' precision key; a Hugging Face config has one dtype for the whole model (give "
              "dtype: float32, or float16 with runner_wrapper.scale_sense; bfloat16 on Ascend): the weights stay "
              "float32 and the model computes in it; per-part compute precision is not supported")
#: MindFormers' spelling -> what to say (a field of the Hugging Face class to give instead, or why refused)
MINDFORMERS_SPELLINGS = {
    "compute_dtype": _PRECISION, "param_init_type": _PRECISION, "layernorm_compute_type": _PRECISION,
    "softmax_compute_type": _PRECISION, "rotary_dtype": _PRECISION, "embedding_init_type": _PRECISION,
    "residual_dtype": _PRECISION,
    "use_flash_attention": "MindFormers' spelling; the Hugging Face field is attn_implementation (false is read as "
                           "eager; flash attention has no CPU kernels: give attn_implementation on Ascend)",
    "pet_config": "LoRA / parameter-efficient fine-tuning is not supported yet (the whole model would be trained); "
                  "remove it",
    "use_past": "MindFormers' inference KV cache; the Hugging Face field is use_cache (false for training)",
    "seq_length": "MindFormers' spelling; the sequence length is data.seq_len (the model's limit: "
                  "max_position_embeddings)",
    "num_layers": "MindFormers' spelling; the Hugging Face field is num_hidden_layers (depth in vision_config)",
    "n_kv_heads": "MindFormers' spelling; the Hugging Face field is num_key_value_heads",
    "theta": "MindFormers' spelling; the Hugging Face field is rope_theta",
    "max_position_embedding": "MindFormers' spelling; the Hugging Face field is max_position_embeddings",
    "init_method_std": "MindFormers' initialisation std; mindone's models read no initializer_range either "
                       "(mindone 0.5.0's PreTrainedModel._init_weights does nothing: the weights start from "
                       "MindSpore's default initialisers), so no value would take effect; remove it",
    "num_heads": "MindFormers' spelling; the Hugging Face field is num_attention_heads",
}

#: MindFormers' spelling (MindFormers 1.9.0 ``LlamaConfig``) -> the Hugging Face fields of the same meaning
#: and value it is read as: the first one the section's class reads (``num_layers``: ``depth`` in a
#: ``vision_config``). Where the class reads none (``theta`` in a ``vision_config``) it is refused
#: (:data:`MINDFORMERS_SPELLINGS`).
MINDFORMERS_RENAMES = {
    "num_layers": ("num_hidden_layers", "depth"),   # MindFormers: decoder layers
    "num_heads": ("num_attention_heads",),          # a vision_config's num_heads is Hugging Face's own
    "n_kv_heads": ("num_key_value_heads",),         # None: as many as the attention heads, in both
    "theta": ("rope_theta",),
    "max_position_embedding": ("max_position_embeddings",),
    "use_flash_attention": ("attn_implementation",),   # false only: the plain attention, eager
}


def _hf_value(field: str, value, key: str):
    """The Hugging Face value of a MindFormers spelling's ``value`` (the same, except ``use_flash_attention``)."""
    if field == "use_flash_attention":
        if value is False:
            return "eager"
        raise SpecError(key, f"{value!r} is refused: {MINDFORMERS_SPELLINGS[field]}")
    if field == "max_position_embedding" and value is None:   # MindFormers reads None as its seq_length
        raise SpecError(key, "None (MindFormers' seq_length): give max_position_embeddings, the model's limit")
    return value


def map_spellings(section: dict, where: str, cls, merged: Optional[dict] = None,
                  also: Iterable[str] = ()) -> Tuple[dict, List[Tuple[str, str, str]]]:
    """(``section`` with every MindFormers spelling of :data:`MINDFORMERS_RENAMES` that ``cls`` (or ``also``)
    reads under its Hugging Face name renamed to it, one (key written, Hugging Face key, console note) per
    field renamed).

    ``merged``: the section as the config files and ``section`` together give it (default ``section``):
    the Hugging Face field set there to another value is refused, naming both keys (one setting, two
    values); the same value is accepted. Spellings ``cls`` reads under no name are left for
    :func:`check_section` to refuse."""
    known = set(fields_of(cls)) | set(also)
    merged = section if merged is None else merged
    out, renamed = dict(section), []
    for field in sorted(f for f in map(str, section) if f in MINDFORMERS_RENAMES and f not in known):
        target = next((t for t in MINDFORMERS_RENAMES[field] if t in known), None)
        if target is None:
            continue
        key = f"{where}.{field}"
        value = _hf_value(field, section[field], key)
        if target in merged and merged[target] != value:
            other = (f"{where}.{target}" if target in section else
                     f"{target} of the config file (model.pretrained / model.config)")
            raise SpecError(key, f"{section[field]!r}, but {other} is {merged[target]!r}: two spellings of one field "
                                 f"(MindFormers' {field}, Hugging Face's {target}); give one of them")
        del out[field]
        out[target] = value
        shown = f"{target}: {value}" if value != section[field] else target
        renamed.append((key, f"{where}.{target}", f"{key}: MindFormers' spelling, read as {shown}"))
    return out, renamed


@functools.lru_cache(maxsize=None)
def _popped_by_base() -> FrozenSet[str]:
    """The old spellings ``PretrainedConfig.__init__`` pops from its kwargs (``torch_dtype``,
    ``attn_implementation``, ...), read from its source."""
    from transformers import PretrainedConfig
    try:
        src = inspect.getsource(PretrainedConfig.__init__)
    except (OSError, TypeError):
        return frozenset()
    return frozenset(re.findall(r"kwargs\.pop\(\s*[\"'](\w+)[\"']", src))


def _params(fn) -> set:
    return {n for n, p in inspect.signature(fn).parameters.items()
            if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


@functools.lru_cache(maxsize=None)
def fields_of(cls) -> FrozenSet[str]:
    """Every field ``cls`` (a transformers config class) reads: its ``__init__`` parameters,
    ``PretrainedConfig``'s common ones and old spellings, its ``attribute_map`` and what its default
    instance writes (``to_dict()``: the keys of a ``config.json`` it saves)."""
    from transformers import PretrainedConfig
    out = _params(cls.__init__) | _params(PretrainedConfig.__init__) | set(_popped_by_base())
    out |= set(getattr(cls, "attribute_map", {}) or {})
    out |= set(cls().to_dict())
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def reads_flat_text(cls) -> bool:
    """Whether ``cls`` (a VLM config) builds its text config from top-level fields when ``text_config``
    is absent (Qwen2.5-VL does, for configs of the older flat layout; Qwen3-VL does not): probed."""
    text = cls.sub_configs["text_config"]
    probe = text().vocab_size + 1
    return getattr(cls(vocab_size=probe).text_config, "vocab_size", None) == probe


def refusal(key: str, field: str, known: Iterable[str], cls_name: str) -> SpecError:
    """The one-line refusal of ``field`` at ``key`` (the MindFormers spelling's reason, else did-you-mean)."""
    if field in MINDFORMERS_SPELLINGS:
        return SpecError(key, f"not a {cls_name} field: {MINDFORMERS_SPELLINGS[field]}")
    near = nearest(field, known)
    hint = f"; did you mean {near!r}?" if near else ""
    return SpecError(key, f"not a {cls_name} field (transformers would keep it unread and train its default){hint}")


def check_section(section: dict, where: str, cls, extra: Iterable[str] = (), prefixes: Tuple[str, ...] = (),
                  flat_text: Optional[type] = None, text_given: bool = False) -> None:
    """Refuse the first field of ``section`` (sorted) that ``cls`` does not read, nor ``extra`` / ``prefixes``
    (the recipe's own keys: ``offset``, ``freeze_vision``). ``flat_text``: the text config class whose fields the top level may carry (the older flat
    layout) when ``text_given`` is false; with ``text_config`` given they would be ignored: refused."""
    known = set(fields_of(cls)) | set(extra)
    text_fields = set(fields_of(flat_text)) - known if flat_text is not None else set()
    for field in sorted(map(str, section)):
        if field in known or field.startswith(prefixes):
            continue
        key = f"{where}.{field}"
        if field in text_fields:
            if not text_given and reads_flat_text(cls):
                continue
            why = "text_config is given" if text_given else f"{cls.__name__} reads the text fields from text_config"
            raise SpecError(key, f"a text-model field at the top level is ignored ({why}); give "
                                 f"{where}.text_config.{field}")
        raise refusal(key, field, sorted(known | text_fields), cls.__name__)
