"""tools/msrun_launch.sh and tools/modelarts_entry.sh: --dry-run prints the exact command."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MSRUN = os.path.join(ROOT, "tools", "msrun_launch.sh")
MA = os.path.join(ROOT, "tools", "modelarts_entry.sh")
MA_VARS = ("MA_NUM_HOSTS", "VC_WORKER_NUM", "VC_TASK_INDEX", "MA_TASK_INDEX", "VC_WORKER_HOSTS", "MA_VJ_NAME",
           "MA_TASK_NAME", "MA_NUM_GPUS", "HP_MASTER_PORT", "HP_LOG_DIR", "HP_CLUSTER_TIME_OUT", "MSRUN",
           "HYPERPARALLEL")
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(script, *args, **env):
    e = {k: v for k, v in os.environ.items() if k not in MA_VARS}
    e.update(env)
    return subprocess.run(["bash", script, *args], cwd=ROOT, capture_output=True, text=True, env=e, timeout=30)


def test_help():
    for script in (MSRUN, MA):
        r = run(script, "--help")
        assert r.returncode == 0 and "Usage:" in r.stdout and "--dry-run" in r.stdout


def test_msrun_single_node_script():
    r = run(MSRUN, "--dry-run", "--worker_num=2", "python", "-m", "hyperparallel.runtime.worker",
            "runs/job.json")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8118 "
                        "--node_rank=0 --log_dir=output/msrun_log --join=True --cluster_time_out=600 "
                        "python -m hyperparallel.runtime.worker runs/job.json\n")


def test_msrun_multi_node_recipe():
    r = run(MSRUN, "--dry-run", "--worker_num", "16", "--local_worker_num", "8", "--master_addr", "10.1.2.3",
            "--master_port", "29500", "--node_rank", "1", "--log_dir", "logs/my run", "--join", "True",
            "--cluster_time_out", "900", "--bind_core", "True", "--", "recipes/qwen2_5_vl_7b.yaml", "--steps", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("env 'HP_MSRUN_ARGS=--worker_num=16 --local_worker_num=8 --master_addr=10.1.2.3 "
                        "--master_port=29500 --node_rank=1 '\\''--log_dir=logs/my run'\\'' --join=True "
                        "--cluster_time_out=900 --bind_core=True' hyperparallel train recipes/qwen2_5_vl_7b.yaml "
                        "--steps 5\n")


def test_msrun_program_names_from_environment():
    r = run(MSRUN, "--dry-run", "--worker_num=4", "train.py", MSRUN="/opt/venv/bin/msrun")
    assert r.stdout.startswith("/opt/venv/bin/msrun --worker_num=4 ")
    r = run(MSRUN, "--dry-run", "--worker_num=4", "r.yml", HYPERPARALLEL=".venv/bin/hyperparallel")
    assert r.stdout.endswith(" .venv/bin/hyperparallel train r.yml\n")


@pytest.mark.parametrize("args,words", [
    (["--worker_num=3", "--local_worker_num=2", "x.py"], "multiple of --local_worker_num"),
    (["--worker_num=16", "--local_worker_num=8", "--node_rank=2", "x.py"], "--node_rank must be 0..1"),
    (["--worker_num=two", "x.py"], "--worker_num must be a whole number"),
    (["--master_port=80", "x.py"], "--master_port must be 1024..65535"),
    (["--join=yes", "x.py"], "--join must be True or False"),
    (["--bogus=1", "x.py"], "unknown option --bogus; allowed:"),
    (["--worker_num=2"], "missing COMMAND"),
])
def test_msrun_bad_flags(args, words):
    r = run(MSRUN, "--dry-run", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("msrun_launch.sh: error: ") and words in r.stderr


def test_modelarts_two_nodes_from_vc_variables():
    r = run(MA, "--dry-run", "recipes/qwen2_5_vl_72b.yaml", "--steps", "10",
            MA_NUM_HOSTS="2", VC_TASK_INDEX="1", VC_WORKER_HOSTS="job-worker-0.job,job-worker-1.job",
            MA_NUM_GPUS="8")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("env 'HP_MSRUN_ARGS=--worker_num=16 --local_worker_num=8 --master_addr=job-worker-0.job "
                        "--master_port=8118 --node_rank=1 --log_dir=output/msrun_log --join=True "
                        "--cluster_time_out=600' hyperparallel train recipes/qwen2_5_vl_72b.yaml --steps 10\n")
    assert "nodes=2 (MA_NUM_HOSTS) node_rank=1 (VC_TASK_INDEX) master_addr=job-worker-0.job (VC_WORKER_HOSTS)" \
        in r.stderr


def test_modelarts_fallback_variables_and_flag_overrides():
    env = dict(VC_WORKER_NUM="4", MA_TASK_INDEX="3", MA_VJ_NAME="vj", MA_TASK_NAME="worker", MA_NUM_GPUS="2",
               HP_MASTER_PORT="30000", HP_LOG_DIR="/cache/logs", HP_CLUSTER_TIME_OUT="1200")
    r = run(MA, "--dry-run", "python", "-m", "hyperparallel.runtime.worker", "job.json", **env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("msrun --worker_num=8 --local_worker_num=2 --master_addr=vj-worker-0.vj --master_port=30000 "
                        "--node_rank=3 --log_dir=/cache/logs --join=True --cluster_time_out=1200 "
                        "python -m hyperparallel.runtime.worker job.json\n")
    r = run(MA, "--dry-run", "--nodes=1", "--node_rank", "0", "--master_addr=127.0.0.1", "--devices_per_node=4",
            "x.py", **env)
    assert r.stdout == ("msrun --worker_num=4 --local_worker_num=4 --master_addr=127.0.0.1 --master_port=30000 "
                        "--node_rank=0 --log_dir=/cache/logs --join=True --cluster_time_out=1200 x.py\n")


def test_modelarts_defaults_without_environment():
    r = run(MA, "--dry-run", "x.py")
    assert r.stdout == ("msrun --worker_num=8 --local_worker_num=8 --master_addr=127.0.0.1 --master_port=8118 "
                        "--node_rank=0 --log_dir=output/msrun_log --join=True --cluster_time_out=600 x.py\n")


@pytest.mark.parametrize("env,words", [
    (dict(MA_NUM_HOSTS="2", VC_TASK_INDEX="2"), "node index 2 (VC_TASK_INDEX) is not below the node count 2"),
    (dict(MA_NUM_GPUS="0"), "devices per node must be a whole number >= 1"),
    (dict(MA_NUM_HOSTS="x"), "node count must be a whole number"),
])
def test_modelarts_bad_environment(env, words):
    r = run(MA, "--dry-run", "x.py", **env)
    assert r.returncode == 2 and r.stdout == "" and words in r.stderr


def test_scripts_are_strict_bash():
    for script in (MSRUN, MA):
        text = open(script).read()
        assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
        assert os.access(script, os.X_OK)


@pytest.mark.msrun
def test_msrun_launch_runs_a_real_two_rank_job(tmp_path):
    """Not a dry run: msrun_launch.sh starts 2 CPU ranks that join one cluster."""
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    import socket
    import sys
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")
    if not os.path.exists(msrun):
        pytest.skip("no msrun next to this interpreter")
    script = tmp_path / "hello.py"
    script.write_text("import mindspore as ms\nms.set_device('CPU')\n"
                      "from mindspore.communication import init, get_rank, get_group_size\ninit()\n"
                      "print(f'hello rank {get_rank()} of {get_group_size()}', flush=True)\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = tmp_path / "logs"
    env = dict(MSRUN=msrun, GLOG_v="3", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    e = {k: v for k, v in os.environ.items() if k not in MA_VARS}
    e.update(env)
    r = subprocess.run(["bash", MSRUN, "--worker_num=2", f"--master_port={port}", f"--log_dir={logs}", str(script)],
                       cwd=str(tmp_path), capture_output=True, text=True, env=e, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for rank in (0, 1):
        assert f"hello rank {rank} of 2" in (logs / f"worker_{rank}.log").read_text()


def test_join_false_is_refused_for_a_recipe_before_launch():
    """``--join=False`` made msrun return at once: "done in 4.7 s", exit 0, no step trained (issue 40)."""
    r = run(MSRUN, "--dry-run", "--join=False", "recipes/tiny_mllm.yaml")
    assert r.returncode == 2 and r.stdout == "" and "--join False is not supported for a recipe" in r.stderr
    assert "--join=False" in run(MSRUN, "--dry-run", "--join=False", "x.py").stdout   # msrun's own script: as given
    from hyperparallel.launch import msrun_overrides
    from hyperparallel.errors import SpecError
    os.environ["HP_MSRUN_ARGS"] = "--join=False"
    try:
        with pytest.raises(SpecError, match=r"^HP_MSRUN_ARGS --join: False is not supported: hyperparallel waits"):
            msrun_overrides(2)
        os.environ["HP_MSRUN_ARGS"] = "--join=True"
        assert msrun_overrides(2) == {"join": "True"}
    finally:
        del os.environ["HP_MSRUN_ARGS"]


def test_msrun_mindformers_positional_form():
    """MindFormers' scripts/msrun_launcher.sh form: the command quoted as one word, then WORKER_NUM MASTER_PORT
    (one node) or WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK ... (several)."""
    r = run(MSRUN, "--dry-run", "run_mindformer.py --config X.yaml --run_mode train", "2", "8119")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8119 "
                        "--node_rank=0 --log_dir=output/msrun_log --join=True --cluster_time_out=600 "
                        "run_mindformer.py --config X.yaml --run_mode train\n")
    r = run(MSRUN, "--dry-run", "run_mindformer.py --config X.yaml", "16", "8", "10.0.0.1", "8119", "1", "logs",
            "True", "900")
    assert r.stdout.startswith("msrun --worker_num=16 --local_worker_num=8 --master_addr=10.0.0.1 --master_port=8119 "
                               "--node_rank=1 --log_dir=logs --join=True --cluster_time_out=900 run_mindformer.py"), \
        r.stderr
    r = run(MSRUN, "--dry-run", "recipes/mf_llama_adamw.yaml --steps 2", "2", "8119")
    assert r.stdout.endswith(" hyperparallel train recipes/mf_llama_adamw.yaml --steps 2\n"), r.stderr
    for args, words in ((("2", "two"), "--master_port must be a whole number, got 'two'"),
                        (tuple("123456789"), "at most 8 values after the quoted command")):
        r = run(MSRUN, "--dry-run", "run_mindformer.py --config X.yaml", *args)
        assert r.returncode == 2 and r.stdout == "" and words in r.stderr, r.stderr
