"""Recipes whose model cannot be built or trained are refused before launch (one line, exit 2),
by ``train``, ``profile`` and ``bench``; an adapter with a wrong boundary spec ends the job on
its first SEND with the chunk, micro-batch and rank named (no hang)."""
import json
import os

import pytest

from helpers import ROOT, recipe, run_cli, run_main

MF = recipe("mf_llama_mllm.yaml")


def _refused(p, *words):
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("command", ["train", "profile", "bench"])
def test_ascend_qwen_vl_recipes_refused_here_naming_the_device_then_the_size(command, tmp_path):
    """The 7B/72B recipes name the real class (mindone's Qwen2_5_VLForConditionalGeneration) and the real
    config: this CPU machine has no Ascend device, and on CPU the model's size is refused."""
    for r in ("qwen2_5_vl_7b.yaml", "qwen2_5_vl_72b.yaml"):
        p = run_main(command, recipe(r), "--run-dir", str(tmp_path / "run"))
        _refused(p, "device: Ascend, but this machine has no Ascend device")
    p = run_main(command, recipe("qwen2_5_vl_7b.yaml"), "--set", "device=CPU", "--run-dir", str(tmp_path / "run"))
    # the base file is a MindFormers graph-mode config: what the runtime cannot do is named first
    _refused(p, "parallel.enable_parallel_optimizer: True is not supported", "2 more: context.mode, "
             "context.device_target")
    cpu = ["--set", "device=CPU", "--set", "parallel.enable_parallel_optimizer=false", "--set", "context.mode=1",
           "--set", "context.device_target=CPU"]
    p = run_main(command, recipe("qwen2_5_vl_7b.yaml"), *cpu, "--run-dir", str(tmp_path / "run"))
    _refused(p, "model.model_config:", "8.3 B parameters", "GiB")
    p = run_main(command, recipe("qwen2_5_vl_7b.yaml"), *cpu, "--set", "model.arch.type=Qwen9VL",
                 "--run-dir", str(tmp_path / "run"))
    _refused(p, "model.arch.type", "'Qwen9VL' has no runtime adapter", "Qwen2_5_VLForConditionalGeneration",
             "Qwen3VLForConditionalGeneration", "LlamaForCausalLM")
    assert not (tmp_path / "run" / "logs").exists()


@pytest.mark.parametrize("command", ["train", "profile", "bench"])
def test_profile_layers_disagreeing_with_model_refused(command, tmp_path):
    p = run_main(command, MF, "--set", "mpipe.profile.regions.1.layers=6", "--run-dir", str(tmp_path / "run"))
    _refused(p, "mpipe.profile.regions[1].layers", "model.model_config.num_layers")


@pytest.mark.parametrize("override,words", [
    ("model.arch.type=Qwen2ForCausalLM", ("model.arch.type", "Qwen2ForCausalLM")),
    ("model.model_config.type=Qwen2Config", ("model.model_config.type", "LlamaConfig")),
    ("model.model_config.use_flash_attention=true", ("model.model_config.use_flash_attention", "CPU", "False")),
    ("model.model_config.fused_rms_norm=true", ("model.model_config.fused_rms_norm", "CPU", "False")),
    ("model.model_config.use_rope_slice=false", ("model.model_config.use_rope_slice", "CPU", "True")),
    ("model.model_config.compute_dtype=bfloat16", ("model.model_config.compute_dtype", "bfloat16", "float32")),
    ("model.model_config.compute_dtype=float16", ("model.model_config.compute_dtype: 'float16' cannot train on CPU",
                                                  "set float32")),
    ("model.model_config.use_past=true", ("model.model_config.use_past", "False")),
    ("model.model_config.vocab_size=64", ("model.model_config.vocab_size", "data.vocab")),
    ("model.vision.num_heads=3", ("model.vision.num_heads",)),
    ("model.bogus=1", ("model.bogus",)),
])
def test_mindformers_config_that_cannot_train_refused(override, words, tmp_path):
    p = run_main("train", MF, "--set", override, "--run-dir", str(tmp_path / "run"))
    _refused(p, *words)
    assert not (tmp_path / "run" / "logs").exists()


