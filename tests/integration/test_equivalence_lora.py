"""LoRA through mindone.peft (``model.lora``) pipelined on 2 msrun ranks trains exactly like mindone's whole
model with the same adapters (``get_peft_model``'s PeftModel called as users call it): losses of 3 steps
within 1e-5 relative, every adapter's gradient at the first and last step. Decoder only (the encoder
frozen: it runs forward only) and decoder + vision (the vision blocks' frozen base still has a backward, for
the adapters), 1f1b and transpose, Qwen2.5-VL and Qwen3-VL. Only the adapters (and ``modules_to_save``) are
trained, dumped and checkpointed, under PEFT's names; a checkpoint exported by ``ckpt --export-hf`` is
PEFT's adapter directory, which ``PeftModel.from_pretrained`` loads onto the base and which gives the
pipeline's loss of the next step; ``--merge-lora`` writes the merged whole model, which gives it too.
One launch on 2 ranks, one on 4 (transpose P=4: a LoRA'd encoder, and a frozen one with decoder adapters)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")
pytest.importorskip("mindone", reason="mindone is not installed")

from helpers import assert_equivalent, case_name, dumped, job_case, launch_cases, reference_run  # noqa: E402
from hyperparallel.recipe import load_recipe  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
Q25 = os.path.join(HERE, "..", "..", "recipes", "qwen2_5_vl_tiny.yaml")
Q3 = os.path.join(HERE, "..", "..", "recipes", "qwen3_vl_tiny.yaml")
STEPS = 3
M2 = "parallel_config.micro_batch_num=2"


def _lora(targets, save=None):
    # init_lora_weights: false: lora_B random too (PEFT's default zeros it, so lora_A's first gradient is 0)
    extra = f", modules_to_save: [{', '.join(save)}]" if save else ""
    return (f"model.lora={{r: 4, lora_alpha: 8, target_modules: [{', '.join(targets)}], "
            f"init_lora_weights: false{extra}}}")


DEC = ("q_proj", "v_proj")
DEC_VIS = ("q_proj", "v_proj", "qkv")
DEC_VIS3 = ("q_proj", "qkv", "linear_fc1")   # Qwen3-VL: linear_fc1 is in the blocks' MLP and in every merger
# (recipe, schedule, targets, encoder trained, modules_to_save)
CASES = [(Q25, "1f1b", DEC, False, None), (Q25, "transpose", DEC, False, None),
         (Q25, "1f1b", DEC_VIS, True, None), (Q25, "transpose", DEC_VIS, True, None),
         (Q3, "transpose", DEC_VIS3, True, None)]
SAVED = (Q25, "1f1b", DEC_VIS, True, ("lm_head",))   # from model.pretrained, saved at step 2, exported


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("ldemo")), 48, seed=3)
    return tuple(f"data.{k}={v}" for k, v in sorted(paths.items()))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, demo):
    """A Hugging Face directory of the tiny Qwen2.5-VL with other weights than the recipe's seed (the base)."""
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    rc = load_parsed(Q25, list(demo) + ["train.seed=123"]).run
    d = str(tmp_path_factory.mktemp("hf"))
    rc.model.network().save_pretrained(d)
    return d


def _overrides(demo, targets, trained, save=None, pretrained=None, micro=M2):
    out = list(demo) + [f"train.steps={STEPS}"] + ([micro] if micro else []) + [
        f"mpipe.encoder.trainable={'true' if trained else 'false'}", _lora(targets, save)]
    return out + ([f"model.pretrained={pretrained}"] if pretrained else [])


