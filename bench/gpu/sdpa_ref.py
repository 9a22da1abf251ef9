"""bench/gpu/sdpa_ref.py — PyTorch's fused attention kernels at GPT-2's shapes,
for comparison with ours (gpt2_ops_check --bench's "attention fwd/bwd (flash)"
rows): causal, bf16, head size 64, q, k, v strided views of one (B, T, 3C)
buffer as our kernels read them. Each backend that runs here (FlashAttention-2
as built into torch, cuDNN's fused attention, memory-efficient) is timed with
CUDA events, median of 20 after a warm-up: the forward alone, and the backward
alone (the gradients of q, k and v, retain_graph). TFLOP/s counts the causal half: forward 2 B T^2 C,
backward 2.5 times that, as gpt2_ops_check does.

    python3 bench/gpu/sdpa_ref.py [d12|d48 ...]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {"d12": (16, 12), "d48": (8, 25)}  # micro-batch, heads; T 1024, head size 64


def median_ms(fn, n=20):
    fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return (ts[(n - 1) // 2] + ts[n // 2]) / 2


def main():
    names = sys.argv[1:] or ["d48", "d12"]
    for name in names:
        if name not in SHAPES:
            sys.exit("sdpa_ref.py: shapes are d12 or d48, not %r" % name)
    torch.manual_seed(0)
    for name in names:
        B, H = SHAPES[name]
        T, D = 1024, 64
        C = H * D
        qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
        flop = 2.0 * B * T * T * C
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION):
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=2))

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            try:
                with sdpa_kernel(backend):
                    f = median_ms(fwd)
                    out = fwd()
                    # gradients of q, k, v only: no accumulation into qkv.grad timed
                    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout,
                                                                retain_graph=True))
            except RuntimeError as e:
                print("# %s %-22s not available: %s" % (name, backend.name, str(e).split("\n")[0][:90]))
                continue
            print("# %s %-22s fwd %6.3f ms %4.0f TFLOP/s   bwd %6.3f ms %4.0f TFLOP/s"
                  % (name, backend.name, f, flop / f / 1e9, bwd, 2.5 * flop / bwd / 1e9))
            del out


if __name__ == "__main__":
    main()
