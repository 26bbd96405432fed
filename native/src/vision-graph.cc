#include "vision-graph.h"

#include "ggml-cpu.h"
#include "ggml.h"
#include "util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace percept {

namespace {

double msSince(int64_t t0) { return double(monotonicNs() - t0) / 1e6; }

// A buffer for weights percept derives from clip's at load, on the buffer type of the weights they come from.
// `what` names them in the error.
ggml_backend_buffer_ptr allocWeights(ggml_context * ctx, const ggml_tensor * from, const char * what) {
    ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_buffer_get_type(from->buffer)));
    if (!buf) throw std::runtime_error(std::string("cannot allocate the ") + what);
    ggml_backend_buffer_set_usage(buf.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    return buf;
}

// Graph nodes and tensors of one shape: each transformer layer makes a few dozen of each.
size_t graphSize(size_t layers) { return 256 + 96 * layers; }

// The ops of clip's graph builders, one method per builder step, on percept's shapes.
// Pixels come in as the preprocessor lays them out, and several images of one size form one batch.
struct Builder {
    const ClipVisionTower & t;
    ggml_context * ctx;
    int32_t flashHead;  // the head size flash attention runs at; 0: without flash attention
    bool rms;           // gemma4v normalizes with RMSNorm, SigLIP with LayerNorm
    // Per layer, q/k/v/o weights with every head zero-padded to flashHead (empty: pad in the graph).
    const std::vector<PaddedHeads> & padded;
    // Per layer, gemma4v's q/k weights ordered for one vision rope (empty: two NeoX ropes).
    const std::vector<RopeOrderedHeads> & ropeOrdered;
    // K and V go to flash attention in f32. ggml-cuda converts a whole contiguous tensor to f16 itself, with its vectorized kernel.
    // That beats a CPY node (native/README.md#measurements). Elsewhere they are cast to f16 in the graph, as clip does.
    bool f32Kv;
    // Where percept's attention kernel runs (CUDA): each attention node whose q, k and v it takes.
    // It takes them before gemma4v's per-head norms and RoPE, which it then applies itself. Null: the graph has them.
    std::map<const ggml_tensor *, HeadPrologue> * prologues;

    // clip_graph::build_norm
    ggml_tensor * norm(ggml_tensor * x, ggml_tensor * w, ggml_tensor * b) const {
        x = rms ? ggml_rms_norm(ctx, x, t.eps) : ggml_norm(ctx, x, t.eps);
        if (w != nullptr) x = ggml_mul(ctx, x, w);
        if (b != nullptr) x = ggml_add(ctx, x, b);
        return x;
    }

    // clip_graph::build_mm, and clip_graph_gemma4v::build_mm's clamps where they bound anything
    // (looked up by clip's weight `of` where w is a reordered copy of it)
    ggml_tensor * mm(ggml_tensor * w, ggml_tensor * x, const ggml_tensor * of = nullptr) const {
        if (of == nullptr) of = w;
        for (const auto & [weight, c] : t.clamps) {
            if (weight != of) continue;
            x = ggml_clamp(ctx, x, c.inMin, c.inMax);
            return ggml_clamp(ctx, ggml_mul_mat(ctx, w, x), c.outMin, c.outMax);
        }
        return ggml_mul_mat(ctx, w, x);
    }

    ggml_tensor * linear(ggml_tensor * w, ggml_tensor * b, ggml_tensor * x, const ggml_tensor * of = nullptr) const {
        x = mm(w, x, of);
        return b != nullptr ? ggml_add(ctx, x, b) : x;
    }

