"""The fields a Hugging Face config class reads, and the refusal of every other field a recipe writes.

transformers' config classes take ``**kwargs`` and keep any unknown field as an attribute nobody reads,
so a misspelt field (``num_hiden_layers``) or a MindFormers spelling (``compute_dtype``,
``use_flash_attention``, ``pet_config``) would train the defaults without a word. The allowed set is
derived from the class itself (:func:`fields_of`), never typed by hand; only the MindFormers
spellings, which no class can tell, are a table here (:data:`MINDFORMERS_SPELLINGS`).

Pure Python (the ``transformers`` config classes, no MindSpore): checked before launch by the
mindone adapter (:mod:`.qwen_vl`), for the fields the recipe writes inline (``model.model_config``).
A ``config.json`` (``model.config``, ``model.pretrained``) is the file Hugging Face wrote and reads,
older spellings included (the public Qwen2.5-VL files carry ``in_chans``): it is not checked.
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import FrozenSet, Iterable, Optional, Tuple

from ..errors import SpecError, nearest

_PRECISION = ("MindFormers' precision key; a Hugging Face config has one dtype for the whole model (give "
              "dtype: float32 on CPU); per-part compute precision is not supported")
#: MindFormers' spelling -> what to say (a field of the Hugging Face class to give instead, or why refused)
MINDFORMERS_SPELLINGS = {
    "compute_dtype": _PRECISION, "param_init_type": _PRECISION, "layernorm_compute_type": _PRECISION,
    "softmax_compute_type": _PRECISION, "rotary_dtype": _PRECISION, "embedding_init_type": _PRECISION,
    "residual_dtype": _PRECISION,
    "use_flash_attention": "MindFormers' spelling; the Hugging Face field is attn_implementation (give eager on CPU)",
    "pet_config": "LoRA / parameter-efficient fine-tuning is not supported yet (the whole model would be trained); "
                  "remove it",
    "use_past": "MindFormers' inference KV cache; the Hugging Face field is use_cache (false for training)",
    "seq_length": "MindFormers' spelling; the sequence length is data.seq_len (the model's limit: "
                  "max_position_embeddings)",
    "num_layers": "MindFormers' spelling; the Hugging Face field is num_hidden_layers (depth in vision_config)",
    "n_kv_heads": "MindFormers' spelling; the Hugging Face field is num_key_value_heads",
    "theta": "MindFormers' spelling; the Hugging Face field is rope_theta",
    "max_position_embedding": "MindFormers' spelling; the Hugging Face field is max_position_embeddings",
    "init_method_std": "MindFormers' spelling; the Hugging Face field is initializer_range",
}


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
