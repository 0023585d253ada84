"""Mixed precision (issue 37): the compute dtype and loss scale a recipe asks for, refused before launch where
they cannot train (bfloat16 on CPU, float16 without a loss scale), MindSpore's dynamic scaler as the runtime
drives it, and the casts the tiny Qwen2.5-VL computes with (float32 master weights, float16 boundaries).

No msrun job: the equivalence of a float16 pipeline with the float16 reference, its checkpoint and its
measured bytes are in tests/test_equivalence_qwen_vl.py (one case of its 2-rank launch).
"""
import os

import pytest

from helpers import run_main
from hyperparallel.errors import SpecError
from hyperparallel.recipe.train import LossScaleSpec, TrainConfig, loss_scale_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Q25 = os.path.join(ROOT, "recipes", "qwen2_5_vl_tiny.yaml")
DYNAMIC = ("runner_wrapper={scale_sense: {type: DynamicLossScaleUpdateCell, loss_scale_value: 1024, "
           "scale_factor: 2, scale_window: 2}}")


# -- runner_wrapper.scale_sense ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sense,want", [
    (None, None), (1.0, None), (1024, LossScaleSpec("static", 1024.0)),
    ({"type": "FixedLossScaleUpdateCell", "loss_scale_value": 128}, LossScaleSpec("static", 128.0)),
    ({"type": "FixedLossScaleUpdateCell", "loss_scale_value": 1}, None),
    ({"type": "DynamicLossScaleUpdateCell", "loss_scale_value": 4096, "scale_factor": 4, "scale_window": 10},
     LossScaleSpec("dynamic", 4096.0, 4, 10)),
    # MindFormers' template defaults for the fields left out (65536, 2, 1000)
    ({"type": "DynamicLossScaleUpdateCell"}, LossScaleSpec("dynamic", 65536.0, 2, 1000)),
])
def test_scale_sense_is_read_as_mindformers_writes_it(sense, want):
    assert loss_scale_of({"scale_sense": sense}) == want
    raw = {"runner_wrapper": {"scale_sense": sense, "use_clip_grad": False}}
    assert TrainConfig.from_raw(raw).loss_scale == want


@pytest.mark.parametrize("sense,key,says", [
    ({"type": "AdaptiveLossScaleUpdateCell"}, "runner_wrapper.scale_sense.type",
     "allowed: DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell"),
    ({"type": "DynamicLossScaleUpdateCell", "scale_factor": 1.5}, "runner_wrapper.scale_sense.scale_factor",
     "whole number"),
    ({"type": "DynamicLossScaleUpdateCell", "scale_window": 0}, "runner_wrapper.scale_sense.scale_window",
     "whole number >= 1"),
    ({"type": "DynamicLossScaleUpdateCell", "loss_scale_value": 0.5}, "runner_wrapper.scale_sense.loss_scale_value",
     ">= 1"),
    ({"type": "FixedLossScaleUpdateCell", "scale_window": 3}, "runner_wrapper.scale_sense.scale_window", "unknown"),
    (0.5, "runner_wrapper.scale_sense", ">= 1"),
])
def test_bad_scale_sense_is_refused_naming_the_field(sense, key, says):
    with pytest.raises(SpecError) as e:
        loss_scale_of({"scale_sense": sense})
    assert e.value.field == key and says in str(e.value), str(e.value)


# -- refused before launch: one line, exit 2 ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo conversations' data settings (the data are checked before the model)."""
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("demo")), 8, seed=3)
    return [f"data.{k}={v}" for k, v in sorted(paths.items())]


def _train(demo, *sets):
    args = ["train", Q25]
    for s in list(demo) + list(sets):
        args += ["--set", s]
    return run_main(*args)


def _one_error(p):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (p.returncode, p.stderr[-2000:])
    return lines[0]


def test_bfloat16_on_cpu_is_refused_naming_the_key_and_the_dtypes_cpu_trains(demo):
    line = _one_error(_train(demo, "model.model_config.dtype=bfloat16", DYNAMIC))
    assert "model.model_config.dtype" in line and "'bfloat16' cannot train on CPU" in line
    assert "allowed on CPU: float32, float16" in line and "device: Ascend" in line