    // gemma4v.cpp add_pos: NeoX RoPE over the first half of each head by column, and the second by row.
    // On heads ordered for it (RopeOrderedHeads), that is one vision rope over [columns; rows; 0; 0].
    ggml_tensor * rope2d(ggml_tensor * x, ggml_tensor * posX, ggml_tensor * posY, ggml_tensor * posXY) const {
        const int nDims = int(x->ne[0]) / 2;
        if (posXY != nullptr) {
            int sections[GGML_MROPE_SECTIONS] = {nDims / 2, nDims / 2, 0, 0};
            return ggml_rope_multi(ctx, x, posXY, nullptr, nDims, sections, GGML_ROPE_TYPE_VISION, 0, t.ropeTheta, 1.0f, 0.0f, 1.0f, 0.0f,
                                   0.0f);
        }
        x = ggml_rope_ext(ctx, x, posX, nullptr, nDims, GGML_ROPE_TYPE_NEOX, 0, t.ropeTheta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        x = ggml_rope_ext(ctx, x, posY, nullptr, nDims, GGML_ROPE_TYPE_NEOX, 0, t.ropeTheta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        return ggml_rope_set_offset(x, nDims);
    }

    // clip_graph::build_attn without mask. q, k, v are [d, heads, positions, images]; returns [keep · heads, positions · images].
    // Flash attention runs at head size flashHead, and narrower q, k and v get zero columns here.
    // A zero column adds nothing to q·k, so the softmax and its scale (still 1/√d_head) are unchanged.
    // Zero v columns give zero outputs, and only the first `keep` columns of each head's output are kept.
    // With weights padded at load, q, k and v come in at flashHead already.
    // The output projection then takes every column (keep = flashHead).
    ggml_tensor * attention(ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, float scale, int64_t keep,
                            const HeadPrologue * prologue = nullptr) const {
        ggml_tensor * cur;
        if (flashHead > 0) {
            const int pad = int(flashHead - q->ne[0]);
            if (pad > 0) {
                q = ggml_pad(ctx, q, pad, 0, 0, 0);
                k = ggml_pad(ctx, k, pad, 0, 0, 0);
                v = ggml_pad(ctx, v, pad, 0, 0, 0);
            }
            // K and V to f16 while contiguous: a permuted view converts element by element, at several times the cost.
            // Then permuted as views, since flash attention reads them by stride.
            if (!f32Kv) {
                k = ggml_cast(ctx, k, GGML_TYPE_F16);
                v = ggml_cast(ctx, v, GGML_TYPE_F16);
            }
            q = ggml_permute(ctx, q, 0, 2, 1, 3);
            k = ggml_permute(ctx, k, 0, 2, 1, 3);
            v = ggml_permute(ctx, v, 0, 2, 1, 3);
            cur = ggml_flash_attn_ext(ctx, q, k, v, nullptr, scale, 0.0f, 0.0f);
            ggml_prec_set_acc(cur, GGML_PREC_F32);
            if (prologue != nullptr) prologues->emplace(cur, *prologue);
            // [flashHead, heads, positions, images]
            if (keep < flashHead) {
                cur = ggml_view_4d(ctx, cur, keep, cur->ne[1], cur->ne[2], cur->ne[3], cur->nb[1], cur->nb[2], cur->nb[3], 0);
                cur = ggml_cont_2d(ctx, cur, keep * cur->ne[1], cur->ne[2] * cur->ne[3]);
            } else {
                cur = ggml_reshape_2d(ctx, cur, cur->ne[0] * cur->ne[1], cur->ne[2] * cur->ne[3]);
            }
        } else {
            q = ggml_permute(ctx, q, 0, 2, 1, 3);
            k = ggml_permute(ctx, k, 0, 2, 1, 3);
            v = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));
            ggml_tensor * kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k, q), nullptr, scale, 0.0f);
            cur = ggml_permute(ctx, ggml_mul_mat(ctx, v, kq), 0, 2, 1, 3);
            cur = ggml_cont_2d(ctx, cur, cur->ne[0] * cur->ne[1], cur->ne[2] * cur->ne[3]);
        }
        return cur;
    }

    // clip_graph::build_ffn (no MoE)
    ggml_tensor * ffn(ggml_tensor * x, const ClipVitLayer & l) const {
        ggml_tensor * up = linear(l.upW, l.upB, x);
        ggml_tensor * cur = up;
        if (l.gateW != nullptr) {
            ggml_tensor * gate = linear(l.gateW, l.gateB, x);
            switch (t.ffn) {
            case ClipFfnOp::Gelu:
                cur = ggml_geglu_split(ctx, gate, up);
                break;
            case ClipFfnOp::GeluErf:
                cur = ggml_geglu_erf_split(ctx, gate, up);
                break;
            case ClipFfnOp::GeluQuick:
                cur = ggml_geglu_quick_split(ctx, gate, up);
                break;
            case ClipFfnOp::Silu:
                cur = ggml_swiglu_split(ctx, gate, up);
                break;
            }
        } else {
            switch (t.ffn) {
            case ClipFfnOp::Gelu:
                cur = ggml_gelu(ctx, up);
                break;
            case ClipFfnOp::GeluErf:
                cur = ggml_gelu_erf(ctx, up);
                break;
            case ClipFfnOp::GeluQuick:
                cur = ggml_gelu_quick(ctx, up);
                break;
            case ClipFfnOp::Silu:
                cur = ggml_silu(ctx, up);
                break;
            }
        }
        return linear(l.downW, l.downB, cur);
    }

    // clip_graph::build_vit: inp [n_embd, positions, images] → the same shape
    ggml_tensor * vit(ggml_tensor * inp, ggml_tensor * posX, ggml_tensor * posY, ggml_tensor * posXY) const {
        const int64_t nPos = inp->ne[1], images = inp->ne[2];
        const bool gemma4v = t.projector == ClipProjector::Gemma4v;
        const float scale = gemma4v ? 1.0f : 1.0f / std::sqrt(float(t.dHead));
        ggml_tensor * inpL = ggml_reshape_2d(ctx, inp, t.nEmbd, nPos * images);
        if (t.preLnW != nullptr) inpL = norm(inpL, t.preLnW, t.preLnB);
        const bool paddedWeights = flashHead > t.dHead && !padded.empty();
        const int64_t dHead = paddedWeights ? flashHead : t.dHead;
        for (size_t il = 0; il < t.layers.size(); il++) {
            const ClipVitLayer & l = t.layers[il];
            const PaddedHeads * p = paddedWeights ? &padded[il] : nullptr;
            const RopeOrderedHeads * r = posXY != nullptr ? &ropeOrdered[il] : nullptr;
            ggml_tensor * cur = norm(inpL, l.ln1W, l.ln1B);
            ggml_tensor * q = p != nullptr ? linear(p->qW, p->qB, cur)
                : r != nullptr             ? linear(r->qW, r->qB, cur, l.qW)
                                           : linear(l.qW, l.qB, cur);
            ggml_tensor * k = p != nullptr ? linear(p->kW, p->kB, cur)
                : r != nullptr             ? linear(r->kW, r->kB, cur, l.kW)
                                           : linear(l.kW, l.kB, cur);
            ggml_tensor * v = p != nullptr ? linear(p->vW, p->vB, cur) : linear(l.vW, l.vB, cur);
            // clip: a q norm of d_head values normalizes each head (after the reshape), else the row
            const bool perHead = l.qNorm != nullptr && l.qNorm->ne[0] == t.dHead;
            // percept's attention kernel normalizes and rotates the heads itself (f32 norm weights)
            HeadPrologue prologue;
            const bool fused = prologues != nullptr && gemma4v && perHead && r != nullptr && t.dHead % 4 == 0 &&
                r->qNorm->type == GGML_TYPE_F32 && (l.kNorm == nullptr || (r->kNorm != nullptr && r->kNorm->type == GGML_TYPE_F32));
            if (fused) prologue = HeadPrologue{r->qNorm, l.kNorm != nullptr ? r->kNorm : nullptr, posXY, t.eps, t.ropeTheta};
            if (!perHead) {
                if (l.qNorm != nullptr) q = norm(q, l.qNorm, nullptr);
                if (l.kNorm != nullptr) k = norm(k, l.kNorm, nullptr);
            }
            q = ggml_reshape_4d(ctx, q, dHead, t.nHead, nPos, images);
            k = ggml_reshape_4d(ctx, k, dHead, t.nHeadKv, nPos, images);
            v = ggml_reshape_4d(ctx, v, dHead, t.nHeadKv, nPos, images);
            if (perHead && !fused) {
                q = norm(q, r != nullptr ? r->qNorm : l.qNorm, nullptr);
                if (l.kNorm != nullptr) k = norm(k, r != nullptr ? r->kNorm : l.kNorm, nullptr);
            }
            if (gemma4v && !fused) {
                q = rope2d(q, posX, posY, posXY);
                k = rope2d(k, posX, posY, posXY);
                v = ggml_rms_norm(ctx, v, t.eps);
            }
            cur = linear(p != nullptr ? p->oW : l.oW, l.oB, attention(q, k, v, scale, dHead, fused ? &prologue : nullptr));
            if (l.ls1 != nullptr) cur = ggml_mul(ctx, cur, l.ls1);
            if (l.attnPostNorm != nullptr) cur = norm(cur, l.attnPostNorm, nullptr);
            inpL = ggml_add(ctx, cur, inpL);

            cur = ffn(norm(inpL, l.ln2W, l.ln2B), l);
            if (l.ffnPostNorm != nullptr) cur = norm(cur, l.ffnPostNorm, nullptr);
            if (l.ls2 != nullptr) cur = ggml_mul(ctx, cur, l.ls2);
            cur = ggml_add(ctx, inpL, cur);
            if (l.lsOut != nullptr) cur = ggml_mul(ctx, cur, l.lsOut);
            inpL = cur;
        }
        if (t.postLnW != nullptr) inpL = norm(inpL, t.postLnW, t.postLnB);
        return ggml_reshape_3d(ctx, inpL, t.nEmbd, nPos, images);
    }

    // Average pooling of the patch grid, merge × merge: [n_embd, cols·rows, images] → [n_embd, tokens, images]
    ggml_tensor * pool(ggml_tensor * x, int64_t cols, int64_t rows) const {
        const int64_t images = x->ne[2];
        x = ggml_cont_4d(ctx, ggml_transpose(ctx, x), cols, rows, t.nEmbd, images);
        x = ggml_pool_2d(ctx, x, GGML_OP_POOL_AVG, t.merge, t.merge, t.merge, t.merge, 0, 0);
        x = ggml_reshape_3d(ctx, x, x->ne[0] * x->ne[1], t.nEmbd, images);
        return ggml_cont(ctx, ggml_transpose(ctx, x));
    }
};

}  // namespace

