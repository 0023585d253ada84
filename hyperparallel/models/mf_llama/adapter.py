"""Adapter: the project's ViT encoder + projector feeding MindFormers' own ``LlamaForCausalLM``.

A recipe's ``model:`` section is a MindFormers model section, as MindFormers writes it,
plus one sub-section for the encoder (MindFormers 1.9.0 ships no vision tower)::

    model:
      arch: {type: LlamaForCausalLM}
      model_config: {type: LlamaConfig, num_layers: 4, hidden_size: 32, ...}
      vision: {type: hp_vit, num_layers: 2, hidden_size: 32, num_heads: 2, mlp_ratio: 2}

Regions ``vision`` (depth ``model.vision.num_layers``: the project's ViT blocks, patch
embedding with the first chunk, mean pooling + projector to the LLM width with the last;
the shared encoder of :mod:`.vit`) and ``llm`` (depth
``model.model_config.num_layers``). The LLM is built by MindFormers' own builder
(``mindformers.models.build_model.build_model``) from the ``arch``/``model_config``
pair; its decoder layers are sliced into the plan's chunks: token embedding (plus the
splice of the image features into the sequence at the image-placeholder positions) with
the first chunk, final norm + LM head + the loss (plain ops: MindFormers' loss cells
do not run under the tape autograd) with the last. Parameters keep MindFormers' names
(``model.layers.3.attention.wq.weight``).

Weights: every process builds the whole (small) LLM right after ``mindspore.set_seed(seed)``
and keeps its slice, so every rank's slice is bit-identical to the single-process model.

Everything up to :meth:`MFLlamaMLLM.regions` and :meth:`MFLlamaMLLM.check_device` is pure
Python: a config that cannot train (on the recipe's device) is refused before launch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ..base import Region
from ..vit import LLM, REGION as VISION, VitConfig, VitLLMAdapter
from ...errors import SpecError, unknown_key, whole
from ...recipe.mindformers import WORD_EMBEDDINGS

MODEL_KEYS = ("arch", "model_config", "vision")
VISION_KEYS = ("type", "num_layers", "hidden_size", "num_heads", "mlp_ratio", "init_std")
VISION_TYPES = ("hp_vit",)

# LlamaConfig defaults of MindFormers 1.9.0 for the keys checked below (facts, used when a
# recipe leaves a key out); ``None`` dtypes follow another key.
LLAMA_DEFAULTS = {"use_past": False, "use_flash_attention": False, "fused_rms_norm": True,
                  "use_rope_slice": False, "compute_dtype": "float16", "layernorm_compute_type": "float32",
                  "softmax_compute_type": "float32", "rotary_dtype": "float32", "param_init_type": "float16",
                  "embedding_init_type": None, "residual_dtype": None}
DTYPE_FOLLOWS = {"embedding_init_type": "param_init_type", "residual_dtype": "compute_dtype"}
# what the legacy Llama needs to train on CPU in PyNative (measured: docs in the notes); every dtype float32
# on every device (check_device)
CPU_FLAGS = {"use_flash_attention": False, "fused_rms_norm": False, "use_rope_slice": True}
FLOAT32 = "float32"
# the LlamaConfig dtype keys, compute_dtype first (a float16 recipe is refused naming it)
DTYPE_KEYS = tuple(k for k in LLAMA_DEFAULTS if k.endswith(("_dtype", "_type")))


@dataclass(frozen=True)
class VisionConfig:
    num_layers: int = 2
    hidden_size: int = 32
    num_heads: int = 2
    mlp_ratio: int = 2
    init_std: float = 0.02


class MFLlamaMLLM(VitLLMAdapter):
    """ViT encoder (the project's) + MindFormers ``LlamaForCausalLM`` (see module docstring)."""

    family = "mindformers LlamaForCausalLM"

    def __init__(self, section: dict, data_shapes: dict, seed: int):
        sec = dict(section or {})
        bad = sorted(set(sec) - set(MODEL_KEYS))
        if bad:
            raise unknown_key("model", sec, MODEL_KEYS, "for a MindFormers model section")
        mc = sec.get("model_config")
        if not isinstance(mc, dict):
            raise SpecError("model.model_config", "missing; give {type: LlamaConfig, num_layers: ..., ...}")
        if mc.get("type") != "LlamaConfig":
            raise SpecError("model.model_config.type", f"{mc.get('type')!r} cannot configure LlamaForCausalLM "
                             f"(use LlamaConfig)")
        if mc.get("use_past", LLAMA_DEFAULTS["use_past"]):
            raise SpecError("model.model_config.use_past", f"{mc.get('use_past')!r} is the inference KV cache; "
                             f"training needs False")
        if mc.get("pet_config") is not None:
            raise SpecError("model.model_config.pet_config", f"{mc['pet_config']!r}: LoRA / parameter-efficient "
                            "fine-tuning is not supported yet (the whole model would be trained); remove it")
        self.mc = dict(mc)
        where = "model.model_config"
        self.num_layers = whole(f"{where}.num_layers", mc.get("num_layers"))
        self.hidden = whole(f"{where}.hidden_size", mc.get("hidden_size"))
        heads = whole(f"{where}.num_heads", mc.get("num_heads"))
        if self.hidden % heads:
            raise SpecError(f"{where}.num_heads", f"{heads} must divide {where}.hidden_size {self.hidden}")
        kv = mc.get("n_kv_heads")
        if kv is not None and (whole(f"{where}.n_kv_heads", mc.get("n_kv_heads")) > heads or heads % kv):
            raise SpecError(f"{where}.n_kv_heads", f"{kv} must divide {where}.num_heads {heads}")
        vocab = whole(f"{where}.vocab_size", mc.get("vocab_size"))
        if vocab != data_shapes["vocab"]:
            raise SpecError(f"{where}.vocab_size", f"{vocab} but the data's vocabulary is {data_shapes['vocab']} "
                                                   "(data.vocab, else data.tokenizer's largest id + 1; must match)")
        seq = whole(f"{where}.seq_length", mc.get("seq_length"))
        if seq < data_shapes["seq_len"]:
            raise SpecError(f"{where}.seq_length", f"{seq} is shorter than the data's sequences "
                             f"({data_shapes['seq_len']} = max images + data.text_len)")
        vs = sec.get("vision")
        if not isinstance(vs, dict):
            raise SpecError("model.vision", "missing; the encoder region: {type: hp_vit, num_layers: N, "
                             "hidden_size: D, num_heads: H, mlp_ratio: R}")
        bad = sorted(set(vs) - set(VISION_KEYS))
        if bad:
            raise unknown_key("model.vision", vs, VISION_KEYS)
        if vs.get("type", "hp_vit") not in VISION_TYPES:
            raise SpecError("model.vision.type", f"{vs.get('type')!r} unknown (known: {', '.join(VISION_TYPES)})")
        self.vision = VisionConfig(**{k: v for k, v in vs.items() if k != "type"})
        for key in ("num_layers", "hidden_size", "num_heads", "mlp_ratio"):
            whole(f"model.vision.{key}", vs.get(key, getattr(self.vision, key)))
        if self.vision.hidden_size % self.vision.num_heads:
            raise SpecError("model.vision.num_heads", "must divide model.vision.hidden_size")
        self.shapes = dict(data_shapes)
        self.seed = int(seed)
        self._net = None

    # -- pure Python -------------------------------------------------------------------
    def regions(self) -> List[Region]:
        return [Region(VISION, self.vision.num_layers, "model.vision.num_layers"),
                Region(LLM, self.num_layers, "model.model_config.num_layers")]

    def setting(self, key: str):
        """The effective LlamaConfig value of ``key`` (the recipe's, else MindFormers' default)."""
        v = self.mc.get(key, LLAMA_DEFAULTS.get(key))
        if v is None and key in DTYPE_FOLLOWS:
            return self.setting(DTYPE_FOLLOWS[key])
        return v

    def check_device(self, device: str) -> None:
        if device == "CPU":
            for key, need in CPU_FLAGS.items():
                if bool(self.setting(key)) != need:
                    given = "" if key in self.mc else " (MindFormers' default)"
                    raise SpecError(f"model.model_config.{key}", f"{self.setting(key)!r}{given} cannot train on "
                                     f"CPU; set {need}")
        # every device: the project's float16 path (a loss scale, float32 master weights and optimizer state,
        # amp on the chunks) is the mindone models'; MindFormers' Llama casts inside its own cells, which the
        # runtime neither scales nor checks, so a dtype other than float32 is refused, never trained as given
        for key in DTYPE_KEYS:
            if self.setting(key) != FLOAT32:
                given = "" if key in self.mc else " (MindFormers' default)"
                where = "cannot train on CPU" if device == "CPU" else (
                    "is not supported: hyperparallel trains MindFormers' Llama in float32 only")
                raise SpecError(f"model.model_config.{key}", f"{self.setting(key)!r}{given} {where}; "
                                 f"set {FLOAT32}")

    def tied_weights(self) -> dict:
        """``tie_word_embeddings: true``: MindFormers' Llama makes its LM head's weight the embedding table."""
        if self.mc.get("tie_word_embeddings") is True:
            return {WORD_EMBEDDINGS: "model.tok_embeddings.embedding_weight"}
        return {}

    # -- MindSpore ------------------------------------------------------------------------
    def network(self):
        """The whole ``LlamaForCausalLM``, built once per adapter right after ``set_seed``."""
        if self._net is None:
            import mindspore as ms
            from mindformers.models.build_model import build_model
            ms.set_seed(self.seed)
            self._net = build_model({"arch": {"type": "LlamaForCausalLM"}, "model_config": dict(self.mc)})
        return self._net

    @property
    def vit(self) -> VitConfig:
        v, s = self.vision, self.shapes
        return VitConfig(layers=v.num_layers, dim=v.hidden_size, heads=v.num_heads, mlp_ratio=v.mlp_ratio,
                         patch_dim=s["patch_dim"], num_patches=s["num_patches"], out_dim=self.hidden,
                         init_std=v.init_std)

    @property
    def seq_len(self) -> int:
        return self.shapes["seq_len"]

    @property
    def llm_width(self) -> int:
        return self.hidden

    def build_llm_chunk(self, start: int, stop: int):
        from .cells import LlamaChunk
        return LlamaChunk(self.network(), start, stop, self.num_layers)

    def tensors(self, micro_batch, loss_scale: float):
        from .cells import LlamaTensors
        return LlamaTensors(micro_batch, loss_scale)
