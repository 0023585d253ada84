"""LoRA through mindone's own ``mindone.peft``: the recipe's ``model.lora`` section, which modules it adapts,
and the injection into the whole mindone model.

``model.lora`` takes PEFT's ``LoraConfig`` field names and defaults (:data:`FIELDS`). PEFT's injection
(``get_peft_model``) runs on the whole model before it is cut into chunks, so parameter names and
maths are PEFT's own (``base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight``)
on every rank and in the reference alike. Which modules a target matches is PEFT's rule
(``check_target_module_exists``: a string is a regular expression matched in full, a list entry
matches a name equal to it or ending in ``.entry``; ``modules_to_save`` entries match a name ending in
them), applied here to the model's module names computed from the config (:func:`module_names`, pure
Python), so a target that matches nothing is refused before launch.

Every base weight is frozen by PEFT (``requires_grad`` False); :func:`inject` marks them
(:func:`is_frozen_base`) so the runtime leaves them out of the weight grads, the optimizer and the
checkpoints: a checkpoint holds the adapters (and ``modules_to_save``) only; the base comes from
``model.pretrained`` (else from the run's seed, as every rank builds it). A region with an adapter is a
trained region of the plan (B and W run; W computes the adapters' grads only); a region without one
must be frozen in the plan, and an adapter on a region the plan freezes is refused
(:func:`check_regions`).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

from ..errors import SpecError, unknown_key

#: ``model.lora`` fields: PEFT's ``LoraConfig`` names and defaults (mindone.peft 0.5.0 = PEFT's)
FIELDS = {"r": 8, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": None, "exclude_modules": None,
          "modules_to_save": None, "bias": "none", "use_rslora": False, "init_lora_weights": True}
BIASES = ("none", "all", "lora_only")
INITS = (True, False, "gaussian")
#: the module kinds PEFT's LoRA adapts here (mindone.peft's lora.Linear; its Embedding and Conv layers are not
#: exercised on these models, so a target naming one is refused)
ADAPTABLE = ("Linear",)
FROZEN_MARK = "_hp_frozen_base"   # set on every frozen base Parameter by :func:`inject`
KEY = "model.lora"


def _names(value, key: str) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value or \
            not all(isinstance(v, str) and v for v in value):
        raise SpecError(key, f"must be a non-empty list of module names, got {value!r}")
    return list(value)


def parse(section) -> Optional[dict]:
    """The checked ``model.lora`` section with PEFT's defaults filled in (None when absent)."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise SpecError(KEY, f"must be a mapping of LoraConfig fields ({', '.join(FIELDS)}), got {section!r}")
    if set(section) - set(FIELDS):
        raise unknown_key(KEY, section, FIELDS, "(PEFT's LoraConfig field names)")
    out = dict(FIELDS, **section)
    r = out["r"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise SpecError(f"{KEY}.r", f"must be a positive whole number (the adapter's rank), got {r!r}")
    a = out["lora_alpha"]
    if isinstance(a, bool) or not isinstance(a, (int, float)) or a <= 0:
        raise SpecError(f"{KEY}.lora_alpha", f"must be a positive number, got {a!r}")
    d = out["lora_dropout"]
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
        raise SpecError(f"{KEY}.lora_dropout", f"must be in [0, 1), got {d!r}")
    t = out["target_modules"]
    if t is None:
        raise SpecError(f"{KEY}.target_modules", "missing; give the modules to adapt (e.g. [q_proj, v_proj]: "
                                                 "PEFT has no default list for mindone's Qwen-VL models)")
    if not isinstance(t, str):
        out["target_modules"] = _names(t, f"{KEY}.target_modules")
    elif not _regex(t, f"{KEY}.target_modules"):
        raise SpecError(f"{KEY}.target_modules", "must not be empty")
    e = out["exclude_modules"]
    if e is not None and not isinstance(e, str):
        out["exclude_modules"] = _names(e, f"{KEY}.exclude_modules")
    elif isinstance(e, str):
        _regex(e, f"{KEY}.exclude_modules")
    out["modules_to_save"] = _names(out["modules_to_save"], f"{KEY}.modules_to_save")
    if out["bias"] not in BIASES:
        raise SpecError(f"{KEY}.bias", f"{out['bias']!r} unknown; allowed: {', '.join(BIASES)}")
    if not isinstance(out["use_rslora"], bool):
        raise SpecError(f"{KEY}.use_rslora", f"must be true or false, got {out['use_rslora']!r}")
    if out["init_lora_weights"] not in INITS or isinstance(out["init_lora_weights"], int) and \
            not isinstance(out["init_lora_weights"], bool):
        raise SpecError(f"{KEY}.init_lora_weights", f"{out['init_lora_weights']!r} unknown; allowed: true, "
                                                    "false, gaussian")
    return out


def _regex(text: str, key: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise SpecError(key, f"{text!r} is not a regular expression: {e}") from None
    return text


# -- module names (pure Python, from the config) -----------------------------------------------

def module_names(kind: str, vision_depth: int, text_layers: int, deepstack: int = 0) -> Dict[str, str]:
    """{module name: class kind} of mindone's whole Qwen2.5-VL (``kind`` qwen2_5_vl) or Qwen3-VL (qwen3_vl)
    model, as ``Cell.cells_and_names`` names them (the root left out); the kind is ``Linear``,
    ``Embedding``, ``Conv3d`` or ``other``. tests/unit/test_lora.py checks it against the built models."""
    L, E, C, O = "Linear", "Embedding", "Conv3d", "other"
    out = {"model": O, "model.visual": O, "model.visual.patch_embed": O, "model.visual.patch_embed.proj": C,
           "model.visual.rotary_pos_emb": O, "model.visual.blocks": O, "model.visual.merger": O,
           "model.language_model": O, "model.language_model.embed_tokens": E, "model.language_model.layers": O,
           "model.language_model.norm": O, "model.language_model.rotary_emb": O, "lm_head": L}
    q25 = kind == "qwen2_5_vl"
    block = {"": O, ".norm1": O, ".norm2": O, ".attn": O, ".attn.qkv": L, ".attn.proj": L, ".mlp": O,
             ".mlp.act_fn": O}
    block.update({".mlp.gate_proj": L, ".mlp.up_proj": L, ".mlp.down_proj": L} if q25 else
                 {".mlp.linear_fc1": L, ".mlp.linear_fc2": L})
    layer = {"": O, ".input_layernorm": O, ".post_attention_layernorm": O, ".self_attn": O, ".mlp": O,
             ".mlp.act_fn": O, ".mlp.gate_proj": L, ".mlp.up_proj": L, ".mlp.down_proj": L}
    layer.update({f".self_attn.{p}_proj": L for p in "qkvo"})
    layer.update({".self_attn.rotary_emb": O} if q25 else {".self_attn.q_norm": O, ".self_attn.k_norm": O})
    merger = ({".ln_q": O, ".mlp": O, ".mlp.0": L, ".mlp.1": O, ".mlp.2": L} if q25 else
              {".norm": O, ".linear_fc1": L, ".act_fn": O, ".linear_fc2": L})
    for i in range(vision_depth):
        out.update({f"model.visual.blocks.{i}{k}": v for k, v in block.items()})
    for i in range(text_layers):
        out.update({f"model.language_model.layers.{i}{k}": v for k, v in layer.items()})
    out.update({f"model.visual.merger{k}": v for k, v in merger.items()})
    if not q25:
        out["model.visual.pos_embed"] = E
        if deepstack:
            out["model.visual.deepstack_merger_list"] = O
        for i in range(deepstack):
            out.update({f"model.visual.deepstack_merger_list.{i}{k}": v for k, v in dict(merger, **{"": O}).items()})
    return out


def region_of(name: str) -> str:
    """The adapter region of a module name: ``vision`` (mindone's ``model.visual``) or ``llm``."""
    return "vision" if name.startswith("model.visual") else "llm"


def _hits(target: str, names, as_regex: bool) -> List[str]:
    if as_regex:
        return [n for n in names if re.fullmatch(target, n)]
    return [n for n in names if n == target or n.endswith("." + target)]


def adapted(cfg: dict, names: Dict[str, str]) -> Dict[str, List[str]]:
    """{region: module names that get an adapter or a trained copy} of the LoRA config ``cfg``
    (:func:`parse`) on the model's ``names`` (:func:`module_names`); SpecError naming the target that
    matches no module, or matches one LoRA cannot adapt here."""
    t, excl = cfg["target_modules"], cfg.get("exclude_modules")
    excluded = set(_hits(excl, names, True)) if isinstance(excl, str) else \
        {n for e in excl or [] for n in _hits(e, names, False)}
    targets = [t] if isinstance(t, str) else t
    out: Dict[str, List[str]] = {}
    for target in targets:
        hit = [n for n in _hits(target, names, isinstance(t, str)) if n not in excluded]
        if not hit:
            raise SpecError(f"{KEY}.target_modules", f"{target!r} matches no module of the model (Linear "
                                                     f"layers here: {_examples(names)})")
        bad = [n for n in hit if names[n] not in ADAPTABLE]
        if bad:
            raise SpecError(f"{KEY}.target_modules", f"{target!r} matches {bad[0]} ({names[bad[0]]}); LoRA adapts "
                                                     f"{', '.join(ADAPTABLE)} layers here")
        for n in hit:
            out.setdefault(region_of(n), []).append(n)
    for target in cfg.get("modules_to_save") or []:
        hit = [n for n in names if n.endswith(target)]   # PEFT's rule for modules_to_save
        if not hit:
            raise SpecError(f"{KEY}.modules_to_save", f"{target!r} matches no module of the model")
        for n in hit:
            out.setdefault(region_of(n), []).append(n)
    return out


def _examples(names: Dict[str, str]) -> str:
    leaf = sorted({n.rsplit(".", 1)[-1] for n, k in names.items() if k == "Linear"})
    return ", ".join(leaf)


def check_regions(cfg: dict, names: Dict[str, str], trainable: Dict[str, bool]) -> None:
    """Refuse a plan that freezes a region LoRA adapts, or trains a region without an adapter (where
    every base weight is frozen: nothing would train), naming the key. ``trainable``: the plan's
    ``{region: trainable}`` in data-flow order."""
    regions = adapted(cfg, names)
    saved = adapted(dict(cfg, target_modules=[], exclude_modules=None), names) if cfg.get("modules_to_save") else {}
    last = list(trainable)[-1] if trainable else None
    for region, on in trainable.items():
        how = f"model.model_config.freeze_{region}: true" + ("" if region == last else
                                                              " or mpipe.encoder.trainable: false")
        if regions.get(region) and not on:
            name = regions[region][0]
            key = "modules_to_save" if name in saved.get(region, []) else "target_modules"
            raise SpecError(f"{KEY}.{key}", f"adapts {name} but the plan freezes region {region!r} (model.model_config."
                                            f"freeze_{region} or mpipe.encoder.trainable); drop it or train the region")
        if on and not regions.get(region):
            raise SpecError(KEY, f"no adapter in region {region!r} (target_modules and modules_to_save match "
                                 f"nothing there) but the plan trains it; freeze it ({how}) or adapt a module there")


# -- MindSpore ---------------------------------------------------------------------------------

def inject(net, cfg: dict):
    """``get_peft_model(net, LoraConfig(**cfg))`` (mindone.peft): the adapters injected into ``net`` in place,
    the base frozen; returns the PeftModel. Each frozen base Parameter is marked (:func:`is_frozen_base`)."""
    from mindone.peft import LoraConfig, get_peft_model
    model = get_peft_model(net, LoraConfig(**cfg))
    for p in model.get_parameters():
        if not p.requires_grad:
            setattr(p, FROZEN_MARK, True)
    return model


def is_frozen_base(p) -> bool:
    """A base weight LoRA froze: not in the weight grads, the optimizer or the checkpoints."""
    return bool(getattr(p, FROZEN_MARK, False))


def trained(params) -> list:
    """``params`` without the frozen base weights."""
    return [p for p in params if not is_frozen_base(p)]
