"""The MindSpore internals the runtime relies on still behave as measured.

Fails loudly if a MindSpore upgrade changes the tape autograd API
(``hyperparallel/runtime/compat.py``).
"""
import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore is not installed")


@pytest.fixture(scope="module")
def compat():
    from hyperparallel.runtime import compat
    compat.setup_device("CPU")
    return compat


def test_internal_api_present(compat):
    compat.check_internal_api()


def test_tape_any_order_and_bw_split_matches_grad(compat):
    """Two stages, two micro-batches, backward in 1F1B-like order with B and W split."""
    from mindspore import nn, Tensor
    ms.set_seed(1)
    s0, s1 = nn.Dense(4, 5), nn.Dense(5, 3)
    xs = [Tensor(np.random.RandomState(i).randn(2, 4).astype(np.float32)) for i in range(2)]
    p0, p1 = s0.trainable_params(), s1.trainable_params()

    tape = compat.Tape
    h = [tape.forward(s0, x) for x in xs]
    hin = [compat.leaf(t, True) for t in h]
    y = [tape.forward(lambda t: (s1(t) ** 2).sum(), t) for t in hin]
    grads0 = [None] * len(p0)
    grads1 = [None] * len(p1)
    one = ms.ops.ones((), ms.float32)
    for m in (1, 0):  # newest first is not required: do m=1 before m=0
        (gh,) = tape.grad([y[m]], [one], [hin[m]], keep_graph=True)        # B
        g1 = tape.grad([y[m]], [one], p1, keep_graph=False)              # W
        grads1 = [compat.acc(a, b) for a, b in zip(grads1, g1)]
        g0 = tape.grad([h[m]], [gh], p0, keep_graph=False)               # BW of stage 0
        grads0 = [compat.acc(a, b) for a, b in zip(grads0, g0)]

    def total(*_):
        return sum((s1(s0(x)) ** 2).sum() for x in xs)
    ref = ms.grad(total, grad_position=None, weights=p0 + p1)(xs[0])
    for got, want in zip(grads0 + grads1, ref):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)
        assert np.abs(got.asnumpy()).sum() > 0


def test_acc_accumulates_out_of_place(compat):
    """The runtime accumulates with acc() (in-place add_ is a silent no-op on CPU)."""
    t = ms.Tensor(np.ones(3, np.float32))
    t2 = compat.acc(t, ms.Tensor(np.ones(3, np.float32)))
    np.testing.assert_allclose(t2.asnumpy(), 2.0)


@pytest.mark.parametrize("train", [{"optimizer": "adam"}, {"optimizer": "sgd"}], ids=["adam", "sgd"])
def test_optimizer_update_op_by_op_is_bit_identical_to_its_jit_graph(compat, train):
    """``train.optimizer_compile: eager`` runs the ``construct`` that nn.Adam/nn.SGD's ``@jit`` wraps:
    parameters and optimizer state equal the compiled update's exactly, step by step."""
    from mindspore import Parameter, Tensor
    from hyperparallel.runtime.optim import Optimizer
    from hyperparallel.recipe.train import TrainConfig
    rng = np.random.default_rng(0)
    init = [rng.standard_normal((6, 4)).astype(np.float32) for _ in range(3)]
    grads = [[rng.standard_normal((6, 4)).astype(np.float32) for _ in range(3)] for _ in range(3)]
    out = {}
    for mode in ("jit", "eager"):
        params = [Parameter(Tensor(v.copy()), name=f"w{i}") for i, v in enumerate(init)]
        opt = Optimizer(params, TrainConfig.from_raw({"train": dict(train, optimizer_compile=mode)}))
        # the eager path really runs op by op: the Cell's construct is a jit wrapper with its body inside
        assert hasattr(type(opt.opt).construct, "__wrapped__")
        for g in grads:
            opt.step({p.name: Tensor(x) for p, x in zip(params, g)})
        out[mode] = {n: p.asnumpy() for n, p in {**{p.name: p for p in params}, **opt.state()}.items()}
    assert set(out["jit"]) == set(out["eager"]) and len(out["jit"]) > 3
    for n, v in out["jit"].items():
        np.testing.assert_array_equal(out["eager"][n], v, err_msg=n)
    assert not np.array_equal(out["jit"]["w0"], init[0])   # the update ran


def test_square_sum_compiled_is_bit_identical_to_op_by_op_and_compiles_once(compat):
    """The gradient norm's square sum (every step, before clipping) in one graph equals the op-by-op sum
    exactly (float32 and bfloat16 gradients), and a second step with the same shapes compiles nothing."""
    from mindspore import Tensor
    from hyperparallel.runtime.optim import square_sum
    rng = np.random.default_rng(3)
    shapes = [(32, 16), (16,), (7, 5, 3), (1,), (64, 32)]
    for dtype in (ms.float32, ms.bfloat16):
        for k in range(3):
            grads = [Tensor(rng.standard_normal(s).astype(np.float32) * 10 ** k).astype(dtype) for s in shapes]
            want = np.sum([np.sum(np.square(g.astype(ms.float32).asnumpy().astype(np.float64))) for g in grads])
            eager, jit = square_sum(grads, compiled=False), square_sum(grads, compiled=True)
            assert jit == eager, (dtype, k)
            assert abs(jit - want) <= 1e-5 * want
            n = compat.graphs_compiled()
            assert square_sum(grads, compiled=True) == jit and compat.graphs_compiled() == n
    assert square_sum([], compiled=True) == 0.0


def test_comm_timeouts_raise_mccl_receive_timeout_unless_set(compat, monkeypatch):
    monkeypatch.delenv("MS_NODE_TIMEOUT", raising=False)
    assert compat.comm_timeouts() == str(compat.CPU_COMM_TIMEOUT_S)
    monkeypatch.setenv("MS_NODE_TIMEOUT", "77")   # the user's own value is kept
    assert compat.comm_timeouts() == "77"


@pytest.mark.msrun
def test_receive_waits_past_mccls_30_s_for_a_late_sender(tmp_path):
    """MCCL's receive alone gives up after 30 s (``Recv failed.``); a pipeline peer that compiles longer
    than that on a loaded CPU must not kill a correct job: through the runtime's Comm, a receive waits for
    a sender 35 s late."""
    import json
    import os
    import subprocess
    import sys
    from hyperparallel.launch import free_port, msrun_path
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=os.path.dirname(os.path.dirname(here)))   # the checkout
    env.pop("MS_NODE_TIMEOUT", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    cmd = msrun_path() + ["--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
                          f"--log_dir={tmp_path / 'log'}", "--join=True",
                          os.path.join(here, "comm_timeout_worker.py"), str(tmp_path)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text()[-1500:] for p in sorted((tmp_path / "log").glob("worker_*.log")))
    assert res.returncode == 0, logs
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    assert r0["got"] == [1.0, 2.0, 3.0] and r0["waited_s"] > 32, r0
    assert r0["MS_NODE_TIMEOUT"] == str(1800) and "Recv failed" not in logs
