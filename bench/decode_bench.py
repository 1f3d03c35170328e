"""Launch-bound greedy decoding of a GPT-2-sized model, tokens per second,
under PyTorch's native allocator, libsymmem as the global allocator, and
libsymmem inside torch.cuda.MemPool.

    python3 bench/decode_bench.py --reps 3 --tokens 256 --out bench-results

The model is transformers' GPT2LMHeadModel built from GPT2Config (124M
parameters: 12 layers, 768 wide, 12 heads) with random weights (nothing is
downloaded), in float16, batch 1: each new token launches a few hundred
small kernels and allocates and frees as many small tensors, so the
allocator's per-call cost shows in tokens/s. Each allocator runs in a fresh
process (the global allocator is chosen before CUDA starts), interleaved
rep by rep; every process's figure is reported, and the medians.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["native", "symmem", "symmem_pool"]


def child(mode, tokens, prompt):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 4:
        os.sched_setaffinity(0, {cpus[2]})  # the same CPU for every allocator
    import contextlib
    import torch
    ctx = contextlib.nullcontext()
    if mode != "native":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import symmem.torch as st
        if mode == "symmem":
            st.use_as_global_allocator()
        else:
            pool = st.mem_pool()
            ctx = torch.cuda.use_mem_pool(pool)
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    with ctx:
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
        model = GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.float16).eval()
        ids = torch.randint(0, cfg.vocab_size, (1, prompt), device="cuda")
        mask = torch.ones_like(ids)

        def decode(n):
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                     pad_token_id=0, use_cache=True)
            torch.cuda.synchronize()
            return out

        decode(16)  # warm-up: kernels, caches
        t0 = time.perf_counter()
        out = decode(tokens)
        dt = time.perf_counter() - t0
        new = out.shape[1] - prompt
    print(json.dumps({"mode": mode, "tokens": new, "tokens_per_s": new / dt,
                      "first_tokens": out[0, prompt:prompt + 8].tolist()}), flush=True)


def run_child(mode, tokens, prompt):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, str(tokens), str(prompt)],
                       capture_output=True, text=True, timeout=900, env=env)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), int(a.child[2]))
        return
    import torch
    os.makedirs(a.out, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    run_child("native", 16, a.prompt)  # discarded: clocks and driver warm up
    res = {m: [] for m in MODES}
    for rep in range(a.reps):
        for mode in MODES:
            res[mode].append(run_child(mode, a.tokens, a.prompt))
        print(f"rep {rep + 1}/{a.reps} done", file=sys.stderr, flush=True)
    # Same weights (seed), same prompt, greedy: every allocator must decode
    # the same tokens; a difference would be a memory bug, not noise.
    same = all(r["first_tokens"] == res["native"][0]["first_tokens"] for rs in res.values() for r in rs)
    med = {m: statistics.median(r["tokens_per_s"] for r in rs) for m, rs in res.items()}
    lines = [f"Greedy decoding, GPT-2 124M (random weights, float16, batch 1, prompt {a.prompt}, {a.tokens} new tokens, "
             f"KV cache), {device}, torch {torch.__version__}; every process's tokens/s in run order, and the median:", "",
             "| allocator | each process (tokens/s) | median | / native |", "|---|---|---|---|"]
    for m in MODES:
        each = ", ".join(f"{r['tokens_per_s']:.1f}" for r in res[m])
        lines.append(f"| {m} | {each} | {med[m]:.1f} | {med[m] / med['native']:.3f} |")
    lines += ["", f"Same tokens decoded under every allocator: {same}"]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "decode_bench.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "decode_bench.json"), "w") as f:
        json.dump({"device": device, "runs": res}, f)
    if not same:
        raise SystemExit("the allocators decoded different tokens")


if __name__ == "__main__":
    main()