// ------------------------------------------------------------------------------------------------

ggml_backend_buffer_type_t VisionGraph::hostBufferType() const {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend_.get());
    return dev != nullptr ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
}

int32_t tensorCoreFlashHead(int32_t dHead) {
    for (int32_t d : {64, 80, 96, 112, 128, 256})
        if (d >= dHead) return d;
    return dHead;
}

bool isCudaBackend(ggml_backend_t backend) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev != nullptr ? ggml_backend_dev_backend_reg(dev) : nullptr;
    return reg != nullptr && std::strcmp(ggml_backend_reg_name(reg), "CUDA") == 0;
}

struct VisionGraph::Graph {
    ggml_context_ptr ctx;       // tensor and graph metadata (no data)
    ggml_context_ptr constCtx;  // gemma4v: the patch positions, set once
    ggml_backend_buffer_ptr constBuf;
    ggml_cgraph * gf = nullptr;
    ggml_tensor * pixels = nullptr;
    ggml_tensor * out = nullptr;
    // With percept's attention kernel: the graph cut at its flash-attention nodes. ggml computes
    // pieces[i], then the kernel cuts[i]; the last piece follows the last cut.
    ggml_context_ptr pieceCtx;
    std::vector<ggml_cgraph *> pieces;
    std::vector<ggml_tensor *> cuts;
    std::map<const ggml_tensor *, HeadPrologue> prologues;  // the cuts that normalize and rotate heads first

    const HeadPrologue * prologueOf(const ggml_tensor * cut) const {
        auto it = prologues.find(cut);
        return it != prologues.end() ? &it->second : nullptr;
    }
};

bool VisionGraph::Shape::operator<(const Shape & o) const {
    return std::tie(layout, width, height, images) < std::tie(o.layout, o.width, o.height, o.images);
}

