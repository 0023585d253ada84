"""``model.lora`` (LoRA through mindone.peft, :mod:`hyperparallel.models.lora`): the section is PEFT's
LoraConfig (names and defaults), refused one line naming the key before launch (an unknown field with the
nearest, a target that matches no module, an adapter on a region the plan freezes, a trained region without
an adapter); the module names computed from the config are the built models' own, and the modules a
config adapts are the ones mindone.peft wraps."""
import os

import pytest

from hyperparallel.errors import SpecError
from hyperparallel.models import lora

HERE = os.path.dirname(os.path.abspath(__file__))
Q25 = os.path.join(HERE, "..", "..", "recipes", "qwen2_5_vl_tiny.yaml")
Q3 = os.path.join(HERE, "..", "..", "recipes", "qwen3_vl_tiny.yaml")
DEC = "model.lora={r: 4, target_modules: [q_proj, v_proj]}"
FREEZE = "mpipe.encoder.trainable=false"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("ldemo")), 8, seed=3)
    return [f"data.{k}={v}" for k, v in sorted(paths.items())]


def _prepare(demo, path, *overrides):
    """What ``train`` checks before launch: the recipe, its run config and the plan."""
    from hyperparallel.recipe import checked_plan
    from hyperparallel.runconfig import load_parsed
    recipe = load_parsed(path, demo + list(overrides))
    rc = recipe.run
    rc.check_plan(checked_plan(recipe, "1f1b"))
    return rc


def test_defaults_are_peft_loraconfigs():
    cfg = lora.parse({"target_modules": ["q_proj"]})
    assert cfg == dict(r=8, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"], exclude_modules=None,
                       modules_to_save=None, bias="none", use_rslora=False, init_lora_weights=True)
    peft = pytest.importorskip("mindone.peft")
    want = peft.LoraConfig()
    assert {k: getattr(want, k) for k in cfg if k != "target_modules"} == \
        {k: v for k, v in cfg.items() if k != "target_modules"}


@pytest.mark.parametrize("section,key,words", [
    ({"alpha": 16, "target_modules": ["q_proj"]}, "model.lora.alpha", "did you mean 'lora_alpha'"),
    ({"r": 0, "target_modules": ["q_proj"]}, "model.lora.r", "positive whole number"),
    ({"lora_dropout": 1.5, "target_modules": ["q_proj"]}, "model.lora.lora_dropout", "[0, 1)"),
    ({"r": 4}, "model.lora.target_modules", "missing"),
    ({"target_modules": "q_proj("}, "model.lora.target_modules", "not a regular expression"),
    ({"target_modules": ["q_proj"], "bias": "some"}, "model.lora.bias", "none, all, lora_only"),
    ({"target_modules": ["q_proj"], "init_lora_weights": "pissa"}, "model.lora.init_lora_weights", "gaussian"),
    ("q_proj", "model.lora", "mapping"),
])
def test_bad_fields_are_refused_naming_the_key(section, key, words):
    with pytest.raises(SpecError) as e:
        lora.parse(section)
    assert e.value.field == key and words in str(e.value), str(e.value)


NAMES = lora.module_names("qwen2_5_vl", 2, 4)


def test_targets_match_by_peft_rule():
    got = lora.adapted(lora.parse({"target_modules": ["q_proj", "qkv"]}), NAMES)
    assert got["llm"] == [f"model.language_model.layers.{i}.self_attn.q_proj" for i in range(4)]
    assert got["vision"] == ["model.visual.blocks.0.attn.qkv", "model.visual.blocks.1.attn.qkv"]
    got = lora.adapted(lora.parse({"target_modules": r".*layers\.3\.mlp\.(up|down)_proj"}), NAMES)
    assert got == {"llm": ["model.language_model.layers.3.mlp.up_proj", "model.language_model.layers.3.mlp.down_proj"]}
    got = lora.adapted(lora.parse({"target_modules": ["v_proj"], "exclude_modules": ["layers.0.self_attn.v_proj"],
                                   "modules_to_save": ["lm_head"]}), NAMES)
    assert got["llm"] == [f"model.language_model.layers.{i}.self_attn.v_proj" for i in (1, 2, 3)] + ["lm_head"]


@pytest.mark.parametrize("section,key,words", [
    ({"target_modules": ["q_proj", "qkv_proj"]}, "model.lora.target_modules", "'qkv_proj' matches no module"),
    ({"target_modules": ["norm1"]}, "model.lora.target_modules", "(other); LoRA adapts Linear"),
    ({"target_modules": ["q_proj"], "modules_to_save": ["vision_head"]}, "model.lora.modules_to_save",
     "'vision_head' matches no"),
])
def test_targets_matching_nothing_are_refused(section, key, words):
    with pytest.raises(SpecError) as e:
        lora.adapted(lora.parse(section), NAMES)
    assert e.value.field == key and words in str(e.value), str(e.value)


