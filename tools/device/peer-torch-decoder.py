#!/usr/bin/env python3
# The PyTorch peer for the decoder's prefill (`percept bench cameras`' ceiling, llama-bench's pp): Gemma 4 E4B's
# text stack in bf16 with SDPA, random weights (only the timing is compared), timed eager and replayed as a CUDA
# graph, with torch.profiler's per-kernel times of one prefill. The shape is the one the batched decoder prefills:
# B sequences of N positions (16 cameras x 290), each attending causally to its own positions; the output head runs
# on each sequence's last position only, as llama.cpp's does. Needs torch with CUDA; prints one JSON line.
#   python3 tools/device/peer-torch-decoder.py [--shapes 1x290,16x290,1x4640] [--layers 42]
import argparse, json, math, time, torch, torch.nn as nn, torch.nn.functional as F

# E4B: 42 layers (5 sliding, 1 full) x 7, hidden 2560, 8 heads over 2 KV heads, head 256 (sliding) / 512 (full),
# gated GELU FFN 10240, per-layer inputs 256 wide, the last 18 layers reuse earlier layers' K and V.
HIDDEN, HEADS, KV_HEADS, FFN, PLE, VOCAB, SHARED = 2560, 8, 2, 10240, 256, 262144, 18
dev = 'cuda'
DT = torch.bfloat16


def lin(i, o):
    return nn.Linear(i, o, bias=False)


class RMS(nn.Module):
    def __init__(s, d, weight=True):
        super().__init__()
        s.w = nn.Parameter(torch.ones(d)) if weight else None

    def forward(s, x):
        return F.rms_norm(x, (x.shape[-1],), s.w, 1e-6)


def rope(x, cos, sin, rotary):
    # NeoX rotation of the first `rotary` dimensions of each head (Gemma 4's full layers rotate a quarter).
    r, rest = x[..., :rotary], x[..., rotary:]
    a, b = r[..., : rotary // 2], r[..., rotary // 2 :]
    return torch.cat((a * cos - b * sin, b * cos + a * sin, rest), -1)


class Layer(nn.Module):
    def __init__(s, full, shared):
        super().__init__()
        s.hd = 512 if full else 256
        s.rot = s.hd // 4 if full else s.hd
        s.shared = shared
        s.attn_norm, s.post_attn, s.ffn_norm, s.post_ffn, s.post_ple = (RMS(HIDDEN) for _ in range(5))
        s.q, s.o = lin(HIDDEN, HEADS * s.hd), lin(HEADS * s.hd, HIDDEN)
        s.q_norm = RMS(s.hd)
        if not shared:
            s.k, s.v = lin(HIDDEN, KV_HEADS * s.hd), lin(HIDDEN, KV_HEADS * s.hd)
            s.k_norm, s.v_norm = RMS(s.hd), RMS(s.hd, weight=False)
        s.gate, s.up, s.down = lin(HIDDEN, FFN), lin(HIDDEN, FFN), lin(FFN, HIDDEN)
        s.ple_gate, s.ple_proj = lin(HIDDEN, PLE), lin(PLE, HIDDEN)

    def forward(s, x, ple, cos, sin, kv):
        B, N, _ = x.shape
        y = s.attn_norm(x)
        q = rope(s.q_norm(s.q(y).view(B, N, HEADS, s.hd)), cos[s.hd], sin[s.hd], s.rot)
        if s.shared:
            k, v = kv[s.hd]
        else:
            k = rope(s.k_norm(s.k(y).view(B, N, KV_HEADS, s.hd)), cos[s.hd], sin[s.hd], s.rot).transpose(1, 2)
            v = s.v_norm(s.v(y).view(B, N, KV_HEADS, s.hd)).transpose(1, 2)
            kv[s.hd] = (k, v)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=1.0, enable_gqa=True)
        x = x + s.post_attn(s.o(a.transpose(1, 2).reshape(B, N, HEADS * s.hd)))
        y = s.ffn_norm(x)
        x = x + s.post_ffn(s.down(F.gelu(s.gate(y), approximate='tanh') * s.up(y)))
        return x + s.post_ple(s.ple_proj(F.gelu(s.ple_gate(x), approximate='tanh') * ple))