def test_mindformers_defaults_that_cannot_train_on_cpu_are_named():
    """A key left out takes MindFormers' default; on CPU the refusal says so."""
    from hyperparallel.runconfig import RunConfig
    from hyperparallel.recipe import load_recipe
    raw = load_recipe(MF).raw
    del raw["model"]["model_config"]["fused_rms_norm"]
    with pytest.raises(ValueError, match=r"^model.model_config.fused_rms_norm: True \(MindFormers' default\)"):
        RunConfig.from_raw(raw)
    raw["device"] = "Ascend"   # the Ascend kernels exist: accepted
    with pytest.raises(ValueError, match=r"^context.device_target: 'CPU' differs from device: Ascend"):
        RunConfig.from_raw(raw)
    raw["context"]["device_target"] = "Ascend"
    assert RunConfig.from_raw(raw).model.depth("llm") == 4
    # float16 is the mindone models' path (loss scale, float32 master weights): MindFormers' Llama is refused
    # in any dtype but float32 on every device, naming the key (never trained as something else)
    raw["model"]["model_config"]["compute_dtype"] = "float16"
    raw["runner_wrapper"] = {"scale_sense": 1024}
    with pytest.raises(ValueError, match=r"^model.model_config.compute_dtype: 'float16' is not supported: "
                                         r"hyperparallel trains MindFormers' Llama in float32 only; set float32$"):
        RunConfig.from_raw(raw)
    del raw["model"]["model_config"]["compute_dtype"]
    with pytest.raises(ValueError, match=r"^model.model_config.compute_dtype: 'float16' \(MindFormers' default\) "
                                         r"is not supported"):
        RunConfig.from_raw(raw)
    raw["model"]["model_config"]["compute_dtype"] = "float32"
    raw["model"]["model_config"]["param_init_type"] = "float16"
    with pytest.raises(ValueError, match=r"^model.model_config.param_init_type: 'float16' is not supported"):
        RunConfig.from_raw(raw)


def test_mindformers_recipe_regions_come_from_the_model():
    from hyperparallel.runconfig import load_parsed
    rc = load_parsed(recipe("mf_qwen2_mllm.yaml"), ["model.model_config.num_layers=6",
                                                    "mpipe.profile.regions.1.layers=6"]).run
    assert [(r.name, r.layers, r.key) for r in rc.model.regions()] == [
        ("vision", 2, "model.vision.num_layers"), ("llm", 6, "model.model_config.num_layers")]
    assert rc.model.setting("n_kv_heads") == 2 and rc.model.setting("qkv_has_bias") is True


@pytest.mark.msrun
def test_wrong_boundary_adapter_fails_first_step_naming_chunk_and_rank(tmp_path):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "adapters")]))
    # a hang would hit the subprocess timeout; no wall-clock assert (a slow CI machine must pass)
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "train", recipe("tiny_mllm.yaml"), "--steps", "2",
                        "--schedule", "1f1b", "--set", "model.adapter=wrong_boundary:WrongBoundary",
                        "--run-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                       timeout=200, env=env)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("error: job failed") and "rank 0 failed" in err, p.stderr
    assert "wrong_boundary" in err and "chunk llm/0 micro-batch 0" in err and "boundary spec" in err, err
    assert "step 1/2" not in p.stdout   # caught on the first step


@pytest.mark.msrun
def test_mf_llama_recipe_trains_with_transpose_loss_falling(tmp_path):
    """hyperparallel train recipes/mf_llama_mllm.yaml --schedule transpose: MindFormers' Llama learns."""
    pytest.importorskip("mindformers", reason="mindformers is not installed")
    import json
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_DEFAULT_PATH"}   # the launcher's default
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "train", MF, "--schedule", "transpose", "--steps",
                        "12", "--compile", "eager", "--run-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                       timeout=400, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        losses = [json.loads(line)["loss"] for line in f]
    assert len(losses) == 12 and all(l == l for l in losses)
    assert sum(losses[-3:]) < 0.85 * sum(losses[:3]), losses
    assert (tmp_path / "run" / "logs" / "mindformers").is_dir()   # MindFormers' logs stay with the job


