#!/usr/bin/env python3
"""Trains percept's demo model: a small Gemma 4 (text + vision) that maps a camera frame to its
RobotAction JSON, on scenes from tools/make-scenes.ts and token ids from tools/demo-model/prompt-tokens.ts.

The model is transformers' Gemma4ForConditionalGeneration built from a small Gemma4Config (real
vocabulary, 262144 ids, and Gemma 4's token ids). The forward pass goes through its modules
(vision_tower, embed_vision, language_model, tied lm_head) but the sequence is laid out and the
attention masks are built here, as percept and llama.cpp run the model (README.md, "Where this
departs from transformers' own path"):
  - the prompt is exactly percept's (nodes/decoder.ts): tokens before the image, <|image>, N image rows,
    <image|>, tokens after, then the action tokens as the grammar-constrained decoder emits them;
  - sliding-window layers see the image rows bidirectionally, full-attention layers causally
    (llama.cpp's LLAMA_NON_CAUSAL_TYPE_SWA_ONLY, percept's "bidirectional-swa" for this text width);
  - image rows take token 0's per-layer-embedding row (HF's pad id, llama.cpp's rule);
  - images: HF/percept Gemma 4 sizing for a fixed token budget, PIL bicubic, x/255, 16x16 patches in
    HWC order, row-major; no padding patches (the budget's tensor is cut to the real patches).
Loss: cross-entropy over the full vocabulary (final logit softcap 30) on the action tokens and the
end-of-turn token only. Prints JSON lines (train loss every --log-every steps; val loss, token
accuracy and greedy exact-match / action / label / bbox-IoU accuracy after each epoch).

Usage: python3 tools/demo-model/train.py --tokens T.json.gz --train DIR... --val DIR --out OUT
                                         [--time-budget S | --steps N] [--seed 0] [...]
       python3 tools/demo-model/train.py --reassemble CKPT_DIR --out full.safetensors
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing as mp
import os
import random
import re
import sys
import time

import numpy as np
from PIL import Image

PATCH = 16
POOL = 3
SIDE = PATCH * POOL  # 48 px per soft token side
T0 = time.time()


def log(event: str, **kw) -> None:
    print(json.dumps({"event": event, "t": round(time.time() - T0, 2), **kw}), flush=True)


# ---------------------------------------------------------------------------------------------
# Model config


def model_config(image_tokens: int) -> dict:
    """The demo model's shape. Text: 4 layers [S,F,S,F], hidden 256 (so percept and llama.cpp run its
    image rows bidirectionally in the sliding layers: not 1536/2560), 4 q heads, 1 kv head, head dim
    64 sliding / 128 full, FFN 1024, PLE 16 per layer over the full vocabulary. Vision: 4 layers,
    hidden 256, 4 heads of 64, FFN 1024, patch 16, pooling 3, a 128-entry position table per axis."""
    return {
        "text": dict(
            vocab_size=262144,
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=64,
            global_head_dim=128,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            sliding_window=512,
            max_position_embeddings=8192,
            final_logit_softcapping=30.0,
            vocab_size_per_layer_input=262144,
            hidden_size_per_layer_input=16,
            num_kv_shared_layers=0,
            use_double_wide_mlp=False,
            attention_k_eq_v=False,
            enable_moe_block=False,
            rms_norm_eps=1e-6,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=[1, 106],
            tie_word_embeddings=True,
        ),
        "vision": dict(
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=64,
            patch_size=PATCH,
            pooling_kernel_size=POOL,
            position_embedding_size=128,
            use_clipped_linears=False,
            standardize=False,
            rms_norm_eps=1e-6,
        ),
        "image_tokens_budget": image_tokens,
    }


# ---------------------------------------------------------------------------------------------
# Images: percept's Gemma 4 preprocessing (nodes/preprocess.ts, sizing 'hf')


def gemma4_target_size(width: int, height: int, budget: int) -> tuple[int, int]:
    """transformers Gemma4ImageProcessor.get_aspect_ratio_preserving_size, as gemma4TargetSize('hf')."""
    max_pixels = budget * SIDE * SIDE
    factor = math.sqrt(max_pixels / (width * height))
    th = math.floor((factor * height) / SIDE) * SIDE
    tw = math.floor((factor * width) / SIDE) * SIDE
    max_side = budget * SIDE
    if th == 0 and tw == 0:
        raise ValueError(f"{width}x{height} resizes to 0x0")
    if th == 0:
        th, tw = SIDE, min(math.floor(width / height) * SIDE, max_side)
    elif tw == 0:
        tw, th = SIDE, min(math.floor(height / width) * SIDE, max_side)
    return tw, th


BICUBIC = getattr(getattr(Image, "Resampling", Image), "BICUBIC")


def load_image(path: str, size: tuple[int, int]) -> np.ndarray:
    """RGB uint8 [H, W, 3] at the target size (bicubic, as HF's processor and percept's 'cubic')."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        if im.size != size:
            im = im.resize(size, BICUBIC)
        return np.asarray(im, dtype=np.uint8)


_SHARED: dict = {}


def _load_chunk(job) -> int:
    start, paths, size = job
    out = _SHARED["array"]
    for i, p in enumerate(paths):
        out[start + i] = load_image(p, size)
    return len(paths)


def load_images(paths: list[str], size: tuple[int, int], workers: int) -> np.ndarray:
    """uint8 [n, H, W, 3]: decoded and resized by forked workers straight into a shared mapping."""
    import mmap

    tw, th = size
    n = len(paths)
    buf = mmap.mmap(-1, max(1, n * th * tw * 3))
    arr = np.frombuffer(buf, dtype=np.uint8, count=n * th * tw * 3).reshape(n, th, tw, 3)
    _SHARED["array"] = arr
    chunk = 128
    jobs = [(i, paths[i : i + chunk], size) for i in range(0, n, chunk)]
    with mp.get_context("fork").Pool(max(1, workers)) as pool:
        done = sum(pool.imap_unordered(_load_chunk, jobs))
    if done != n:
        raise RuntimeError(f"loaded {done} of {n} images")
    return arr


