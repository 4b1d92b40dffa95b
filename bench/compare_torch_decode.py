#!/usr/bin/env python3
"""Decoding side by side with PyTorch: one query row per head (or a few) against a long KV cache,
torch.nn.functional.scaled_dot_product_attention(enable_gqa=True) on the CPU against flashattn (through
bench/torch_shim.cpp's flashattn_shim_decode), in one process on the same tensors, alternated in blocks,
with a streaming read of a tensor as large as K+V (torch's sum) in the same rounds.

    python3 bench/compare_torch_decode.py --shim build/bench/libflashattn_torch_shim.so --threads 1

B = 1, 32 query heads over 8 KV heads, d = 128, K/V in BHSD (contiguous (1, 8, S, 128)), as bench_decode.
Per shape: K+V GB/s of each side (median of its timed calls), the read's GB/s, each over the read, and
flashattn's time over torch's per round. Both outputs are compared (max |difference| printed).
"""
import argparse
import ctypes
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--keys", default="32768,131072")
    ap.add_argument("--q", default="1,4")
    ap.add_argument("--dtypes", default="fp32,bf16,fp16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import torch
    shim = ctypes.CDLL(args.shim)
    dtypes = {"fp32": (torch.float32, 0), "bf16": (torch.bfloat16, 1), "fp16": (torch.float16, 2)}
    f = torch.nn.functional.scaled_dot_product_attention
    print(f"# torch {torch.__version__}; B=1, H=32, Hk=8, d=128, BHSD; {args.rounds} rounds x {args.reps} calls")
    print("dtype threads keys q | ours GB/s | torch GB/s | read GB/s | ours x read | torch x read | ours/torch time (rounds) | max|diff|")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name in args.dtypes.split(","):
            dtype, code = dtypes[name]
            for keys in (int(k) for k in args.keys.split(",")):
                for sq in (int(x) for x in args.q.split(",")):
                    g = torch.Generator().manual_seed(0)
                    q = torch.randn(1, 32, sq, 128, generator=g).to(dtype)
                    k = torch.randn(1, 8, keys, 128, generator=g).to(dtype)
                    v = torch.randn(1, 8, keys, 128, generator=g).to(dtype)
                    o = torch.empty_like(q)
                    other = torch.ones(2 * k.numel() * k.element_size() // 4, dtype=torch.float32)
                    qs, kvs = (ctypes.c_int64 * 4)(*q.shape), (ctypes.c_int64 * 4)(*k.shape)
                    st = (ctypes.c_int64 * 16)(*(s for x in (q, k, v, o) for s in x.stride()))
                    ptrs = [ctypes.c_void_p(x.data_ptr()) for x in (q, k, v, o)]

                    def ours():
                        if shim.flashattn_shim_decode(*ptrs, code, qs, kvs, st, threads) != 0:
                            sys.exit("flashattn_shim_decode failed")

                    def theirs():  # no mask, as bench_decode's rows (and the shim's call)
                        return f(q, k, v, enable_gqa=True)

                    bytes_kv = 2.0 * k.numel() * k.element_size()
                    t_o, t_t, t_r, ratios = [], [], [], []
                    with torch.no_grad():
                        ref = theirs().float()
                        ours()
                        diff = (o.float() - ref).abs().max().item()
                        for _ in range(args.rounds):
                            blk = []
                            for fn, acc in ((ours, t_o), (theirs, t_t), (lambda: other.sum(), t_r)):
                                ts = []
                                for _ in range(args.reps):
                                    t0 = time.perf_counter()
                                    fn()
                                    ts.append(time.perf_counter() - t0)
                                acc += ts
                                blk.append(statistics.median(ts))
                            ratios.append(blk[0] / blk[1])
                    gb = lambda ts: bytes_kv / statistics.median(ts) * 1e-9
                    print(f"{name} {threads} {keys} {sq} | {gb(t_o):.1f} | {gb(t_t):.1f} | {gb(t_r):.1f} | "
                          f"{gb(t_o) / gb(t_r):.2f} | {gb(t_t) / gb(t_r):.2f} | "
                          f"{' '.join(f'{r:.2f}' for r in ratios)} | {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