@pytest.mark.parametrize("name", ["mf_llama_mllm.yaml", "mf_llama_mllm_bench.yaml"])
def test_bench_prepares_mindformers_recipes(name):
    """``hyperparallel bench RECIPE --schedule 1f1b --schedule transpose``: checked and planned before launch."""
    from hyperparallel.bench import bench as B
    from hyperparallel.cli import build_parser
    args = build_parser().parse_args(["bench", recipe(name), "--schedule", "1f1b", "--schedule", "transpose"])
    _, rc, plans = B.prepare(args)
    # the two schedules, then (None, plan) of the reference whose run measures the profile (gpipe)
    assert [n for n, _ in plans] == ["1f1b", "transpose", None] and args.profile_schedule == "gpipe"
    assert plans[-1][1].meta["order"] == "gpipe"
    assert rc.model.family == "mindformers LlamaForCausalLM"
    for _, plan in plans:
        assert {c.region: c.stop for c in plan.chunks} == {r.name: r.layers for r in rc.model.regions()}


def test_mf_llama_chunk_outside_its_region_refused():
    from hyperparallel.runconfig import load_parsed
    model = load_parsed(MF).run.model
    with pytest.raises(ValueError, match=r"layers \[2, 6\) outside region 'llm' \(0\.\.4\)"):
        model.build_chunk("llm", 2, 6)


def test_tiny_profile_layers_disagreeing_with_model_refused(tmp_path):
    """The tiny MLLM owns its depth (model.llm_layers); a profile saying otherwise is one line, exit 2."""
    p = run_main("train", recipe("tiny_mllm.yaml"), "--set", "mpipe.profile.regions.1.layers=6",
                 "--run-dir", str(tmp_path / "run"))
    _refused(p, "mpipe.profile.regions[1].layers", "model.llm_layers", "6", "4")
    assert not (tmp_path / "run" / "logs").exists()


# -- mindone's Qwen VLMs: bad configs refused before launch, naming the key -------------------------
QWEN = recipe("qwen2_5_vl_tiny.yaml")


@pytest.mark.parametrize("sets,words", [
    (["model.model_config.vision_config.out_hidden_size=32"],
     ["model.model_config.vision_config.out_hidden_size: 32 but the LLM's hidden_size is 64"]),
    (["model.model_config.attn_implementation=flash_attention_2"],
     ["model.model_config.attn_implementation", "no CPU kernels"]),
    (["model.model_config.text_config.dtype=bfloat16"], ["model.model_config.text_config.dtype", "one dtype"]),
    (["model.model_config.dtype=bfloat16"], ["model.model_config.dtype", "cannot train on CPU", "float32, float16"]),
    (["model.model_config.image_token_id=999"], ["model.model_config.image_token_id: 999 must be a token id below"]),
    (["model.model_config.text_config.vocab_size=16"], ["vocab_size: 16 is smaller than the data's vocabulary"]),
    (["model.model_config.type=LlamaConfig"], ["model.model_config.type", "use Qwen2_5_VLConfig"]),
    (["model.weights=x"], ["model.weights: unknown key"]),
    (["model.pretrained=/no/such/dir"], ["model.pretrained: /no/such/dir: not a Hugging Face model directory"]),
    (["model.model_config.vision_config.fullatt_block_indexes=[5]"], ["fullatt_block_indexes: [5] are not"]),
])
def test_qwen_vl_configs_that_cannot_train_are_refused_before_launch(sets, words, tmp_path):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path / "d"), 8, seed=1)
    data = [f"--set=data.{k}={v}" for k, v in sorted(paths.items())]
    p = run_main("train", QWEN, *data, *[f"--set={s}" for s in sets], "--run-dir", str(tmp_path / "run"))
    _refused(p, *words)
    assert not (tmp_path / "run" / "logs").exists()


def test_pretrained_directory_with_a_missing_shard_is_refused_before_launch(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    from hyperparallel.data.demo import write_demo   # a clean checkout has no data/demo
    paths = write_demo(str(tmp_path / "d"), 8, seed=1)
    data = [f"--set=data.{k}={v}" for k, v in sorted(paths.items())]
    p = run_main("train", QWEN, *data, f"--set=model.pretrained={d}", "--run-dir", str(tmp_path / "run"))
    _refused(p, "model.pretrained:", "shard model-00001-of-00002.safetensors is missing")
    p = run_main("train", QWEN, *data, "--resume-from", str(d), "--run-dir", str(tmp_path / "run"))
    _refused(p, "--resume-from:", "shard model-00001-of-00002.safetensors is missing")


def _hf(d, shards):
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"w{i}": s for i, s in
                                                                               enumerate(shards)}}))
    return d


