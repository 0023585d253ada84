"""Adapter of the VLMs people train: mindone.transformers' Qwen2.5-VL and Qwen3-VL, Hugging Face configs
and weight names.

Recipe ``model:`` section (MindFormers' ``arch`` / ``model_config`` keys, Hugging Face fields inside)::

    model:
      arch: {type: Qwen2_5_VLForConditionalGeneration}   # or Qwen3VLForConditionalGeneration
      config: path/to/config.json          # a Hugging Face config (optional)
      pretrained: path/to/hf_model_dir     # config.json + model.safetensors[.index.json] (optional)
      model_config: {vision_config: {depth: 2, ...}, text_config: {...}, image_token_id: 10, ...}

The config is ``pretrained``'s ``config.json``, then ``config``, then the inline ``model_config``
fields (each wins over the one before; :func:`hyperparallel.recipe.mindformers.model_config`).
Regions: ``vision`` (``vision_config.depth`` blocks; the patch embedding, window reordering and
rotary set-up with the first chunk, the merger and the reverse reordering with the last) and
``llm`` (``text_config.num_hidden_layers`` decoder layers; the token embedding and the scatter of
the image features with the first chunk, final norm + LM head + loss with the last). Qwen3-VL's
deepstack features cross every boundary before the layer that adds them, packed into the one
boundary tensor. Every chunk's side inputs come from the micro-batch's token ids and
``image_grid_thw`` alone (:mod:`.side`), so a boundary spec never needs pixels.

Everything here is pure Python (the ``transformers`` config classes, no MindSpore): a config that
is missing, inconsistent or cannot train on the recipe's device is refused before launch, naming
the key. The MindSpore side is :mod:`.cells`.
"""
from __future__ import annotations

import copy
import json
import os
from typing import List, Optional

from ...errors import SpecError, unknown_key, whole
from ...recipe.mindformers import WORD_EMBEDDINGS, model_config
from ..base import ModelAdapter, Region, TensorSpec

VISION, LLM = "vision", "llm"

#: ``mpipe.compile: jit`` compiles these chunks with the graph-ready layer forwards of :mod:`.graph` on mindone's cells
#: (mindone's own ``construct`` methods do not compile under ``mindspore.jit``: torch-style ``Tensor.transpose(1, 2)``,
#: ``expand(..., -1, 1)``, host-side ``cu_seqlens.tolist()``; tests/unit/mindone_jit_probe.py). The cases they do not
#: cover run eager, the start banner and the ranks' log saying why, naming the key (:meth:`QwenVL.compile_reason`).
LORA_REASON = "model.lora: PEFT's LoRA layers have no graph form here"
TP_REASON = ("parallel_config.model_parallel > 1: the tensor-parallel layers communicate inside the chunk "
             "(no collective in a CPU jit graph)")
DTYPE_REASON = "{key}: {dtype}: the compiled Qwen-VL bodies are float32 only (MindSpore's amp casts are per cell)"
# mindone class -> (family key, transformers config class, model_type)
ARCHS = {"Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", "Qwen2_5_VLConfig"),
         "Qwen3VLForConditionalGeneration": ("qwen3_vl", "Qwen3VLConfig")}
MODEL_KEYS = ("arch", "model_config", "config", "pretrained", "lora")
TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
#: compute dtypes (the Hugging Face config's ``torch_dtype`` / ``dtype``); master weights stay float32
PRECISIONS = ("float32", "float16", "bfloat16")
#: on CPU bfloat16 has no MatMul kernel (MindSpore 2.9.0: "Select CPU operator[MatMul] fail! Unsupported data type!")
CPU_DTYPES = ("float32", "float16")
# MindFormers' keys in a model_config that are the recipe's, not the Hugging Face config's
NOT_HF = ("type", "architectures", "model_type", "pp_interleave_num", "offset")
# keys the recipe front end reads from a model_config besides NOT_HF (freeze_* flags, text_config.offset too)
RECIPE_KEYS = NOT_HF + ("batch_size",)
BYTES_PER_PARAM_TRAINED = 16   # float32 weight, gradient and Adam's two moments