# ---------------------------------------------------------------------------------------------
# Data: scenes.jsonl files + the token file


def read_scenes(dirs: list[str]) -> list[dict]:
    rows = []
    for d in dirs:
        with open(os.path.join(d, "scenes.jsonl")) as f:
            for line in f:
                if line.strip():
                    o = json.loads(line)
                    o["path"] = os.path.join(d, o["image"])
                    rows.append(o)
    rows.sort(key=lambda o: o["seed"])
    return rows


def read_tokens(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    if doc.get("format") != "percept-demo-tokens/1":
        raise ValueError(f"{path}: not a percept-demo-tokens/1 file")
    doc["by_seed"] = {seed: k for seed, k in doc["items"]}
    return doc


def attach_targets(rows: list[dict], tok: dict) -> None:
    """Each scene's action token ids, checked against the action in scenes.jsonl."""
    for o in rows:
        k = tok["by_seed"].get(o["seed"])
        if k is None:
            raise KeyError(f"seed {o['seed']} has no tokens in the token file (run prompt-tokens.ts for its split)")
        if json.loads(tok["texts"][k]) != o["action"]:
            raise ValueError(f"seed {o['seed']}: token file action {tok['texts'][k]} != scenes.jsonl {o['action']}")
        o["k"] = k


# ---------------------------------------------------------------------------------------------
# Embedding tables regenerated from the seed (the compact checkpoint keeps only the rows the task uses)


def regen_tables(seed: int, vocab: int, hidden: int, ple_width: int, std: float = 0.02):
    """The initial token-embedding and per-layer-embedding tables: rows no training token touches keep
    exactly these values (their gradient is masked), so a checkpoint need not store them."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + 17)
    embed = torch.randn(vocab, hidden, generator=g, dtype=torch.float32) * std
    ple = torch.randn(vocab, ple_width, generator=g, dtype=torch.float32) * std
    return embed, ple


def build_model(cfg: dict, seed: int):
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    text, vision = dict(cfg["text"]), dict(cfg["vision"])
    for _ in range(8):  # a key this transformers version does not know is dropped (and logged), not fatal
        try:
            config = Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
            break
        except TypeError as err:
            m = re.search(r"unexpected keyword argument '(\w+)'", str(err))
            if not m or (m.group(1) not in text and m.group(1) not in vision):
                raise
            log("note", message=f"Gemma4Config does not take {m.group(1)}: dropped")
            text.pop(m.group(1), None)
            vision.pop(m.group(1), None)
    for c in (config, config.text_config, config.vision_config):
        try:
            c._attn_implementation = "sdpa"
        except Exception:  # noqa: BLE001 - older/newer config classes
            pass
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config)
    lm = model.model.language_model
    t = cfg["text"]
    embed, ple = regen_tables(seed, t["vocab_size"], t["hidden_size"], t["num_hidden_layers"] * t["hidden_size_per_layer_input"])
    with torch.no_grad():
        lm.embed_tokens.weight.copy_(embed)
        lm.embed_tokens_per_layer.weight.copy_(ple)
        pe = model.model.vision_tower.patch_embedder.position_embedding_table
        g = torch.Generator(device="cpu").manual_seed(seed + 7)
        pe.copy_(torch.randn(pe.shape, generator=g) * 0.02)
    return model, config


# ---------------------------------------------------------------------------------------------
# The forward pass as percept runs the model


def image_mask_rule(q: int, k: int, layer_type: str, img0: int, n_image: int, window: int, bidirectional: bool) -> bool:
    """May position q attend to k? As llama.cpp decodes percept's prompt (native/src/generate.cc
    decodeImage: the image rows in one ubatch with llama_set_causal_attn(false) when the model's rule,
    native/src/model.cc imageAttentionRule, is not 'causal'; gemma4's non-causal type is SWA-only):
    causal everywhere, sliding layers within their window; with `bidirectional`, sliding layers also let
    each image row see every image row."""
    image = img0 <= q < img0 + n_image and img0 <= k < img0 + n_image
    if layer_type == "full_attention":
        return k <= q
    return (k <= q and q - k < window) or (bidirectional and image)


class Runner:
    def __init__(self, model, tok: dict, n_image: int, cols: int, rows: int, device):
        import torch

        self.torch = torch
        self.model = model
        self.device = device
        self.lm = model.model.language_model
        self.vt = model.model.vision_tower
        self.ev = model.model.embed_vision
        tc = model.config.text_config
        self.L = tc.num_hidden_layers
        self.P = tc.hidden_size_per_layer_input
        self.softcap = tc.final_logit_softcapping
        self.layer_types = list(tc.layer_types)
        self.window = tc.sliding_window
        p = tok["prompt"]
        self.prompt = p["before"] + [p["imageStart"]] + [0] * n_image + [p["imageEnd"]] + p["after"]
        self.img0 = len(p["before"]) + 1  # first image row
        self.n_image = n_image
        self.a0 = len(self.prompt)  # first action position
        self.end = tok["endToken"]
        self.cols, self.rows = cols, rows
        pos = [(i % cols, i // cols) for i in range(cols * rows)]
        self.patch_pos = torch.tensor(pos, dtype=torch.long, device=device)
        self._masks: dict = {}
        self.image_token_id = model.config.image_token_id
        self.mask_mode = "custom"
        self.path = "model"
        self.image_attention = "bidirectional-swa"

    def weight(self):
        return self.lm.embed_tokens.weight

    def masks(self, S: int, B: int, bidirectional_image: bool = True) -> dict:
        """{layer type: bool [B, 1, S, S]} (True: may attend) by image_mask_rule."""
        bidirectional_image = bidirectional_image and self.image_attention == "bidirectional-swa"
        key = (S, bidirectional_image)
        if key not in self._masks:
            torch = self.torch
            q = torch.arange(S, device=self.device)[:, None]
            k = torch.arange(S, device=self.device)[None, :]
            causal = k <= q
            sliding = causal & (q - k < self.window)
            if bidirectional_image:
                a, b = self.img0, self.img0 + self.n_image
                sliding = sliding | ((q >= a) & (q < b) & (k >= a) & (k < b))
            self._masks[key] = (causal[None, None], sliding[None, None])
        causal, sliding = self._masks[key]
        m = {"full_attention": causal.expand(B, 1, S, S), "sliding_attention": sliding.expand(B, 1, S, S)}
        return {t: m[t] for t in set(self.layer_types)}

    def check_masks(self) -> dict:
        """masks() against image_mask_rule element by element, on a short and a full-length sequence."""
        for S in (self.img0 + self.n_image + 3, self.a0 + 70):
            for bidi in (False, True):
                got = self.masks(S, 1, bidi)
                for lt, m in got.items():
                    want = [[image_mask_rule(qq, kk, lt, self.img0, self.n_image, self.window, bidi and self.image_attention == "bidirectional-swa")
                             for kk in range(S)] for qq in range(S)]
                    if m[0, 0].cpu().tolist() != want:
                        raise RuntimeError(f"mask for {lt} (S={S}, bidirectional={bidi}) differs from image_mask_rule")
        return {"mask_rule": "ok", "window": self.window}

    def patches(self, imgs_u8):
        """uint8 [B, H, W, 3] → pixel_values [B, rows·cols, 768] (x/255, HWC inside a patch) and (col,row) ids."""
        B, H, W, _ = imgs_u8.shape
        x = imgs_u8.float().div_(255.0)
        x = x.view(B, H // PATCH, PATCH, W // PATCH, PATCH, 3).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(B, (H // PATCH) * (W // PATCH), PATCH * PATCH * 3)
        return x, self.patch_pos[None].expand(B, -1, -1)

    def hidden(self, ids, imgs_u8, bidirectional_image: bool = True):
        """ids [B, S] (image slots hold anything), frames uint8 [B, H, W, 3] → last hidden states [B, S, H].

        transformers' own Gemma4Model.forward does the merge (image_token_id placeholders replaced by
        get_image_features' soft tokens, unscaled; the per-layer embeddings of those rows from the pad
        id 0, as llama.cpp does); only the attention masks are given, as the {layer type: mask} dict
        the model takes instead of building its own (mask_mode 'hf' when the probe refused it)."""
        torch = self.torch
        B, S = ids.shape
        pv, pos = self.patches(imgs_u8)
        masks = self.masks(S, B, bidirectional_image) if self.mask_mode == "custom" else None
        if self.path == "model":
            hf_ids = ids.clone()
            hf_ids[:, self.img0 : self.img0 + self.n_image] = self.image_token_id
            kw = dict(input_ids=hf_ids, pixel_values=pv, image_position_ids=pos, use_cache=False)
            if masks is not None:
                kw["attention_mask"] = masks
            out = self.model.model(**kw)
        else:  # "manual": the same merge written out (the fallback where Gemma4Model.forward refused these inputs)
            pad_ids = ids.clone()
            pad_ids[:, self.img0 : self.img0 + self.n_image] = 0
            e = self.lm.embed_tokens(pad_ids)
            rows = self.image_rows(pv, pos, B).to(e.dtype)
            e = torch.cat([e[:, : self.img0], rows, e[:, self.img0 + self.n_image :]], dim=1)
            ple = self.lm.embed_tokens_per_layer(pad_ids).reshape(B, S, self.L, self.P)
            out = self.lm(
                inputs_embeds=e,
                per_layer_inputs=ple,
                attention_mask=masks,
                position_ids=torch.arange(S, device=self.device)[None].expand(B, -1),
                use_cache=False,
            )
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        if h.shape[:2] != (B, S):
            raise RuntimeError(f"hidden states {tuple(h.shape)} for {B}x{S} ids")
        return h

    def image_rows(self, pv, pos, B: int):
        """get_image_features' soft tokens as [B, N, H], whether it gives a tensor or one per image."""
        torch = self.torch
        out = self.model.model.get_image_features(pv, pos)
        h = out if torch.is_tensor(out) else getattr(out, "pooler_output", None)
        if h is None:
            h = self.ev(inputs_embeds=out.last_hidden_state)
        if not torch.is_tensor(h):
            h = torch.cat([t.reshape(-1, t.shape[-1]) for t in h if torch.is_tensor(t) and t.is_floating_point()])
        return h.reshape(B, self.n_image, -1)

    def probe(self, imgs_u8) -> dict:
        """Checks that a mask dict is taken as meant: causal masks given here must reproduce the model's
        own (causal) masks, and the bidirectional image must change the result. Otherwise falls back to
        the model's own masks (mask_mode 'hf') so that a run still trains."""
        torch = self.torch
        r: dict = {}
        # TF32 off while comparing: with it, two correct fp32 paths differed by 1.4 % of the largest value
        # (a 2026-12-04 run), enough to look like a mask that was not applied.
        tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            return self._probe(imgs_u8, r)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32

    def _probe(self, imgs_u8, r: dict) -> dict:
        torch = self.torch
        r.update(self.check_masks())
        with torch.no_grad():
            B = imgs_u8.shape[0]
            ids = torch.tensor(self.prompt, device=self.device)[None].repeat(B, 1)
            self.mask_mode = "hf"
            try:
                ref = self.hidden(ids, imgs_u8).float()
            except Exception as err:  # noqa: BLE001 - try the written-out merge
                r["model_path_error"] = f"{type(err).__name__}: {err}"
                self.path = "manual"
                ref = self.hidden(ids, imgs_u8).float()
            r["path"] = self.path
            if self.path == "model":  # diagnostic: the written-out merge against transformers' own
                try:
                    self.path = "manual"
                    r["manual_vs_model"] = float((self.hidden(ids, imgs_u8).float() - ref).abs().max())
                except Exception as err:  # noqa: BLE001
                    r["manual_error"] = f"{type(err).__name__}: {err}"
                finally:
                    self.path = "model"
            r["ref_absmax"] = float(ref.abs().max())
            try:
                self.mask_mode = "custom"
                causal = self.hidden(ids, imgs_u8, bidirectional_image=False).float()
                chosen, self.image_attention = self.image_attention, "bidirectional-swa"
                try:
                    bidi = self.hidden(ids, imgs_u8, bidirectional_image=True).float()
                finally:
                    self.image_attention = chosen
                r["custom_causal_vs_hf"] = float((causal - ref).abs().max())
                r["bidirectional_vs_causal"] = float((bidi - causal).abs().max())
                r["bidirectional_vs_causal_before_image"] = float((bidi - causal)[:, : self.img0].abs().max())
                # A mask taken the wrong way round (or ignored) changes the result by as much as the
                # bidirectional image does (about 100 % of the largest value); numerics by far less.
                tol = 1e-2 * max(1.0, r["ref_absmax"])
                if not (r["custom_causal_vs_hf"] <= tol and r["bidirectional_vs_causal"] > tol
                        and r["bidirectional_vs_causal_before_image"] <= tol):
                    raise RuntimeError("the mask dict is not applied as meant")
            except Exception as err:  # noqa: BLE001 - fall back, and say so
                r["error"] = f"{type(err).__name__}: {err}"
                self.mask_mode = "hf"
        r["mask_mode"] = self.mask_mode
        return r

    def trained_attention(self) -> str:
        """What the image rows saw in training: percept/llama.cpp must decode them the same way."""
        if self.mask_mode == "custom" and self.image_attention == "bidirectional-swa":
            return "bidirectional-swa: sliding layers see the image rows bidirectionally, full layers causally"
        return "causal: every layer causal (percept: an image segment with causal: true)"

    def logits(self, h):
        """Tied output head (bf16 matmul under autocast), then the final softcap in fp32."""
        z = (h @ self.weight().t()).float()
        if self.softcap:
            z = self.torch.tanh(z / self.softcap) * self.softcap
        return z


