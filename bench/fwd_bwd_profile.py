#!/usr/bin/env python3
"""Where the reference GPT's forward+backward time goes on one CPU thread.

    DION_REF=/tmp/dion_ref python3 bench/fwd_bwd_profile.py N_LAYER N_EMBD

Batch 8, sequence 128, vocabulary 50304, 4 heads, fp32. Prints, in one process (ratios side by
side under the same load): eager forward+backward median/min/max of 5; a chunked lm_head +
cross-entropy prototype (custom autograd function, 256 rows per chunk, the grads computed in the
forward; its loss against eager); the torch profiler's top ops of one eager step; the reference
GPT.compile()'d first step (compile) and its median. Not a test: nothing asserts on time.
"""
import os, sys, time, statistics, torch, torch.nn.functional as F
sys.path.insert(0, os.environ.get("DION_REF", "/tmp/dion_ref"))  # fetched, never committed
from models.gpt_model import GPT, GPTConfig
torch.set_num_threads(1)
L, C = int(sys.argv[1]), int(sys.argv[2])
B, T, V = 8, 128, 50304
torch.manual_seed(0)
def mk():
    m = GPT(GPTConfig(sequence_len=T, vocab_size=V, n_layer=L, n_head=4, n_embd=C)); m.init_weights(); return m
m = mk()
x = torch.randint(0, V, (B, T)); y = torch.randint(0, V, (B, T))
def step(model):
    loss = model(x, y); loss.backward(); model.zero_grad(set_to_none=True); return loss
def timeit(f, n=5):
    f(); ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts), max(ts)
# chunked lm_head + CE (prototype of the lever): never holds [B*T,V] logits grad whole
class ChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, t, chunk):
        N = h.shape[0]; gh = torch.zeros_like(h); gw = torch.zeros_like(w); tot = h.new_zeros(())
        for s in range(0, N, chunk):
            hc = h[s:s+chunk]; tc = t[s:s+chunk]
            lg = hc @ w.t(); lse = torch.logsumexp(lg, 1)
            tot += (lse - lg.gather(1, tc[:, None])[:, 0]).sum()
            p = torch.softmax(lg, 1); p[torch.arange(len(tc)), tc] -= 1; p /= N
            gh[s:s+chunk] = p @ w; gw.addmm_(p.t(), hc)
        ctx.save_for_backward(gh, gw); return tot / N
    @staticmethod
    def backward(ctx, g):
        gh, gw = ctx.saved_tensors; return gh * g, gw * g, None, None
def hidden(model):
    x_ = model.transformer.wte(x)
    for b in model.transformer.h: x_ = b(x_)
    return F.rms_norm(x_, (x_.size(-1),))
def step_chunk(model, chunk=256):
    h = hidden(model).view(-1, C)
    loss = ChunkedCE.apply(h, model.lm_head.weight, y.view(-1), chunk); loss.backward(); model.zero_grad(set_to_none=True); return loss
with torch.no_grad(): pass
l_ref = step(m).item(); l_ch = step_chunk(m).item()
print(f"L{L}xC{C} loss eager {l_ref:.6f} chunked {l_ch:.6f} diff {abs(l_ref-l_ch):.2e}")
e = timeit(lambda: step(m)); print("eager fwd+bwd s med/min/max", e)
c = timeit(lambda: step_chunk(m)); print("chunked-CE fwd+bwd", c, "speedup", e[0]/c[0])
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as p:
    step(m)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
mc = mk(); mc.compile()
t0 = time.perf_counter(); step(mc); print("compile first step s", time.perf_counter()-t0)
cc = timeit(lambda: step(mc)); print("compiled fwd+bwd", cc, "eager/compiled", e[0]/cc[0])
