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
