"""Records the fixture percept's demo model is checked against (test/e2e/demo-model.test.ts).

PyTorch (transformers' Gemma4ForConditionalGeneration, fp32, TF32 off) runs the weights percept runs:
the shipped weights file dequantized (Q8_0 / Q6_K blocks as llama.cpp reads them) and the vocabulary
tables regenerated from their seed. It reads percept's own pixels (parity-frames.ts PNGs), so the
comparison starts from identical inputs. Per frame it writes: the pixels' sha256, the encoder's soft
tokens (first values of some rows), the unconstrained greedy action text, and the top logits at every
action step (teacher-forced on that text). A .gz weights file (the shipped one) is decompressed to a temp
file first; the weights sha256 it records is of the decompressed GGUF content.

    python3 tools/demo-model/record-parity.py --weights models/demo/gemma4-robot.weights.gguf.gz \
        --frames DIR --tokens tokens.json.gz --gguf-py build/llama.cpp/gguf-py --out parity.json
"""

import argparse
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import zlib

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402 - the trainer's model, runner and greedy decoding

ENCODER_ROWS = (0, 1, 33, 65)  # soft-token rows whose first values are recorded
ENCODER_VALUES = 8
TOP = 8


def open_weights(path: str):
    """The weights file's GGUF content as a binary stream: decompressed when the path ends in .gz."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def copy_weights(path: str, dst) -> None:
    """Copies the GGUF content into dst; a damaged .gz is an error naming the file."""
    try:
        with open_weights(path) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"demo weights {path}: cannot be decompressed ({e}); the file is damaged") from e


def weights_sha256(path: str) -> str:
    """The weights hash: sha256 of the GGUF content (decompressed), as percept's demoWeightsSha256."""
    h = hashlib.sha256()

    class Sink:
        def write(self, b):
            h.update(b)

    copy_weights(path, Sink())
    return h.hexdigest()


def read_weights(path: str, gguf_py: str):
    """The weights file: its info KV and every tensor as float32 (or int32 ids), in PyTorch's shape order."""
    if path.endswith(".gz"):
        # gguf-py reads by file offset (a memmap): decompress to a temp file. The arrays below are copies.
        with tempfile.TemporaryDirectory() as tmp:
            plain = os.path.join(tmp, os.path.basename(path)[: -len(".gz")])
            with open(plain, "wb") as dst:
                copy_weights(path, dst)
            return read_weights(plain, gguf_py)
    sys.path.insert(0, gguf_py)
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    f = r.fields["percept.demo.model"]
    info = json.loads(bytes(f.parts[f.data[0]]).decode("utf-8"))
    out = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            out[t.name] = np.array(t.data, dtype=np.int32).reshape(shape)
        else:
            out[t.name] = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    return info, out


def load_model(info: dict, tensors: dict, device):
    import torch

    cfg = train.model_config(info["imageTokens"])
    if cfg["text"]["hidden_size"] != info["text"]["hidden"] or cfg["text"]["num_hidden_layers"] != info["text"]["layers"]:
        raise ValueError("the weights file's text shape is not train.model_config's")
    model, _ = train.build_model(cfg, info["tables"]["seed"])
    sd = model.state_dict()
    done = set()
    with torch.no_grad():
        for name, v in tensors.items():
            if name.startswith("tables."):
                continue
            key = "model." + name
            if key not in sd:
                raise KeyError(f"{name}: no such parameter in the transformers model")
            if tuple(sd[key].shape) != v.shape:
                raise ValueError(f"{name}: shape {v.shape} in the file, {tuple(sd[key].shape)} in the model")
            sd[key].copy_(torch.from_numpy(v))
            done.add(key)
        ids = torch.from_numpy(tensors["tables.ids"].astype(np.int64))
        lm = model.model.language_model
        lm.embed_tokens.weight[ids] = torch.from_numpy(tensors["tables.embed_tokens.rows"])
        lm.embed_tokens_per_layer.weight[ids] = torch.from_numpy(tensors["tables.embed_tokens_per_layer.rows"])
    tables = {p.data_ptr() for p in (lm.embed_tokens.weight, lm.embed_tokens_per_layer.weight)}
    missing = [k for k, p in sd.items() if k not in done and p.data_ptr() not in tables]
    if missing:
        raise KeyError(f"not in the weights file: {missing}")
    return model.float().to(device).eval()