def token_weights(tok: dict, bbox_weight: float, action_weight: float = 1.0) -> list[list[float]]:
    """Per action token: `bbox_weight` for the tokens that spell the bbox numbers, `action_weight` for
    those that spell the action's name (the decision), 1 elsewhere."""
    out = []
    for text, ids in zip(tok["texts"], tok["tokens"]):
        spans = []
        for key, weight, end in (('"bbox":[', bbox_weight, "]"), ('"action":"', action_weight, '"')):
            a = text.find(key)
            if a >= 0:
                spans.append((a + len(key), text.find(end, a + len(key)), weight))
        w, pos = [], 0
        for t in ids:
            w.append(next((x for lo, hi, x in spans if lo <= pos < hi), 1.0))
            pos += len(tok["pieces"].get(str(t), ""))
        out.append(w)
    return out


def batch_tensors(runner: Runner, targets: list[list[int]], device):
    """Teacher forcing: input = prompt + action[:-1]; the row before each action token predicts it."""
    import torch

    n = max(len(t) for t in targets)
    S = runner.a0 + n - 1
    ids = torch.zeros(len(targets), S, dtype=torch.long)
    ids[:, : runner.a0] = torch.tensor(runner.prompt)
    bi, pi, tg = [], [], []
    for b, t in enumerate(targets):
        if len(t) > 1:
            ids[b, runner.a0 : runner.a0 + len(t) - 1] = torch.tensor(t[:-1])
        for j, tok in enumerate(t):
            bi.append(b)
            pi.append(runner.a0 - 1 + j)
            tg.append(tok)
    as_t = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
    return ids.to(device), as_t(bi), as_t(pi), as_t(tg)