VisionGraph::VisionGraph(clip_ctx * clip, const VisionGraphOptions & options) : tower_(clipVisionTower(clip)) {
    // The backend of clip's weight buffer: a backend of our own on that device, so the CUDA graphs
    // ggml-cuda keeps per backend are ours alone.
    ggml_backend_buffer_type_t weights = ggml_backend_buffer_get_type(tower_.patchW->buffer);
    ggml_backend_dev_t device = ggml_backend_buft_get_device(weights);
    // The CPU backend's plain buffer type names no device.
    if (device == nullptr && ggml_backend_buft_is_host(weights)) device = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (device == nullptr)
        throw std::runtime_error(std::string("clip's weight buffer (") + ggml_backend_buft_name(weights) + ") has no device");
    backend_.reset(ggml_backend_dev_init(device, nullptr));
    if (!backend_) throw std::runtime_error(std::string("cannot start a ") + ggml_backend_dev_name(device) + " backend");
    if (ggml_backend_is_cpu(backend_.get())) ggml_backend_cpu_set_n_threads(backend_.get(), options.threads);
    ggml_tensor * k = tower_.patchW;  // [p, p, 3, n_embd]: kx, ky, channel, out
    if (k->ne[0] != tower_.patchSize || k->ne[1] != tower_.patchSize || k->ne[2] != 3 || k->ne[3] != tower_.nEmbd || !ggml_is_contiguous(k))
        throw std::runtime_error("the patch kernel is not [patch, patch, 3, n_embd]");
    if (tower_.projector == ClipProjector::Gemma3) transposeProjection();

    // Whether the backend runs every op, checked on the smallest image of each layout.
    // Flash attention runs where it can, or as asked. Any other missing op means clip keeps the tower.
    const bool gemma3 = tower_.projector == ClipProjector::Gemma3;
    const int32_t p = tower_.patchSize;
    const int32_t side = gemma3 ? int32_t(std::lround(std::sqrt(double(tower_.posEmbd->ne[1])))) * p : tower_.merge * p;
    const Shape preprocessed{gemma3 ? PixelLayout::Chw : PixelLayout::Patches, side, side, 1};
    const Shape other{gemma3 ? PixelLayout::Patches : PixelLayout::Chw, side, side, 1};
    const int32_t padded = tensorCoreFlashHead(tower_.dHead);
    const bool cuda = isCudaBackend(backend_.get());
    const bool perceptKernel = cuda && VisionAttention::built() && tower_.dHead <= VisionAttention::maxHead;
    if (options.flashAttention == FlashAttention::Percept && !perceptKernel) {
        throw std::runtime_error(std::string("percept's attention kernel needs a CUDA build and a head size of at most 128 (") +
                                 ggml_backend_name(backend_.get()) + ", head size " + std::to_string(tower_.dHead) + ")");
    }
    if (options.flashAttention == FlashAttention::Percept || (options.flashAttention == FlashAttention::Auto && perceptKernel)) {
        // The kernel pads heads itself: the graph keeps the tower's head size and no weight copies.
        attention_ = std::make_unique<VisionAttention>(cudaDevice());
        ggml_backend_dev_t dev = ggml_backend_get_device(backend_.get());
        pieceDone_.reset(ggml_backend_event_new(dev));
        attentionDone_.reset(ggml_backend_event_new(dev));
        if (!pieceDone_ || !attentionDone_) {
            pieceDone_.reset();
            attentionDone_.reset();
        }
    }
    switch (attention_ ? FlashAttention::On : options.flashAttention) {
    case FlashAttention::Off:
        flashHead_ = 0;
        break;
    case FlashAttention::On:
        flashHead_ = tower_.dHead;
        break;
    case FlashAttention::Padded:
        flashHead_ = padded;
        break;
    case FlashAttention::Auto:
    case FlashAttention::Percept:
        // A few zero columns cost ggml-cuda's tensor-core kernel far less than its tile kernel costs
        // at the tower's own head size (see tensorCoreFlashHead).
        flashHead_ = cuda ? padded : tower_.dHead;
        break;
    }
    std::unique_ptr<Graph> probe = build(preprocessed, flashHead_);
    if (options.flashAttention == FlashAttention::Auto && !attention_) {
        for (int i = 0; i < ggml_graph_n_nodes(probe->gf) && flashHead_ > 0; i++) {
            ggml_tensor * node = ggml_graph_node(probe->gf, i);
            if (node->op == GGML_OP_FLASH_ATTN_EXT && !ggml_backend_supports_op(backend_.get(), node)) flashHead_ = 0;
        }
        if (flashHead_ == 0) probe = build(preprocessed, 0);
    }
    // Padded heads from padded weights where nothing acts on a head's columns between the projections and attention (SigLIP).
    // Per-head norms and RoPE (gemma4v) see the real columns.
    if (flashHead_ > tower_.dHead && padHeads()) probe = build(preprocessed, flashHead_);
    if (tower_.projector == ClipProjector::Gemma4v && orderHeadsForRope()) probe = build(preprocessed, flashHead_);
    checkSupported(*probe);
    checkSupported(*build(other, flashHead_));
    graphNodes_ = ggml_graph_n_nodes(probe->gf);
    galloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_.get())));
}

VisionGraph::~VisionGraph() = default;

// siglip.cpp multiplies by ggml_cont(ggml_transpose(mm_input_proj_w)) on every call: once here.
void VisionGraph::transposeProjection() {
    ggml_tensor * proj = tower_.projW;
    const ggml_type type = proj->type;
    if ((type != GGML_TYPE_F32 && type != GGML_TYPE_F16 && type != GGML_TYPE_BF16) || !ggml_is_contiguous(proj) ||
        proj->ne[1] != tower_.nEmbd)
        throw std::runtime_error("gemma3's input projection is not a plain f32/f16/bf16 [n_out, n_embd] matrix");
    ggml_init_params params{ggml_tensor_overhead(), nullptr, true};
    derivedCtx_.reset(ggml_init(params));
    projT_ = ggml_new_tensor_2d(derivedCtx_.get(), type, proj->ne[1], proj->ne[0]);
    derivedBuf_ = allocWeights(derivedCtx_.get(), proj, "transposed input projection");
    const int64_t rows = proj->ne[1], cols = proj->ne[0];
    const size_t es = ggml_type_size(type);
    std::vector<uint8_t> src(ggml_nbytes(proj)), dst(ggml_nbytes(proj));
    ggml_backend_tensor_get(proj, src.data(), 0, src.size());
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) std::memcpy(&dst[size_t(c * rows + r) * es], &src[size_t(r * cols + c) * es], es);
    ggml_backend_tensor_set(projT_, dst.data(), 0, dst.size());
}

namespace {

// A contiguous f32/f16/bf16 tensor: its values can be moved one by one (not a quantized block).
bool plainFloat(const ggml_tensor * w) {
    return w != nullptr && (w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16) && ggml_is_contiguous(w);
}

// src holds `rows` rows of `heads` runs of `from` elements of es bytes.
// dst gets each run widened to `to` elements, zero-filled after the copied ones.
void padRuns(const std::vector<uint8_t> & src, std::vector<uint8_t> & dst, int64_t rows, int64_t heads, int64_t from, int64_t to,
             size_t es) {
    dst.assign(size_t(rows * heads * to) * es, 0);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++)
            std::memcpy(&dst[size_t((r * heads + h) * to) * es], &src[size_t((r * heads + h) * from) * es], size_t(from) * es);
}

}  // namespace

