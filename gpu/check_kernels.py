"""Check DFVG's Triton kernels against their PyTorch references on this machine's GPU (`make -C gpu all`):
greedy acceptance, tree-mask verify attention, the fused decoder layers' attention and GEMV kernels.

Fresh random inputs per case (never zeros), outputs poisoned first, relative error against a float32/64
reference; exits non-zero on any failure, and with one line when there is no GPU. Prints one line per case
and the median time of each kernel and reference (triton.testing.do_bench, measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _report(name: str, rel: float, failures: list[str], limit: float = 1.5e-2) -> None:
    ok = rel < limit
    print(f"{name}: rel {rel:.2e} {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(f"{name}: rel {rel:.2e}")


def check_greedy_accept(kernels, failures: list[str]) -> None:
    for rows, vocab in [(1, 151936), (3, 151936), (5, 1000), (9, 151936), (16, 32000), (9, 4097)]:
        for trial in range(3):
            logits = torch.randn(rows, vocab, device="cuda")
            drafts = logits.argmax(-1)[: rows - 1].clone()
            if trial and rows > 1:  # force a mismatch at a random position
                at = int(torch.randint(0, rows - 1, ()))
                drafts[at] = (drafts[at] + 1) % vocab
            if trial == 2:  # a tie: the lowest index must win
                logits[0, 7] = logits[0, 5] = logits[0].max() + 1
            want = kernels.greedy_accept_reference(logits, drafts)
            out = torch.full((rows + 2,), -7, dtype=torch.long, device="cuda")
            got = kernels.greedy_accept_triton(logits, drafts, out)
            ok = torch.equal(got, want)
            print(f"greedy_accept rows={rows:2d} V={vocab:6d} trial={trial}: {'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"greedy_accept {rows}x{vocab}: {got.tolist()[:4]} != {want.tolist()[:4]}")


def check_verify_attention(kernels, failures: list[str]) -> None:
    cases = [(12, 2, 128, 300, 5), (14, 2, 64, 37, 9), (12, 2, 128, 0, 3), (8, 8, 64, 100, 16)]
    for heads, kv, hd, start, rows in cases:
        q = torch.randn(rows, heads, hd, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(start + rows + 50, kv, hd, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        for name, tree in [("chain", kernels.chain_tree_mask(rows, "cuda")),
                           ("tree", torch.rand(rows, rows, device="cuda") < 0.5)]:
            tree = tree | torch.eye(rows, dtype=torch.bool, device="cuda")  # a token always sees itself
            want = kernels.verify_attention_reference(q.double(), kc.double(), vc.double(), start, tree)
            got = kernels.verify_attention_triton(q, kc, vc, start, tree)
            rel = ((got.double() - want).norm() / want.norm()).item()  # NaN anywhere makes it NaN: FAIL
            _report(f"verify_attention H={heads} KV={kv} hd={hd} start={start} T={rows} {name}", rel, failures,
                    limit=1e-2)


def check_decode_attention(kernels, failures: list[str]) -> None:
    """dfvg.gpu.decode_attention (split + merge, positions on the device) vs the chain-mask reference."""
    from dfvg.gpu.decode_attention import attention

    for heads, kv, hd, start, rows in [(12, 2, 128, 400, 1), (12, 2, 128, 2100, 9), (14, 2, 64, 0, 5),
                                       (8, 8, 64, 63, 16)]:
        q = torch.randn(rows, heads, hd, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(start + rows + 40, kv, hd, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        pos = torch.arange(start, start + rows, device="cuda")
        want = kernels.verify_attention_reference(q.double(), kc.double(), vc.double(), start,
                                                  kernels.chain_tree_mask(rows, "cuda"))
        got = attention(q.reshape(rows, heads * hd), kc, vc, pos, (heads, kv, hd, 0, 0.0)).view(rows, heads, hd)
        _report(f"decode_attention H={heads} KV={kv} hd={hd} start={start} T={rows}",
                ((got.double() - want).norm() / want.norm()).item(), failures)


def check_fused_linear(failures: list[str]) -> None:
    """dfvg.gpu.fused.fused_linear in each prologue/epilogue combination vs float64 torch."""
    from dfvg.gpu.fused import fused_linear

    f = torch.nn.functional
    for rows, n, k in [(1, 1536, 8960), (1, 8960, 1536), (5, 1536, 1536), (16, 896, 896)]:
        scale = torch.logspace(-1, 1, rows, device="cuda")[:, None] * 3  # rows of RMS 0.3..30: RMSNorm matters
        x = (torch.randn(rows, k, device="cuda") * scale).to(torch.bfloat16)
        w = torch.randn(2 * n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        g, b = torch.rand(k, device="cuda").to(torch.bfloat16) + 0.5, torch.randn(n, device="cuda").to(torch.bfloat16)
        res = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        xd = x.double()
        normed = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)) * g.double()
        gate, up = (normed @ w.double().T).split(n, -1)
        cases = {"residual+bias": (fused_linear(x, w[:n], bias=b, residual=res),
                                   res.double() + xd @ w[:n].double().T + b.double()),
                 "norm+swiglu": (fused_linear(x, w, norm=g, swiglu=True), f.silu(gate) * up),
                 "norm, float32 out": (fused_linear(x, w[:n], norm=g, out_dtype=torch.float32),
                                       normed @ w[:n].double().T)}
        for name, (got, want) in cases.items():
            _report(f"fused_linear T={rows} N={n} K={k} {name}",
                    ((got.double() - want).norm() / want.norm()).item(), failures)


def timings(kernels) -> None:
    import triton.testing

    logits = torch.randn(9, 151936, device="cuda")
    drafts = logits.argmax(-1)[:8].clone()
    for name, fn in [("greedy_accept triton", lambda: kernels.greedy_accept_triton(logits, drafts)),
                     ("greedy_accept torch ", lambda: kernels.greedy_accept_reference(logits, drafts))]:
        print(f"time {name} 9x151936: {triton.testing.do_bench(fn, return_mode='median') * 1000:.1f} us")
    q = torch.randn(9, 12, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(700, 2, 128, device="cuda", dtype=torch.bfloat16)
    tree = kernels.chain_tree_mask(9, "cuda")
    for name, fn in [("verify_attention triton", lambda: kernels.verify_attention_triton(q, kc, kc, 600, tree)),
                     ("verify_attention ref   ", lambda: kernels.verify_attention_reference(q, kc, kc, 600, tree))]:
        print(f"time {name} T=9 S=609: {triton.testing.do_bench(fn, return_mode='median') * 1000:.1f} us")


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu: no CUDA GPU on this machine; the Triton kernels were not built or checked")
        return 1
    from dfvg.gpu import kernels

    if not kernels.HAVE_TRITON:
        print("gpu: Triton is not installed; pip install triton (it ships with CUDA builds of torch)")
        return 1
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures: list[str] = []
    check_greedy_accept(kernels, failures)
    check_verify_attention(kernels, failures)
    check_decode_attention(kernels, failures)
    check_fused_linear(failures)
    torch.cuda.synchronize()
    timings(kernels)
    print(f"{len(failures)} failure(s)" + "".join(f"\n  {f}" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