# ---------------------------------------------------------------------------------------------
# Evaluation


def iou(a, b) -> float:
    try:
        ax0, ay0, ax1, ay1 = (float(v) for v in a)
        bx0, by0, bx1, by1 = (float(v) for v in b)
    except Exception:  # noqa: BLE001 - a malformed prediction scores 0
        return 0.0
    iw = max(0.0, min(ax1, bx1) - max(ax0, bx0))
    ih = max(0.0, min(ay1, by1) - max(ay0, by0))
    inter = iw * ih
    union = max(0.0, ax1 - ax0) * max(0.0, ay1 - ay0) + max(0.0, bx1 - bx0) * max(0.0, by1 - by0) - inter
    return inter / union if union > 0 else 0.0


def without_bbox(a):
    if not isinstance(a, dict):
        return a
    a = dict(a)
    if isinstance(a.get("target"), dict):
        a["target"] = {k: v for k, v in a["target"].items() if k != "bbox"}
    return a


def score(pred_ids: list[int], gold_ids: list[int], pieces: dict, end: int, gold: dict) -> dict:
    out_ids = pred_ids[: pred_ids.index(end)] if end in pred_ids else pred_ids
    text = "".join(pieces.get(str(t), f"<{t}>") for t in out_ids)
    try:
        pred = json.loads(text)
    except Exception:  # noqa: BLE001
        pred = None
    gt = gold.get("target") or {}
    pt = (pred or {}).get("target") if isinstance(pred, dict) else None
    pt = pt if isinstance(pt, dict) else {}
    r = {
        "tokens_exact": float(pred_ids[: len(gold_ids)] == gold_ids),
        "json_valid": float(isinstance(pred, dict)),
        "exact": float(pred == gold),
        "exact_but_bbox": float(without_bbox(pred) == without_bbox(gold)),
        "action": float(isinstance(pred, dict) and pred.get("action") == gold.get("action")),
        "label": float(pt.get("label") == gt.get("label")),
        "hazards": float(isinstance(pred, dict) and sorted(pred.get("hazards", [])) == sorted(gold.get("hazards", []))),
        "heading": float(isinstance(pred, dict) and pred.get("heading_deg") == gold.get("heading_deg")),
    }
    if "bbox" in gt:
        r["bbox_iou"] = iou(pt.get("bbox"), gt["bbox"])
    return r, text