bool VisionGraph::padHeads() {
    const ClipVisionTower & t = tower_;
    if (t.projector == ClipProjector::Gemma4v || !t.clamps.empty()) return false;
    for (const ClipVitLayer & l : t.layers) {
        if (l.qNorm != nullptr || l.kNorm != nullptr) return false;
        for (const ggml_tensor * w : {l.qW, l.kW, l.vW, l.oW})
            if (!plainFloat(w)) return false;
        for (const ggml_tensor * b : {l.qB, l.kB, l.vB})
            if (b != nullptr && !plainFloat(b)) return false;
    }
    const int64_t d = t.dHead, f = flashHead_, nEmbd = t.nEmbd;
    ggml_init_params params{7 * t.layers.size() * ggml_tensor_overhead(), nullptr, true};
    paddedCtx_.reset(ggml_init(params));
    ggml_context * ctx = paddedCtx_.get();
    std::vector<PaddedHeads> padded(t.layers.size());
    for (size_t il = 0; il < t.layers.size(); il++) {
        const ClipVitLayer & l = t.layers[il];
        PaddedHeads & p = padded[il];
        p.qW = ggml_new_tensor_2d(ctx, l.qW->type, nEmbd, t.nHead * f);
        p.kW = ggml_new_tensor_2d(ctx, l.kW->type, nEmbd, t.nHeadKv * f);
        p.vW = ggml_new_tensor_2d(ctx, l.vW->type, nEmbd, t.nHeadKv * f);
        p.oW = ggml_new_tensor_2d(ctx, l.oW->type, t.nHead * f, l.oW->ne[1]);
        if (l.qB != nullptr) p.qB = ggml_new_tensor_1d(ctx, l.qB->type, t.nHead * f);
        if (l.kB != nullptr) p.kB = ggml_new_tensor_1d(ctx, l.kB->type, t.nHeadKv * f);
        if (l.vB != nullptr) p.vB = ggml_new_tensor_1d(ctx, l.vB->type, t.nHeadKv * f);
    }
    paddedBuf_ = allocWeights(ctx, t.layers[0].qW, "head-padded attention weights");
    std::vector<uint8_t> src, dst;
    // Reads `from`, pads each of its heads' runs to f and writes `to`.
    // q/k/v weights and biases pad their outputs: a head is d rows of a matrix, or d values of a vector.
    // The output projection pads its inputs: in each row, a head is d values.
    auto pad = [&](const ggml_tensor * from, ggml_tensor * to, bool inputs) {
        if (from == nullptr) return;
        src.resize(ggml_nbytes(from));
        ggml_backend_tensor_get(from, src.data(), 0, src.size());
        const size_t es = ggml_type_size(from->type);
        if (inputs) {
            padRuns(src, dst, from->ne[1], from->ne[0] / d, d, f, es);
        } else {
            const bool matrix = from->ne[1] > 1;
            const int64_t unit = matrix ? int64_t(ggml_row_size(from->type, from->ne[0])) : int64_t(es);
            padRuns(src, dst, 1, (matrix ? from->ne[1] : from->ne[0]) / d, d * unit, f * unit, 1);
        }
        ggml_backend_tensor_set(to, dst.data(), 0, dst.size());
    };
    for (size_t il = 0; il < t.layers.size(); il++) {
        const ClipVitLayer & l = t.layers[il];
        const PaddedHeads & p = padded[il];
        for (const auto & [from, to] : {std::pair{l.qW, p.qW}, {l.kW, p.kW}, {l.vW, p.vW}, {l.qB, p.qB}, {l.kB, p.kB}, {l.vB, p.vB}})
            pad(from, to, false);
        pad(l.oW, p.oW, true);
    }
    padded_ = std::move(padded);
    return true;
}

bool VisionGraph::orderHeadsForRope() {
    const ClipVisionTower & t = tower_;
    const int64_t d = t.dHead, q = d / 4;
    if (d % 4 != 0) return false;
    for (const ClipVitLayer & l : t.layers) {
        if (!plainFloat(l.qW) || !plainFloat(l.kW)) return false;
        for (const ggml_tensor * x : {l.qB, l.kB})
            if (x != nullptr && !plainFloat(x)) return false;
        // a norm over the whole row would see the reordered columns: per-head norms only
        for (const ggml_tensor * n : {l.qNorm, l.kNorm})
            if (n != nullptr && (!plainFloat(n) || n->ne[0] != d)) return false;
    }
    // the new dimension n of a head holds the old one `from(n)`: quarters 0, 2, 1, 3
    auto from = [q](int64_t n) { return n < q || n >= 3 * q ? n : n < 2 * q ? n + q : n - q; };
    ggml_init_params params{6 * t.layers.size() * ggml_tensor_overhead(), nullptr, true};
    ropeCtx_.reset(ggml_init(params));
    ggml_context * ctx = ropeCtx_.get();
    std::vector<RopeOrderedHeads> ordered(t.layers.size());
    auto like = [ctx](const ggml_tensor * x) { return x != nullptr ? ggml_dup_tensor(ctx, x) : nullptr; };
    for (size_t il = 0; il < t.layers.size(); il++) {
        const ClipVitLayer & l = t.layers[il];
        ordered[il] = {like(l.qW), like(l.qB), like(l.kW), like(l.kB), like(l.qNorm), like(l.kNorm)};
    }
    ropeBuf_ = allocWeights(ctx, t.layers[0].qW, "rope-ordered q/k weights");
    std::vector<uint8_t> src, dst;
    // A matrix reorders its rows (output features) within each head, a vector its values.
    auto reorder = [&](const ggml_tensor * x, ggml_tensor * to) {
        if (x == nullptr) return;
        src.resize(ggml_nbytes(x));
        dst.resize(src.size());
        ggml_backend_tensor_get(x, src.data(), 0, src.size());
        const bool matrix = x->ne[1] > 1;
        const size_t unit = matrix ? ggml_row_size(x->type, x->ne[0]) : ggml_type_size(x->type);
        const int64_t units = matrix ? x->ne[1] : x->ne[0];
        for (int64_t u = 0; u < units; u++) {
            const int64_t head = u / d, n = u % d;
            std::memcpy(&dst[size_t(u) * unit], &src[size_t(head * d + from(n)) * unit], unit);
        }
        ggml_backend_tensor_set(to, dst.data(), 0, dst.size());
    };
    for (size_t il = 0; il < t.layers.size(); il++) {
        const ClipVitLayer & l = t.layers[il];
        RopeOrderedHeads & r = ordered[il];
        reorder(l.qW, r.qW);
        reorder(l.qB, r.qB);
        reorder(l.kW, r.kW);
        reorder(l.kB, r.kB);
        reorder(l.qNorm, r.qNorm);
        reorder(l.kNorm, r.kNorm);
    }
    ropeOrdered_ = std::move(ordered);
    return true;
}