def test_pretrained_shard_names_that_leave_the_model_directory_are_refused(tmp_path):
    from hyperparallel.models.hf_dir import weight_files
    (tmp_path / "secret.safetensors").write_bytes(b"x")
    link = _hf(tmp_path / "link", ["model-1.safetensors"])
    (link / "model-1.safetensors").symlink_to(tmp_path / "secret.safetensors")
    secret = str(tmp_path / "secret.safetensors")
    for d, shard in ((_hf(tmp_path / "abs", [secret]), secret),
                     (_hf(tmp_path / "abs2", ["/no/such.safetensors"]), "/no/such.safetensors"),
                     (_hf(tmp_path / "dots", ["../secret.safetensors"]), "../secret.safetensors"),
                     (_hf(tmp_path / "dots2", ["sub/../../none.safetensors"]), "sub/../../none.safetensors"),
                     (link, "model-1.safetensors")):
        with pytest.raises(ValueError) as e:   # the same refusal whether the outside file exists or not
            weight_files(str(d))
        assert str(e.value) == (f"{d}/model.safetensors.index.json: shard {shard!r} resolves outside the model "
                                f"directory {d} (an absolute path, '..' or a symlink out); refused")
    # the Hugging Face cache: a snapshot's files (the index too) are links into ../../blobs
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "i").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    (blobs / "w").write_bytes(b"x")
    (blobs / "c").write_text("{}")
    for name, blob in (("model.safetensors.index.json", "i"), ("model-1.safetensors", "w"), ("config.json", "c")):
        (snap / name).symlink_to(os.path.join("..", "..", "blobs", blob))
    assert weight_files(str(snap)) == [str(snap / "model-1.safetensors")]
    from hyperparallel.data.demo import write_demo   # and train refuses it before launch
    paths = write_demo(str(tmp_path / "d"), 8, seed=1)
    data = [f"--set=data.{k}={v}" for k, v in sorted(paths.items())]
    p = run_main("train", QWEN, *data, f"--set=model.pretrained={tmp_path / 'dots'}", "--run-dir",
                 str(tmp_path / "run"))
    _refused(p, "model.pretrained:", "shard '../secret.safetensors' resolves outside the model directory")
    assert not (tmp_path / "run" / "logs").exists()


def test_a_tokenizer_with_id_gaps_must_fit_the_models_vocabulary(tmp_path):
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path / "d"), 8, seed=1, videos=False)
    d = json.load(open(paths["tokenizer"]))
    d["model"]["vocab"]["beta"] = 300   # 40-odd tokens, the largest id 300: the model's 256 rows are too few
    tok = tmp_path / "gap.json"
    tok.write_text(json.dumps(d))
    sets = [f"data.{k}={v}" for k, v in sorted(dict(paths, tokenizer=str(tok)).items())]
    with pytest.raises(ValueError, match=r"^model.model_config.text_config.vocab_size: 256 is smaller than the "
                                         r"data's vocabulary \(301 tokens: data.vocab, else data.tokenizer's "
                                         r"largest token id \+ 1\)"):
        load_parsed(QWEN, sets).run
    assert load_parsed(QWEN, sets[:2] + [f"data.tokenizer={paths['tokenizer']}"]).run.data.shapes()[
        "vocab"] < 256


def test_pretrained_weights_that_do_not_fit_the_config_are_refused_naming_the_first_names(tmp_path):
    """The ranks build the model and refuse weights of another shape (SpecError -> 'input refused' -> exit 2)."""
    pytest.importorskip("mindone", reason="mindone is not installed")
    from hyperparallel.runtime import compat
    from hyperparallel.models.qwen_vl.cells import load_hf_weights
    from hyperparallel.errors import SpecError
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.data.demo import write_demo
    compat.setup_device("CPU")
    paths = write_demo(str(tmp_path / "d"), 8, seed=1)
    data = [f"data.{k}={v}" for k, v in sorted(paths.items())]
    big = load_parsed(QWEN, data + ["model.model_config.text_config.intermediate_size=256"]).run
    big.model.network().save_pretrained(str(tmp_path / "hf"))
    small = load_parsed(QWEN, data).run
    with pytest.raises(SpecError, match=r"model.pretrained: .*does not fit the config: wrong shapes "
                                        r"\['model.language_model.layers.0.mlp.down_proj.weight'"):
        load_hf_weights(small.model.network(), str(tmp_path / "hf"), small.model.checkpoint_name)


