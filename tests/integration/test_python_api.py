"""examples/train_mf_llama.py: a user's own msrun script trains recipes/mf_llama_mllm.yaml through
the Python API (Runtime.from_recipe, step, save, load) exactly like the single-process reference."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")
if importlib.util.find_spec("mindformers") is None:
    pytest.skip("mindformers is not installed", allow_module_level=True)
os.environ.setdefault("LOCAL_DEFAULT_PATH", tempfile.mkdtemp(prefix="hp_mindformers_logs_"))

from hyperparallel.launch import free_port, msrun_path  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "train_mf_llama.py")
RECIPE = os.path.join(ROOT, "recipes", "mf_llama_mllm.yaml")


def msrun(script_args, log_dir, world=2, timeout=400):
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT
    cmd = msrun_path() + [f"--worker_num={world}", f"--local_worker_num={world}", f"--master_port={free_port()}",
                          f"--log_dir={log_dir}", "--join=True", EXAMPLE] + list(script_args)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    logs = "".join(open(os.path.join(log_dir, f)).read()[-3000:] for f in sorted(os.listdir(log_dir))
                   if f.startswith("worker_"))
    assert p.returncode == 0, p.stdout[-2000:] + logs
    return p


def reference_losses(steps):
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.reference import Reference
    compat.setup_device("CPU")
    recipe = load_parsed(RECIPE)
    ref = Reference(recipe.run, recipe.micro_batch_num,
                    {r.name: r.trainable for r in recipe.profile.regions})
    return [ref.step(s)[0] for s in range(steps)]


@pytest.mark.msrun
def test_example_script_trains_saves_and_resumes_like_reference(tmp_path):
    ckpt, a, b = tmp_path / "ckpt", tmp_path / "a.json", tmp_path / "b.json"
    msrun(["--steps", "3", "--save-dir", str(ckpt), "--out", str(a)], str(tmp_path / "log1"))
    assert (ckpt / "step_3" / "COMPLETE").exists() and (ckpt / "step_3" / "meta.json").exists()
    msrun(["--steps", "5", "--save-dir", str(ckpt), "--resume", "--out", str(b)], str(tmp_path / "log2"))
    first = json.loads(a.read_text())
    resumed = json.loads(b.read_text())
    assert sorted(first) == ["0", "1", "2"] and sorted(resumed) == ["3", "4"]
    got = [first[k] for k in ("0", "1", "2")] + [resumed[k] for k in ("3", "4")]
    np.testing.assert_allclose(got, reference_losses(5), rtol=1e-5)
    assert_loads_into_mindformers_llama(ckpt / "step_3")


def assert_loads_into_mindformers_llama(step_dir):
    """The pipelined run's checkpoint loads into MindFormers' own LlamaForCausalLM, built by
    MindFormers' builder from the recipe, with MindSpore's own calls (no project code between)."""
    import glob

    import mindspore as ms
    from mindformers.models.build_model import build_model
    from mindformers.tools.register import MindFormerConfig
    params = {}
    for f in sorted(glob.glob(str(step_dir / "*.safetensors"))):
        params.update(ms.load_checkpoint(f, format="safetensors"))
    net = build_model(MindFormerConfig(RECIPE).model)
    assert type(net).__name__ == "LlamaForCausalLM"
    not_loaded, _ = ms.load_param_into_net(net, params)
    assert not_loaded == [], not_loaded[:5]
    for p in net.get_parameters():   # the trained values, not the fresh initialisation
        np.testing.assert_array_equal(p.asnumpy(), params[p.name].asnumpy(), err_msg=p.name)