size_t VisionGraph::copiedWeightBytes() const {
    size_t bytes = 0;
    for (const ggml_backend_buffer_ptr * b : {&derivedBuf_, &paddedBuf_, &ropeBuf_})
        if (*b) bytes += ggml_backend_buffer_get_size(b->get());
    return bytes;
}

void VisionGraph::checkSupported(const Graph & g) const {
    for (int i = 0; i < ggml_graph_n_nodes(g.gf); i++) {
        ggml_tensor * node = ggml_graph_node(g.gf, i);
        if (attention_ && node->op == GGML_OP_FLASH_ATTN_EXT) continue;  // never run by ggml
        if (!ggml_backend_supports_op(backend_.get(), node)) {
            throw std::runtime_error(std::string(ggml_backend_name(backend_.get())) + " cannot run " + ggml_op_desc(node) + " (" +
                                     ggml_type_name(node->type) + (node->op == GGML_OP_FLASH_ATTN_EXT ? ", flash attention" : "") + ")");
        }
    }
}

int32_t VisionGraph::outputTokens(int32_t width, int32_t height) const {
    const int32_t p = tower_.patchSize, m = tower_.merge;
    return (width / p / m) * (height / p / m);
}

std::string VisionGraph::bufferName() const { return ggml_backend_buft_name(ggml_backend_get_default_buffer_type(backend_.get())); }

size_t VisionGraph::computeBytes() const { return ggml_gallocr_get_buffer_size(galloc_.get(), 0); }

std::unique_ptr<VisionGraph::Graph> VisionGraph::build(const Shape & s, int32_t flashHead) const {
    const ClipVisionTower & t = tower_;
    const int64_t p = t.patchSize, cols = s.width / p, rows = s.height / p, nPos = cols * rows, images = s.images;
    if (s.width % p != 0 || s.height % p != 0 || cols % t.merge != 0 || rows % t.merge != 0 || images < 1)
        throw std::runtime_error("image size does not fit the patch grid and pooling");
    const bool gemma4v = t.projector == ClipProjector::Gemma4v;
    if (gemma4v ? (cols > t.posEmbd->ne[1] || rows > t.posEmbd->ne[1]) : nPos != t.posEmbd->ne[1])
        throw std::runtime_error("image size does not fit the position table");

    auto g = std::make_unique<Graph>();
    const size_t size = graphSize(t.layers.size());
    ggml_init_params params{size * ggml_tensor_overhead() + ggml_graph_overhead_custom(size, false), nullptr, true};
    g->ctx.reset(ggml_init(params));
    ggml_context * ctx = g->ctx.get();
    g->gf = ggml_new_graph_custom(ctx, size, false);
    Builder b{t, ctx, flashHead, gemma4v, padded_, ropeOrdered_, isCudaBackend(backend_.get()), attention_ ? &g->prologues : nullptr};

    // Patch embedding, as ggml_conv_2d computes clip's: im2col rows (kx fastest, then ky, then the
    // channel) in f16, times the kernel. Planar pixels go through im2col; HWC patches are the same
    // rows with the channel first, reordered by a permute. The same roundings in the same order as
    // clip's: a randomly initialized tower amplifies any difference in its input.
    const ggml_type rowType = t.patchW->type == GGML_TYPE_BF16 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    ggml_tensor * x;
    if (s.layout == PixelLayout::Patches) {
        x = g->pixels = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 3 * p * p, nPos, images);
    } else {
        x = g->pixels = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s.width, s.height, 3, images);
    }
    ggml_set_name(g->pixels, "pixels");
    ggml_set_input(g->pixels);
    if (gemma4v) x = ggml_scale_bias(ctx, x, 2.0f, -1.0f);  // [0,1] → [-1,1]
    if (s.layout == PixelLayout::Patches) {
        x = ggml_permute(ctx, ggml_reshape_4d(ctx, x, 3, p, p, nPos * images), 2, 0, 1, 3);  // → [p, p, 3, patches]
        x = ggml_cast(ctx, x, rowType);
    } else {
        x = ggml_im2col(ctx, t.patchW, x, int(p), int(p), 0, 0, 1, 1, true, rowType);  // [3·p², cols, rows, images]
    }
    x = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, x, 3 * p * p, nPos * images), ggml_reshape_2d(ctx, t.patchW, 3 * p * p, t.nEmbd));
    // [patches · images, n_embd] → [n_embd, patches, images]
    x = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, x, nPos, images, t.nEmbd), 1, 2, 0, 3));
    if (t.patchB != nullptr) x = ggml_add(ctx, x, t.patchB);

    ggml_tensor *posX = nullptr, *posY = nullptr, *posXY = nullptr;
    if (gemma4v) {
        // gemma4v.cpp: learned x and y tables, looked up by each patch's column and row
        ggml_init_params cp{3 * ggml_tensor_overhead(), nullptr, true};
        g->constCtx.reset(ggml_init(cp));
        posX = ggml_new_tensor_1d(g->constCtx.get(), GGML_TYPE_I32, nPos);
        posY = ggml_new_tensor_1d(g->constCtx.get(), GGML_TYPE_I32, nPos);
        // the vision rope's positions: columns, rows, and two unused sections
        if (!ropeOrdered_.empty()) posXY = ggml_new_tensor_1d(g->constCtx.get(), GGML_TYPE_I32, 4 * nPos);
        g->constBuf.reset(ggml_backend_alloc_ctx_tensors(g->constCtx.get(), backend_.get()));
        if (!g->constBuf) throw std::runtime_error("cannot allocate the patch positions");
        std::vector<int32_t> xs(static_cast<size_t>(nPos)), ys(static_cast<size_t>(nPos));
        for (int64_t i = 0; i < nPos; i++) {
            xs[size_t(i)] = int32_t(i % cols);
            ys[size_t(i)] = int32_t(i / cols);
        }
        ggml_backend_tensor_set(posX, xs.data(), 0, ggml_nbytes(posX));
        ggml_backend_tensor_set(posY, ys.data(), 0, ggml_nbytes(posY));
        if (posXY != nullptr) {
            std::vector<int32_t> xy(size_t(4 * nPos), 0);
            std::copy(xs.begin(), xs.end(), xy.begin());
            std::copy(ys.begin(), ys.end(), xy.begin() + nPos);
            ggml_backend_tensor_set(posXY, xy.data(), 0, ggml_nbytes(posXY));
        }
        const int64_t table = t.posEmbd->ne[1];
        const size_t row = ggml_row_size(t.posEmbd->type, t.nEmbd);
        ggml_tensor * tblX = ggml_view_2d(ctx, t.posEmbd, t.nEmbd, table, row, 0);
        ggml_tensor * tblY = ggml_view_2d(ctx, t.posEmbd, t.nEmbd, table, row, table * row);
        x = ggml_add(ctx, x, ggml_get_rows(ctx, tblX, posX));
        x = ggml_add(ctx, x, ggml_get_rows(ctx, tblY, posY));
    } else {
        x = ggml_add(ctx, x, t.posEmbd);
    }

    x = b.pool(b.vit(x, posX, posY, posXY), cols, rows);

    if (gemma4v) {
        // Gemma4VisionPooler's ×√h, the optional standardization, Gemma4MultimodalEmbedder
        x = ggml_scale(ctx, x, std::sqrt(float(t.nEmbd)));
        if (t.stdBias != nullptr && t.stdScale != nullptr) x = ggml_mul(ctx, ggml_sub(ctx, x, t.stdBias), t.stdScale);
        x = b.mm(t.projW, ggml_rms_norm(ctx, x, t.eps));
    } else {
        // siglip.cpp (gemma3): RMSNorm · soft_emb_norm, then the input projection
        x = ggml_mul(ctx, ggml_rms_norm(ctx, x, t.eps), t.softEmbNormW);
        x = ggml_mul_mat(ctx, projT_, x);
    }
    g->out = x;
    ggml_set_name(g->out, "embeddings");
    ggml_set_output(g->out);
    ggml_build_forward_expand(g->gf, g->out);
    if (attention_) cutAtAttention(*g);
    return g;
}

