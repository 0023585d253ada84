"""The plan/check CLI and its refusals (exit 2, one line, no traceback)."""
import json
import subprocess
import sys

import pytest

from helpers import ROOT, recipe


def test_plan_prints_one_line_per_action_and_exports(cli, tmp_path):
    out = tmp_path / "plan.json"
    r = cli("plan", recipe("mllm_encoder_heavy.yaml"), "--set", "parallel_config.pipeline_stage=2",
            "--set", "parallel_config.micro_batch_num=4", "--export", str(out))
    assert r.returncode == 0, r.stderr
    assert "device 0" in r.stdout and "device 1" in r.stdout
    assert "idx" in r.stdout and "kind" in r.stdout and "peer" in r.stdout
    obj = json.loads(out.read_text())
    n_actions = sum(len(p) for p in obj["programs"].values())
    action_lines = [ln for ln in r.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert len(action_lines) == n_actions
    # device 1 owns micro-batches 1 and 3 of the encoder and sends them to device 0
    d1 = obj["programs"]["1"]
    assert [a["micro"] for a in d1 if a["kind"] == "F" and a["region"] == "vision"] == [1, 3]
    assert {"kind": "SEND", "region": "vision", "chunk": 0, "micro": 1, "peer": 0, "tensor": "act"} in d1

    r = cli("check", str(out))
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stderr


def test_check_refuses_a_tampered_plan(cli, tmp_path):
    r = cli("plan", recipe("llm_pipeline.yaml"), "--export", str(tmp_path / "p.json"))
    assert r.returncode == 0
    obj = json.loads((tmp_path / "p.json").read_text())
    prog = obj["programs"]["3"]
    k = next(i for i, a in enumerate(prog) if a["kind"] == "RECV")
    del prog[k]
    (tmp_path / "bad.json").write_text(json.dumps(obj))
    r = cli("check", str(tmp_path / "bad.json"))
    assert r.returncode != 0
    assert f"device 3 action {k} (F llm c3 m0): needs act of llm c2 m0" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_recipe_ok(cli):
    r = cli("check", recipe("mllm_encoder_heavy.yaml"), "--schedule", "transpose(backward=central)",
            "--set", "mpipe.profile.regions.0.trainable=true")
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


BAD = [
    (["--schedule", "fastest"], "schedule: 'fastest' unknown; allowed: gpipe, 1f1b, interleaved, zb_h1, interleaved_zb, zbv, dualpipev, interleaved_zb_fast, zbv_fast, transpose"),
    (["--schedule", "transpose(owners=lucky)"], "schedule.owners: 'lucky' unknown; allowed: round_robin, min, balanced"),
    (["--schedule", "[{region: vision, skeleton: fold}, {region: llm, skeleton: pipe}]"],
     "schedule[0].skeleton: 'fold' unknown; allowed: pipe, place, transpose"),
    (["--schedule", "[{region: audio, skeleton: place}, {region: llm, skeleton: pipe}]"],
     "schedule[0].region: 'audio' unknown; allowed: vision, llm"),
    (["--set", "parallel_config.pipeline_stage=0"], "parallel_config.pipeline_stage: must be a whole number >= 1"),
    (["--set", "parallel_config.micro_batch_num=-2"], "parallel_config.micro_batch_num: must be a whole number >= 1"),
    (["--set", "parallel_config.pipeline_stage=16"], "mpipe.profile.regions[1].layers: 'llm' has 8 layers, cannot cut"),
    (["--set", "mpipe.profile.regions.1.forward_ms=-1"], "mpipe.profile.regions[1].forward_ms: must be a number >= 0"),
    (["--set", "mpipe.profile.regions.0.color=red"], "mpipe.profile.regions[0].color: unknown key; allowed: name"),
    (["--set", "mpipe.speed=9"], "mpipe.speed: unknown key; allowed: schedule, profile"),
    (["--schedule", "1f1b", "--set", "parallel_config.pp_interleave_num=2"],
     "parallel_config.pp_interleave_num: must be 1 for order '1f1b'"),
    (["--schedule", "zbv", "--set", "parallel_config.pp_interleave_num=1"],
     "parallel_config.pp_interleave_num: must be 2 for order 'zbv' (V-shape: two chunks per device), got 1; allowed: 2"),
    (["--schedule", "transpose(order=dualpipev)", "--set", "parallel_config.pp_interleave_num=4"],
     "parallel_config.pp_interleave_num: must be 2 for order 'dualpipev'"),
    (["--schedule", "interleaved", "--set", "parallel_config.pp_interleave_num=2", "--set",
      "parallel_config.micro_batch_num=3"],
     "parallel_config.micro_batch_num: must be >= pipeline_stage (4) for order 'interleaved' with pp_interleave_num=2"),
    (["--schedule", "zbv", "--set", "parallel_config.pp_interleave_num=2", "--set", "parallel_config.micro_batch_num=6"],
     "parallel_config.micro_batch_num: must be >= 2 x pipeline_stage - 1 (7) for order 'zbv', got 6"),
    (["--schedule", "transpose(order=wave)"],
     "schedule.order: 'wave' unknown; allowed: gpipe, 1f1b, interleaved, zb_h1, interleaved_zb, zbv, dualpipev, interleaved_zb_fast, zbv_fast"),
    (["--schedule", "[{region: vision, skeleton: transpose}, {region: llm, skeleton: pipe, order: zbw}]"],
     "schedule[1].order: 'zbw' unknown; allowed: gpipe, 1f1b, interleaved, zb_h1, interleaved_zb, zbv, dualpipev, interleaved_zb_fast, zbv_fast"),
    (["--set", "nonsense"], "--set: expected key.path=value"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_is_refused_with_one_line(cli, args, message):
    r = cli("plan", recipe("mllm_encoder_heavy.yaml"), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr


def test_missing_keys_and_files_are_refused(cli, tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("parallel_config: {pipeline_stage: 2}\nmpipe: {profile: {regions: [{name: llm, layers: 4}]}}\n")
    r = cli("plan", str(bad))
    assert r.returncode == 2 and r.stderr.strip() == "error: parallel_config.micro_batch_num: missing"
    r = cli("plan", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "file not found" in r.stderr


def test_planning_never_imports_mindspore():
    code = ("import sys; from hyperparallel.cli import main; "
            f"main(['plan', {recipe('mllm_encoder_heavy.yaml')!r}]); main(['check', {recipe('llm_pipeline.yaml')!r}]);"
            f"main(['simulate', {recipe('mllm_encoder_heavy.yaml')!r}, '--schedule', '1f1b', '--schedule', 'transpose']);"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('mindspore', 'mindformers')];"
            "print('IMPORTED', bad)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "IMPORTED []" in r.stdout


def test_outputs_never_overwrite_the_recipe(cli, tmp_path):
    """``plan --export``, ``simulate --trace/--png`` onto the recipe being read: refused naming the flag,
    the recipe as it was."""
    own = tmp_path / "llm.yaml"
    own.write_text(open(recipe("llm_pipeline.yaml")).read())
    before = own.read_text()
    for args in (("plan", str(own), "--export", str(own)), ("simulate", str(own), "--trace", str(own))):
        r = cli(*args)
        assert r.returncode == 2 and r.stderr.startswith(f"error: {args[2]}: {own} is the input {own}"), r.stderr
    assert own.read_text() == before