def test_recipe_refusals_before_launch(demo):
    pytest.importorskip("transformers")
    with pytest.raises(SpecError) as e:   # the target matches nothing of this model: when the adapter is built
        _prepare(demo, Q25, "model.lora={target_modules: [query]}", FREEZE)
    assert e.value.field == "model.lora.target_modules" and "'query' matches no module" in str(e.value)
    with pytest.raises(SpecError) as e:   # an adapter in the vision blocks, which the plan freezes
        _prepare(demo, Q25, "model.lora={target_modules: [q_proj, qkv]}", FREEZE)
    assert e.value.field == "model.lora.target_modules" and "plan freezes region 'vision'" in str(e.value)
    with pytest.raises(SpecError) as e:   # decoder-only LoRA but the plan trains the encoder: nothing would train
        _prepare(demo, Q25, DEC, "mpipe.encoder.trainable=true")
    assert e.value.field == "model.lora" and "no adapter in region 'vision'" in str(e.value)
    assert "freeze_vision: true or mpipe.encoder.trainable: false" in str(e.value)
    with pytest.raises(SpecError) as e:   # a trained copy of the merger, in the frozen encoder
        _prepare(demo, Q25, "model.lora={target_modules: [q_proj], modules_to_save: [merger]}", FREEZE)
    assert e.value.field == "model.lora.modules_to_save" and "adapts model.visual.merger" in str(e.value)
    with pytest.raises(SpecError) as e:
        _prepare(demo, Q25, "model.lora={target_modules: [q_proj], lora_alfa: 4}", FREEZE)
    assert e.value.field == "model.lora.lora_alfa" and "did you mean 'lora_alpha'" in str(e.value)
    with pytest.raises(SpecError) as e:
        _prepare(demo, Q25, DEC, FREEZE, "model.model_config.tie_word_embeddings=true",
                 "model.model_config.text_config.tie_word_embeddings=true")
    assert e.value.field == "model.lora" and "tie_word_embeddings" in str(e.value)
    with pytest.raises(SpecError) as e:   # MindFormers' freeze flag freezes the region too
        _prepare(demo, Q25, "model.lora={target_modules: [qkv, q_proj]}", "model.model_config.freeze_vision=true")
    assert e.value.field == "model.lora.target_modules" and "model.visual.blocks.0.attn.qkv" in str(e.value)
    _prepare(demo, Q25, DEC, "model.model_config.freeze_vision=true")
    rc = _prepare(demo, Q25, DEC, FREEZE)   # decoder only, encoder frozen: accepted
    assert rc.model.lora["r"] == 4 and sorted(rc.model.lora_modules) == ["llm"]
    _prepare(demo, Q3, "model.lora={target_modules: [q_proj, qkv, linear_fc1]}")   # decoder + vision (and mergers)


@pytest.mark.slow
@pytest.mark.parametrize("path", [Q25, Q3])
def test_module_names_are_the_built_models(demo, path):
    """The names computed from the config (checked before launch) are mindone's; mindone.peft wraps exactly the
    modules :func:`lora.adapted` names, and freezes every other weight."""
    pytest.importorskip("mindone")
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime import compat
    compat.setup_device("CPU")
    rc = load_parsed(path, demo + [FREEZE, "model.model_config.vision_config.depth=3"]).run
    built = {n: type(c).__name__ for n, c in rc.model.network().cells_and_names() if n}
    names = rc.model.module_names()
    assert set(built) == set(names)
    assert {n for n, k in built.items() if k in ("Linear", "Embedding", "Conv3d")} == \
        {n for n, k in names.items() if k != "other"}
    assert all(built[n] == k for n, k in names.items() if k != "other")
    rc = load_parsed(path, demo + ["model.lora={target_modules: [v_proj, qkv], "
                                   "modules_to_save: [lm_head]}",
                            "model.model_config.vision_config.depth=3"]).run
    net = rc.model.network()
    wrapped = sorted(n for n, c in net.cells_and_names() if type(c).__name__ == "Linear" and hasattr(c, "lora_A"))
    want = rc.model.lora_modules
    assert wrapped == sorted(want["llm"][:-1] + want["vision"])
    trained = {p.name for p in net.trainable_params()}
    assert trained and all(".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n for n in trained)
    assert all(lora.is_frozen_base(p) == (p.name not in trained) for p in net.get_parameters())


def test_merge_lora_needs_export_hf(tmp_path):
    from hyperparallel.cli import build_parser
    from hyperparallel.commands.train import check_ckpt_output
    args = build_parser().parse_args(["ckpt", str(tmp_path), "--merge", str(tmp_path / "x.ckpt"), "--merge-lora"])
    with pytest.raises(SpecError) as e:
        check_ckpt_output(args)
    assert e.value.field == "--merge-lora" and "only with --export-hf" in str(e.value)
    args = build_parser().parse_args(["ckpt", str(tmp_path), "--export-hf", str(tmp_path / "out"), "--merge-lora"])
    check_ckpt_output(args)   # accepted: whether the step has adapters is known once it is read