void VisionGraph::cutAtAttention(Graph & g) const {
    const int n = ggml_graph_n_nodes(g.gf);
    std::vector<std::pair<int, int>> ranges;  // [first, end) of each piece
    int first = 0;
    for (int i = 0; i < n; i++) {
        ggml_tensor * node = ggml_graph_node(g.gf, i);
        if (node->op != GGML_OP_FLASH_ATTN_EXT) continue;
        ranges.emplace_back(first, i);
        g.cuts.push_back(node);
        first = i + 1;
    }
    ranges.emplace_back(first, n);
    size_t bytes = 0;
    for (const auto & [a, b] : ranges) bytes += ggml_graph_overhead_custom(size_t(std::max(1, b - a)), false);
    ggml_init_params params{bytes, nullptr, true};
    g.pieceCtx.reset(ggml_init(params));
    for (const auto & [a, b] : ranges) {
        ggml_cgraph * piece = ggml_new_graph_custom(g.pieceCtx.get(), size_t(std::max(1, b - a)), false);
        for (int i = a; i < b; i++) ggml_graph_add_node(piece, ggml_graph_node(g.gf, i));
        g.pieces.push_back(piece);
    }
}

namespace {

DeviceTensorView deviceView(const ggml_tensor * t) {
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16)
        throw std::runtime_error(std::string("attention operand ") + t->name + " is " + ggml_type_name(t->type) + ", not f32 or f16");
    DeviceTensorView v;
    v.data = t->data;
    v.f16 = t->type == GGML_TYPE_F16;
    for (int i = 0; i < 4; i++) {
        v.ne[i] = t->ne[i];
        v.nb[i] = t->nb[i];
    }
    return v;
}

}  // namespace

void VisionGraph::runAttention(const Graph & g, ggml_tensor * node, bool wait) {
    // flash_attn_ext's operands: q, k, v, mask; op params scale, max_bias, logit_softcap
    float params[3];
    std::memcpy(params, node->op_params, sizeof(params));
    if (node->src[3] != nullptr || params[1] != 0.0f || params[2] != 0.0f || node->type != GGML_TYPE_F32 || !ggml_is_contiguous(node))
        throw std::runtime_error("percept's attention kernel takes no mask, ALiBi or soft-capping");
    const DeviceTensorView q = deviceView(node->src[0]), k = deviceView(node->src[1]), v = deviceView(node->src[2]);
    float * out = static_cast<float *>(node->data);
    const HeadPrologue * prologue = g.prologueOf(node);
    AttentionPrologue heads;
    if (prologue != nullptr) {
        heads.norm[0] = heads.norm[2] = true;
        heads.weight[0] = static_cast<const float *>(prologue->qNorm->data);
        heads.norm[1] = prologue->kNorm != nullptr;
        heads.weight[1] = prologue->kNorm != nullptr ? static_cast<const float *>(prologue->kNorm->data) : nullptr;
        heads.eps = prologue->eps;
        heads.positions = static_cast<const int32_t *>(prologue->positions->data);
        heads.ropeTheta = prologue->ropeTheta;
    }
    const AttentionPrologue * first = prologue != nullptr ? &heads : nullptr;
    if (wait || !pieceDone_) {
        ggml_backend_synchronize(backend_.get());
        attention_->run(q, k, v, params[0], out, first);
        return;
    }
    ggml_backend_event_record(pieceDone_.get(), backend_.get());
    attention_->enqueue(q, k, v, params[0], out, first, cudaEventOf(pieceDone_.get()), cudaEventOf(attentionDone_.get()));
    ggml_backend_event_wait(backend_.get(), attentionDone_.get());
}

