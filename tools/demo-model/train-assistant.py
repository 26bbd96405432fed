#!/usr/bin/env python3
"""Trains the demo model's draft: a Gemma 4 MTP assistant (llama.cpp's `gemma4-assistant`) on the frozen
model's teacher-forced states. The assistant is llama.cpp's graph written in plain PyTorch, since llama.cpp runs it.
Design, runs and numbers: tools/demo-model/README.md ("The draft").

Usage (the model's states from transformers on the GPU host, or from target_torch.py on the CPU):
    python3 tools/demo-model/train-assistant.py --target CKPT --tokens T.json.gz --train DIR... --val DIR --out OUT
    python3 tools/demo-model/train-assistant.py --weights models/demo/gemma4-robot.weights.gguf.gz \
        --soft-tokens TRAIN_SOFT VAL_SOFT --tokens T.json.gz --train DIR --val DIR --out OUT --device cpu
Writes OUT/assistant/{assistant.safetensors, assistant.json} and OUT/summary.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as base  # noqa: E402  the target's data, layout and forward pass
import target_torch as tt  # noqa: E402  the target as plain PyTorch: its layout, ops and forward
from target_torch import prompt_layout, rms_norm, rotate_half  # noqa: E402

log = base.log
TABLE_STD = 0.02


def regen_assistant_table(seed: int, vocab: int, hidden: int):
    """The assistant's token table before training: torch CPU randn from its own seed (models/demo-assistant.ts redraws it)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + 29)
    return torch.randn(vocab, hidden, generator=g, dtype=torch.float32) * TABLE_STD


def build_assistant(cfg: dict, used_ids: list[int], seed: int):
    import torch
    from torch import nn

    F = nn.functional
    d, T, H, hd, ff, eps = cfg["hidden"], cfg["backbone_hidden"], cfg["heads"], cfg["head_dim_sliding"], cfg["ffn"], cfg["eps"]

    def rms(x, w):
        return rms_norm(x, w, eps)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.Parameter(torch.ones(d))
            self.q = nn.Linear(d, H * hd, bias=False)
            self.q_norm = nn.Parameter(torch.ones(hd))
            self.o = nn.Linear(H * hd, d, bias=False)
            self.attn_post_norm = nn.Parameter(torch.ones(d))
            self.ffn_norm = nn.Parameter(torch.ones(d))
            self.gate = nn.Linear(d, ff, bias=False)
            self.up = nn.Linear(d, ff, bias=False)
            self.down = nn.Linear(ff, d, bias=False)
            self.ffn_post_norm = nn.Parameter(torch.ones(d))
            self.out_scale = nn.Parameter(torch.ones(1))

    class Assistant(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Linear(2 * T, d, bias=False)
            self.post = nn.Linear(d, T, bias=False)
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["layers"]))
            self.output_norm = nn.Parameter(torch.ones(d))
            table = regen_assistant_table(seed, cfg["vocab"], d)
            self.register_buffer("used", torch.tensor(used_ids, dtype=torch.long))
            self.rows = nn.Parameter(table[self.used].clone())

        def forward(self, x_emb, h, keys, values, kv_mask, cos_sin):
            """x_emb, h [N, T]; the target's keys/values [N, S, hd]; kv_mask [N, S] → logits of the used rows, next h."""
            cur = self.pre(torch.cat([x_emb, h], -1))
            cos, sin = cos_sin
            for layer in self.layers:
                q = layer.q(rms(cur, layer.attn_norm)).view(-1, H, hd)
                q = rms(q, layer.q_norm)
                q = q * cos[:, None] + rotate_half(q) * sin[:, None]
                att = torch.einsum("nhd,nsd->nhs", q.float(), keys.float())  # scale 1, as Gemma 4
                att = att.masked_fill(~kv_mask[:, None], float("-inf")).softmax(-1)
                a = torch.einsum("nhs,nsd->nhd", att, values.float()).reshape(-1, H * hd).to(cur.dtype)
                attn_out = rms(layer.o(a), layer.attn_post_norm) + cur
                f = rms(attn_out, layer.ffn_norm)
                f = layer.down(F.gelu(layer.gate(f), approximate="tanh") * layer.up(f))
                cur = (rms(f, layer.ffn_post_norm) + attn_out) * layer.out_scale
            out = rms(cur, self.output_norm)
            return out @ self.rows.t(), self.post(out)

    return Assistant()


