"""Small builders shared by the core tests."""
from hyperparallel.mpipe import parse_profile


def profile(*regions, link=None):
    """regions: (name, layers, trainable[, forward_ms, backward_ms, weight_ms])."""
    out = []
    for r in regions:
        name, layers, trainable = r[:3]
        f, b, w = (list(r[3:]) + [1.0, 1.0, 1.0][len(r[3:]):])[:3]
        out.append({"name": name, "layers": layers, "trainable": trainable, "forward_ms": f, "backward_ms": b,
                    "weight_ms": w, "activation_mb": 1.0, "output_mb": 1.0, "param_mb": 1.0})
    obj = {"regions": out}
    if link:
        obj["link"] = link
    return parse_profile(obj)


def mllm(trained_encoder: bool, enc_layers: int = 2, llm_layers: int = 8, enc_ms: float = 3.0):
    return profile(("vision", enc_layers, trained_encoder, enc_ms, enc_ms, enc_ms), ("llm", llm_layers, True))


def dumped(dump_dir: str):
    """What a worker case with ``dump_dir`` wrote: (losses.json as a dict, {param name: [grad of every rank
    holding it]} of the first step)."""
    import json
    import os

    import numpy as np
    with open(os.path.join(dump_dir, "losses.json")) as f:
        got = json.load(f)
    grads = {}
    for fn in sorted(os.listdir(dump_dir)):
        if fn.startswith("grads_rank"):
            for k, v in np.load(os.path.join(dump_dir, fn)).items():
                grads.setdefault(k, []).append(v)
    return got, grads


def reference_run(recipe, steps: int):
    """(per-step losses, step-0 grads by name) of the single-process reference of a loaded recipe."""
    from hyperparallel.mindspore import compat
    from hyperparallel.mindspore.config import RunConfig
    from hyperparallel.mindspore.reference import Reference
    compat.setup_device("CPU")
    ref = Reference(RunConfig.from_raw(recipe.raw), recipe.micro_batch_num * recipe.data_parallel,
                    {r.name: r.trainable for r in recipe.profile.regions})
    losses, grads0 = [], None
    for s in range(steps):
        loss, g = ref.step(s)
        losses.append(loss)
        grads0 = g if grads0 is None else grads0
    return losses, grads0
