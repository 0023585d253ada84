"""Recipes as MindFormers YAML: the loader (conformance with MindFormers' own MindFormerConfig),
the mpipe: section, and the shipped MindFormers recipes through plan/check/simulate."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import importlib.util

from hyperparallel.errors import SpecError
from hyperparallel.recipe.files import _load_yaml, load_raw
from hyperparallel.recipe import load_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPES = os.path.join(ROOT, "recipes")
HAVE_MF = importlib.util.find_spec("mindformers") is not None
needs_mf = pytest.mark.skipif(not HAVE_MF, reason="mindformers is not installed (requirements.txt pins 1.9.0)")

PROFILE = textwrap.dedent("""\
    mpipe:
      schedule: 1f1b
      profile:
        regions:
          - {name: vision, layers: 2, trainable: false, forward_ms: 2.0}
          - {name: llm, layers: 4, trainable: true, forward_ms: 1.0}
    """)


def mf_env():
    pp = os.environ.get("PYTHONPATH")
    return dict(os.environ, GLOG_v="3", PYTHONPATH=ROOT + (os.pathsep + pp if pp else ""))


def write(tmp_path, name, text):
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))
    return str(p)


@pytest.fixture
def family(tmp_path):
    """base_a + base_b (two bases, MindFormers combines them top-level, later wins) <- child."""
    write(tmp_path, "base/a.yaml", """\
        parallel_config: {data_parallel: 2, model_parallel: 1, pipeline_stage: 2, micro_batch_num: 4}
        model: {model_config: {num_hidden_layers: 4, hidden_size: 64, vision_config: {depth: 2, hidden_size: 32}}}
        optimizer: {type: AdamW, betas: [0.9, 0.95]}
        """)
    write(tmp_path, "base/b.yaml", PROFILE + textwrap.dedent("""\
        parallel:
          pipeline_config: {pipeline_interleave: false, pipeline_scheduler: 1f1b}
        optimizer: {type: SGD}
        """))
    return write(tmp_path, "child.yaml", """\
        base_config: [base/a.yaml, base/b.yaml]
        parallel_config: {pipeline_stage: 4, micro_batch_num: 8}
        model: {model_config: {vision_config: {depth: 3}}}
        mpipe: {schedule: transpose}
        """)


def expected_child():
    return {
        "parallel_config": {"data_parallel": 2, "model_parallel": 1, "pipeline_stage": 4, "micro_batch_num": 8},
        "model": {"model_config": {"num_hidden_layers": 4, "hidden_size": 64,
                                   "vision_config": {"depth": 3, "hidden_size": 32}}},
        "optimizer": {"type": "SGD"},
        "parallel": {"pipeline_config": {"pipeline_interleave": False, "pipeline_scheduler": "1f1b"}},
        "mpipe": {"schedule": "transpose", "profile": {"regions": [
            {"name": "vision", "layers": 2, "trainable": False, "forward_ms": 2.0},
            {"name": "llm", "layers": 4, "trainable": True, "forward_ms": 1.0}]}},
    }


def test_fallback_loader_merges_like_mindformers(family):
    assert _load_yaml(family) == expected_child()


#: loads files with MindFormers' own class (imports MindSpore), prints one JSON line per file; then
#: applies MindFormers' ConfigTemplate (what MindFormerConfig(path) adds) to the files named after "--template"
MF_LOAD = """
import json, sys
from mindformers.tools.register import MindFormerConfig as C
from mindformers.tools.register.template import ConfigTemplate
args = sys.argv[1:]
cut = args.index("--template")
for path in args[:cut]:
    print("JSON", json.dumps([path, C(**C._file2dict(path)).to_dict()]))
for path in args[cut + 1:]:
    cfg = C(**C._file2dict(path)).to_dict()
    cfg.setdefault("run_mode", "train")
    try:
        ConfigTemplate.apply_template(cfg)
        print("TEMPLATE", json.dumps([path, "ok", cfg["parallel_config"]["pipeline_stage"], cfg.get("mpipe")]))
    except (KeyError, ValueError) as e:
        print("TEMPLATE", json.dumps([path, type(e).__name__ + ": " + str(e)]))
