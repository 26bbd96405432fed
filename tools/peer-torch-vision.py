#!/usr/bin/env python3
# The PyTorch peer for `percept bench encode --ep cuda`: the same vision-tower shapes in fp16 with
# SDPA, timed eager and replayed as a CUDA graph, random weights (only the timing is compared).
# The shapes are the ones percept's graph runs: the ViT attends over every patch before pooling
# (Gemma 4 E4B at a 280-token budget: 264 tokens = 2376 patches; SigLIP so400m at 896²: 4096
# patches), not over the pooled tokens. Needs torch with CUDA; prints one JSON line.
#   python3 tools/peer-torch-vision.py
import json, sys, time, torch, torch.nn as nn, torch.nn.functional as F
torch.backends.cuda.matmul.allow_tf32 = True
dev = 'cuda'

class RMS(nn.Module):
    def __init__(s, d): super().__init__(); s.w = nn.Parameter(torch.ones(d))
    def forward(s, x): return F.rms_norm(x, (x.shape[-1],), s.w, 1e-6)

def rope2d(x, cos, sin):
    # NeoX rotation over two halves of each head (x by column, y by row)
    h = x.shape[-1] // 2
    out = []
    for part, c, s in ((x[..., :h], cos[0], sin[0]), (x[..., h:], cos[1], sin[1])):
        a, b = part[..., : h // 2], part[..., h // 2 :]
        out.append(torch.cat((a * c - b * s, b * c + a * s), -1))
    return torch.cat(out, -1)

class Gemma4Layer(nn.Module):
    def __init__(s, d, heads, ffn):
        super().__init__(); s.h = heads; s.dh = d // heads
        s.ln1, s.ln2, s.pn1, s.pn2 = RMS(d), RMS(d), RMS(d), RMS(d)
        s.qn, s.kn = RMS(s.dh), RMS(s.dh)
        s.q, s.k, s.v, s.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        s.up, s.gate, s.down = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False), nn.Linear(ffn, d, bias=False)
    def forward(s, x, cos, sin):
        B, N, D = x.shape
        y = s.ln1(x)
        q = s.qn(s.q(y).view(B, N, s.h, s.dh)); k = s.kn(s.k(y).view(B, N, s.h, s.dh))
        v = F.rms_norm(s.v(y).view(B, N, s.h, s.dh), (s.dh,), None, 1e-6)
        q, k = rope2d(q, cos, sin), rope2d(k, cos, sin)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=1.0)
        x = x + s.pn1(s.o(a.transpose(1, 2).reshape(B, N, D)))
        y = s.ln2(x)
        return x + s.pn2(s.down(F.gelu(s.gate(y), approximate='tanh') * s.up(y)))

class SiglipLayer(nn.Module):
    def __init__(s, d, heads, ffn):
        super().__init__(); s.h = heads; s.dh = d // heads
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc1, s.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
    def forward(s, x, cos=None, sin=None):
        B, N, D = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(B, N, 3, s.h, s.dh).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + s.o(a.transpose(1, 2).reshape(B, N, D))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate='tanh'))

def tower(kind):
    if kind == 'e4b':  # Gemma 4 E4B vision: 768 h, 16 L, 12 heads, gated ffn 3072; 264 tokens = 2376 patches (44 x 54)
        d, L, heads, ffn, n, pool = 768, 16, 12, 3072, 2376, 3
        layers = nn.ModuleList(Gemma4Layer(d, heads, ffn) for _ in range(L))
        patch = nn.Linear(768, d, bias=False)
    else:  # SigLIP so400m/14 @ 896: 4096 patches, 1152 h, 27 L, 16 heads, ffn 4304
        d, L, heads, ffn, n, pool = 1152, 27, 16, 4304, 4096, 4
        layers = nn.ModuleList(SiglipLayer(d, heads, ffn) for _ in range(L))
        patch = nn.Linear(14 * 14 * 3, d)
    proj = nn.Linear(d, 2560, bias=False)
    m = nn.ModuleDict(dict(layers=layers, patch=patch, proj=proj)).to(dev).half().eval()
    dh = d // heads
    cos = torch.rand(2, n, 1, dh // 4, device=dev, dtype=torch.half)
    sin = torch.rand(2, n, 1, dh // 4, device=dev, dtype=torch.half)
    inp = torch.rand(1, n, patch.in_features, device=dev, dtype=torch.half)
    def fwd():
        x = m['patch'](inp)
        for l in m['layers']: x = l(x, cos, sin)
        if kind == 'e4b':
            x = x.view(1, 44, 54, d).permute(0, 3, 1, 2)
        else:
            x = x.view(1, 64, 64, d).permute(0, 3, 1, 2)
        x = F.avg_pool2d(x, pool).flatten(2).transpose(1, 2)
        return m['proj'](x)
    return fwd, n

def timeit(f, iters=50):
    for _ in range(5): f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort(); return ts[len(ts) // 2], ts[int(len(ts) * 0.99) - 1]

res = {'torch': torch.__version__, 'gpu': torch.cuda.get_device_name()}
with torch.inference_mode():
    for kind in ('e4b', 'so400m'):
        fwd, n = tower(kind)
        eager = timeit(fwd)
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3): fwd()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g): out = fwd()
        graph = timeit(g.replay)
        res[kind] = {'patches': n, 'eager_p50_ms': eager[0], 'eager_p99_ms': eager[1], 'graph_p50_ms': graph[0], 'graph_p99_ms': graph[1]}
print(json.dumps(res))
