"""The model seam: everything the runtime needs from a model, and nothing more.

The interpreter (:mod:`hyperparallel.runtime.interpreter`) never names a region,
a model class or a shape formula: it asks an adapter. One adapter per model family
(the tiny MLLM, MindFormers' Llama, a user's own model):

* ``regions()``: the model's regions in data-flow order, with their layer counts
  (the model owns its depth; the cost profile only supplies costs);
* ``build_chunk(region, start, stop)``: a Cell for layers ``[start, stop)`` of a
  region; the region's input layers go with the chunk that starts at 0, its output
  layers (and, for the last region, the loss) with the chunk that ends at the
  region's depth. ``chunk.forward(x, batch)`` returns the chunk's output, or for
  the model's last chunk the micro-batch loss times ``batch.loss_scale``. For ``mpipe.compile:
  jit`` a chunk gives its computation on tensors only: ``graph_args(batch)`` (the side inputs it
  reads, a fixed-length tuple, ``None`` where it reads nothing) and ``graph_body(self, x, *args)``
  (what ``forward`` computes; ``forward`` may simply call it), compiled with ``mindspore.jit``; a
  chunk without them runs eager and its ``graph_reason`` (or a default) says why in the log
  (:mod:`hyperparallel.runtime.compiled`);
* ``compile_reason(region)`` (optional, pure Python): whether a region's chunks compile, said before
  launch: '' (they compile), why they run eager, or None (only the chunk Cell can tell: the default).
  The launcher's start banner prints it and the ranks follow the same answer;
* ``tensors(micro_batch, loss_scale)``: the side inputs every chunk may read
  (token ids, masks, positions, targets), as MindSpore tensors;
* ``model_input(tensors)``: the input of the model's first chunk;
* ``boundary(region, stop, micro_batch)``: shape and dtype of the tensor leaving
  a chunk that ends at layer ``stop`` of ``region`` (so a RECV can allocate), from
  the micro-batch's shape facts only (never its pixels: they load lazily);
* ``image_tokens()``: LLM tokens per image, the expansion of an image placeholder
  in real conversation data;
* ``check_device(device)`` (optional): refuse, before launch, a configuration that
  cannot train on the recipe's device;
* ``check_packing()`` (optional, pure Python): refuse ``data.packing: true`` unless the model confines
  attention and positions to each sample of a packed sequence (default: refused);
* ``precision()`` (optional, pure Python): (compute dtype, the recipe key that gave it): the dtype the
  chunks compute in and their boundary tensors travel in; the parameters (master weights), gradients and
  optimizer state stay float32 (default ``('float32', '')``; docs/training.md, mixed precision);
* ``data_format()``: how a data source lays out a micro-batch for this model (a dict the data
  layer reads: ``{"format": "merge_index", "image_tokens": k}`` by default);
* ``reference()`` (optional): the whole model as users call it, for the single-process reference
  (default: the chunks of :meth:`build_full` chained);
* ``checkpoint_name(name)`` / ``checkpoint_files()`` / ``pretrained`` (optional): names in
  checkpoint files as the model's own, files a step directory carries (e.g. a Hugging Face
  ``config.json``), a directory of weights to start from;
* ``tied_weights()`` (optional, pure Python): ``{label: parameter name}`` of the weights that several
  chunks share (``word_embeddings``: the input embedding that is also the LM head when the config ties
  them). The chunks holding a copy of one must hold one and the same Parameter (build them from one
  network); the plan's ``tied`` entries (from the recipe's ``tie_word_embeddings``) must name the same labels.

* ``check_tensor_parallel(T)`` / ``shard(group)`` / ``sharded_params()`` (optional: tensor parallelism,
  ``parallel_config.model_parallel: T``): refuse, before launch, a T the model cannot split its layers into
  (default: every T > 1); on each rank, before any ``build_chunk``, split the layers over ``group`` (its
  ``size``, ``rank`` and the group's collectives ``all_reduce(t)`` / ``all_gather(t)``, which the T ranks call
  in the same order: inside chunk forwards and backwards, which they run identically); and name the
  parameters split so (``{name: axis}``: each rank holds the ``rank``-th of ``size`` equal slices along
  ``axis``; the others are whole copies). Parameter names stay the model's; checkpoints hold whole tensors.
  ``tensor_parallel_split(T)`` (pure Python) names them without a group (the memory figures' split share).

Constructing an adapter, ``regions()``, ``check_device()``, ``check_tensor_parallel()``, ``tensor_parallel_split()`` and ``compile_reason()`` are pure Python (the
launcher checks a recipe before any rank starts); the other methods may import MindSpore.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple


@dataclass(frozen=True)
class Region:
    """One region of the model: a name, its number of layers and the config key that sets it."""

    name: str
    layers: int
    key: str = ""   # e.g. ``model.llm_layers``: named in errors about the depth


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype (a MindSpore dtype name, e.g. ``float32``) of a tensor crossing a chunk boundary."""

    shape: Tuple[int, ...]
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n * _ITEMSIZE.get(self.dtype, 4)


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "float64": 8, "bool_": 1}