"""


def shipped_recipes():
    out = []
    for d, _, files in os.walk(RECIPES):
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".yaml")]
    return sorted(out)


@needs_mf
@pytest.mark.slow
def test_every_shipped_recipe_loads_as_mindformers_own_class_loads_it(family, tmp_path):
    """Conformance: the built-in merge == MindFormerConfig._file2dict + MindFormerConfig(**d), file by file;
    and MindFormers' template accepts the Ascend recipes and refuses the CPU recipes' interleave spelling."""
    files = shipped_recipes() + [family]
    mf = ("mf_llama_mllm.yaml", "mf_qwen2_mllm.yaml", "mf_llama_mllm_data.yaml", "mf_llama_mllm_bench.yaml")
    templ = [os.path.join(RECIPES, n) for n in ("qwen2_5_vl_7b.yaml", "qwen2_5_vl_72b.yaml", *mf, "llm_pipeline.yaml")]
    r = subprocess.run([sys.executable, "-c", MF_LOAD, *files, "--template", *templ], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300, env=mf_env())  # MindFormers logs to ./output
    assert r.returncode == 0, r.stderr[-2000:]
    got = dict(json.loads(l[5:]) for l in r.stdout.splitlines() if l.startswith("JSON "))
    assert sorted(got) == sorted(files) and len(files) > 10
    for path in files:
        assert _load_yaml(path) == got[path], path
    assert got[family] == expected_child()
    t = {x[0]: x[1:] for x in (json.loads(l[9:]) for l in r.stdout.splitlines() if l.startswith("TEMPLATE "))}
    for name in templ[:-1]:   # the Ascend recipes and the MindFormers-model CPU recipes are MindFormers configs
        raw = load_raw(name)
        assert t[name] == ["ok", raw["parallel_config"]["pipeline_stage"], raw["mpipe"]], name
    # documented difference: MindFormers 1.9 wants pp_interleave_num in model.model_config
    assert t[templ[-1]][0].startswith("KeyError") and "pp_interleave_num" in t[templ[-1]][0]


def test_loading_imports_no_mindspore_or_mindformers(family):
    code = ("import sys; from hyperparallel.recipe import load_recipe; "
            f"r = load_recipe({family!r}); "
            f"r2 = load_recipe({os.path.join(RECIPES, 'qwen2_5_vl_72b.yaml')!r}); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('mindspore', 'mindformers')]; "
            "print('IMPORTED', bad)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "IMPORTED []" in r.stdout


def test_recipe_values_from_inherited_sections(family):
    r = load_recipe(family)
    assert (r.pipeline_stage, r.micro_batch_num, r.data_parallel, r.pp_interleave_num) == (4, 8, 2, 1)
    assert r.schedule == "transpose" and r.profile.names() == ("vision", "llm")


def test_set_switches_a_recipe_to_transpose(family):
    r = load_recipe(family, ["mpipe.schedule=1f1b"])
    assert r.schedule == "1f1b"
    r = load_recipe(family, ["mpipe.schedule=transpose", "mpipe.encoder.owners=min"])
    assert r.plan_schedule().name() == "transpose(owners=min)"


@pytest.mark.parametrize("override,field,allowed", [
    ("mpipe.bogus=1", "mpipe.bogus", "allowed: schedule, profile, encoder"),
    ("mpipe.encoder.bogus=1", "mpipe.encoder.bogus", "allowed: owners, backward, spill, optimizer, trainable"),
    ("mpipe.encoder.trainable=maybe", "mpipe.encoder.trainable", "true or false"),
    ("parallel.pipeline_config.pipeline_scheduler=wave", "parallel.pipeline_config.pipeline_scheduler",
     "allowed: gpipe, 1f1b, seqpipe, seqvpp, seqsmartvpp, zero_bubble_v"),
])
def test_bad_mpipe_keys_list_the_allowed_ones(family, override, field, allowed):
    with pytest.raises(SpecError) as e:
        load_recipe(family, [override])
    assert e.value.field == field and allowed in str(e.value)


def test_encoder_options(family):
    r = load_recipe(family, ["mpipe.encoder={owners: min, backward: central, trainable: true}"])
    assert r.plan_schedule().name() == "transpose(owners=min, backward=central)"
    assert r.profile.region("vision").trainable is True
    # the schedule's own options win only if they agree
    with pytest.raises(SpecError) as e:
        load_recipe(family, ["mpipe.encoder.owners=min", "mpipe.schedule=transpose(owners=balanced)"])
    assert e.value.field == "mpipe.encoder.owners"
    # --schedule values get the recipe's encoder options too
    r = load_recipe(family, ["mpipe.encoder.owners=min"])
    assert r.plan_schedule("transpose(order=gpipe)").name() == "transpose(owners=min, order=gpipe)"
    assert r.plan_schedule("1f1b").name() == "1f1b"


def test_pp_interleave_num_in_mindformers_place(family):
    r = load_recipe(family, ["model.model_config.pp_interleave_num=2", "parallel_config.pipeline_stage=2",
                             "parallel.pipeline_config.pipeline_interleave=true"])
    assert r.pp_interleave_num == 2 and r.v_key == "model.model_config.pp_interleave_num"
    # MindFormers' LayerSetting: pp_interleave_num counts only with pipeline_interleave on
    assert load_recipe(family, ["model.model_config.pp_interleave_num=2"]).pp_interleave_num == 1
    with pytest.raises(SpecError) as e:
        load_recipe(family, ["model.model_config.pp_interleave_num=2", "parallel_config.pp_interleave_num=1"])
    assert e.value.field == "parallel_config.pp_interleave_num"


def test_profile_from_model_config_when_missing(tmp_path):
    """A MindFormers user's recipe + base_config + a bare mpipe: section plans with unit costs."""
    p = write(tmp_path, "user.yaml", f"""\
        base_config: {os.path.join(RECIPES, 'mindformers', 'qwen2_5_vl_7b.yaml')}
        mpipe: {{schedule: transpose, encoder: {{trainable: false}}}}
        """)
    r = load_recipe(p)
    assert [(x.name, x.layers, x.trainable) for x in r.profile.regions] == [("vision", 32, False), ("llm", 28, True)]
    assert r.schedule == "transpose" and r.pipeline_stage == 4


