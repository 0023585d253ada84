"""Two msrun nodes on one machine, started the way a ModelArts job starts them (issue 24).

``tools/modelarts_entry.sh`` runs twice, with exactly the variables a two-node ModelArts job sets
(``MA_NUM_HOSTS``, ``VC_TASK_INDEX``, ``VC_WORKER_HOSTS``, ``MA_NUM_GPUS``; plus ``HP_MASTER_PORT`` and
``HP_LOG_DIR``, since both "nodes" share this machine's ports and folders); each execs
``tools/msrun_launch.sh``, which runs ``hyperparallel train`` with the msrun flags in ``HP_MSRUN_ARGS``:
``--worker_num=4 --local_worker_num=2 --node_rank=K --master_addr=127.0.0.1``. P=2 x D=2 trains like the
single-process reference; node 0's run directory has the metrics. A node that never starts ends the
other after ``--cluster_time_out``, the missing node named.
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")
MA = os.path.join(ROOT, "tools", "modelarts_entry.sh")
MSRUN_LAUNCH = os.path.join(ROOT, "tools", "msrun_launch.sh")
DP2 = ("--set", "parallel_config.data_parallel=2")
# the optimizer's update op by op (bit-identical, tested): no ~4 s first-step compile per run
EAGER = ("--set", "train.optimizer_compile=eager", "--compile", "eager")
STEPS = 3
# what the entry reads (docs/launch.md lists them); none may leak in from the test's own environment
READ = ("MA_NUM_HOSTS", "VC_WORKER_NUM", "VC_TASK_INDEX", "MA_TASK_INDEX", "VC_WORKER_HOSTS", "MA_VJ_NAME",
        "MA_TASK_NAME", "MA_NUM_GPUS", "HP_MASTER_PORT", "HP_LOG_DIR", "HP_CLUSTER_TIME_OUT", "HP_MSRUN_ARGS")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in READ}
    env.update(PYTHONPATH=ROOT, GLOG_v="3", HYPERPARALLEL=os.path.join(os.path.dirname(sys.executable), "hyperparallel"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    d = tmp_path_factory.mktemp("nodes")
    port = _port()
    procs = []
    for k in (0, 1):
        env = _env(MA_NUM_HOSTS="2", VC_TASK_INDEX=str(k), VC_WORKER_HOSTS="127.0.0.1,127.0.0.1", MA_NUM_GPUS="2",
                   HP_MASTER_PORT=str(port), HP_LOG_DIR=str(d / f"logs{k}"), HP_CLUSTER_TIME_OUT="300")
        procs.append(subprocess.Popen(["bash", MA, RECIPE, *DP2, *EAGER, "--steps", str(STEPS), "--run-dir", str(d / f"run{k}")],
                                      cwd=str(d), env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
    return d, out


@pytest.mark.msrun
def test_two_modelarts_nodes_train_like_the_reference(two_nodes):
    from helpers import reference_run
    from hyperparallel.recipe import load_recipe
    d, out = two_nodes
    for k, (o, e, rc) in enumerate(out):
        assert rc == 0, f"node {k}: {e[-3000:]}\n{o[-3000:]}"
    assert "this node has no rank 0: node 0's run directory has the metrics" in out[1][0]
    assert not (d / "run1" / "metrics.jsonl").exists()
    with open(d / "run0" / "metrics.jsonl") as f:
        m = [json.loads(line) for line in f]
    assert [x["step"] for x in m] == [1, 2, 3] and [x["rank"] for x in m[0]["memory"]] == [0, 1, 2, 3]
    want = reference_run(load_recipe(RECIPE, overrides=["parallel_config.data_parallel=2"]), STEPS)[0]
    np.testing.assert_allclose([x["loss"] for x in m], want, rtol=1e-5)
    # each node's ranks: node 0 holds ranks 0 and 1, node 1 ranks 2 and 3 (logs named by global rank)
    assert sorted(f for f in os.listdir(d / "logs0") if f.startswith("worker_")) == ["worker_0.log", "worker_1.log"]
    assert sorted(f for f in os.listdir(d / "logs1") if f.startswith("worker_")) == ["worker_2.log", "worker_3.log"]


@pytest.mark.msrun
def test_a_node_that_never_starts_ends_the_other_naming_it(tmp_path):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    p = subprocess.run(["bash", MSRUN_LAUNCH, "--worker_num=4", "--local_worker_num=2", "--node_rank=0",
                        f"--master_port={_port()}", f"--log_dir={tmp_path / 'logs'}", "--cluster_time_out=10", "--",
                        RECIPE, *DP2, *EAGER, "--steps", "2", "--run-dir", str(tmp_path / "run")],
                       cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    err = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and err.startswith("error: job failed (exit 1): node 1 (ranks 2-3) never joined"), p.stderr


def test_only_node_0_starts_a_scheduler_on_a_shared_machine(monkeypatch):
    """msrun starts a scheduler on every node whose addresses include --master_addr: a node rank above 0
    on node 0's machine runs msrun through compat.msrun_node (no second scheduler); elsewhere plain msrun."""
    from hyperparallel.launch import msrun_command, msrun_overrides
    for addr, node, shim in (("127.0.0.1", "1", True), ("127.0.0.1", "0", False), ("10.255.255.1", "1", False)):
        monkeypatch.setenv("HP_MSRUN_ARGS", f"--local_worker_num=2 --node_rank={node} --master_addr={addr}")
        cmd = msrun_command("job.json", 4, "logs", 1234, msrun_overrides(4))
        assert (cmd[1:3] == ["-m", "hyperparallel.runtime.compat"]) == shim, cmd
        assert f"--node_rank={node}" in cmd and cmd[-1] == "job.json"