def _name(path, schedule, targets, save=None):
    stem = os.path.splitext(os.path.basename(path))[0]
    return case_name(f"lora_{stem}_{schedule}_{'_'.join(targets)}_{'_'.join(save or ())}")


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory, demo, hf_dir):
    tmp = str(tmp_path_factory.mktemp("lora2"))
    cases = [job_case(tmp, p, s, _name(p, s, t), _overrides(demo, t, tr), steps=STEPS, chunks="jit")
             for p, s, t, tr, _ in CASES]
    p, s, t, tr, save = SAVED
    cases.append(job_case(tmp, p, s, _name(p, s, t, save), _overrides(demo, t, tr, save, hf_dir), steps=STEPS,
                          chunks="jit", save_dir=os.path.join(tmp, "ckpt"), save_every=2))
    # resumed from its step 3 under transpose: the base from model.pretrained, the adapters from the checkpoint
    cases.append(job_case(tmp, p, "transpose", "resumed", _overrides(demo, t, tr, save, hf_dir), steps=STEPS + 1,
                          chunks="jit", save_dir=os.path.join(tmp, "ckpt"), resume=True))
    launch_cases(tmp, cases, 2, timeout=1200)
    return {c["name"]: c for c in cases}


def _assert_adapters_only(grads, targets, vision, save=None):
    """The trained parameters are PEFT's adapters of ``targets`` (and the copies of ``save``), by PEFT's names."""
    assert grads and all(n.startswith("base_model.model.") for n in grads), sorted(grads)[:3]
    kinds = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in grads if ".lora_" in n}
    assert kinds == set(targets) & {"q_proj", "v_proj", "qkv", "linear_fc1"} - (set() if vision else {"qkv"})
    assert any(n.startswith("base_model.model.model.visual.") for n in grads) == vision
    copies = sorted(n for n in grads if ".modules_to_save." in n)
    assert copies == [f"base_model.model.{m}.modules_to_save.default.weight" for m in save or ()]
    assert all(".lora_" in n or ".modules_to_save." in n for n in grads)


@pytest.mark.msrun
@pytest.mark.parametrize("path,schedule,targets,trained,save", CASES,
                         ids=["q25-1f1b-decoder", "q25-transpose-decoder", "q25-1f1b-decoder+vision",
                              "q25-transpose-decoder+vision", "q3-transpose-decoder+vision"])
def test_lora_matches_mindones_peft_model(two_rank, demo, path, schedule, targets, trained, save):
    case = two_rank[_name(path, schedule, targets)]
    ref = reference_run(load_recipe(path, _overrides(demo, targets, trained)), STEPS)
    grads = assert_equivalent(case, *ref)
    _assert_adapters_only(grads, targets, trained)


def _step_loss(demo, adapter_setup, step):
    """The loss of ``step`` (2 micro-batches, the run's loss scales) of mindone's whole model as
    ``adapter_setup(rc.model)`` makes it (the PeftModel loaded from the export, or the merged model)."""
    from hyperparallel.data.loss_norm import loss_scales
    from hyperparallel.models.qwen_vl.cells import WholeModel
    from hyperparallel.runconfig import load_parsed
    rc = load_parsed(Q25, list(demo) + [f"train.steps={STEPS}", M2]).run
    adapter_setup(rc.model)
    src = rc.source()
    scales = loss_scales(src, step, 2, rc.train.loss_normalization)
    whole = WholeModel(rc.model)
    return sum(float(whole.loss(src.micro_batch(step, m), scales[m]).asnumpy()) for m in range(2))