def test_missing_base_and_cycle_are_one_line_errors(tmp_path):
    p = write(tmp_path, "a.yaml", "base_config: nope.yaml\n" + PROFILE)
    with pytest.raises(SpecError, match="not found"):
        load_recipe(p)
    write(tmp_path, "x.yaml", "base_config: y.yaml\n")
    p = write(tmp_path, "y.yaml", "base_config: x.yaml\n")
    with pytest.raises(SpecError) as e:
        load_recipe(p)
    assert e.value.field == "base_config" and str(e.value) == "base_config: inheritance cycle: y.yaml -> x.yaml -> y.yaml"
    p = write(tmp_path, "self.yaml", "base_config: [ok.yaml, sub/../self.yaml]\n")
    write(tmp_path, "ok.yaml", "a: 1\n")
    with pytest.raises(SpecError, match="inheritance cycle: self.yaml -> self.yaml"):
        load_recipe(p)
    # a file inherited twice along different branches is no cycle
    write(tmp_path, "common.yaml", PROFILE + "parallel_config: {pipeline_stage: 2, micro_batch_num: 4}\n")
    write(tmp_path, "left.yaml", "base_config: common.yaml\n")
    p = write(tmp_path, "both.yaml", "base_config: [left.yaml, common.yaml]\n")
    assert load_recipe(p).pipeline_stage == 2


@pytest.mark.parametrize("name", ["qwen2_5_vl_7b.yaml", "qwen2_5_vl_72b.yaml"])
def test_ascend_recipes_are_mindformers_configs(name):
    raw = load_raw(os.path.join(RECIPES, name))
    assert raw["device"] == "Ascend" and raw["context"]["device_target"] == "Ascend"
    assert raw["model"]["model_config"]["vision_config"]["depth"] == 32


@pytest.mark.parametrize("args,expect", [
    (["check", "recipes/qwen2_5_vl_7b.yaml"], "OK: 2 devices, 16 micro-batches"),
    (["check", "recipes/qwen2_5_vl_72b.yaml"], "OK: 8 devices, 32 micro-batches"),
    (["plan", "recipes/qwen2_5_vl_7b.yaml", "--set", "mpipe.schedule=1f1b"], "schedule 1f1b: P=2 M=16 V=1 D=4"),
    (["plan", "recipes/qwen2_5_vl_72b.yaml"], "schedule transpose(order=interleaved, recompute=full): P=8 M=32 V=2 D=8"),
    (["simulate", "recipes/qwen2_5_vl_7b.yaml", "--schedule", "1f1b", "--schedule", "transpose"], "transpose"),
    (["simulate", "recipes/qwen2_5_vl_72b.yaml", "--schedule", "interleaved", "--schedule",
      "transpose(order=interleaved)"], "transpose(order=interleaved, recompute=full)"),
    (["plan", "recipes/tiny_mllm_mindformers.yaml"], "schedule transpose(owners=min): P=2 M=4"),
])
def test_cli_accepts_mindformers_recipes(cli, args, expect):
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout


def test_transpose_on_72b_means_transpose_plus_interleaved(cli):
    # the recipe has pp_interleave_num > 1: a transpose without order pipes the LLM interleaved
    r = cli("plan", "recipes/qwen2_5_vl_72b.yaml", "--schedule", "transpose")
    assert r.returncode == 0, r.stderr
    assert "schedule transpose(order=interleaved, recompute=full)" in r.stdout   # the recipe's mpipe.recompute
    # an explicit V = 1 order is still refused, naming the key
    r = cli("plan", "recipes/qwen2_5_vl_72b.yaml", "--schedule", "transpose(order=1f1b)")
    assert r.returncode == 2 and "pp_interleave_num" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.msrun
def test_train_accepts_a_mindformers_recipe(tmp_path):
    """`hyperparallel train` on the tiny recipe switched the MindFormers way (base_config + mpipe:)."""
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "hyperparallel", "train", "recipes/tiny_mllm_mindformers.yaml",
                        "--steps", "2", "--run-dir", str(run_dir), "--set", "train.optimizer_compile=eager", "--compile", "eager"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)   # eager: no ~4 s optimizer compile
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    assert "schedule transpose(owners=min)" in r.stdout
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2] and all(x["schedule"] == "transpose(owners=min)" for x in rows)