class Decoder(nn.Module):
    def __init__(s, layers):
        super().__init__()
        full = [(i % 6) == 5 for i in range(layers)]
        s.layers = nn.ModuleList(Layer(f, i >= layers - SHARED) for i, f in enumerate(full))
        s.ple_model_proj, s.ple_norm, s.norm = lin(HIDDEN, layers * PLE), RMS(PLE), RMS(HIDDEN)
        s.n = layers

    def build(s):
        # The two embedding tables and the tied head, made on the GPU at once (random values, bf16).
        s.embed = (torch.randn(VOCAB, HIDDEN, device=dev, dtype=DT) * 0.02).contiguous()
        s.ple_embed = (torch.randn(VOCAB, s.n * PLE, device=dev, dtype=DT) * 0.02).contiguous()
        return s

    def forward(s, ids, cos, sin):
        B, N = ids.shape
        x = F.embedding(ids, s.embed) * math.sqrt(HIDDEN)
        ple = F.embedding(ids, s.ple_embed).view(B, N, s.n, PLE) * math.sqrt(PLE)
        ple = (s.ple_norm(s.ple_model_proj(x).view(B, N, s.n, PLE) / math.sqrt(HIDDEN)) + ple) / math.sqrt(2)
        kv = {}
        for i, layer in enumerate(s.layers):
            x = layer(x, ple[:, :, i], cos, sin, kv)
        last = s.norm(x[:, -1])
        return torch.tanh(F.linear(last, s.embed) / 30) * 30


def tables(N):
    cos, sin = {}, {}
    for hd, rot, theta in ((256, 256, 1e4), (512, 128, 1e6)):
        inv = 1.0 / theta ** (torch.arange(0, rot, 2, device=dev).float() / rot)
        ang = torch.arange(N, device=dev).float()[:, None] * inv[None]
        cos[hd], sin[hd] = ang.cos().to(DT)[None, :, None], ang.sin().to(DT)[None, :, None]
    return cos, sin


def timeit(f, iters):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def kind(name):
    n = name.lower()
    if 'flash' in n or 'fmha' in n or 'attention' in n:
        return 'attention'
    if 'gemm' in n or 'nvjet' in n or 'xmma' in n or 'cutlass' in n or 'matmul' in n:
        return 'matmul'
    if 'norm' in n:
        return 'norm'
    return 'elementwise/other'


def profile(f, reps=3):
    from torch.profiler import ProfilerActivity, profile as prof

    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            f()
        torch.cuda.synchronize()
    rows, by_kind = [], {}
    for e in p.key_averages():
        us = getattr(e, 'device_time_total', None) or getattr(e, 'cuda_time_total', 0)
        if us <= 0 or e.key.startswith('cuda') or e.key.startswith('Memcpy') or e.key.startswith('Memset'):
            continue
        ms = us / 1e3 / reps
        rows.append({'kernel': e.key[:120], 'ms': round(ms, 4), 'calls': e.count // reps, 'kind': kind(e.key)})
        by_kind[kind(e.key)] = by_kind.get(kind(e.key), 0) + ms
    rows.sort(key=lambda r: -r['ms'])
    return {'kernels_ms': round(sum(r['ms'] for r in rows), 3), 'by_kind_ms': {k: round(v, 3) for k, v in by_kind.items()}, 'top': rows[:20]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--shapes', default='1x290,16x290,1x4640')
    ap.add_argument('--layers', type=int, default=42)
    ap.add_argument('--iters', type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    m = Decoder(a.layers).to(dev, DT).eval().build()
    res = {'torch': torch.__version__, 'gpu': torch.cuda.get_device_name(), 'dtype': 'bfloat16', 'layers': a.layers, 'shapes': {}}
    with torch.inference_mode():
        for shape in a.shapes.split(','):
            B, N = (int(v) for v in shape.split('x'))
            ids = torch.randint(0, VOCAB, (B, N), device=dev)
            cos, sin = tables(N)
            fwd = lambda: m(ids, cos, sin)
            eager = timeit(fwd, a.iters)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    fwd()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fwd()
            graph = timeit(g.replay, a.iters)
            res['shapes'][shape] = {
                'eager_ms': round(eager, 3),
                'graph_ms': round(graph, 3),
                'eager_tok_per_s': round(B * N / eager * 1e3),
                'graph_tok_per_s': round(B * N / graph * 1e3),
                'profile': profile(fwd),
            }
    print(json.dumps(res))


if __name__ == '__main__':
    main()