def _config_class(arch: str):
    """transformers' config class of a mindone VLM class (``Qwen2_5_VLConfig``)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")   # no "PyTorch not found" line on stderr
    import transformers
    return getattr(transformers, ARCHS[arch][1])


def _hf_config(arch: str, fields: dict):
    """The transformers config object of ``fields`` (Hugging Face config.json keys)."""
    cls = _config_class(arch)
    kw = {k: v for k, v in fields.items() if k not in NOT_HF and not k.startswith("freeze_")}
    try:
        return cls(**kw)
    except (TypeError, ValueError, KeyError) as e:
        raise SpecError("model.model_config", f"not a valid {ARCHS[arch][1]}: {str(e).splitlines()[0]}") from None


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class QwenVL(ModelAdapter):
    """mindone's Qwen2.5-VL / Qwen3-VL (see the module docstring)."""

    def __init__(self, section: dict, data_shapes: dict, seed: int):
        sec = dict(section or {})
        bad = sorted(set(sec) - set(MODEL_KEYS))
        if bad:
            raise unknown_key("model", sec, MODEL_KEYS, "for a mindone VLM section")
        self.arch = (sec.get("arch") or {}).get("type")
        self.family = f"mindone {self.arch}"
        self.kind = ARCHS[self.arch][0]
        self.pretrained: Optional[str] = sec.get("pretrained")
        if self.pretrained is not None:
            from ..hf_dir import is_hf_dir, weight_files
            if not is_hf_dir(str(self.pretrained)):
                raise SpecError("model.pretrained", f"{self.pretrained}: not a Hugging Face model directory "
                                                    "(config.json with model.safetensors or its shard index)")
            try:
                weight_files(str(self.pretrained))
            except ValueError as e:
                raise SpecError("model.pretrained", str(e)) from None
        inline = sec.get("model_config") if isinstance(sec.get("model_config"), dict) else {}
        inline, renamed = self._map_spellings(inline, model_config({"model": sec}))
        self._notes = [note for _, _, note in renamed]
        self._written = {hf: key for key, hf, _ in renamed}   # a Hugging Face key -> the spelling the recipe wrote
        if "model_config" in sec:
            sec["model_config"] = inline
        fields = model_config({"model": sec})
        self._check_fields(inline, "text_config" in fields)
        given = (sec.get("model_config") or {}).get("type")
        if given not in (None, ARCHS[self.arch][1]):
            raise SpecError("model.model_config.type", f"{given!r} cannot configure {self.arch} "
                                                       f"(use {ARCHS[self.arch][1]})")
        self.fields = fields
        self.cfg = _hf_config(self.arch, fields)
        self.text_key = "model.model_config.text_config" if "text_config" in fields else "model.model_config"
        self.vision_key = "model.model_config.vision_config"
        self.seed, self.shapes = int(seed), dict(data_shapes)
        self._check()
        self._net = None
        self._tp_size = 1
        self._check_lora(sec.get("lora"))   # model.lora: PEFT's LoraConfig (:mod:`.lora`)

    # -- configuration checks (pure Python) ----------------------------------------------
    def _map_spellings(self, inline: dict, merged: dict):
        """(``inline`` with MindFormers' spellings of Hugging Face fields read as those fields, (key written,
        Hugging Face key, note) of each): :func:`.hf_fields.map_spellings` on ``model.model_config`` (the
        text fields of the older flat layout too, where the class reads them) and its ``text_config`` /
        ``vision_config``.
        Every rank builds its adapter from the same recipe, so maps the same; only the front end prints."""
        from ..hf_fields import fields_of, map_spellings, reads_flat_text
        cls = _config_class(self.arch)
        subs = cls.sub_configs
        flat = "text_config" not in merged and reads_flat_text(cls)
        out, renamed = map_spellings(inline, "model.model_config", cls, merged,
                                     fields_of(subs["text_config"]) if flat else ())
        for name in ("text_config", "vision_config"):
            if isinstance(inline.get(name), dict):
                sub, said = map_spellings(inline[name], f"model.model_config.{name}", subs[name],
                                          merged.get(name) if isinstance(merged.get(name), dict) else None)
                out[name] = sub
                renamed += said
        return out, renamed

    def notes(self) -> List[str]:
        return list(self._notes)

    def _key(self, key: str) -> str:
        """``key`` as the recipe wrote it (``text_config.num_layers`` where it gave MindFormers' spelling)."""
        return self._written.get(key, key)

    def _check_fields(self, inline: dict, text_given: bool) -> None:
        """Every field the recipe writes in ``model.model_config`` (and its ``text_config`` /
        ``vision_config``) is one the config class reads, or the recipe's own: else refused, named
        (:mod:`.hf_fields`)."""
        from ..hf_fields import check_section
        cls = _config_class(self.arch)
        subs = cls.sub_configs
        check_section(inline, "model.model_config", cls, RECIPE_KEYS, ("freeze_",), flat_text=subs["text_config"],
                      text_given=text_given)
        for name, extra in (("text_config", ("offset",)), ("vision_config", ())):
            sub = inline.get(name)
            if isinstance(sub, dict):
                check_section(sub, f"model.model_config.{name}", subs[name], extra)

    @property
    def text(self):
        return self.cfg.text_config

    @property
    def vision(self):
        return self.cfg.vision_config

    @property
    def deepstack(self) -> List[int]:
        """Vision blocks whose features the LLM adds (Qwen3-VL), in the order of the layers they go to."""
        return list(getattr(self.vision, "deepstack_visual_indexes", None) or []) if self.kind == "qwen3_vl" else []

    def _check(self) -> None:
        t, v = self.text, self.vision
        for key, value, where in (("depth", v.depth, self.vision_key), ("num_hidden_layers", t.num_hidden_layers,
                                                                            self.text_key)):
            whole(self._key(f"{where}.{key}"), value)
        if v.out_hidden_size != t.hidden_size:
            raise SpecError(f"{self.vision_key}.out_hidden_size", f"{v.out_hidden_size} but the LLM's hidden_size "
                                                                   f"is {t.hidden_size} (the merger feeds the LLM)")
        for k in TOKEN_KEYS:
            tok = getattr(self.cfg, k, None)
            if not isinstance(tok, int) or not 0 <= tok < t.vocab_size:
                raise SpecError(f"model.model_config.{k}", f"{tok!r} must be a token id below "
                                                           f"{self.text_key}.vocab_size ({t.vocab_size})")
        vocab = self.shapes.get("vocab")
        if vocab is not None and int(vocab) > t.vocab_size:
            raise SpecError(f"{self.text_key}.vocab_size", f"{t.vocab_size} is smaller than the data's "
                                                           f"vocabulary ({vocab} tokens: data.vocab, else "
                                                           "data.tokenizer's largest token id + 1)")
        seq = self.shapes.get("seq_len")
        if seq is not None and int(seq) > t.max_position_embeddings:
            raise SpecError("data.seq_len", f"{seq} exceeds {self.text_key}.max_position_embeddings "
                                            f"({t.max_position_embeddings})")
        bad = [i for i in self.deepstack if not 0 <= i < v.depth]
        if bad or len(self.deepstack) > t.num_hidden_layers:
            raise SpecError(f"{self.vision_key}.deepstack_visual_indexes",
                            f"{self.deepstack}: every index must be a vision block (0..{v.depth - 1}) and there "
                            f"may be at most text_config.num_hidden_layers ({t.num_hidden_layers}) of them")
        if self.kind == "qwen2_5_vl":
            bad = [i for i in (v.fullatt_block_indexes or []) if not 0 <= i < v.depth]
            if bad:
                raise SpecError(f"{self.vision_key}.fullatt_block_indexes", f"{bad} are not vision blocks "
                                                                            f"(0..{v.depth - 1})")

    def _check_lora(self, section) -> None:
        from .. import lora
        self.lora, self.peft = lora.parse(section), None
        if self.lora is None:
            return
        self.lora_modules = lora.adapted(self.lora, self.module_names())   # a target matching nothing: refused
        if self.tied_weights():
            raise SpecError(lora.KEY, "LoRA with tie_word_embeddings: true is not supported yet; untie them")

    def module_names(self) -> dict:
        """{module name: kind} of the whole model, from the config (:func:`.lora.module_names`)."""
        from ..lora import module_names
        return module_names(self.kind, int(self.vision.depth), int(self.text.num_hidden_layers), len(self.deepstack))

    def check_trainable(self, trainable: dict) -> None:
        """With ``model.lora``: the plan trains exactly the regions with an adapter (:func:`.lora.check_regions`)."""
        if self.lora is not None:
            from ..lora import check_regions
            check_regions(self.lora, self.module_names(), {r.name: trainable.get(r.name, True)
                                                           for r in self.regions()})

    def regions(self) -> List[Region]:
        return [Region(VISION, int(self.vision.depth), self._key(f"{self.vision_key}.depth")),
                Region(LLM, int(self.text.num_hidden_layers), self._key(f"{self.text_key}.num_hidden_layers"))]

    def parameter_count(self) -> int:
        """Parameters of the whole model (an estimate from the config, within a few percent)."""
        t, v = self.text, self.vision
        D, I, L = t.hidden_size, t.intermediate_size, t.num_hidden_layers
        hd = getattr(t, "head_dim", None) or D // t.num_attention_heads
        attn = D * hd * (2 * t.num_attention_heads + 2 * t.num_key_value_heads)
        llm = L * (attn + 3 * D * I) + 2 * t.vocab_size * D
        Dv, u = v.hidden_size, v.spatial_merge_size ** 2
        patch = v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * Dv
        mlp = (3 if self.kind == "qwen2_5_vl" else 2) * Dv * v.intermediate_size
        merger = (Dv * u) ** 2 + Dv * u * v.out_hidden_size
        vis = patch + v.depth * (4 * Dv * Dv + mlp) + merger * (1 + len(self.deepstack))
        return int(llm + vis)

    def check_device(self, device: str) -> None:
        if device != "CPU":
            return
        need, have = self.parameter_count() * BYTES_PER_PARAM_TRAINED, _memory_bytes()
        if have and need > have:
            raise SpecError("model.model_config", f"about {self.parameter_count() / 1e9:.1f} B parameters need "
                                                  f"~{need / 2 ** 30:.0f} GiB to train (weights, gradients, Adam) but "
                                                  f"this machine has {have / 2 ** 30:.0f} GiB; train it on Ascend "
                                                  f"(device: Ascend)")
        attn = self.fields.get("attn_implementation")
        if attn not in (None, "eager"):
            raise SpecError("model.model_config.attn_implementation",
                            f"{attn!r} has no CPU kernels (flash attention needs Ascend); set eager")
        dtype, key = self.precision()
        if dtype not in CPU_DTYPES:
            raise SpecError(key, f"{dtype!r} cannot train on CPU (MindSpore has no CPU MatMul kernel for it); allowed "
                                 f"on CPU: {', '.join(CPU_DTYPES)} (float16 with runner_wrapper.scale_sense); "
                                 f"{dtype} trains on Ascend (device: Ascend)")

    def check_packing(self) -> None:
        """Packed sequences (``data.packing``): each sample's attention confined to itself by a block-diagonal
        causal mask, the 4-D additive mask mindone's eager attention takes; M-RoPE positions per sample
        (:func:`.side.packed_causal_mask`, :func:`.side.pack_positions`). Flash attention would need its
        variable-length form (per-sample sequence lengths), not done: refused."""
        attn = self.fields.get("attn_implementation")
        if attn not in (None, "eager"):
            raise SpecError("data.packing", f"true with model.model_config.attn_implementation {attn!r}: packed "
                                            "sequences are done with eager attention's block-diagonal mask (flash "
                                            "attention's variable-length form is not done); set eager or "
                                            "data.packing: false")

    def precision(self):
        """(compute dtype, key): the config's ``torch_dtype`` / ``dtype`` (top level; a ``vision_config`` /
        ``text_config`` one must agree: the model computes in one dtype), float32 when none is given."""
        found = []
        for where, sub in (("model.model_config", self.fields), (self.vision_key, self.fields.get("vision_config")),
                           (self.text_key, self.fields.get("text_config"))):
            for k in ("torch_dtype", "dtype"):
                value = sub.get(k) if isinstance(sub, dict) else None
                if value is None:
                    continue
                name = str(value).replace("torch.", "")
                if name not in PRECISIONS:
                    raise SpecError(f"{where}.{k}", f"{value!r} unknown; allowed: {', '.join(PRECISIONS)}")
                found.append((name, f"{where}.{k}"))
        if not found:
            return "float32", ""
        if len({n for n, _ in found}) > 1:
            (a, ka), (b, kb) = found[0], next(f for f in found if f[0] != found[0][0])
            raise SpecError(kb, f"{b!r} but {ka} is {a!r}: the model computes in one dtype; give the same")
        return found[0]

    # -- tensor parallelism (parallel_config.model_parallel: T; :mod:`.tp`) ---------------------------
    def check_tensor_parallel(self, size: int) -> None:
        """T must divide the query heads and the MLP channels of the language model, and divide the key/value
        heads or be a multiple of them (each then replicated on T / kv ranks; the encoder is replicated within
        the group); refused before launch, naming the key. A vocabulary T does not divide is padded to a
        multiple of T (:mod:`.tp`)."""
        self._tp_size = size   # compile_reason: the LLM's chunks run eager under T > 1
        if size == 1:
            return
        key = "parallel_config.model_parallel"
        t = self.text
        if self.kind == "qwen3_vl" and getattr(t, "attention_bias", False):
            raise SpecError(key, f"{size} with {self._key(f'{self.text_key}.attention_bias')}: true is not done "
                                 "(o_proj's bias would be added on every rank); allowed: 1, or attention_bias: false")
        H, KV = t.num_attention_heads, t.num_key_value_heads

        def fits(d):   # key/value heads split, or each replicated on d / KV ranks
            return all(m % d == 0 for m in (H, t.intermediate_size)) and (KV % d == 0 or d % KV == 0)
        allowed = ", ".join(str(d) for d in range(1, H + 1) if fits(d))
        for field, n in (("num_attention_heads", H), ("intermediate_size", t.intermediate_size)):
            if n % size:
                raise SpecError(key, f"{size} does not divide {self._key(f'{self.text_key}.{field}')} ({n}); "
                                     f"allowed: {allowed}")
        if KV % size and size % KV:
            raise SpecError(key, f"{size} neither divides nor is a multiple of "
                                 f"{self._key(f'{self.text_key}.num_key_value_heads')} ({KV}); allowed: {allowed}")
        if self.tied_weights():
            raise SpecError(key, f"{size} with tied word embeddings (tie_word_embeddings: true) is not done; "
                                 "allowed: 1, or untie them")

    def shard(self, group) -> None:
        """Split the language model's layers, embedding and LM head over ``group`` (before any chunk)."""
        from .tp import shard_network
        shard_network(self.network(), group, self.text.num_attention_heads, self.text.num_key_value_heads,
                      self.text.vocab_size)
        self.tp_group = group

    def sharded_params(self) -> dict:
        g = getattr(self, "tp_group", None)
        return self.tensor_parallel_split(g.size) if g else {}

    def tensor_parallel_split(self, size: int) -> dict:
        from .tp import sharded
        return sharded(int(self.text.num_hidden_layers), size, self.text.num_key_value_heads,
                       int(self.text.vocab_size)) if size > 1 else {}

    def compile_reason(self, region: str) -> str:
        """'' (the chunks compile: :mod:`.graph`), or why they run eager naming the key: LoRA (:data:`LORA_REASON`),
        a compute dtype other than float32 (:data:`DTYPE_REASON`), the LLM's chunks under tensor parallelism
        (:data:`TP_REASON`; the vision encoder is replicated, so it still compiles)."""
        self.depth(region)   # KeyError for a region the model lacks
        if self.lora is not None:
            return LORA_REASON
        dtype, key = self.precision()
        if dtype != "float32":
            return DTYPE_REASON.format(key=key, dtype=dtype)
        if region == LLM and (getattr(self, "tp_group", None) is not None or self._tp_size > 1):
            return TP_REASON
        return ""

    def data_format(self) -> dict:
        v = self.vision
        return dict(format="qwen_vl", patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                    merge_size=v.spatial_merge_size, **{k: getattr(self.cfg, k) for k in TOKEN_KEYS},
                    video_layout="per_frame" if self.kind == "qwen3_vl" else "grouped")

    def image_tokens(self) -> int:
        raise NotImplementedError(f"{self.family}: an image's token count follows its size (data_format())")

    # -- shapes (from the micro-batch's facts, never its pixels) ------------------------------
    def boundary(self, region: str, stop: int, micro_batch) -> TensorSpec:
        spec = self._boundary(region, stop, micro_batch)
        return TensorSpec(spec.shape, self.precision()[0])   # activations travel in the compute dtype

    def _boundary(self, region: str, stop: int, micro_batch) -> TensorSpec:
        v, D = self.vision, self.text.hidden_size
        u = v.spatial_merge_size ** 2
        M = micro_batch.num_patches // u   # merged tokens of every image (filler included) and video
        if region == VISION:
            k = sum(1 for i in self.deepstack if i < stop)
            if stop == v.depth:
                return TensorSpec((M, D * (1 + k)))
            if not self.deepstack:
                return TensorSpec((micro_batch.num_patches, v.hidden_size))
            return TensorSpec((M, u * v.hidden_size + k * D))
        B, S = micro_batch.input_ids.shape
        left = max(0, len(self.deepstack) - stop)   # deepstack features still to be added
        if left:
            return TensorSpec((B * S * D + left * M * D,))
        return TensorSpec((B, S, D))

    # -- MindSpore ---------------------------------------------------------------------------
    def network(self):
        """The whole mindone model, built once per adapter right after ``mindspore.set_seed(seed)``
        (every rank's chunks are slices of it, bit-identical to the single-process model), with
        ``model.pretrained``'s weights when given."""
        if self._net is None:
            from .cells import build_network
            self._net = build_network(self)
        return self._net

    def build_chunk(self, region: str, start: int, stop: int):
        if not 0 <= start < stop <= self.depth(region):
            raise ValueError(f"{self.family}: layers [{start}, {stop}) outside region {region!r} "
                             f"(0..{self.depth(region)})")
        from .cells import LLMChunk, VisionChunk
        cls = VisionChunk if region == VISION else LLMChunk
        return cls(self, start, stop)

    def tensors(self, micro_batch, loss_scale: float):
        from .cells import QwenTensors
        return QwenTensors(self, micro_batch, loss_scale)

    def model_input(self, tensors):
        return tensors.pixel_values

    def processor_record(self, data_cfg):
        from .processor import processor_record
        return processor_record(data_cfg)

    def write_processor(self, record, hf_cfg, out):
        from .processor import write_processor
        return write_processor(record, hf_cfg, out)

    def reference(self):
        """mindone's whole model as users call it; under a float16 / bfloat16 compute dtype the chunks chained
        (None) instead: MindSpore's mixed precision casts the ops of the cell they run in, and the whole model
        computes its loss inside its top cell (in float16) where the chunks compute it outside any cell (in
        float32, as Hugging Face's loss upcasts the logits). Measured (tiny Qwen2.5-VL, one micro-batch): float32
        whole model and chained chunks equal exactly; float16 losses 5e-5 apart, gradients 0.4% relative."""
        if self.precision()[0] != "float32":
            return None
        from .cells import WholeModel
        return WholeModel(self)

    def tied_weights(self) -> dict:
        """The token embedding is also the LM head when the text config ties them (the flag mindone's
        ``tie_weights`` reads): one Parameter, named as the embedding."""
        if getattr(self.cfg.get_text_config(decoder=True), "tie_word_embeddings", False):
            return {WORD_EMBEDDINGS: "model.language_model.embed_tokens.weight"}
        return {}

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoint_name(self, name: str) -> str:
        """The in-memory parameter name of a name in a checkpoint file: Hugging Face's hub spelling
        (``visual.*``, ``model.layers.*``: what ``save_pretrained`` writes for Qwen2.5-VL) or the
        in-memory one (``model.visual.*``, ``model.language_model.*``)."""
        if name.startswith("visual."):
            return "model." + name
        if name.startswith("model.") and not name.startswith(("model.visual.", "model.language_model.")):
            return "model.language_model." + name[len("model."):]
        return name

    def checkpoint_files(self) -> dict:
        """Files a checkpoint step directory carries besides the weights: the Hugging Face config,
        so ``hyperparallel ckpt --export-hf`` can write a directory ``from_pretrained`` loads."""
        cfg = copy.deepcopy(self.cfg.to_dict())
        cfg["architectures"] = [self.arch]
        out = {"config.json": json.dumps(cfg, indent=1, sort_keys=True, default=str)}
        if self.lora is not None:   # what ckpt --export-hf rebuilds the base and its adapters from
            out["lora.json"] = json.dumps({"lora": self.lora, "pretrained": self.pretrained, "seed": self.seed},
                                          indent=1, sort_keys=True)
        return out