# -- every key used or refused (issue 40): Hugging Face fields, MindFormers spellings, LoRA ---------------
@pytest.fixture(scope="module")
def demo_sets(tmp_path_factory):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("demo")), 8, seed=1)
    return [f"data.{k}={v}" for k, v in sorted(paths.items())]


@pytest.mark.parametrize("name,sets,words", [
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.vision_config.dpth=3"],
     "model.model_config.vision_config.dpth: not a Qwen2_5_VLVisionConfig field (transformers would keep it unread "
     "and train its default); did you mean 'depth'?"),
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.text_config.num_hiden_layers=3"],
     "model.model_config.text_config.num_hiden_layers: not a Qwen2_5_VLTextConfig field"),
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.image_tokn_id=10"], "did you mean 'image_token_id'?"),
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.compute_dtype=float32"],
     "model.model_config.compute_dtype: not a Qwen2_5_VLConfig field: MindFormers' precision key"),
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.text_config.param_init_type=float32"],
     "model.model_config.text_config.param_init_type: not a Qwen2_5_VLTextConfig field: MindFormers' precision"),
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.use_flash_attention=true"],
     "model.model_config.use_flash_attention: True is refused: MindFormers' spelling; the Hugging Face field is "
     "attn_implementation (false is read as eager"),
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.text_config.init_method_std=0.02"],
     "model.model_config.text_config.init_method_std: not a Qwen2_5_VLTextConfig field: MindFormers' "
     "initialisation std; mindone's models read no initializer_range either"),
    # a rename the section's class has no field for: refused, naming the field it is elsewhere
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.vision_config.theta=5.0"],
     "model.model_config.vision_config.theta: not a Qwen2_5_VLVisionConfig field: MindFormers' spelling; the "
     "Hugging Face field is rope_theta"),
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.pet_config={pet_type: lora, lora_rank: 8}"],
     "model.model_config.pet_config: not a Qwen2_5_VLConfig field: LoRA / parameter-efficient fine-tuning is not "
     "supported yet"),
    # MindFormers' spelling and the Hugging Face field, two values: both keys named
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.text_config.num_layers=2"],
     "model.model_config.text_config.num_layers: 2, but model.model_config.text_config.num_hidden_layers is 4: two "
     "spellings of one field (MindFormers' num_layers, Hugging Face's num_hidden_layers); give one of them"),
    ("qwen3_vl_tiny.yaml", ["model.model_config.use_flash_attention=false",
                            "model.model_config.attn_implementation=sdpa"],
     "model.model_config.use_flash_attention: False, but model.model_config.attn_implementation is 'sdpa'"),
    # with text_config given, a top-level text field is ignored by the class
    ("qwen2_5_vl_tiny.yaml", ["model.model_config.hidden_size=64"],
     "model.model_config.hidden_size: a text-model field at the top level is ignored (text_config is given); give "
     "model.model_config.text_config.hidden_size"),
    ("qwen3_vl_tiny.yaml", ["model.model_config.rope_theta=5.0"], "model.model_config.rope_theta: a text-model "
                                                                   "field at the top level is ignored"),
    ("qwen3_vl_tiny.yaml", ["model.model_config.vision_config.fullatt_block_indexes=[1]"],
     "model.model_config.vision_config.fullatt_block_indexes: not a Qwen3VLVisionConfig field"),
])
def test_hugging_face_fields_the_class_does_not_read_are_refused(demo_sets, name, sets, words):
    """transformers keeps an unknown field as an attribute nobody reads: it trained the default, silently."""
    from hyperparallel.errors import SpecError
    from hyperparallel.recipe import derive_recipe
    from hyperparallel.runconfig import load_parsed
    rec = load_parsed(recipe(name), demo_sets + sets)
    with pytest.raises(SpecError) as e:
        rec.run
    assert str(e.value).startswith(words) or words in str(e.value), str(e.value)
    assert derive_recipe(rec).num_devices == 2   # plan still reads it