def summarize(scores: list[dict]) -> dict:
    s = {}
    for k in ("tokens_exact", "json_valid", "exact", "exact_but_bbox", "action", "label", "hazards", "heading"):
        s[k] = round(sum(r[k] for r in scores) / max(1, len(scores)), 4)
    ious = [r["bbox_iou"] for r in scores if "bbox_iou" in r]
    s["bbox_n"] = len(ious)
    s["bbox_iou_mean"] = round(sum(ious) / max(1, len(ious)), 4)
    s["bbox_iou_ge_0.5"] = round(sum(v >= 0.5 for v in ious) / max(1, len(ious)), 4)
    s["bbox_iou_ge_0.7"] = round(sum(v >= 0.7 for v in ious) / max(1, len(ious)), 4)
    s["n"] = len(scores)
    return s


def greedy(runner: Runner, imgs_u8, max_new: int) -> list[list[int]]:
    """Unconstrained greedy decoding (stricter than percept's grammar-constrained decoder). Every step runs
    prompt + max_new positions (pad ids after the last token, which causal attention keeps out): stepping at
    the growing length, fp32 transformers once picked a token its own teacher-forced pass did not."""
    torch = runner.torch
    B = imgs_u8.shape[0]
    ids = torch.tensor(runner.prompt, dtype=torch.long, device=runner.device)[None].repeat(B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=runner.device)
    out = []
    for _ in range(max_new):
        n = ids.shape[1]
        pad = torch.zeros(B, runner.a0 + max_new - n, dtype=torch.long, device=runner.device)
        h = runner.hidden(torch.cat([ids, pad], dim=1), imgs_u8)[:, n - 1]
        nxt = runner.logits(h).argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, runner.end), nxt)
        out.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        done |= nxt == runner.end
        if bool(done.all()):
            break
    return torch.stack(out, 1).tolist()


def evaluate(runner, images, rows, tok, idx, batch, greedy_n, max_new, all_preds=False):
    """Teacher-forced val loss / token accuracy on idx, greedy scores on its first greedy_n (with
    all_preds, every greedy output as "predictions")."""
    torch = runner.torch
    F = torch.nn.functional
    tot_loss, tot_n, tot_ok, picked_ok, picked_n = 0.0, 0, 0, 0, 0
    with torch.no_grad(), torch.autocast(runner.device.type, dtype=torch.bfloat16):
        for s in range(0, len(idx), batch):
            sel = idx[s : s + batch]
            targets = [tok["tokens"][rows[i]["k"]] for i in sel]
            ids, bi, pi, tg = batch_tensors(runner, targets, runner.device)
            h = runner.hidden(ids, images[torch.tensor(sel, device=runner.device)])
            z = runner.logits(h[bi, pi])
            tot_loss += float(F.cross_entropy(z, tg, reduction="sum"))
            ok = z.argmax(-1) == tg
            tot_ok += int(ok.sum())
            tot_n += len(tg)
            forced = "".join(tok["forced"][rows[i]["k"]] for i in sel)
            m = torch.tensor([c == "0" for c in forced], device=runner.device)
            picked_ok += int((ok & m).sum())
            picked_n += int(m.sum())
        scores, samples, predictions = [], [], []
        g = idx[:greedy_n]
        for s in range(0, len(g), batch):
            sel = g[s : s + batch]
            preds = greedy(runner, images[torch.tensor(sel, device=runner.device)], max_new)
            for i, p in zip(sel, preds):
                r, text = score(p, tok["tokens"][rows[i]["k"]], tok["pieces"], tok["endToken"], rows[i]["action"])
                scores.append(r)
                if all_preds:
                    predictions.append({"seed": rows[i]["seed"], "pred": text, "gold": tok["texts"][rows[i]["k"]], **{k: r[k] for k in ("exact", "action", "label")}, "bbox_iou": r.get("bbox_iou")})
                if len(samples) < 3 or (r["exact_but_bbox"] < 1 and len(samples) < 8):
                    samples.append({"seed": rows[i]["seed"], "gold": tok["texts"][rows[i]["k"]], "pred": text})
    return {
        "val_loss": round(tot_loss / max(1, tot_n), 5),
        "val_token_acc": round(tot_ok / max(1, tot_n), 5),
        "val_picked_token_acc": round(picked_ok / max(1, picked_n), 5),
        "greedy": summarize(scores),
        "samples": samples,
        **({"predictions": predictions} if all_preds else {}),
    }


# ---------------------------------------------------------------------------------------------
# Checkpoint


TABLES = ("model.language_model.embed_tokens.weight", "model.language_model.embed_tokens_per_layer.weight")