class ModelAdapter:
    """Base class of model adapters (see the module docstring for the contract)."""

    #: short name of the family, shown in logs and errors
    family: str = "model"

    def regions(self) -> List[Region]:
        raise NotImplementedError

    def build_chunk(self, region: str, start: int, stop: int):
        raise NotImplementedError

    def tensors(self, micro_batch: Any, loss_scale: float) -> Any:
        raise NotImplementedError

    def model_input(self, tensors: Any):
        raise NotImplementedError

    def boundary(self, region: str, stop: int, micro_batch: Any) -> TensorSpec:
        raise NotImplementedError

    def image_tokens(self) -> int:
        """LLM tokens the encoder emits per image: a data source expands each image placeholder
        to this many positions (data.type conversations needs it)."""
        raise NotImplementedError(f"model adapter {self.family}: image_tokens() not implemented, so "
                                  "data.type conversations cannot lay out its sequences")

    def check_device(self, device: str) -> None:
        """Pure Python, before launch: SpecError('model.<key>', ...) if the model cannot train on
        ``device`` (e.g. a kernel that device lacks). Default: every device."""

    def check_packing(self) -> None:
        """Pure Python, before launch: SpecError('data.packing', ...) unless the model reads packed sequences
        (``data.packing: true``: several samples per sequence, each attending only to itself, its positions
        restarting; :mod:`hyperparallel.data.packing`). Default: refused."""
        from ..errors import SpecError
        raise SpecError("data.packing", f"true: the {self.family} model does not take packed sequences (its "
                                        "attention would cross samples); set data.packing: false")

    def check_trainable(self, trainable: dict) -> None:
        """Pure Python, before launch: SpecError if the plan's ``{region: trainable}`` cannot train this
        model as configured (e.g. ``model.lora``: an adapter on a region the plan freezes). Default: any."""

    def precision(self) -> Tuple[str, str]:
        """Pure Python, before launch: (compute dtype name, the recipe key that set it; '' for the default).
        Default float32."""
        return "float32", ""

    def check_tensor_parallel(self, size: int) -> None:
        """Pure Python, before launch: SpecError('parallel_config.model_parallel', ...) if the model cannot split
        its layers over ``size`` ranks. Default: only 1 (no tensor-parallel layers)."""
        if size != 1:
            from ..errors import SpecError
            raise SpecError("parallel_config.model_parallel", f"{size}: the {self.family} model has no "
                                                              "tensor-parallel layers; allowed: 1")

    def shard(self, group) -> None:
        """Split the model's layers over the tensor-parallel ``group`` (see the module docstring)."""
        raise NotImplementedError(f"{self.family}: no tensor-parallel layers")

    def sharded_params(self) -> dict:
        """{parameter name: axis} of the parameters split over the tensor-parallel group (default none)."""
        return {}

    def tensor_parallel_split(self, size: int) -> dict:
        """Pure Python: the parameters a group of ``size`` would split (``sharded_params``' form: an axis, or
        (axis, slices) for a slice held by several ranks), without splitting anything (default none): what
        the memory figures of tensor parallelism count."""
        return {}

    def processor_record(self, data_cfg) -> Optional[dict]:
        """Pure Python: what a checkpoint's ``meta.json`` records of the run's processor (where its tokenizer
        came from, the image settings in effect), from the run's data config, so ``ckpt --export-hf`` can
        write the processor files. Default: None (this model writes none)."""
        return None

    def write_processor(self, record: Optional[dict], hf_cfg: dict, out: str) -> Tuple[List[str], str]:
        """Write the processor files of ``record`` (:meth:`processor_record`) into the export folder ``out``
        for the Hugging Face config ``hf_cfg``. Returns (files written, '') or ([], why none were)."""
        arch = (hf_cfg.get("architectures") or [self.family])[0]
        return [], f"no processor is written for {arch} (the {self.family} adapter writes none)"

    def notes(self) -> List[str]:
        """Pure Python, before launch: lines the front end prints once on the console (a recipe's spelling
        read as another, e.g. MindFormers' ``num_layers`` as ``num_hidden_layers``); the ranks, building the
        same adapter, print nothing. Default none."""
        return []

    def compile_reason(self, region: str) -> Optional[str]:
        """Pure Python, before launch: why the chunks of ``region`` run eager under ``mpipe.compile: jit``,
        '' when they compile (their Cells give ``graph_body``/``graph_args``), or None when the adapter does
        not say (then each chunk Cell decides on its rank). The start banner prints it; the ranks run
        what it says (:class:`hyperparallel.runtime.compiled.Body`)."""
        return None

    def data_format(self) -> dict:
        """The micro-batch layout a data source must produce (the data layer knows the formats)."""
        return {"format": "merge_index", "image_tokens": self.image_tokens()}

    def reference(self):
        """The single-process reference model (an object with ``params(region)`` and
        ``loss(micro_batch, loss_scale)``), or None: the chunks of :meth:`build_full` chained."""
        return None

    #: a Hugging Face model directory whose weights every rank starts from (None: the recipe's init)
    pretrained = None

    def checkpoint_name(self, name: str) -> str:
        """The model's parameter name for ``name`` in a checkpoint file (default: the same)."""
        return name

    def checkpoint_files(self) -> dict:
        """{file name: text} a checkpoint step directory carries besides the weights (default none)."""
        return {}

    def tied_weights(self) -> dict:
        """{label: parameter name} of the weights shared by several chunks (default none)."""
        return {}

    # -- derived helpers (not to be overridden) ------------------------------------
    def region_names(self) -> List[str]:
        return [r.name for r in self.regions()]

    def depth(self, region: str) -> int:
        for r in self.regions():
            if r.name == region:
                return r.layers
        raise KeyError(f"{self.family}: no region {region!r} (regions: {', '.join(self.region_names())})")

    def build_full(self) -> list:
        """The whole model as one chunk per region (the single-process reference's model)."""
        return [self.build_chunk(r.name, 0, r.layers) for r in self.regions()]