def test_hugging_face_fields_the_class_reads_and_the_recipes_own_keys_pass(demo_sets):
    from hyperparallel.runconfig import load_parsed
    for name in ("qwen2_5_vl_tiny.yaml", "qwen3_vl_tiny.yaml"):
        load_parsed(recipe(name), demo_sets).run
    rc = load_parsed(QWEN, demo_sets + [
        "model.model_config.torch_dtype=float32", "model.model_config.bos_token_id=1",   # PretrainedConfig's
        "model.model_config.freeze_vision=true", "model.model_config.text_config.offset=0",   # the recipe's
        "model.model_config.vision_config.initializer_range=0.01",
        "model.model_config.text_config.attention_dropout=0.0"]).run
    assert rc.model.vision.initializer_range == 0.01


def _mindformers_spelt(tmp_path, layers: int) -> str:
    """The tiny Qwen2.5-VL recipe with MindFormers' spellings of its Hugging Face fields (``layers`` LLM layers)."""
    import yaml
    raw = yaml.safe_load(open(QWEN))
    mc = raw["model"]["model_config"]
    t, v = mc["text_config"], mc["vision_config"]
    for hf, mf in (("num_hidden_layers", "num_layers"), ("num_key_value_heads", "n_kv_heads"), ("rope_theta", "theta"),
                   ("max_position_embeddings", "max_position_embedding"), ("num_attention_heads", "num_heads")):
        t[mf] = t.pop(hf)
    t.update(num_layers=layers, theta=5000.0, max_position_embedding=256, n_kv_heads=1)
    v["num_layers"] = v.pop("depth")
    mc["use_flash_attention"] = False
    path = tmp_path / f"spelt{layers}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


SPELT_NOTES = [f"model.model_config.{k}: MindFormers' spelling, read as {hf}" for k, hf in (
    ("use_flash_attention", "attn_implementation: eager"), ("text_config.max_position_embedding",
                                                            "max_position_embeddings"),
    ("text_config.n_kv_heads", "num_key_value_heads"), ("text_config.num_heads", "num_attention_heads"),
    ("text_config.num_layers", "num_hidden_layers"), ("text_config.theta", "rope_theta"),
    ("vision_config.num_layers", "depth"))]


def test_mindformers_spellings_of_hugging_face_fields_are_read_as_them(demo_sets, tmp_path):
    """MindFormers' num_layers (depth in a vision_config), n_kv_heads, theta, max_position_embedding, num_heads and
    use_flash_attention: false are Hugging Face fields under other names: read as them (the built model has the
    value), each said once (the adapter's notes, printed by the front end), the key as written in messages."""
    from hyperparallel.runconfig import load_parsed
    built = {}
    for layers in (2, 4):
        rc = load_parsed(_mindformers_spelt(tmp_path, layers), demo_sets).run
        t, m = rc.model.text, rc.model
        assert (t.num_hidden_layers, t.num_key_value_heads, t.rope_theta, t.max_position_embeddings,
                t.num_attention_heads, m.vision.depth) == (layers, 1, 5000.0, 256, 4, 2)
        assert m.fields["attn_implementation"] == "eager" and "num_layers" not in m.fields["text_config"]
        assert m.notes() == SPELT_NOTES
        assert [(r.name, r.layers, r.key) for r in m.regions()] == [
            ("vision", 2, "model.model_config.vision_config.num_layers"),
            ("llm", layers, "model.model_config.text_config.num_layers")]
        net = m.network()
        built[layers] = (len(net.model.language_model.layers), len(net.model.visual.blocks),
                         net.model.language_model.layers[0].self_attn.k_proj.weight.shape[0])
    assert built == {2: (2, 2, 16), 4: (4, 2, 16)}   # n_kv_heads 1 x head_dim 16: the k projection's rows