@pytest.mark.msrun
def test_lora_checkpoint_holds_adapters_and_exports_peft_adapter(two_rank, demo, hf_dir, tmp_path):
    """From ``model.pretrained`` with ``modules_to_save: [lm_head]``: the pipeline equals the reference; step 2's
    checkpoint holds the adapters and the LM head's trained copy only (the base is model.pretrained's);
    ``--export-hf`` writes PEFT's adapter directory, which mindone.peft loads onto the base and which gives the
    pipeline's loss of step 3 (its weights are step 2's); ``--merge-lora`` the merged model, the same loss; a run
    resumed from step 3 (under transpose) trains its 4th step as the reference's."""
    p, s, t, tr, save = SAVED
    case = two_rank[_name(p, s, t, save)]
    grads = assert_equivalent(case, *reference_run(load_recipe(p, _overrides(demo, t, tr, save, hf_dir)), STEPS))
    _assert_adapters_only(grads, t, tr, save)
    step = os.path.join(case["save_dir"], "step_2")
    from hyperparallel.runtime.ckpt_files import safetensors_header
    held = {n for f in os.listdir(step) if f.endswith(".safetensors")
            for n in safetensors_header(os.path.join(step, f))}
    weights = {n for n in held if n.startswith("base_model.")}
    assert weights == set(grads)   # no frozen base weight; the optimizer state is the adapters' too
    assert all(n.split(".", 1)[-1] in weights for n in held - weights if "." in n and not n.startswith("base_model."))
    with open(os.path.join(step, "lora.json")) as f:
        assert json.load(f)["pretrained"] == hf_dir
    pipeline = dumped(case["dump_dir"])[0]["losses"][2]

    out = tmp_path / "adapter"
    r = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", step, "--export-hf", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PeftModel.from_pretrained" in r.stdout
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(os.listdir(out))
    with open(out / "adapter_config.json") as f:
        cfg = json.load(f)
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and sorted(cfg["target_modules"]) == sorted(t)
    assert cfg["modules_to_save"] == ["lm_head"] and cfg["base_model_name_or_path"] == os.path.abspath(hf_dir)
    names = set(safetensors_header(str(out / "adapter_model.safetensors")))
    assert "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert "base_model.model.lm_head.weight" in names   # PEFT's spelling of a modules_to_save copy

    def peft_loaded(adapter):
        from mindone.peft import PeftModel
        adapter.peft = PeftModel.from_pretrained(adapter.network(), str(out))
    from hyperparallel.runtime import compat
    compat.setup_device("CPU")
    np.testing.assert_allclose(_step_loss(demo + (f"model.pretrained={hf_dir}",), peft_loaded, 2), pipeline, rtol=1e-5)

    merged = tmp_path / "merged"
    r = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", step, "--export-hf", str(merged),
                        "--merge-lora"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    names = set(safetensors_header(str(merged / "model.safetensors")))
    assert "model.layers.0.self_attn.q_proj.weight" in names and not any("lora" in n for n in names)

    def merged_model(adapter):
        from hyperparallel.models.qwen_vl import cpu as mindone_cpu
        mindone_cpu.apply()
        from mindone.transformers import Qwen2_5_VLForConditionalGeneration
        adapter._net = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(merged))
    np.testing.assert_allclose(_step_loss(demo, merged_model, 2), pipeline, rtol=1e-5)
    got = dumped(two_rank["resumed"]["dump_dir"])[0]   # resumed at step 3: the 4th step as the reference's
    assert got["start"] == 3 and len(got["losses"]) == 1
    ref = reference_run(load_recipe(p, _overrides(demo, t, tr, save, hf_dir)), STEPS + 1)
    np.testing.assert_allclose(got["losses"][0], ref[0][3], rtol=1e-5)
    r = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", step, "--merge", str(tmp_path / "x.ckpt"),
                        "--merge-lora"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "--merge-lora: only with --export-hf" in r.stderr + r.stdout


P4_CASES = [(DEC_VIS, True), (DEC, False)]   # transpose P=4, the recipe's 4 micro-batches
P4 = "parallel_config.pipeline_stage=4"


@pytest.fixture(scope="module")
def four_rank(tmp_path_factory, demo):
    tmp = str(tmp_path_factory.mktemp("lora4"))
    cases = [job_case(tmp, Q25, "transpose", _name(Q25, "transpose_p4", t), _overrides(demo, t, tr, micro=P4),
                      steps=STEPS, chunks="jit") for t, tr in P4_CASES]
    launch_cases(tmp, cases, 4, timeout=1200)
    return {c["name"]: c for c in cases}


@pytest.mark.msrun
@pytest.mark.parametrize("targets,trained", P4_CASES, ids=["decoder+vision", "decoder-frozen-encoder"])
def test_lora_transpose_on_four_ranks_matches(four_rank, demo, targets, trained):
    case = four_rank[_name(Q25, "transpose_p4", targets)]
    assert case["plan"]["num_devices"] == 4 and case["plan"]["num_micro"] == 4
    assert case["plan"]["trainable"] == {"vision": trained, "llm": True}
    ref = reference_run(load_recipe(Q25, _overrides(demo, targets, trained, micro=P4)), STEPS)
    _assert_adapters_only(assert_equivalent(case, *ref), targets, trained)