def rope_cos_sin(pos, head_dim: int, theta: float):
    """NEOX RoPE over the whole head (llama.cpp rope_ext, mode NEOX, no freq factors: the sliding layers)."""
    import torch

    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim))
    ang = pos.float()[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def cache_layer(cache, i: int):
    """(keys, values) [B, kv heads, S, head dim] of layer i from a transformers cache, whichever API it has."""
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


class TargetStates:
    """The frozen target, teacher-forced: final-norm hidden states and its last sliding layer's KV."""

    def __init__(self, runner, layer: int):
        self.r = runner
        self.layer = layer

    def __call__(self, ids, imgs_u8):
        r = self.r
        torch = r.torch
        B, S = ids.shape
        pv, pos = r.patches(imgs_u8)
        hf_ids = ids.clone()
        hf_ids[:, r.img0 : r.img0 + r.n_image] = r.image_token_id
        out = r.model.model(input_ids=hf_ids, pixel_values=pv, image_position_ids=pos, attention_mask=r.masks(S, B), use_cache=True)
        k, v = cache_layer(out.past_key_values, self.layer)
        if k.shape[0] != B or k.shape[2] != S or k.shape[1] != 1:
            raise RuntimeError(f"layer {self.layer} cache keys {tuple(k.shape)} for {B}x{S} ids (one KV head expected)")
        return out.last_hidden_state, k[:, 0], v[:, 0]


def draft_examples(layout, targets: list[list[int]], forced: list[str], ahead: int, device):
    """One example per action token but the last: its sequence, its row p, the tokens x[p+1..p+1+ahead]
    (input, then step targets; -1 past the end), and which targets the model picks (the grammar does not force)."""
    import torch

    a0 = layout.a0
    bi, pi, toks, picked = [], [], [], []
    for b, (t, f) in enumerate(zip(targets, forced)):
        # x[a0 + j] = t[j]; the target predicts t[0] at row a0-1, so the assistant starts at p = a0-1.
        for j in range(len(t) - 1):
            p = a0 - 1 + j
            seq = t[j : j + 1 + ahead]
            bi.append(b)
            pi.append(p)
            toks.append(seq + [-1] * (1 + ahead - len(seq)))
            fl = f[j + 1 : j + 1 + ahead]
            picked.append([c == "0" for c in fl] + [False] * (ahead - len(fl)))
    as_t = lambda v, dt=torch.long: torch.tensor(v, dtype=dt, device=device)  # noqa: E731
    return as_t(bi), as_t(pi), as_t(toks), as_t(picked, torch.bool)


def run_assistant(asst, target_table, states, ex, used_index, ahead: int, theta: float, head_dim: int):
    """Per draft step: logits [N, U] and the used-row index of its target token (-1: none)."""
    import torch

    h_all, keys, values = states
    bi, pi, toks, _ = ex
    S = keys.shape[1]
    h = h_all[bi, pi].float()
    q_pos = pi + 1
    kv_mask = torch.arange(S, device=pi.device)[None] <= pi[:, None]
    cos_sin = rope_cos_sin(q_pos, head_dim, theta)
    k, v = keys[bi], values[bi]
    scale = math.sqrt(target_table.shape[1])
    out = []
    for step in range(ahead):
        x = toks[:, step]
        valid = x >= 0
        x_emb = target_table[x.clamp(min=0)].float() * scale
        logits, h = asst(x_emb, h, k, v, kv_mask, cos_sin)
        want = toks[:, step + 1]
        want_idx = torch.where((want >= 0) & valid, used_index[want.clamp(min=0)], torch.full_like(want, -1))
        out.append((logits, want_idx))
    return out


class Layout:
    """percept's prompt around the image (train.py Runner's layout, without a model)."""

    def __init__(self, tok: dict, n_image: int):
        self.prompt, self.img0 = prompt_layout(tok, n_image)
        self.n_image = n_image
        self.a0 = len(self.prompt)


def layer_head_dim(tc, layer: int) -> int:
    """Layer `layer`'s head dim: transformers 5.17 keeps Gemma 4's per layer and refuses the global attribute."""
    return int(tc.per_layer_config[layer].head_dim)


def hf_target(args, tok: dict, rows_of: dict, device) -> dict:
    """The target from a train.py checkpoint through transformers (the GPU host): states computed per batch from the frames."""
    import torch

    with open(os.path.join(args.target, "checkpoint.json")) as f:
        tinfo = json.load(f)
    tw, th = tinfo["image_size"]
    cols, nrows = tinfo["patch_grid"]
    images = {}
    for name, rows_ in rows_of.items():
        t = time.time()
        images[name] = torch.from_numpy(base.load_images([o["path"] for o in rows_], (tw, th), args.workers)).to(device)
        log("images", split=name, n=len(rows_), seconds=round(time.time() - t, 1))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, _ = base.build_model(base.model_config(tinfo["image_tokens_budget"]), tinfo.get("table_seed", tinfo["seed"]))
    missing, unexpected = model.load_state_dict(base.reassemble(args.target, None), strict=False)
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    runner = base.Runner(model, tok, tinfo["image_rows"], cols, nrows, device)
    if list(runner.prompt) != list(tinfo["prompt_tokens"]):
        raise ValueError("the token file's prompt differs from the one the target was trained on")
    tc = model.config.text_config
    types = list(tc.layer_types)
    sliding = max(i for i, t in enumerate(types) if t == "sliding_attention")
    if sliding != len(types) - 2:
        raise ValueError(f"layer types {types}: llama.cpp's assistant reads layer n-2 as the last sliding one, here {sliding}")
    try:
        theta = float(tc.rope_parameters["sliding_attention"]["rope_theta"])
    except Exception:  # noqa: BLE001 - older configs: Gemma 4's sliding default
        theta = 10000.0
    states = TargetStates(runner, sliding)

    def states_of(ids, split, sel):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return states(ids, images[split][torch.tensor(sel, device=device)])

    full = next(i for i, t in enumerate(types) if t == "full_attention")
    return {
        "layout": Layout(tok, tinfo["image_rows"]),
        "states_of": states_of,
        "table": runner.weight().detach(),
        "config": {
            "hidden": tc.hidden_size,
            "head_dim": layer_head_dim(tc, sliding),
            "head_dim_full": layer_head_dim(tc, full),
            "rope_theta_sliding": theta,
            "window": tc.sliding_window,
            "context": tc.max_position_embeddings,
            "eps": tc.rms_norm_eps,
            "vocab": tc.vocab_size,
        },
        "source": os.path.basename(os.path.normpath(args.target)),
        "steps": tinfo.get("init_steps", 0) + tinfo.get("steps", 0),
        "missing": [k for k in missing if k != "lm_head.weight"][:5],
        "unexpected": list(unexpected)[:5],
        "kv_layer": sliding,
    }


def torch_target(args, tok: dict, rows_of: dict, device) -> dict:
    """The target from the shipped weights through target_torch.py (plain PyTorch, checked against the parity
    fixture): every frame's states computed once, from its soft tokens (soft-tokens.ts), and kept."""
    import torch

    if not args.soft_tokens:
        raise ValueError("--weights needs --soft-tokens TRAIN_DIR VAL_DIR")
    torch.set_num_threads(os.cpu_count() or 1)
    target = tt.load_target(args.weights, args.gguf_py)
    text = target.info["text"]
    kv_layer = tt.KV_LAYER
    if kv_layer != target.L - 2:
        raise ValueError(f"target_torch takes layer {kv_layer}'s KV; llama.cpp's assistant reads layer n-2 = {target.L - 2}")

    for d in args.soft_tokens:
        with open(os.path.join(d, "index.json")) as f:
            budget = json.load(f).get("imageTokens")
        if budget != target.info["imageTokens"]:
            raise ValueError(f"{d}: soft tokens at {budget} image tokens; the model was trained at {target.info['imageTokens']}")
    want_rows: list[int] = []

    def soft_tokens(d: str, seed: int):
        """A frame's soft tokens; every frame must have as many rows as the first."""
        path = os.path.join(d, f"{seed}.f32")
        with open(path, "rb") as f:
            x = np.frombuffer(f.read(), dtype="<f4")
        rows = x.size // target.hidden
        want_rows[:] = want_rows or [rows]
        if x.size % target.hidden or rows != want_rows[0]:
            raise ValueError(f"{path}: {x.size} values, not {want_rows[0]} rows of {target.hidden}")
        return torch.from_numpy(x.copy()).view(rows, target.hidden)

    cache: dict = {}
    layout = None
    for (split, rows_), d in zip(rows_of.items(), args.soft_tokens):
        t = time.time()
        per = []
        for s in range(0, len(rows_), 16):
            chunk = rows_[s : s + 16]
            embeds = torch.stack([soft_tokens(d, o["seed"]) for o in chunk])
            if layout is None:
                layout = Layout(tok, embeds.shape[1])
            targets = [tok["tokens"][o["k"]] for o in chunk]
            ids, _, _, _ = base.batch_tensors(layout, targets, torch.device("cpu"))
            with torch.no_grad():
                h, k2, v2, _ = target.forward(ids, embeds, layout.img0, logits=False)
            for b, tg in enumerate(targets):
                n = layout.a0 + len(tg) - 1
                per.append((h[b, :n].clone(), k2[b, :n].clone(), v2[b, :n].clone()))
        cache[split] = per
        log("states", split=split, n=len(per), seconds=round(time.time() - t, 1))

    def states_of(ids, split, sel):
        B, S = ids.shape
        out = [torch.zeros(B, S, x.shape[-1], device=device) for x in cache[split][sel[0]]]
        for b, i in enumerate(sel):
            for o, x in zip(out, cache[split][i]):
                o[b, : x.shape[0]] = x.to(device)
        return tuple(out)

    return {
        "layout": layout,
        "states_of": states_of,
        "table": target.embed.to(device),
        "config": {
            "hidden": target.hidden,
            "head_dim": text["headDim"]["sliding"],
            "head_dim_full": text["headDim"]["full"],
            "rope_theta_sliding": float(text["rope"]["baseSwa"]),
            "window": text["window"],
            "context": text["context"],
            "eps": text["eps"],
            "vocab": target.embed.shape[0],
        },
        "source": os.path.basename(args.weights),
        "steps": target.info.get("provenance", {}).get("steps"),
        "kv_layer": kv_layer,
    }


def save_safetensors(tensors: dict, path: str) -> None:
    """The safetensors format (8-byte header length, JSON header, raw little-endian data), without the package."""
    import torch

    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        b = t.numpy().tobytes()
        header[k] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="the target's compact checkpoint (train.py ckpt/): its states from transformers, on the GPU")
    ap.add_argument("--weights", help="or the shipped weights file: its states from target_torch.py (plain PyTorch, CPU)")
    ap.add_argument("--soft-tokens", nargs=2, metavar=("TRAIN_DIR", "VAL_DIR"),
                    help="with --weights: soft-tokens.ts output for the --train and --val frames")
    ap.add_argument("--gguf-py", default="build/llama.cpp/gguf-py", help="with --weights: llama.cpp's gguf-py")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--train", nargs="+", required=True)
    ap.add_argument("--val", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1, help="Q-only layers, all sliding (they read the target's last sliding layer)")
    ap.add_argument("--steps-ahead", type=int, default=3, help="draft steps trained per position")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--time-budget", type=float, default=240.0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--max-train", type=int, default=0)
    ap.add_argument("--max-val", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    import torch

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device)

    tok = base.read_tokens(args.tokens)
    train_rows, val_rows = base.read_scenes(args.train), base.read_scenes(args.val)
    if args.max_train:
        train_rows = train_rows[: args.max_train]
    if args.max_val:
        val_rows = val_rows[: args.max_val]
    base.attach_targets(train_rows, tok)
    base.attach_targets(val_rows, tok)
    rows_of = {"train": train_rows, "val": val_rows}
    if bool(args.target) == bool(args.weights) or bool(args.soft_tokens) != bool(args.weights):
        raise ValueError("give --target CKPT (transformers, GPU), or --weights FILE with --soft-tokens TRAIN VAL (plain PyTorch)")
    src = hf_target(args, tok, rows_of, device) if args.target else torch_target(args, tok, rows_of, device)
    layout, states_of, target_table, tc = src["layout"], src["states_of"], src["table"], src["config"]
    head_dim, theta = tc["head_dim"], tc["rope_theta_sliding"]
    log("target", **{k: v for k, v in src.items() if k not in ("layout", "states_of", "table", "config")}, **tc)

    used = set(layout.prompt) | {tok["endToken"], tok["special"]["eos"], tok["special"]["bos"], 0}
    for seq in tok["tokens"]:
        used.update(seq)
    used_ids = sorted(used)
    used_index = torch.full((tc["vocab"],), -1, dtype=torch.long, device=device)
    used_index[torch.tensor(used_ids, device=device)] = torch.arange(len(used_ids), device=device)
    acfg = {
        "layers": args.layers,
        "hidden": args.hidden,
        "backbone_hidden": tc["hidden"],
        "heads": args.heads,
        "kv_heads": 1,
        "head_dim_sliding": head_dim,
        "head_dim_full": tc["head_dim_full"],
        "ffn": args.ffn,
        "sliding": [True] * args.layers,
        "window": tc["window"],
        "context": tc["context"],
        "rope_theta_sliding": theta,
        "eps": tc["eps"],
        "vocab": tc["vocab"],
        "table_seed": args.seed,
        "table_std": TABLE_STD,
    }
    asst = build_assistant(acfg, used_ids, args.seed).to(device)
    n_params = sum(p.numel() for p in asst.parameters())
    log("assistant", params=n_params, params_without_rows=n_params - asst.rows.numel(), **acfg)
    opt = torch.optim.AdamW(asst.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    F = torch.nn.functional

    gpu = device.type == "cuda"

    def batch_loss(split: str, sel, train: bool):
        rows_ = rows_of[split]
        targets = [tok["tokens"][rows_[i]["k"]] for i in sel]
        forced = [tok["forced"][rows_[i]["k"]] for i in sel]
        ids, _, _, _ = base.batch_tensors(layout, targets, device)
        with torch.no_grad():
            states = tuple(s.float() for s in states_of(ids, split, sel))
        ex = draft_examples(layout, targets, forced, args.steps_ahead, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=train and gpu):
            steps = run_assistant(asst, target_table, states, ex, used_index, args.steps_ahead, theta, head_dim)
        losses, stats = [], []
        picked = ex[3]
        for k, (logits, want) in enumerate(steps):
            m = want >= 0
            if not bool(m.any()):
                continue
            z = logits.float()[m]
            losses.append(F.cross_entropy(z, want[m]) * (0.7**k))
            ok = z.argmax(-1) == want[m]
            pk = picked[:, k][m]
            stats.append((int(ok.sum()), int(m.sum()), int((ok & pk).sum()), int(pk.sum())))
        return sum(losses) / sum(0.7**k for k in range(len(losses))), stats

    def lr_at(step: int, frac: float) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    def evaluate(split: str) -> dict:
        asst.eval()
        tot = [[0, 0, 0, 0] for _ in range(args.steps_ahead)]
        loss_sum, n = 0.0, 0
        with torch.no_grad():
            n_rows = len(rows_of[split])
            for s in range(0, n_rows, 125):
                sel = list(range(s, min(n_rows, s + 125)))
                loss, stats = batch_loss(split, sel, False)
                loss_sum += float(loss) * len(sel)
                n += len(sel)
                for k, st in enumerate(stats):
                    tot[k] = [a + b for a, b in zip(tot[k], st)]
        asst.train()
        return {
            "loss": round(loss_sum / max(1, n), 5),
            "step_acc": [round(t[0] / max(1, t[1]), 4) for t in tot],
            "step_acc_picked": [round(t[2] / max(1, t[3]), 4) for t in tot],
            "positions": [t[1] for t in tot],
            "picked_positions": [t[3] for t in tot],
        }

    log("eval", step=0, **evaluate("val"))
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    step, t0 = 0, time.time()
    history = []
    run = [0.0, 0]
    n_train = len(rows_of["train"])
    if n_train < args.batch:
        raise ValueError(f"{n_train} training frames, fewer than one batch (--batch {args.batch})")
    stop = False
    while not stop:
        perm = torch.randperm(n_train, generator=gen).tolist()
        for s in range(0, n_train - args.batch + 1, args.batch):
            elapsed = time.time() - t0
            frac = step / args.steps if args.steps else elapsed / args.time_budget
            if (args.steps and step >= args.steps) or (not args.steps and elapsed >= args.time_budget):
                stop = True
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step, frac)
            loss, _ = batch_loss("train", perm[s : s + args.batch], True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(asst.parameters(), 1.0)
            opt.step()
            step += 1
            run[0] += float(loss)
            run[1] += 1
            if step % args.log_every == 0 or step == 1:
                log("train", step=step, loss=round(run[0] / run[1], 5), lr=round(lr_at(step, frac), 6),
                    steps_per_s=round(step / max(1e-9, time.time() - t0), 2))
                run = [0.0, 0]
        else:
            ev = evaluate("val")
            history.append({"step": step, **ev})
            log("eval", step=step, **ev)
    train_seconds = time.time() - t0
    final = evaluate("val")
    log("final", step=step, train_seconds=round(train_seconds, 1), **final)

    out_dir = os.path.join(args.out, "assistant")
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().float().cpu().contiguous() for k, v in asst.state_dict().items() if k != "used"}
    sd["ids"] = torch.tensor(used_ids, dtype=torch.long)
    save_safetensors(sd, os.path.join(out_dir, "assistant.safetensors"))
    meta = {
        "format": "percept-demo-assistant/1",
        "config": acfg,
        "target": src["source"],
        "target_steps": src["steps"],
        "steps": step,
        "train_seconds": round(train_seconds, 1),
        "seed": args.seed,
        "steps_ahead": args.steps_ahead,
        "tensors": {
            "pre.weight": "nextn.pre_projection.weight ([hidden, 2·backbone])",
            "post.weight": "nextn.post_projection.weight ([backbone, hidden])",
            "rows": "token_embd rows for ids (the rest: regen_assistant_table(table_seed))",
            "layers.i.*": "blk.i.* (q → attn_q, o → attn_output, attn_post_norm → post_attention_norm, out_scale → layer_output_scale)",
        },
        "final": final,
    }
    with open(os.path.join(out_dir, "assistant.json"), "w") as f:
        json.dump(meta, f, indent=1)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"final": final, "history": history, "steps": step, "train_seconds": train_seconds, "params": n_params}, f, indent=1)
    log("saved", dir=out_dir)


if __name__ == "__main__":
    main()