def test_mindformers_spelling_against_a_config_files_field_is_refused_naming_both(demo_sets, tmp_path):
    """text_config.num_layers: 2 over a config.json whose num_hidden_layers is 4: one setting with two values."""
    import yaml
    from hyperparallel.errors import SpecError
    from hyperparallel.runconfig import load_parsed
    raw = yaml.safe_load(open(QWEN))
    cfg = {k: v for k, v in raw["model"]["model_config"].items() if k != "type"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for layers, ok in ((4, True), (2, False)):
        raw["model"] = {"arch": raw["model"]["arch"], "config": str(tmp_path / "config.json"),
                        "model_config": {"text_config": {"num_layers": layers}}}
        (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
        rec = load_parsed(str(tmp_path / "r.yaml"), demo_sets)
        if ok:
            assert rec.run.model.notes() == [
                "model.model_config.text_config.num_layers: MindFormers' spelling, read as num_hidden_layers"]
            continue
        with pytest.raises(SpecError, match=r"^model.model_config.text_config.num_layers: 2, but num_hidden_layers of "
                                            r"the config file \(model.pretrained / model.config\) is 4: two spellings"):
            rec.run


def test_fields_of_a_hugging_face_directory_are_hugging_faces_own(demo_sets, tmp_path):
    """A config.json (model.config / model.pretrained) is the file transformers wrote and reads, with the older
    spellings of the public files (in_chans, vision_token_id): not checked; only the recipe's inline fields are."""
    import yaml
    from hyperparallel.runconfig import load_parsed
    raw = yaml.safe_load(open(QWEN))
    mc = raw["model"]["model_config"]
    cfg = dict({k: v for k, v in mc.items() if k != "type"}, vision_token_id=12,
               vision_config=dict(mc["vision_config"], in_chans=3))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    raw["model"] = {"arch": raw["model"]["arch"], "config": str(tmp_path / "config.json")}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
    load_parsed(str(tmp_path / "r.yaml"), demo_sets).run


def test_mindformers_llama_lora_is_refused_not_trained_in_full(tmp_path):
    """pet_config: {pet_type: lora} trained the whole model silently."""
    from hyperparallel.errors import SpecError
    from hyperparallel.recipe import derive_recipe
    from hyperparallel.runconfig import load_parsed
    rec = load_parsed(MF, ["model.model_config.pet_config={pet_type: lora, lora_rank: 8, lora_alpha: 16}"])
    with pytest.raises(SpecError, match=r"^model.model_config.pet_config: \{'pet_type': 'lora', .*LoRA / "
                                        r"parameter-efficient fine-tuning is not supported yet"):
        rec.run
    assert derive_recipe(rec).num_devices == 2


NOTE = "note: model.model_config.text_config.num_layers: MindFormers' spelling, read as num_hidden_layers"


def _note_once(p, tmp_path):
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines().count(NOTE) == 1, p.stdout
    logs = tmp_path / "run" / "logs"
    files = [f for f in logs.rglob("*") if f.is_file()]
    assert files, logs
    said = [f.name for f in files if "MindFormers' spelling" in f.read_text(errors="replace")]
    assert not said, said   # the ranks (and the reference's library log) build the same model silently


def test_a_mindformers_spelling_is_said_once_on_the_console_before_training(tmp_path):
    """``train --reference``: the note comes from the front end, before the first step, once."""
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path / "d"), 8, seed=1)
    data = [f"--set=data.{k}={v}" for k, v in sorted(paths.items())]
    p = run_cli("train", QWEN, *data, "--set=model.model_config.text_config.num_layers=4", "--reference",
                "--steps", "1", "--run-dir", str(tmp_path / "run"), timeout=300)
    _note_once(p, tmp_path)
    lines = p.stdout.splitlines()
    assert lines.index(NOTE) < min(i for i, line in enumerate(lines) if line.startswith("[reference]")), p.stdout


@pytest.mark.msrun
def test_a_mindformers_spelling_is_said_once_not_once_per_rank(tmp_path):
    """A pipeline run of two ranks: the launcher's console says it once; no rank's log says it."""
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path / "d"), 8, seed=1)
    data = [f"--set=data.{k}={v}" for k, v in sorted(paths.items())]
    p = run_cli("train", QWEN, *data, "--set=model.model_config.text_config.num_layers=4", "--steps", "1",
                "--run-dir", str(tmp_path / "run"), timeout=400)
    _note_once(p, tmp_path)
    assert "step 1/1" in p.stdout or (tmp_path / "run" / "metrics.jsonl").is_file(), p.stdout
