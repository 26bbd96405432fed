"""The demo model's text decoder (demo:gemma4-robot, llama.cpp arch `gemma4`) as a plain PyTorch forward pass.

CPU, float32, no transformers: it mirrors llama.cpp's src/models/gemma4.cpp graph (and transformers'
Gemma4TextModel, which the fixture was recorded with) on the weights percept ships
(models/demo/gemma4-robot.weights.gguf.gz, dequantized by record-parity.py's read_weights; the two vocabulary
tables redrawn from their seed by train.py's regen_tables, the trained rows put back). For token ids with an
image segment (rows img0 .. img0+n_image-1 given as soft-token embeddings, as percept decodes them) it returns

  h       [B, S, 256]        the final RMS norm's output (llama.cpp's t_h_nextn, the lm head's input);
  k2, v2  [B, S, 64]         text layer 2's K (after k_norm and RoPE) and V (after its weightless RMS norm),
                             as llama.cpp caches them (the last sliding-window layer, one KV head);
  logits  [B, S|rows, 262144] tied output head, final softcap 30 (optional).

Attention masks as percept/llama.cpp decode the prompt (train.py image_mask_rule): causal; sliding layers also
within the 512 window and bidirectional among the image rows; full layers plain causal.

Checked against test/fixtures/demo-model/parity.json (fp32 transformers on an H200; the soft tokens from
percept's ONNX encoder, tools/demo-model/soft-tokens.ts):

    node --import tsx tools/demo-model/soft-tokens.ts --out /tmp/soft
    /usr/bin/python3 tools/demo-model/target_torch.py --check --soft /tmp/soft

What the check measured, and how fast it runs: tools/demo-model/README.md ("The draft").

Use from Python:

    from target_torch import load_target
    t = load_target("models/demo/gemma4-robot.weights.gguf.gz", "build/llama.cpp/gguf-py")
    h, k2, v2, logits = t.forward(ids, image_embeds, img0)
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KV_LAYER = 2  # the last sliding-window layer: the one whose K/V forward() returns


def _record_parity():
    """tools/demo-model/record-parity.py as a module (its name has a hyphen); it imports train.py."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    spec = importlib.util.spec_from_file_location("record_parity", os.path.join(HERE, "record-parity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rms_norm(x, weight, eps):
    """Gemma 4's RMSNorm (transformers Gemma3nRMSNorm, llama.cpp build_norm LLM_NORM_RMS): weight as-is, no +1."""
    y = x * torch.pow(x.float().pow(2).mean(-1, keepdim=True) + eps, -0.5).to(x.dtype)  # the mean in fp32 under autocast
    return y if weight is None else y * weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Target:
    """The text decoder's weights and forward pass. Built by load_target."""

    def __init__(self, info: dict, tensors: dict, seed_tables: bool = True):
        text = info["text"]
        if text.get("arch") != "gemma4":
            raise ValueError(f"not a gemma4 text decoder: {text.get('arch')}")
        self.info = info
        self.L = text["layers"]
        self.hidden = text["hidden"]
        self.heads = text["heads"]
        self.sliding = list(text["sliding"])
        self.head_dim = [text["headDim"]["sliding"] if s else text["headDim"]["full"] for s in self.sliding]
        self.kv_heads = [text["kvHeads"]["sliding"] if s else text["kvHeads"]["full"] for s in self.sliding]
        self.window = text["window"]
        self.P = text["perLayerInput"]
        self.eps = text["eps"]
        self.softcap = text["softcap"]
        if text.get("sharedKvLayers", 0) or text.get("doubleWideMlp"):
            raise ValueError("KV sharing / double-wide MLP: not what this forward pass writes out")
        if not self.sliding[KV_LAYER]:
            raise ValueError(f"layer {KV_LAYER} is not a sliding-window layer")

        def T(name):
            return torch.from_numpy(np.ascontiguousarray(tensors["language_model." + name])).float()

        self.layers = []
        for i in range(self.L):
            p = f"layers.{i}."
            self.layers.append(
                {
                    k: T(p + n)
                    for k, n in dict(
                        attn_norm="input_layernorm.weight",
                        wq="self_attn.q_proj.weight",
                        wk="self_attn.k_proj.weight",
                        wv="self_attn.v_proj.weight",
                        q_norm="self_attn.q_norm.weight",
                        k_norm="self_attn.k_norm.weight",
                        wo="self_attn.o_proj.weight",
                        attn_post_norm="post_attention_layernorm.weight",
                        ffn_norm="pre_feedforward_layernorm.weight",
                        gate="mlp.gate_proj.weight",
                        up="mlp.up_proj.weight",
                        down="mlp.down_proj.weight",
                        ffn_post_norm="post_feedforward_layernorm.weight",
                        ple_gate="per_layer_input_gate.weight",
                        ple_proj="per_layer_projection.weight",
                        ple_post_norm="post_per_layer_input_norm.weight",
                        out_scale="layer_scalar",
                    ).items()
                }
            )
        self.norm = T("norm.weight")
        self.ple_model_proj = T("per_layer_model_projection.weight")  # [L*P, hidden]
        self.ple_proj_norm = T("per_layer_projection_norm.weight")

        # RoPE as transformers computes it: sliding layers over the whole head; full layers rotate only the first
        # partial·head_dim/2 pairs (llama.cpp's rope_freqs 1e30 for the rest). NEOX halves.
        rope = text["rope"]
        self.inv_freq = []
        for i, s in enumerate(self.sliding):
            d = self.head_dim[i]
            if s:
                inv = 1.0 / (float(rope["baseSwa"]) ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            else:
                angles = int(text["partialRotaryFull"] * d // 2)
                inv = 1.0 / (float(rope["base"]) ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / d))
                inv = torch.cat([inv, torch.zeros(d // 2 - angles, dtype=torch.float32)])
            self.inv_freq.append(inv)

        # The two vocabulary tables: regen_tables' draw from the seed, then the stored (trained) rows.
        import train  # noqa: E402 - on sys.path via _record_parity

        tb = info["tables"]
        embed, ple = train.regen_tables(tb["seed"], tb["vocab"], self.hidden, self.L * self.P, tb.get("std", 0.02))
        ids = torch.from_numpy(tensors["tables.ids"].astype(np.int64))
        embed[ids] = torch.from_numpy(tensors["tables.embed_tokens.rows"]).float()
        ple[ids] = torch.from_numpy(tensors["tables.embed_tokens_per_layer.rows"]).float()
        self.embed = embed  # [vocab, hidden]: input embeddings and the tied output head
        self.ple_table = ple  # [vocab, L*P]
        self._masks: dict = {}
        self._rope: dict = {}

    # ------------------------------------------------------------------------------------------------

    def masks(self, S: int, img0: int, n_image: int):
        """(sliding, full) bool [S, S], True where q may attend k (train.py image_mask_rule, bidirectional)."""
        key = (S, img0, n_image)
        if key not in self._masks:
            q = torch.arange(S)[:, None]
            k = torch.arange(S)[None, :]
            full = k <= q
            sliding = full & (q - k < self.window)
            if n_image > 0:
                a, b = img0, img0 + n_image
                sliding = sliding | ((q >= a) & (q < b) & (k >= a) & (k < b))
            self._masks[key] = (sliding, full)
        return self._masks[key]

    def rope(self, il: int, S: int):
        key = (il, S)
        if key not in self._rope:
            pos = torch.arange(S, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[il][None, :]  # [S, d/2], one fp32 product as transformers
            emb = torch.cat([freqs, freqs], dim=-1)
            self._rope[key] = (emb.cos(), emb.sin())
        return self._rope[key]

    def embed_inputs(self, token_ids, image_embeds, img0: int):
        """Input embeddings [B,S,H] (tokens · sqrt(H), image rows as given) and the per-layer inputs [B,S,L,P]."""
        B, S = token_ids.shape
        ids = token_ids.clone()
        n_image = 0 if image_embeds is None else image_embeds.shape[1]
        if n_image:
            ids[:, img0 : img0 + n_image] = 0  # the image rows' per-layer embeddings: the pad id's (llama.cpp)
        x = F.embedding(ids, self.embed) * math.sqrt(self.hidden)
        if n_image:
            if image_embeds.shape != (B, n_image, self.hidden):
                raise ValueError(f"image_embeds {tuple(image_embeds.shape)}, expected ({B}, {n_image}, {self.hidden})")
            x = torch.cat([x[:, :img0], image_embeds.float(), x[:, img0 + n_image :]], dim=1)
        tok = (F.embedding(ids, self.ple_table) * math.sqrt(self.P)).view(B, S, self.L, self.P)
        proj = F.linear(x, self.ple_model_proj) * (self.hidden**-0.5)
        proj = rms_norm(proj.view(B, S, self.L, self.P), self.ple_proj_norm, self.eps)
        return x, (proj + tok) * (2.0**-0.5)

    def layer(self, il: int, x, ple_in, mask):
        w = self.layers[il]
        B, S, _ = x.shape
        d, nh, nkv = self.head_dim[il], self.heads, self.kv_heads[il]
        cos, sin = self.rope(il, S)

        cur = rms_norm(x, w["attn_norm"], self.eps)
        q = rms_norm(F.linear(cur, w["wq"]).view(B, S, nh, d), w["q_norm"], self.eps)
        k = rms_norm(F.linear(cur, w["wk"]).view(B, S, nkv, d), w["k_norm"], self.eps)
        v = rms_norm(F.linear(cur, w["wv"]).view(B, S, nkv, d), None, self.eps)
        cs, sn = cos[None, :, None, :], sin[None, :, None, :]
        q = q * cs + rotate_half(q) * sn
        k = k * cs + rotate_half(k) * sn

        # attention, scale 1.0 (q_norm/k_norm instead); the kv heads shared by heads/kv_heads query heads
        qh = q.permute(0, 2, 1, 3)  # [B, nh, S, d]
        kh = k.permute(0, 2, 1, 3).repeat_interleave(nh // nkv, dim=1)
        vh = v.permute(0, 2, 1, 3).repeat_interleave(nh // nkv, dim=1)
        scores = (qh @ kh.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ vh  # [B, nh, S, d]
        cur = F.linear(attn.permute(0, 2, 1, 3).reshape(B, S, nh * d), w["wo"])
        attn_out = rms_norm(cur, w["attn_post_norm"], self.eps) + x

        cur = rms_norm(attn_out, w["ffn_norm"], self.eps)
        cur = F.linear(F.gelu(F.linear(cur, w["gate"]), approximate="tanh") * F.linear(cur, w["up"]), w["down"])
        cur = rms_norm(cur, w["ffn_post_norm"], self.eps) + attn_out

        pe = F.gelu(F.linear(cur, w["ple_gate"]), approximate="tanh") * ple_in
        cur = cur + rms_norm(F.linear(pe, w["ple_proj"]), w["ple_post_norm"], self.eps)
        return cur * w["out_scale"], k, v

    def logits(self, h):
        """Tied output head, then the final softcap: tanh(z / cap) · cap."""
        z = F.linear(h, self.embed)
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    @torch.no_grad()
    def forward(self, token_ids, image_embeds, img0: int, logits=True):
        """token_ids LongTensor [B,S] (the image slots may hold anything), image_embeds FloatTensor [B,n_image,H]
        (or None), img0 the first image row. logits: True (every row), False/None (skip the lm head: it is the
        costly part), or a LongTensor / slice of positions (logits of those rows only).
        Returns (h [B,S,H], k2 [B,S,64], v2 [B,S,64], logits or None)."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
        if token_ids.dim() == 1:
            token_ids = token_ids[None]
        if image_embeds is not None and image_embeds.dim() == 2:
            image_embeds = image_embeds[None]
        B, S = token_ids.shape
        n_image = 0 if image_embeds is None else image_embeds.shape[1]
        x, ple = self.embed_inputs(token_ids, image_embeds, img0)
        sliding, full = self.masks(S, img0, n_image)
        k2 = v2 = None
        for il in range(self.L):
            x, k, v = self.layer(il, x, ple[:, :, il], sliding if self.sliding[il] else full)
            if il == KV_LAYER:
                k2, v2 = k[:, :, 0], v[:, :, 0]  # one kv head
        h = rms_norm(x, self.norm, self.eps)
        z = None
        if logits is True:
            z = self.logits(h)
        elif logits is not None and logits is not False:
            z = self.logits(h[:, logits])
        return h, k2, v2, z


def load_target(weights_path: str, gguf_py: str) -> Target:
    """The shipped weights file (a .gguf or its .gz) → Target, both vocabulary tables in fp32."""
    rp = _record_parity()
    info, tensors = rp.read_weights(weights_path, gguf_py)
    return Target(info, tensors)


def prompt_layout(tok: dict, n_image: int):
    """train.py Runner's prompt: before + [imageStart] + [0]·n_image + [imageEnd] + after; (prompt, img0)."""
    p = tok["prompt"]
    prompt = p["before"] + [p["imageStart"]] + [0] * n_image + [p["imageEnd"]] + p["after"]
    return prompt, len(p["before"]) + 1


# ----------------------------------------------------------------------------------------------------


def check(args) -> int:
    rp = _record_parity()
    import train

    torch.set_num_threads(args.threads)
    t0 = time.time()
    info, tensors = rp.read_weights(args.weights, args.gguf_py)
    target = Target(info, tensors)
    t_load = time.time() - t0
    with open(args.fixture) as f:
        fixture = json.load(f)
    with open(os.path.join(args.soft, "index.json")) as f:
        index = json.load(f)["frames"]
    tok = train.read_tokens(args.tokens)
    frames = fixture["frames"][: args.frames] if args.frames else fixture["frames"]
    if len(index) < len(frames):
        raise ValueError(f"{args.soft}: {len(index)} soft-token files for {len(frames)} fixture frames")

    def soft(i):
        e = index[i]
        a = np.fromfile(os.path.join(args.soft, e["file"]), dtype="<f4").reshape(e["rows"], e["width"])
        return torch.from_numpy(a.copy())

    n_image = index[0]["rows"]
    prompt, img0 = prompt_layout(tok, n_image)
    a0 = len(prompt)
    worst = {"diff": 0.0, "at": ""}
    steps = argmax_same = top8_same = 0
    argmax_bad, enc_worst = [], 0.0
    per_frame_worst = []
    t_fwd = 0.0
    for b0 in range(0, len(frames), args.batch):
        batch = frames[b0 : b0 + args.batch]
        imgs = torch.stack([soft(fr["index"]) for fr in batch])
        for fr, img in zip(batch, imgs):  # the soft tokens against the fixture's first values
            for r, vs in fr["encoder"]["first"].items():
                enc_worst = max(enc_worst, float((img[int(r), : len(vs)] - torch.tensor(vs)).abs().max()))
        n = max(len(fr["tokens"]) for fr in batch)
        seqs = torch.zeros(len(batch), a0 + n - 1, dtype=torch.long)  # right padding: causal, so it changes nothing
        for j, fr in enumerate(batch):
            ids = prompt + fr["tokens"][:-1]
            seqs[j, : len(ids)] = torch.tensor(ids)
        t1 = time.time()
        _, _, _, z = target.forward(seqs, imgs, img0, logits=slice(a0 - 1, a0 - 1 + n))
        t_fwd += time.time() - t1
        for j, fr in enumerate(batch):
            fw = 0.0
            for s, top in enumerate(fr["top"]):
                row = z[j, s]
                ids = torch.tensor(top["ids"])
                diff = (row[ids] - torch.tensor(top["logits"])).abs()
                d = float(diff.max())
                fw = max(fw, d)
                if d > worst["diff"]:
                    worst = {"diff": d, "at": f"frame {fr['index']} step {s} token {top['ids'][int(diff.argmax())]}"}
                am = int(row.argmax())
                steps += 1
                if am == top["ids"][0] and am == fr["tokens"][s]:
                    argmax_same += 1
                else:
                    argmax_bad.append({"frame": fr["index"], "step": s, "ours": am, "torch": top["ids"][0]})
                top8_same += int(torch.topk(row, len(top["ids"])).indices.tolist() == top["ids"])
            per_frame_worst.append(round(fw, 7))

    # batching changes nothing: frame 0 alone against its row in the batch above
    fr = frames[0]
    ids = torch.tensor([prompt + fr["tokens"][:-1]])
    t1 = time.time()
    h1, k1, v1, z1 = target.forward(ids, soft(fr["index"])[None], img0, logits=slice(a0 - 1, a0 - 1 + len(fr["tokens"])))
    t_single = time.time() - t1
    b_first = frames[: args.batch]
    n = max(len(f["tokens"]) for f in b_first)
    seqs = torch.zeros(len(b_first), a0 + n - 1, dtype=torch.long)
    for j, f in enumerate(b_first):
        seqs[j, : a0 + len(f["tokens"]) - 1] = torch.tensor(prompt + f["tokens"][:-1])
    hb, kb, vb, _ = target.forward(seqs, torch.stack([soft(f["index"]) for f in b_first]), img0, logits=False)
    S1 = ids.shape[1]
    batch_vs_single = max(float((hb[0, :S1] - h1[0]).abs().max()), float((kb[0, :S1] - k1[0]).abs().max()),
                          float((vb[0, :S1] - v1[0]).abs().max()))

    ok = argmax_same == steps and worst["diff"] <= args.tolerance
    report = {
        "frames": len(frames),
        "steps": steps,
        "argmax_same": argmax_same,
        "argmax_differs": argmax_bad[:10],
        "top8_order_same": top8_same,
        "max_logit_diff": worst["diff"],
        "at": worst["at"],
        "tolerance": args.tolerance,
        "per_frame_max_logit_diff": per_frame_worst,
        "soft_tokens_vs_fixture_first_values": enc_worst,
        "batch_vs_single_frame_max_diff": batch_vs_single,
        "shapes": {"h": list(h1.shape), "k2": list(k1.shape), "v2": list(v1.shape), "logits_rows": list(z1.shape)},
        "seconds": {
            "load": round(t_load, 2),
            "forward_total": round(t_fwd, 2),
            "per_frame_batched": round(t_fwd / len(frames), 3),
            "one_frame_alone": round(t_single, 3),
            "threads": args.threads,
            "batch": args.batch,
        },
        "ok": ok,
    }
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="teacher-forced logits against the recorded fixture")
    ap.add_argument("--weights", default=os.path.join(ROOT, "models/demo/gemma4-robot.weights.gguf.gz"))
    ap.add_argument("--gguf-py", default=os.path.join(ROOT, "build/llama.cpp/gguf-py"))
    ap.add_argument("--fixture", default=os.path.join(ROOT, "test/fixtures/demo-model/parity.json"))
    ap.add_argument("--soft", help="soft-tokens.ts output folder for the sample bag (index.json + frame-NNN.f32)")
    ap.add_argument("--tokens", default=os.path.join(ROOT, ".carry/demo-eval/tokens.json.gz"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--frames", type=int, default=0, help="only the first N fixture frames (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    if not args.check:
        ap.error("nothing to do: pass --check (or import load_target)")
    if not args.soft:
        ap.error("--check needs --soft DIR (node --import tsx tools/demo-model/soft-tokens.ts --out DIR)")
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