def test_float16_without_a_loss_scale_is_refused_naming_the_key_to_give(demo):
    line = _one_error(_train(demo, "model.model_config.dtype=float16"))
    assert "runner_wrapper.scale_sense" in line and "model.model_config.dtype is float16" in line
    assert "DynamicLossScaleUpdateCell" in line and "FixedLossScaleUpdateCell" in line


def test_an_unknown_dtype_and_two_dtypes_are_refused(demo):
    line = _one_error(_train(demo, "model.model_config.dtype=float8"))
    assert "model.model_config.dtype" in line and "allowed: float32, float16, bfloat16" in line
    line = _one_error(_train(demo, "model.model_config.dtype=float16", "model.model_config.text_config.dtype=float32",
                             DYNAMIC))
    assert "model.model_config.text_config.dtype" in line and "one dtype" in line


def _adapter(demo, *sets, device="CPU"):
    from hyperparallel.recipe import load_recipe
    from hyperparallel.runconfig import RunConfig
    raw = load_recipe(Q25, list(demo) + list(sets)).raw
    if device != "CPU":
        raw = dict(raw, device=device)
    return RunConfig.from_raw(raw).model


def test_bfloat16_is_accepted_for_ascend_and_float16_with_a_loss_scale_on_cpu(demo):
    assert _adapter(demo, "model.model_config.dtype=bfloat16", device="Ascend").precision() == \
        ("bfloat16", "model.model_config.dtype")
    m = _adapter(demo, "model.model_config.dtype=float16", "model.model_config.torch_dtype=torch.float16", DYNAMIC)
    assert m.precision() == ("float16", "model.model_config.torch_dtype")   # Hugging Face's two spellings agree
    assert _adapter(demo).precision() == ("float32", "model.model_config.dtype")


# -- the runtime side (MindSpore, one process) ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu():
    """MindSpore on CPU, set once for this process (before any kernel runs)."""
    pytest.importorskip("mindspore")
    from hyperparallel.runtime import compat
    compat.setup_device("CPU")


def test_dynamic_loss_scale_halves_on_overflow_and_doubles_after_a_window_of_finite_steps(cpu):
    from hyperparallel.runtime.loss_scale import LossScale
    s = LossScale(LossScaleSpec("dynamic", 1024.0, 2, 2))
    seen = []
    for finite in (True, True, False, True, True, True, False):
        seen.append(s.value)
        s.update(finite)
    assert seen == [1024.0, 1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]
    assert s.state() == {"loss_scale": 1024.0, "loss_scale_counter": 0}
    other = LossScale(LossScaleSpec("dynamic", 8.0, 2, 2))
    other.load({"loss_scale": 2048.0, "loss_scale_counter": 1})
    other.update(True)
    assert other.value == 4096.0   # a restored counter continues its window
    static = LossScale(LossScaleSpec("static", 128.0))
    static.update(False)
    assert (static.on, static.value) == (True, 128.0) and not LossScale(None).on and LossScale(None).value == 1.0


@pytest.mark.slow
def test_float16_qwen_vl_keeps_float32_parameters_and_sends_float16_activations(demo, cpu):
    """MindSpore's amp (O2) on mindone's network: Parameters stay float32 (the master weights), a chunk's output
    is float16 and the adapter's boundary spec says so (a RECV allocates it); the last chunk's loss is float32."""
    pytest.importorskip("mindone")
    sets = list(demo) + ["model.model_config.dtype=float16", DYNAMIC]
    from hyperparallel.runconfig import load_parsed
    rc = load_parsed(Q25, sets).run
    m = rc.model
    mb = rc.source().micro_batch(0, 0)
    vision, llm = m.build_chunk("vision", 0, 2), m.build_chunk("llm", 0, 4)
    assert {str(p.dtype) for c in (vision, llm) for p in c.get_parameters()} == {"Float32"}
    t = m.tensors(mb, 1.0)
    out = vision.forward(m.model_input(t), t)
    spec = m.boundary("vision", 2, mb)
    assert (str(out.dtype), tuple(out.shape)) == ("Float16", spec.shape) and spec.dtype == "float16"
    loss = llm.forward(out, t)
    assert str(loss.dtype) == "Float32" and float(loss.asnumpy()) > 0
