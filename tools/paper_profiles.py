"""Per-layer costs of the paper-scale recipes, derived from public model sizes.

Prints the numbers written into recipes/paper_8dev_qwen_vit.yaml and
recipes/paper_512dev_deepseek_vit.yaml, so every figure in them can be re-derived.
All inputs are assumptions (see the recipe comments); change them here and re-run.

Usage: python tools/paper_profiles.py
"""
from __future__ import annotations

MB = 1024 * 1024

# -- hardware (Ascend 910C-class, assumed) ------------------------------------------------------
PEAK_TFLOPS = 752.0        # BF16 dense peak per device (two 910B-class dies)
MFU_DENSE = 0.40           # achieved fraction for dense transformer layers (ViT, Qwen)
MFU_MOE = 0.30             # achieved fraction for MoE layers (all-to-all and routing folded in)
BYTES = 2                  # bf16 activations and parameters


def vit_layer(h: int, mlp: int, patches_per_image: int, images: int) -> dict:
    """One ViT layer for one micro-batch (one sample with ``images`` images)."""
    params = 4 * h * h + 2 * h * mlp                      # qkv + out, two MLP matrices
    tokens = patches_per_image * images
    flops_tok = 2 * params + 4 * patches_per_image * h    # matmuls + attention within each image
    fwd = flops_tok * tokens / (PEAK_TFLOPS * 1e12 * MFU_DENSE) * 1e3
    return {"params": params, "tokens": tokens, "forward_ms": fwd, "activation_mb": 34 * tokens * h / MB,
            "param_mb": params * BYTES / MB}


def dense_llm_layer(h: int, inter: int, heads: int, kv_heads: int, seq: int) -> dict:
    head_dim = h // heads
    params = 2 * h * h + 2 * h * kv_heads * head_dim + 3 * h * inter   # q, o, k, v, SwiGLU MLP
    flops_tok = 2 * params + 2 * seq * h                                # causal attention (QK^T and AV, halved)
    fwd = flops_tok * seq / (PEAK_TFLOPS * 1e12 * MFU_DENSE) * 1e3
    return {"params": params, "forward_ms": fwd, "activation_mb": 34 * seq * h / MB,
            "output_mb": seq * h * BYTES / MB, "param_mb": params * BYTES / MB}


def deepseek_v3_layer(seq: int, ep: int) -> dict:
    """DeepSeek-V3 MoE layer (hidden 7168, MLA, 256 routed experts of 2048, top-8, 1 shared)."""
    h, heads, expert = 7168, 128, 3 * 7168 * 2048
    mla = 7168 * 1536 + 1536 * heads * 192 + 7168 * 576 + 512 * heads * 256 + heads * 128 * 7168
    active = mla + 9 * expert                              # 8 routed + 1 shared expert per token
    flops_tok = 2 * active + seq * heads * (192 + 128)     # causal attention, halved
    fwd = flops_tok * seq / (PEAK_TFLOPS * 1e12 * MFU_MOE) * 1e3
    held = mla + expert + 256 * expert / ep                # attention + shared expert + 1/EP of routed experts
    return {"active": active, "forward_ms": fwd, "activation_mb": 2 * 34 * seq * h / MB,
            "output_mb": seq * h * BYTES / MB, "param_mb": held * BYTES / MB}


def show(name: str, d: dict) -> None:
    print(f"{name}: " + ", ".join(f"{k}={v:.4g}" for k, v in d.items()))


if __name__ == "__main__":
    print("# (a) 8 devices: Qwen2.5-7B + Qwen2-VL ViT-675M, 16 images of 448x448 per sample")
    vit = vit_layer(1280, 5120, (448 // 14) ** 2, 16)
    show("vit layer", vit)
    print(f"  vit output (16 x 256 merged tokens x 3584 x bf16) = {16 * 256 * 3584 * BYTES / MB:.4g} MB")
    show("qwen2.5-7b layer, seq 5120", dense_llm_layer(3584, 18944, 28, 4, 16 * 256 + 1024))
    print("# (b) 512 devices: DeepSeek-V3 + ViT-675M, 8 images of 448x448 per sample, PP 16 x DP 32, EP 32")
    vit = vit_layer(1280, 5120, (448 // 14) ** 2, 8)
    show("vit layer", vit)
    print(f"  vit output (8 x 256 merged tokens x 7168 x bf16) = {8 * 256 * 7168 * BYTES / MB:.4g} MB")
    show("deepseek-v3 layer, seq 4096", deepseek_v3_layer(8 * 256 + 2048, 32))