def save_checkpoint(model, cfg: dict, meta: dict, used_ids: list[int], out_dir: str, shard_bytes: int, dtype: str = "float16") -> dict:
    """Compact: every tensor except the two vocabulary tables (in `dtype`, sharded), plus the tables' rows
    (fp32) for the ids the task uses; the other rows are regen_tables(seed) exactly (their gradient was masked)."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    if "lm_head.weight" in sd and torch.equal(sd["lm_head.weight"], sd[TABLES[0]]):
        del sd["lm_head.weight"]  # tied
    ids = torch.tensor(sorted(set(used_ids)), dtype=torch.long)
    rows = {"ids": ids, "embed_rows": sd.pop(TABLES[0])[ids].contiguous(), "ple_rows": sd.pop(TABLES[1])[ids].contiguous()}
    save_file(rows, os.path.join(out_dir, "table-rows.safetensors"))
    sd = {k: v.to(getattr(torch, dtype)) for k, v in sd.items()}
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        n = sd[k].numel() * sd[k].element_size()
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = sd[k]
        size += n
    if cur:
        shards.append(cur)
    files = []
    for i, sh in enumerate(shards):
        name = f"weights-{i + 1}-of-{len(shards)}.safetensors"
        save_file(sh, os.path.join(out_dir, name))
        files.append(name)
    info = {
        **meta,
        "model_config": cfg,
        "hf_config": model.config.to_dict(),
        "weight_files": files,
        "weights_dtype": dtype,
        "table_rows_file": "table-rows.safetensors",
        "tables": list(TABLES),
        "table_regen": "regen_tables(table_seed, 262144, 256, 64): torch CPU Generator seeded table_seed*1000003+17, randn(vocab,256)*0.02 then randn(vocab,64)*0.02",
    }
    with open(os.path.join(out_dir, "checkpoint.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)
    return {"files": files + ["table-rows.safetensors", "checkpoint.json"], "bytes": sum(os.path.getsize(os.path.join(out_dir, x)) for x in files + ["table-rows.safetensors"])}


def reassemble(ckpt_dir: str, out: str | None):
    """Full HF state dict (safetensors at `out`, or returned) from a compact checkpoint: what an exporter reads."""
    import torch
    from safetensors.torch import load_file, save_file

    with open(os.path.join(ckpt_dir, "checkpoint.json")) as f:
        info = json.load(f)
    t = info["model_config"]["text"]
    embed, ple = regen_tables(info.get("table_seed", info["seed"]), t["vocab_size"], t["hidden_size"], t["num_hidden_layers"] * t["hidden_size_per_layer_input"])
    rows = load_file(os.path.join(ckpt_dir, info["table_rows_file"]))
    embed[rows["ids"]] = rows["embed_rows"]
    ple[rows["ids"]] = rows["ple_rows"]
    sd = {TABLES[0]: embed, TABLES[1]: ple}
    for name in info["weight_files"]:
        sd.update({k: v.float() for k, v in load_file(os.path.join(ckpt_dir, name)).items()})
    if out is None:
        return sd
    save_file(sd, out)
    print(f"wrote {out}: {len(sd)} tensors, {sum(v.numel() for v in sd.values())} values")
    return sd


def verify_reassembly(model, ckpt_dir: str) -> dict:
    """The reassembled compact checkpoint against the live model rounded as stored, tensor by tensor (0 = exact)."""
    import torch

    sd = reassemble(ckpt_dir, None)
    with open(os.path.join(ckpt_dir, "checkpoint.json")) as f:
        dt = getattr(torch, json.load(f).get("weights_dtype", "float32"))
    live = {k: v.detach().cpu().to(dt).float() if k not in TABLES else v.detach().float().cpu() for k, v in model.state_dict().items()}
    live.pop("lm_head.weight", None)
    missing = sorted(set(live) - set(sd))
    extra = sorted(set(sd) - set(live))
    worst = max((float((sd[k] - live[k]).abs().max()) for k in live if k in sd), default=0.0)
    return {"tensors": len(sd), "missing": missing[:5], "extra": extra[:5], "max_abs_diff": worst}


# ---------------------------------------------------------------------------------------------
# Training


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", help="prompt-tokens.ts output (.json or .json.gz)")
    ap.add_argument("--train", nargs="+", default=[], help="make-scenes dataset folders (train split)")
    ap.add_argument("--val", nargs="+", default=[], help="make-scenes dataset folders (val split)")
    ap.add_argument("--eval", action="append", default=[], metavar="NAME=DIR",
                    help="a further set scored greedily at the end (every frame; predictions in eval.json)")
    ap.add_argument("--out", required=True, help="output folder (or file with --reassemble)")
    ap.add_argument("--reassemble", help="compact checkpoint folder → full safetensors at --out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--image-tokens", type=int, default=70, help="Gemma 4 token budget (70 → 66 rows for 16:9 frames)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (reproducible schedule); 0: --time-budget")
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds of training (schedule follows elapsed time)")
    ap.add_argument("--max-epochs", type=int, default=1000)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--val-greedy", type=int, default=250, help="val frames decoded greedily after each epoch")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--max-train", type=int, default=0, help="use only the first N training frames (smoke tests)")
    ap.add_argument("--max-val", type=int, default=0)
    ap.add_argument("--shard-mib", type=float, default=15.0)
    ap.add_argument("--ckpt-dtype", choices=["float16", "bfloat16", "float32"], default="float16",
                    help="checkpoint weights (not the table rows, kept fp32)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--image-attention", choices=["bidirectional-swa", "causal"], default="bidirectional-swa",
                    help="how the image rows are attended: percept/llama.cpp's rule for this width, or causal")
    ap.add_argument("--init-from", help="start from a compact checkpoint folder (continue a run in another call)")
    ap.add_argument("--path", choices=["model", "manual"], help="force the forward path (default: Gemma4Model.forward, else manual)")
    ap.add_argument("--save-every-epoch", action="store_true")
    ap.add_argument("--bbox-weight", type=float, default=1.0, help="loss weight of the bbox number tokens (1: plain mean)")
    ap.add_argument("--action-weight", type=float, default=1.0, help="loss weight of the tokens that spell the action's name")
    args = ap.parse_args()

    if args.reassemble:
        reassemble(args.reassemble, args.out)
        return

    import torch
    import transformers

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    tok = read_tokens(args.tokens)
    train_rows = read_scenes(args.train)
    val_rows = read_scenes(args.val)
    if args.max_train:
        train_rows = train_rows[: args.max_train]
    if args.max_val:
        val_rows = val_rows[: args.max_val]
    eval_rows = {}
    for spec in args.eval:
        name, _, d = spec.partition("=")
        eval_rows[name] = read_scenes([d])
    attach_targets(train_rows, tok)
    attach_targets(val_rows, tok)
    for rows_ in eval_rows.values():
        attach_targets(rows_, tok)
    sizes = {(o["width"], o["height"]) for rows_ in (train_rows, val_rows, *eval_rows.values()) for o in rows_}
    targets = {gemma4_target_size(w, h, args.image_tokens) for w, h in sizes}
    if len(targets) != 1:
        raise ValueError(f"frames of several aspect ratios ({sizes}) give several grids {targets}; use one")
    tw, th = targets.pop()
    cols, nrows = tw // PATCH, th // PATCH
    n_image = (cols // POOL) * (nrows // POOL)
    log(
        "data",
        train=len(train_rows),
        val=len(val_rows),
        eval={k: len(v) for k, v in eval_rows.items()},
        frame_sizes=sorted(sizes),
        target=[tw, th],
        patches=cols * nrows,
        image_rows=n_image,
        budget=args.image_tokens,
        prompt_before=len(tok["prompt"]["before"]),
        prompt_after=len(tok["prompt"]["after"]),
        action_tokens=tok["actionTokens"],
        model_file=tok["model"],
        torch=torch.__version__,
        transformers=transformers.__version__,
    )

    # Images first (forked workers), then CUDA.
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    images = {}
    for name, rows_ in (("train", train_rows), ("val", val_rows), *eval_rows.items()):
        t = time.time()
        host = load_images([o["path"] for o in rows_], (tw, th), args.workers)
        images[name] = host
        log("images", split=name, n=len(rows_), seconds=round(time.time() - t, 1), mib=round(host.nbytes / 2**20))
    images = {k: torch.from_numpy(v).to(device) for k, v in images.items()}

    cfg = model_config(args.image_tokens)
    model, config = build_model(cfg, args.seed)
    model.to(device)
    model.train()
    runner = Runner(model, tok, n_image, cols, nrows, device)
    if model.get_output_embeddings().weight.data_ptr() != runner.weight().data_ptr():
        model.get_output_embeddings().weight = runner.weight()  # tied, as Gemma 4 (and llama.cpp's missing output.weight)
        log("note", message="lm_head was not tied to embed_tokens: tied here")
    n_params = sum(p.numel() for p in model.parameters())
    t = cfg["text"]
    table = t["vocab_size"] * (t["hidden_size"] + t["num_hidden_layers"] * t["hidden_size_per_layer_input"])
    vision = sum(p.numel() for n, p in model.named_parameters() if "vision" in n)
    log(
        "model",
        params=n_params,
        vocab_tables=table,
        vision_params=vision,
        text_params_without_tables=n_params - table - vision,
        attn=getattr(config, "_attn_implementation", None),
        layer_types=list(config.text_config.layer_types),
    )

    # Rows of the vocabulary tables the task touches: only these are trained (see regen_tables).
    used = set(runner.prompt) | {tok["endToken"], tok["special"]["eos"], tok["special"]["bos"], 0}
    for seq in tok["tokens"]:
        used.update(seq)
    used_ids = sorted(used)
    row_mask = torch.zeros(t["vocab_size"], 1, device=device)
    row_mask[torch.tensor(used_ids, device=device)] = 1.0
    log("vocab", used_ids=len(used_ids))

    runner.image_attention = args.image_attention
    args.table_seed, args.init_steps = args.seed, 0
    if args.init_from:
        with open(os.path.join(args.init_from, "checkpoint.json")) as f:
            init = json.load(f)
        args.table_seed = init.get("table_seed", args.seed)
        args.init_steps = init.get("init_steps", 0) + init.get("steps", 0)
        sd = reassemble(args.init_from, None)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        log("init_from", path=args.init_from, missing=[k for k in missing if k != "lm_head.weight"][:5], unexpected=list(unexpected)[:5])
    if args.path:
        runner.path = args.path
    log("probe", **runner.probe(images["val"][:4]))

    tables = [runner.weight(), runner.lm.embed_tokens_per_layer.weight]
    table_ids = {id(p) for p in tables}
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if id(p) in table_ids:
            continue
        (decay if p.ndim >= 2 and "position_embedding" not in n else no_decay).append(p)
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
            {"params": tables, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        **({"fused": True} if device.type == "cuda" else {}),
    )
    F = torch.nn.functional
    n_train = len(train_rows)
    steps_per_epoch = max(1, n_train // args.batch)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    val_idx = list(range(len(val_rows)))
    max_new = tok["actionTokens"]["max"] + 4

    weighted = args.bbox_weight != 1.0 or args.action_weight != 1.0
    token_w = token_weights(tok, args.bbox_weight, args.action_weight) if weighted else None
    if token_w is not None:
        log("note", message=f"bbox number tokens weighted {args.bbox_weight}, action name tokens {args.action_weight}",
            weighted_share=round(sum(x != 1.0 for w in token_w for x in w) / max(1, sum(map(len, token_w))), 4))

    def lr_at(step: int, frac: float) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    step, epoch = 0, 0
    t_train = time.time()
    eval_seconds = 0.0
    history = []
    run_loss, run_acc, run_n = 0.0, 0.0, 0
    stop = False
    last_eval = None
    while not stop and epoch < args.max_epochs:
        perm = torch.randperm(n_train, generator=gen).tolist()
        for s in range(steps_per_epoch):
            elapsed = time.time() - t_train
            frac = step / args.steps if args.steps else elapsed / args.time_budget
            if (args.steps and step >= args.steps) or (not args.steps and elapsed >= args.time_budget):
                stop = True
                break
            lr = lr_at(step, frac)
            for gp in opt.param_groups:
                gp["lr"] = lr
            sel = perm[s * args.batch : (s + 1) * args.batch]
            targets = [tok["tokens"][train_rows[i]["k"]] for i in sel]
            ids, bi, pi, tg = batch_tensors(runner, targets, device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                h = runner.hidden(ids, images["train"][torch.tensor(sel, device=device)])
                z = runner.logits(h[bi, pi])
                if token_w is None:
                    loss = F.cross_entropy(z, tg)
                else:
                    w = torch.tensor([x for i in sel for x in token_w[train_rows[i]["k"]]], device=device)
                    loss = (F.cross_entropy(z.float(), tg, reduction="none") * w).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for p in tables:
                if p.grad is not None:
                    p.grad.mul_(row_mask.to(p.grad.dtype))
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            run_loss += float(loss)
            run_acc += float((z.argmax(-1) == tg).float().mean())
            run_n += 1
            if step % args.log_every == 0 or step == 1:
                log(
                    "train",
                    step=step,
                    epoch=round(epoch + (s + 1) / steps_per_epoch, 3),
                    loss=round(run_loss / run_n, 5),
                    token_acc=round(run_acc / run_n, 4),
                    lr=round(lr, 7),
                    grad_norm=round(float(gnorm), 3),
                    steps_per_s=round(step / max(1e-9, time.time() - t_train - eval_seconds), 2),
                )
                run_loss, run_acc, run_n = 0.0, 0.0, 0
        else:
            epoch += 1
            te = time.time()
            model.eval()
            try:
                ev = evaluate(runner, images["val"], val_rows, tok, val_idx, 250, min(args.val_greedy, len(val_idx)), max_new)
                last_eval = {"epoch": epoch, "step": step, **ev}
                history.append({k: v for k, v in last_eval.items() if k != "samples"})
                log("eval", **last_eval, seconds=round(time.time() - te, 1))
            except Exception as err:  # noqa: BLE001 - an evaluation bug must not end the run
                log("error", where="eval", error=f"{type(err).__name__}: {err}")
            if args.save_every_epoch:
                try:
                    save_checkpoint(model, cfg, ckpt_meta(args, tok, runner, step, epoch, tw, th), used_ids, os.path.join(args.out, "ckpt"), int(args.shard_mib * 2**20), args.ckpt_dtype)
                except Exception as err:  # noqa: BLE001
                    log("error", where="save", error=f"{type(err).__name__}: {err}")
            model.train()
            eval_seconds += time.time() - te
            continue
        break

    train_seconds = time.time() - t_train
    model.eval()
    te = time.time()
    final: dict = {}
    try:
        final = evaluate(runner, images["val"], val_rows, tok, val_idx, 250, len(val_idx), max_new, all_preds=True)
    except Exception as err:  # noqa: BLE001 - still save what was trained
        log("error", where="final eval", error=f"{type(err).__name__}: {err}")
    results = {"val": final}
    for name, rows_ in eval_rows.items():
        try:
            results[name] = evaluate(runner, images[name], rows_, tok, list(range(len(rows_))), 250, len(rows_), max_new, all_preds=True)
            log("final_eval", set=name, **{k: v for k, v in results[name].items() if k not in ("samples", "predictions")})
        except Exception as err:  # noqa: BLE001
            log("error", where=f"eval {name}", error=f"{type(err).__name__}: {err}")
    final = {k: v for k, v in final.items() if k != "predictions"}
    log(
        "final",
        epoch_frac=round(step / steps_per_epoch, 3),
        step=step,
        train_seconds=round(train_seconds, 1),
        **final,
        seconds=round(time.time() - te, 1),
        max_gpu_mib=round(torch.cuda.max_memory_allocated() / 2**20) if device.type == "cuda" else None,
    )
    saved: dict = {}
    try:
        ckpt = os.path.join(args.out, "ckpt")
        saved = save_checkpoint(model, cfg, ckpt_meta(args, tok, runner, step, step / steps_per_epoch, tw, th), used_ids, ckpt, int(args.shard_mib * 2**20), args.ckpt_dtype)
        log("saved", **saved)
    except Exception as err:  # noqa: BLE001
        log("error", where="save", error=f"{type(err).__name__}: {err}")
    summary = {
        "final": final,
        "history": history,
        "steps": step,
        "epochs": step / steps_per_epoch,
        "train_seconds": train_seconds,
        "params": n_params,
        "checkpoint": saved,
        "mask_mode": runner.mask_mode,
        "path": runner.path,
        "image_attention": runner.trained_attention(),
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump({"step": step, "image_attention": runner.trained_attention(), "sets": results}, f, indent=1)
    try:
        log("reassembly", **verify_reassembly(model, os.path.join(args.out, "ckpt")))
    except Exception as err:  # noqa: BLE001
        log("error", where="reassembly", error=f"{type(err).__name__}: {err}")


def ckpt_meta(args, tok, runner, step, epoch, tw, th) -> dict:
    return {
        "format": "percept-demo-ckpt/1",
        "seed": args.seed,
        "table_seed": args.table_seed,
        "steps": step,
        "epochs": epoch,
        "init_from": args.init_from,
        "init_steps": args.init_steps,
        "image_tokens_budget": args.image_tokens,
        "image_size": [tw, th],
        "image_rows": runner.n_image,
        "patch_grid": [runner.cols, runner.rows],
        "prompt_tokens": runner.prompt,
        "image_first_row": runner.img0,
        "end_token": tok["endToken"],
        "tokens_file_model": tok["model"],
        "schema_sha256": tok["schemaSha256"],
        "image_attention": runner.trained_attention(),
    }


if __name__ == "__main__":
    main()