def cut(ids: list, end: int) -> list:
    """ids up to and including the first end token."""
    return ids[: ids.index(end) + 1] if end in ids else ids


def patch_digest(img: np.ndarray) -> str:
    """sha256 of the patches' bytes (HWC inside a 16×16 patch, patches row-major): parity-frames.ts' pixelDigest."""
    H, W, _ = img.shape
    p = train.PATCH
    x = img.reshape(H // p, p, W // p, p, 3).transpose(0, 2, 1, 3, 4)
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--frames", required=True, help="parity-frames.ts output folder")
    ap.add_argument("--tokens", required=True, help="prompt-tokens.ts output (prompt ids and token pieces)")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder (the bundled tree's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = torch.device(args.device)
    t0 = time.time()
    info, tensors = read_weights(args.weights, args.gguf_py)
    model = load_model(info, tensors, device)
    tok = train.read_tokens(args.tokens)
    with open(os.path.join(args.frames, "frames.json")) as f:
        frames = json.load(f)["frames"]
    W, H = frames[0]["width"], frames[0]["height"]
    cols, rows = W // train.PATCH, H // train.PATCH
    n_image = frames[0]["imageTokens"]
    runner = train.Runner(model, tok, n_image, cols, rows, device)
    runner.image_attention = info["provenance"]["imageAttention"].split(":")[0]
    imgs = [np.asarray(Image.open(os.path.join(args.frames, fr["image"])).convert("RGB")) for fr in frames]
    probe = runner.probe(torch.from_numpy(np.stack(imgs[:2])).to(device))
    if runner.mask_mode != "custom":
        raise RuntimeError(f"the model refused the image attention masks: {probe}")
    max_new = tok["actionTokens"]["max"] + 4
    records = []
    inconsistent = []  # frames whose greedy text is not its own teacher-forced argmax
    with torch.no_grad():
        for fr, img in zip(frames, imgs):
            digest = patch_digest(img)
            if digest != fr["sha256"]:
                raise ValueError(f"{fr['image']}: pixels {digest} are not the ones percept recorded ({fr['sha256']})")
            x = torch.from_numpy(img[None]).to(device)
            pv, pos = runner.patches(x)
            enc = runner.image_rows(pv, pos, 1)[0].float()
            ids = cut(train.greedy(runner, x, max_new)[0], runner.end)
            text = "".join(tok["pieces"].get(str(t), f"<{t}>") for t in ids if t != runner.end)
            seq = torch.tensor(runner.prompt + ids[:-1], device=device)[None]
            h = runner.hidden(seq, x)[0, runner.a0 - 1 : runner.a0 - 1 + len(ids)]
            z = runner.logits(h)
            top = torch.topk(z, TOP, dim=-1)
            # The greedy text must be its own teacher-forced argmax at every step.
            steps = [j for j in range(len(ids)) if int(top.indices[j, 0]) != ids[j]]
            if steps:
                inconsistent.append({"frame": fr["index"], "steps": steps})
            records.append(
                {
                    "index": fr["index"],
                    "sha256": digest,
                    "encoder": {
                        "rows": n_image,
                        "width": int(enc.shape[1]),
                        "first": {str(r): [round(float(v), 6) for v in enc[r, :ENCODER_VALUES]] for r in ENCODER_ROWS},
                        "absMean": round(float(enc.abs().mean()), 6),
                    },
                    "text": text,
                    "tokens": ids,
                    "top": [
                        {"ids": top.indices[j].tolist(), "logits": [round(float(v), 5) for v in top.values[j]]}
                        for j in range(len(ids))
                    ],
                }
            )
    doc = {
        "format": "percept-demo-parity/1",
        "weights": os.path.basename(args.weights).removesuffix(".gz"),
        "weightsSha256": weights_sha256(args.weights),
        "recorded": {
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "dtype": "float32, TF32 off",
            "seconds": round(time.time() - t0, 1),
        },
        "imageAttention": runner.image_attention,
        "probe": probe,
        "frames": records,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(json.dumps({"frames": len(records), "seconds": doc["recorded"]["seconds"], "texts": [r["text"] for r in records[:3]]}))
    if inconsistent:
        sys.exit(f"{args.out}: greedy text is not the teacher-forced argmax: {inconsistent}")


if __name__ == "__main__":
    main()