VisionGraph::Graph & VisionGraph::laidOut(const Shape & s, VisionGraphTimes & times) {
    int64_t t0 = monotonicNs();
    auto it = graphs_.find(s);
    if (it == graphs_.end()) {
        it = graphs_.emplace(s, build(s, flashHead_)).first;
        times.build = msSince(t0);
    }
    Graph & g = *it->second;
    if (laidOut_ != &g) {
        // One compute buffer serves every shape, as there is one encode at a time. It grows only for a larger shape.
        // A shape lays the buffer out again when another one used it last.
        // gallocr places only tensors without data, and would reuse the last placement for any graph with as many nodes.
        // So forget this graph's old places and plan it anew.
        t0 = monotonicNs();
        laidOut_ = nullptr;
        for (ggml_tensor * x = ggml_get_first_tensor(g.ctx.get()); x != nullptr; x = ggml_get_next_tensor(g.ctx.get(), x)) {
            x->data = nullptr;
            x->buffer = nullptr;
        }
        if (!ggml_gallocr_reserve(galloc_.get(), g.gf) || !ggml_gallocr_alloc_graph(galloc_.get(), g.gf))
            throw std::runtime_error("cannot allocate the compute buffer");
        laidOut_ = &g;
        times.alloc = msSince(t0);
    }
    return g;
}

void VisionGraph::reserve(PixelLayout layout, int32_t width, int32_t height, int32_t images) {
    VisionGraphTimes ignored;
    laidOut({layout, width, height, images}, ignored);
}

void VisionGraph::encode(const std::vector<const float *> & pixels, PixelLayout layout, int32_t width, int32_t height, float * out,
                         VisionGraphTimes & times, std::map<std::string, VisionOpTime> * ops) {
    Graph & g = laidOut({layout, width, height, int32_t(pixels.size())}, times);
    const int64_t t0 = monotonicNs();
    const size_t perImage = ggml_nbytes(g.pixels) / pixels.size();
    for (size_t i = 0; i < pixels.size(); i++) ggml_backend_tensor_set(g.pixels, pixels[i], i * perImage, perImage);
    times.upload = msSince(t0);
    computeAndRead(g, out, times, ops);
}

void VisionGraph::encodeFilled(const std::function<void(ggml_tensor * pixels)> & fill, PixelLayout layout, int32_t width, int32_t height,
                               int32_t images, float * out, VisionGraphTimes & times, std::map<std::string, VisionOpTime> * ops) {
    Graph & g = laidOut({layout, width, height, images}, times);
    const int64_t t0 = monotonicNs();
    fill(g.pixels);
    times.upload = msSince(t0);
    computeAndRead(g, out, times, ops);
}

int32_t VisionGraph::cudaDevice() const {
    if (!isCudaBackend(backend_.get())) return -1;
    // ggml-cuda names its devices CUDA0, CUDA1, … by their CUDA index.
    const char * name = ggml_backend_dev_name(ggml_backend_get_device(backend_.get()));
    return std::strncmp(name, "CUDA", 4) == 0 ? int32_t(std::strtol(name + 4, nullptr, 10)) : -1;
}

void VisionGraph::computeAndRead(Graph & g, float * out, VisionGraphTimes & times, std::map<std::string, VisionOpTime> * ops) {
    ggml_backend_t backend = backend_.get();
    int64_t t0 = monotonicNs();
    if (ops == nullptr && !g.cuts.empty()) {
        // Everything is queued without a host wait, as the streams wait for each other at each cut. Then one wait for all of it.
        // Host waits around every cut cost E4B's 16 layers more than the kernel saved.
        for (size_t i = 0; i < g.pieces.size(); i++) {
            if (ggml_graph_n_nodes(g.pieces[i]) > 0 && ggml_backend_graph_compute_async(backend, g.pieces[i]) != GGML_STATUS_SUCCESS)
                throw std::runtime_error("graph compute failed");
            if (i < g.cuts.size()) runAttention(g, g.cuts[i], false);
        }
        ggml_backend_synchronize(backend);
    } else if (ops == nullptr) {
        if (ggml_backend_graph_compute(backend, g.gf) != GGML_STATUS_SUCCESS) throw std::runtime_error("graph compute failed");
    } else {
        // Node by node, each waited for: what each op type costs (without fusion across nodes).
        ggml_init_params params{ggml_graph_overhead_custom(1, false), nullptr, true};
        ggml_context_ptr one(ggml_init(params));
        ggml_cgraph * single = ggml_new_graph_custom(one.get(), 1, false);
        for (int i = 0; i < ggml_graph_n_nodes(g.gf); i++) {
            ggml_tensor * node = ggml_graph_node(g.gf, i);
            ggml_graph_clear(single);
            ggml_graph_add_node(single, node);
            const int64_t n0 = monotonicNs();
            const bool percept = attention_ && node->op == GGML_OP_FLASH_ATTN_EXT;
            if (percept) {
                runAttention(g, node, true);
            } else if (ggml_backend_graph_compute(backend, single) != GGML_STATUS_SUCCESS) {
                throw std::runtime_error("graph compute failed");
            }
            VisionOpTime & op = (*ops)[percept ? std::string(ggml_op_desc(node)) + " (percept)" : std::string(ggml_op_desc(node))];
            op.ms += msSince(n0);
            op.count++;
            if (node->buffer != nullptr && ggml_backend_buffer_is_host(node->buffer)) op.onHost++;
        }
    }
    times.compute = msSince(t0);

    t0 = monotonicNs();
    ggml_backend_tensor_get(g.out, out, 0, ggml_nbytes(g.out));
    times.read = msSince(t0);
}

}  // namespace percept
