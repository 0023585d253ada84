"""MindFormers' own rules for a training config: layer layout, scheduler keys, model towers.

Pure functions over the recipe dictionary, no MindSpore. Each rule cites the MindFormers 1.9.0 /
MindSpore 2.9.0 function it reproduces, and refuses (one-line :class:`SpecError` naming the key
the user set) exactly where that function raises, plus where the planner cannot follow
(a chunk without layers, a scheduler the schedule algebra has no order for).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

from ..mpipe import orders
from ..errors import SpecError, is_whole, whole

#: ``parallel.pipeline_config.pipeline_scheduler`` values MindSpore 2.9 accepts.
SCHEDULERS = ("gpipe", "1f1b", "seqpipe", "seqvpp", "seqsmartvpp", "zero_bubble_v")
#: Layer-count keys of a model (or tower) config, in the order they are looked for.
LAYER_KEYS = ("num_hidden_layers", "num_layers", "depth")
#: Tower keys under ``model.model_config`` that hold the language model.
LLM_TOWERS = ("llm_model", "language_model", "text_model", "text_config", "llm_config")
_SUFFIXES = ("_model", "_config", "_tower", "_encoder")
_ALIASES = {"visual": "vision", "vit": "vision", "image": "vision", "language": "llm", "language_model": "llm",
            "text": "llm", "llm": "llm"}


def _read_config(key: str, path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except OSError as e:
        raise SpecError(key, f"{path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise SpecError(key, f"{path}: not a JSON config ({str(e).splitlines()[0]})") from None
    if not isinstance(out, dict):
        raise SpecError(key, f"{path}: a config must be a JSON object")
    return out


def _deep(dst: dict, src: dict) -> dict:
    out = dict(dst)
    for k, v in src.items():
        out[k] = _deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def pretrained_model_dir_config(raw: dict) -> Optional[str]:
    """The ``config.json`` of MindFormers' top-level ``pretrained_model_dir`` (its newer configs take the
    model's sizes from that Hugging Face directory), or None when the key is absent or the directory has
    none (a placeholder path of a public config)."""
    d = raw.get("pretrained_model_dir")
    cfg = os.path.join(d, "config.json") if isinstance(d, str) and d else None
    return cfg if cfg and os.path.isfile(cfg) else None


def model_config(raw: dict) -> dict:
    """The model's config fields: ``model.pretrained``'s ``config.json`` (a Hugging Face model
    directory; else that of MindFormers' ``pretrained_model_dir``, where it has one), then ``model.config``
    (a ``config.json`` path), then the inline ``model.model_config``, each deep-merged over the one before.
    Without config files: ``model.model_config`` itself."""
    model = raw.get("model")
    if not isinstance(model, dict):
        return {}
    inline = model.get("model_config") if isinstance(model.get("model_config"), dict) else {}
    files = []
    if model.get("pretrained"):
        cfg = os.path.join(str(model["pretrained"]), "config.json")
        if not os.path.isfile(cfg):
            raise SpecError("model.pretrained", f"{model['pretrained']}: not a Hugging Face model directory "
                                                "(no config.json)")
        files.append(("model.pretrained", cfg))
    elif pretrained_model_dir_config(raw):
        files.append(("pretrained_model_dir", pretrained_model_dir_config(raw)))
    if model.get("config"):
        files.append(("model.config", str(model["config"])))
    if not files:
        return inline
    out: dict = {}
    for key, path in files:
        out = _deep(out, _read_config(key, path))
    return _deep(out, inline)


def is_mindformers_config(raw: dict) -> bool:
    """A MindFormers training config: its ``model:`` section has ``model_config`` or ``arch``."""
    model = raw.get("model")
    return isinstance(model, dict) and bool({"model_config", "arch", "config", "pretrained"} & set(model))


# -- layer layout ------------------------------------------------------------------------------

def _offset_grid(offset, P: int, V: int, key: str) -> List[List[int]]:
    """``offset`` broadcast to V rows of P, after MindFormers' shape and sum checks."""
    if is_whole(offset):
        return [[offset] * P for _ in range(V)]
    if isinstance(offset, list) and offset and all(is_whole(x) for x in offset):
        if len(offset) != P:
            raise SpecError(key, f"{offset} has {len(offset)} entries; MindFormers needs pipeline_stage ({P}) "
                                 "entries (offset.shape[-1] == pp)")
        return [list(offset) for _ in range(V)]
    if isinstance(offset, list) and offset and all(isinstance(r, list) and r and all(is_whole(x) for x in r)
                                                   for r in offset):
        bad = [len(r) for r in offset if len(r) != P]
        if bad:
            raise SpecError(key, f"{offset} has rows of {bad[0]} entries; MindFormers needs pipeline_stage ({P}) "
                                 "entries per row (offset.shape[-1] == pp)")
        if len(offset) != V:
            raise SpecError(key, f"{offset} has {len(offset)} rows; MindFormers needs pp_interleave_num ({V}) "
                                 "rows of pipeline_stage entries (offset.shape[-2] == pp_interleave_num)")
        return [list(r) for r in offset]
    raise SpecError(key, f"must be a whole number, a list of pipeline_stage ({P}) whole numbers, or "
                         f"pp_interleave_num ({V}) such lists; got {offset!r}")


def _flat_sum(offset) -> int:
    if is_whole(offset):
        return offset
    return sum(x if is_whole(x) else sum(x) for x in offset)


def layer_layout(num_layers: int, offset, P: int, V: int, key: str = "model.model_config.offset",
                 zbv: bool = False) -> Tuple[int, ...]:
    """Layers of every pipeline chunk (data-flow order, chunk ``v*P + p``) as MindFormers lays them out.

    Reproduces ``LayerSetting.__init__`` and ``LayerSetting._check_inputs`` of
    ``mindformers/parallel_core/training_graph/transformer/utils.py`` (used by the legacy Llama
    and the mcore transformer block alike): ``offset`` (scalar 0 when absent) must have P
    entries per row and V rows, and its entries (before broadcasting) must sum to
    ``num_layers % (P*V)``; it is broadcast to V x P and added to ``num_layers // (P*V)``
    (for ``zero_bubble_v`` the second row is reversed: chunk ``P + k`` runs on stage
    ``P - 1 - k``); layer ``i`` goes to the first chunk whose cumulative count exceeds ``i``
    (``np.searchsorted``), so a broadcast total above ``num_layers`` leaves the last chunks
    short, as MindFormers does. MindFormers lets the first and last chunk be empty; the planner
    needs every chunk to hold a layer and refuses that too.
    """
    total = P * V
    if total <= 1:
        return (num_layers,)
    base, rem = divmod(num_layers, total)
    grid = _offset_grid(0 if offset is None else offset, P, V, key)
    given = 0 if offset is None else offset
    if _flat_sum(given) != rem:
        what = "absent (MindFormers' default 0)" if offset is None else f"{offset!r} sums to {_flat_sum(given)}"
        example = [1] * rem + [0] * (P - rem) if V == 1 and rem <= P else None
        hint = f"; e.g. offset: {example}" if example else ""
        raise SpecError(key, f"{what}; MindFormers requires the offsets to sum to num_layers % (pipeline_stage x "
                             f"pp_interleave_num) = {num_layers} % ({P} x {V}) = {rem} "
                             f"(LayerSetting._check_inputs){hint}")
    rows = [[base + x for x in row] for row in grid]
    if zbv and V >= 2:
        rows[1] = rows[1][::-1]
    flat = [n for row in rows for n in row]
    if flat[0] < 0 or flat[-1] < 0 or any(n < 1 for n in flat[1:-1]):
        raise SpecError(key, f"{offset!r} gives chunks of {flat} layers; MindFormers needs the first and last chunk "
                             ">= 0 layers and every middle chunk >= 1 (LayerSetting._check_inputs)")
    if sum(flat) < num_layers:
        raise SpecError(key, f"{offset!r} gives chunks of {flat} layers, {sum(flat)} in all, fewer than num_layers "
                             f"{num_layers}")
    out, acc = [], 0
    for n in flat:
        out.append(min(acc + n, num_layers) - min(acc, num_layers))
        acc += n
    empty = [i for i, n in enumerate(out) if n < 1]
    if empty:
        c = empty[0]
        raise SpecError(key, f"{'absent' if offset is None else repr(offset)} leaves pipeline chunk {c} (virtual "
                             f"stage {c // P}, stage {c % P}) without layers (layers per chunk: {out}); every chunk "
                             "of the plan needs at least 1 layer")
    return tuple(out)


RECOMPUTE_KEY = "recompute_config.recompute"


def recompute_of(value, P: int, V: int, key: str = RECOMPUTE_KEY, zbv: bool = False):
    """The pipelined region's recompute option (:mod:`hyperparallel.mpipe.recompute`) of MindFormers'
    ``recompute_config.recompute``: true -> ``full``; false (or absent) -> ``none``; a count per stage (a list
    of pipeline_stage whole numbers, or pp_interleave_num such lists) -> the recomputed layers of every
    pipeline chunk, in the grid MindFormers' ``offset`` uses (chunk ``v*P + p``; for ``zero_bubble_v`` the
    second row reversed, as the chunks it names run on those stages)."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() == "false"):
        return "none"
    if value is True or (isinstance(value, str) and value.strip().lower() == "true"):
        return "full"
    if not isinstance(value, list):
        raise SpecError(key, f"{value!r} unknown; allowed: true, false, a list of pipeline_stage ({P}) recomputed "
                             f"layer counts, or pp_interleave_num ({V}) such lists")
    try:
        rows = _offset_grid(value, P, V, key)
    except SpecError as e:   # the grid's shape rule, said of this key
        raise SpecError(key, str(e)[len(key) + 2:].replace("offset.shape", "recompute's shape")) from None
    if any(n < 0 for r in rows for n in r):
        raise SpecError(key, f"{value!r}: recomputed layer counts must be >= 0")
    if zbv and V >= 2:
        rows[1] = rows[1][::-1]
    return tuple(n for r in rows for n in r)


def offset_of(layers: Sequence[int], P: int, V: int, zbv: bool = False):
    """The ``model.model_config.offset`` that makes MindFormers lay out ``layers`` (chunk ``v*P + p``,
    data-flow order; the inverse of :func:`layer_layout`).

    0 when every chunk has ``num_layers // (P*V)`` layers, a flat list for V = 1, else V lists of P;
    with ``zbv`` the second row is reversed, as :func:`layer_layout` reverses it back.
    """
    base = sum(layers) // (P * V)
    off = [n - base for n in layers]
    if not any(off):
        return 0
    if V == 1:
        return off
    rows = [off[v * P:(v + 1) * P] for v in range(V)]
    if zbv:
        rows[1] = rows[1][::-1]
    return rows


# -- pipeline scheduler keys --------------------------------------------------------------------

def pipeline_interleave(raw: dict) -> Optional[bool]:
    """``parallel.pipeline_config.pipeline_interleave`` (None when there is no pipeline_config).

    MindSpore's ``_AutoParallelContext.set_pipeline_config`` needs both ``pipeline_interleave``
    (a bool) and ``pipeline_scheduler`` when ``pipeline_config`` is given.
    """
    par = raw.get("parallel")
    ppc = par.get("pipeline_config") if isinstance(par, dict) else None
    if ppc is None:
        return None
    if not isinstance(ppc, dict):
        raise SpecError("parallel.pipeline_config", "must be a mapping with pipeline_interleave and "
                                                    "pipeline_scheduler")
    for k in ("pipeline_interleave", "pipeline_scheduler"):
        if k not in ppc:
            raise SpecError(f"parallel.pipeline_config.{k}", "missing; MindSpore's set_pipeline_config needs "
                                                             "pipeline_interleave and pipeline_scheduler")
    if not isinstance(ppc["pipeline_interleave"], bool):
        raise SpecError("parallel.pipeline_config.pipeline_interleave",
                        f"must be true or false, got {ppc['pipeline_interleave']!r}")
    if ppc["pipeline_scheduler"] not in SCHEDULERS:
        raise SpecError("parallel.pipeline_config.pipeline_scheduler",
                        f"{ppc['pipeline_scheduler']!r} unknown; allowed: {', '.join(SCHEDULERS)}")
    return ppc["pipeline_interleave"]


def seq_split_num(raw: dict) -> None:
    """Refuse ``parallel_config.seq_split_num`` > 1: no order of the schedule algebra splits the sequence."""
    pc = raw.get("parallel_config")
    v = pc.get("seq_split_num", 1) if isinstance(pc, dict) else 1
    if v is None or v == 1:
        return
    whole("parallel_config.seq_split_num", v)
    raise SpecError("parallel_config.seq_split_num",
                    f"{v} splits every micro-batch along the sequence (MindSpore's seqpipe); no order of the "
                    "schedule algebra does that; supported: 1")


def order_from_keys(raw: dict, P: int, V: int, M: int, v_key: str) -> str:
    """The pipe order MindSpore runs for ``parallel.pipeline_config`` (V already the effective count).

    The order comes from the registry's MindSpore scheduler of each order
    (:func:`hyperparallel.mpipe.orders.for_scheduler`): ``1f1b`` -> ``interleaved`` when V > 1,
    else ``1f1b``; ``gpipe`` -> ``gpipe``; ``zero_bubble_v`` -> ``zbv`` (MindFormers'
    ``TransformerConfig`` checks: pp_interleave_num 2, pipeline_stage >= 2, micro_batch_num >=
    2 x pipeline_stage). Everything else is refused naming the key.
    """
    key = "parallel.pipeline_config.pipeline_scheduler"
    interleave = pipeline_interleave(raw)
    sched = raw["parallel"]["pipeline_config"]["pipeline_scheduler"] if interleave is not None else "1f1b"
    supported = sorted({o.mindspore[0] for o in orders.ORDERS.values() if o.mindspore})
    found = orders.for_scheduler(sched, V)
    if found is None:
        raise SpecError(key, f"{sched!r} (sequence-pipelined) has no order in the schedule algebra; supported: "
                             f"{', '.join(supported)} (or give mpipe.schedule)")
    if sched != "1f1b" and not interleave:
        # MindSpore's set_pipeline_config: "When pipeline_interleave is False, ... only '1f1b' is allowed."
        raise SpecError(key, f"{sched!r} needs parallel.pipeline_config.pipeline_interleave: true (MindSpore "
                             "allows only '1f1b' without interleave)")
    if sched == "zero_bubble_v":
        if V != 2:
            raise SpecError(v_key, f"must be 2 for pipeline_scheduler 'zero_bubble_v' (MindFormers' "
                                   f"TransformerConfig), got {V}")
        if P < 2:
            raise SpecError("parallel_config.pipeline_stage", f"must be >= 2 for 'zero_bubble_v', got {P}")
        if M < 2 * P:
            raise SpecError("parallel_config.micro_batch_num",
                            f"must be >= 2 x pipeline_stage ({2 * P}) for 'zero_bubble_v', got {M}")
    return found.name


# -- towers of a (vision-)language model config ------------------------------------------------

class Tower(tuple):
    """(region name, layers, key of the layer count, config dict)."""

    name = property(lambda s: s[0])
    layers = property(lambda s: s[1])
    key = property(lambda s: s[2])
    config = property(lambda s: s[3])


def _layers(node: dict, path: str, key: str) -> int:
    """The layer count ``node[key]``, plus a multi-token-prediction depth (``mtp_depth``, DeepSeek-V3):
    MindFormers lays out ``num_layers + mtp_depth`` layers over the stages (its DeepSeek-V3 model builds
    ``LayerSetting(config.num_layers + mtp_depth, ...)``), so the offsets sum against that count."""
    n = whole(f"{path}.{key}", node[key])
    if node.get("mtp_depth") is not None:
        n += whole(f"{path}.mtp_depth", node["mtp_depth"], minimum=0)
    return n


def _count(cfg: dict, where: str) -> Optional[Tuple[int, str, dict]]:
    """(layers, key, the dict holding it) of a tower config, looking into a nested ``model_config``."""
    for node, path in ((cfg, where), (cfg.get("model_config"), where + ".model_config")):
        if not isinstance(node, dict):
            continue
        for k in LAYER_KEYS:
            if k in node:
                return _layers(node, path, k), f"{path}.{k}", node
    return None


def region_name(key: str) -> str:
    """``vision_model`` -> ``vision``, ``llm_model`` -> ``llm``, ``audio_encoder`` -> ``audio``."""
    if key in LLM_TOWERS:
        return "llm"
    name = key
    for s in _SUFFIXES:
        if name.endswith(s) and len(name) > len(s):
            name = name[: -len(s)]
            break
    return _ALIASES.get(name, name)


def towers(mc: dict) -> List[Tower]:
    """The model's towers in data-flow order (encoders as they appear, the language model last).

    The language model is a tower under one of ``LLM_TOWERS`` (MindFormers' multi-modal configs:
    ``llm_model.model_config.num_layers``), else ``model.model_config`` itself
    (``num_hidden_layers`` / ``num_layers``). Encoders are the other mappings under
    ``model.model_config`` with a layer count (``vision_model.model_config.num_hidden_layers``,
    ``vision_config.depth``, ...). Empty when there is no language-model layer count.
    """
    base = "model.model_config"
    enc, llm = [], None
    for k, v in mc.items():
        if not isinstance(v, dict):
            continue
        c = _count(v, f"{base}.{k}")
        if c is None:
            continue
        t = Tower((region_name(k), c[0], c[1], c[2]))
        if t.name == "llm":
            if llm is not None:
                raise SpecError(f"{base}.{k}", f"a second language-model tower (the first: {llm.key}); give "
                                               "mpipe.profile")
            llm = t
        else:
            if any(e.name == t.name for e in enc):
                raise SpecError(f"{base}.{k}", f"a second {t.name!r} tower; give mpipe.profile")
            enc.append(t)
    if llm is None:
        for k in ("num_hidden_layers", "num_layers"):
            if k in mc:
                llm = Tower(("llm", _layers(mc, base, k), f"{base}.{k}", mc))
                break
    return enc + [llm] if llm is not None else []


#: ``model:`` keys that are not towers
MODEL_SECTION_KEYS = ("arch", "model_config", "config", "pretrained", "type", "adapter", "lora")


def model_towers(raw: dict) -> List[Tower]:
    """The towers of a recipe's whole ``model:`` section: encoders given beside the MindFormers model
    (``model.vision: {type: hp_vit, num_layers: N}``, hyperparallel's ViT in front of MindFormers' Llama),
    then :func:`towers` of the model config. Empty when there is no language-model layer count."""
    ts = towers(model_config(raw))
    model = raw.get("model")
    if not ts or not isinstance(model, dict):
        return ts
    front = []
    for k, v in model.items():
        if k in MODEL_SECTION_KEYS or not isinstance(v, dict):
            continue
        c = _count(v, f"model.{k}")
        if c is None:
            continue
        t = Tower((region_name(k), c[0], c[1], c[2]))
        if t.name == "llm" or any(e.name == t.name for e in front + ts):
            raise SpecError(f"model.{k}", f"a second {t.name!r} tower; give mpipe.profile")
        front.append(t)
    return front + ts


def freeze_flags(mc: dict) -> Dict[str, Tuple[bool, str]]:
    """``freeze_vision: true`` and the like: {region name: (frozen, key)}."""
    out = {}
    for k, v in mc.items():
        if not k.startswith("freeze_") or len(k) == len("freeze_"):
            continue
        key = f"model.model_config.{k}"
        if not isinstance(v, bool):
            raise SpecError(key, f"must be true or false, got {v!r}")
        out[region_name(k[len("freeze_"):])] = (v, key)
    return out


#: the label of an LLM's tied input embedding and LM head, in profiles and plans (``mpipe.profile.tied``)
WORD_EMBEDDINGS = "word_embeddings"


def tied_word_embeddings(raw: dict) -> Optional[Tuple[str, int, int]]:
    """(the key that ties them, vocabulary, hidden size) when the language-model tower's own config sets
    ``tie_word_embeddings: true`` (MindFormers' LlamaConfig, a flat Hugging Face config, or the
    ``text_config`` of a VLM: the flag Hugging Face's and mindone's ``tie_weights`` read), else None."""
    ts = model_towers(raw)
    if not ts or ts[-1].name != "llm":
        return None
    llm = ts[-1]
    cfg = llm.config
    if cfg.get("tie_word_embeddings") is not True:
        return None
    key = llm.key.rsplit(".", 1)[0] + ".tie_word_embeddings"
    mc = model_config(raw)
    vocab = cfg.get("vocab_size", mc.get("vocab_size"))
    hidden = cfg.get("hidden_size", mc.get("hidden_size"))
    return key, (vocab if is_whole(vocab) and vocab > 0 else 0), (hidden if is_whole(hidden) and hidden > 0 else 0)
