// clip's vision tower as data (llama-internal.h), for percept's own graph (vision-graph.cc).
#include "../llama-internal.h"

#include "clip-graph.h"  // clip_graph: the one declared path to a clip_ctx's model
#include "clip-impl.h"
#include "clip.h"

#include <cfloat>
#include <stdexcept>
#include <string>
#include <vector>

namespace percept {

namespace {

// clip_ctx is defined inside clip.cpp; its graph builders are the declared way in: a builder made
// for any image holds a reference to the context's model (this one never builds anything).
struct ClipModelProbe : clip_graph {
    using clip_graph::clip_graph;
    ggml_cgraph * build() override { return gf; }
};

const clip_model & clipModelOf(clip_ctx * ctx) {
    const clip_image_f32 image;
    return ClipModelProbe(ctx, image).model;
}

void refuse(bool present, const char * what) {
    if (present) throw std::runtime_error(std::string("the tower has ") + what + ", which percept's graph does not build");
}

}  // namespace

ClipVisionTower clipVisionTower(clip_ctx * ctx) {
    const clip_model & m = clipModelOf(ctx);
    const clip_hparams & hp = m.hparams;
    ClipVisionTower t;
    if (m.modality != CLIP_MODALITY_VISION) throw std::runtime_error("not a vision tower");
    if (m.proj_type == PROJECTOR_TYPE_GEMMA3) t.projector = ClipProjector::Gemma3;
    else if (m.proj_type == PROJECTOR_TYPE_GEMMA4V) t.projector = ClipProjector::Gemma4v;
    else throw std::runtime_error("projector '" + PROJECTOR_TYPE_NAMES[m.proj_type] + "' has no percept graph");
    switch (hp.ffn_op) {
    case FFN_GELU:
        t.ffn = ClipFfnOp::Gelu;
        break;
    case FFN_GELU_ERF:
        t.ffn = ClipFfnOp::GeluErf;
        break;
    case FFN_GELU_QUICK:
        t.ffn = ClipFfnOp::GeluQuick;
        break;
    case FFN_SILU:
        t.ffn = ClipFfnOp::Silu;
        break;
    default:
        throw std::runtime_error("the tower's FFN activation has no percept graph");
    }
    t.nEmbd = hp.n_embd;
    t.nHead = hp.n_head;
    t.nHeadKv = hp.n_head_kv;
    t.dHead = hp.n_embd_head > 0 ? hp.n_embd_head : (hp.n_head > 0 ? hp.n_embd / hp.n_head : 0);
    t.patchSize = hp.patch_size;
    t.merge = hp.n_merge;
    t.nOutEmbd = clip_n_mmproj_embd(ctx);
    t.eps = hp.eps;
    t.ropeTheta = hp.rope_theta;
    if (t.dHead <= 0 || t.nHeadKv <= 0 || t.nHead % t.nHeadKv != 0 || t.patchSize <= 0 || t.merge <= 0)
        throw std::runtime_error("the tower's head or patch geometry is not usable");

    refuse(m.class_embedding != nullptr, "a class token");
    refuse(m.patch_embeddings_1 != nullptr, "a second patch kernel");
    refuse(m.norm_embd_w != nullptr || m.patch_norm_1_w != nullptr, "patch-embedding norms");
    refuse(m.patch_embeddings_0 == nullptr || m.mm_input_proj_w == nullptr, "no patch kernel or no input projection");
    t.patchW = m.patch_embeddings_0;
    t.patchB = m.patch_bias;
    t.posEmbd = m.position_embeddings;
    t.preLnW = m.pre_ln_w;
    t.preLnB = m.pre_ln_b;
    t.postLnW = m.post_ln_w;
    t.postLnB = m.post_ln_b;
    t.projW = m.mm_input_proj_w;
    t.softEmbNormW = m.mm_soft_emb_norm_w;
    t.stdBias = m.std_bias;
    t.stdScale = m.std_scale;
    refuse(t.posEmbd == nullptr, "no position embedding");
    refuse(t.projector == ClipProjector::Gemma3 && t.softEmbNormW == nullptr, "no soft-embedding norm");

    for (const clip_layer & l : m.layers) {
        refuse(l.qkv_w != nullptr, "a fused QKV projection");
        refuse(l.attn_sinks != nullptr, "attention sinks");
        refuse(l.ff_gate_exps_w != nullptr, "a mixture-of-experts FFN");
        refuse(l.has_deepstack(), "a deepstack merger");
        refuse(l.q_w == nullptr || l.k_w == nullptr || l.v_w == nullptr || l.o_w == nullptr, "a layer without Q, K, V or O");
        refuse(l.ff_up_w == nullptr || l.ff_down_w == nullptr, "a layer without an FFN");
        ClipVitLayer v;
        v.ln1W = l.ln_1_w, v.ln1B = l.ln_1_b;
        v.qW = l.q_w, v.qB = l.q_b, v.kW = l.k_w, v.kB = l.k_b, v.vW = l.v_w, v.vB = l.v_b;
        v.qNorm = l.q_norm, v.kNorm = l.k_norm;
        v.oW = l.o_w, v.oB = l.o_b;
        v.attnPostNorm = l.attn_post_norm_w;
        v.ls1 = l.ls_1_w, v.ls2 = l.ls_2_w, v.lsOut = l.ls_out_w;
        v.ln2W = l.ln_2_w, v.ln2B = l.ln_2_b;
        v.upW = l.ff_up_w, v.upB = l.ff_up_b, v.gateW = l.ff_gate_w, v.gateB = l.ff_gate_b, v.downW = l.ff_down_w, v.downB = l.ff_down_b;
        v.ffnPostNorm = l.ff_post_norm_w;
        t.layers.push_back(v);
    }
    refuse(t.layers.empty(), "no transformer layers");

    if (t.projector == ClipProjector::Gemma4v) {
        // The products clip_graph_gemma4v::build_mm clamps: every one but the patch kernel's.
        std::vector<const ggml_tensor *> products{t.projW};
        for (const ClipVitLayer & l : t.layers)
            for (const ggml_tensor * w : {l.qW, l.kW, l.vW, l.oW, l.upW, l.gateW, l.downW})
                if (w != nullptr) products.push_back(w);
        for (const ggml_tensor * w : products) {
            auto it = m.clamp_info_map.find(w->name);
            if (it == m.clamp_info_map.end()) continue;
            const auto & c = it->second;
            if (c.inp_min == -FLT_MAX && c.inp_max == FLT_MAX && c.out_min == -FLT_MAX && c.out_max == FLT_MAX) continue;
            t.clamps.emplace_back(w, ClipClamp{c.inp_min, c.inp_max, c.out_min, c.out_max});
        }
    }
    return t;
}

}  // namespace percept
