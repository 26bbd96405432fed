#include "llama-internal.h"

#include "clip-impl.h"  // clip_image_f32 (its buffer is interleaved RGB, row-major)
#include "clip.h"
#include "ggml-backend.h"
#include "llama-ext.h"  // llama_get_memory_breakdown
#include "llama-grammar.h"
#include "clip-graph.h"         // clip_graph: the one declared path to a clip_ctx's model
#include "ggml-backend-impl.h"  // ggml_backend_event, ggml_backend's entries
#include "ggml-impl.h"          // ggml_cgraph
#include "llama-context.h"      // llama_context::get_sched

#include <algorithm>
#include <cfloat>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace percept {

void setGraphSlots(llama_context * ctx, uint32_t slots) { ctx->set_graph_slots(slots); }

std::vector<BufferBytes> memoryBreakdown(const llama_context * ctx) {
    std::vector<BufferBytes> out;
    for (const auto & [buft, d] : llama_get_memory_breakdown(ctx)) {
        out.push_back({ggml_backend_buft_name(buft), d.model, d.context, d.compute});
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Grammar

void GrammarDeleter::operator()(llama_grammar * g) const { llama_grammar_free_impl(g); }

GrammarPtr grammarParse(const llama_vocab * vocab, const std::string & gbnf, const std::string & root) {
    return GrammarPtr(llama_grammar_init_impl(vocab, gbnf.c_str(), root.c_str(), false, nullptr, 0, nullptr, 0));
}

GrammarPtr grammarClone(const llama_grammar & grammar) { return GrammarPtr(llama_grammar_clone_impl(grammar)); }

void grammarApply(const llama_grammar & grammar, llama_token_data_array * candidates) { llama_grammar_apply_impl(grammar, candidates); }

void grammarAccept(llama_grammar & grammar, llama_token token) { llama_grammar_accept_impl(grammar, token); }

bool grammarComplete(const llama_grammar & grammar) {
    if (grammar.stacks.empty()) return false;
    for (const auto & stack : grammar.stacks)
        if (!stack.empty()) return false;
    return true;
}

int64_t grammarSingleChar(const llama_grammar & grammar) {
    if (grammar.partial_utf8.n_remain != 0 || grammar.stacks.empty()) return -1;
    int64_t chr = -1;
    for (const auto & stack : grammar.stacks) {
        if (stack.empty()) return -1;  // end of grammar is admissible too
        const llama_grammar_element * pos = stack.back();
        if (pos->type != LLAMA_GRETYPE_CHAR) return -1;
        if (pos[1].type == LLAMA_GRETYPE_CHAR_ALT || pos[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) return -1;
        if (chr >= 0 && int64_t(pos->value) != chr) return -1;
        chr = pos->value;
    }
    return chr;
}

namespace {

uint8_t leadByte(uint32_t cp) {
    return cp < 0x80   ? uint8_t(cp)
        : cp < 0x800   ? uint8_t(0xC0 | (cp >> 6))
        : cp < 0x10000 ? uint8_t(0xE0 | (cp >> 12))
                       : uint8_t(0xF0 | (cp >> 18));
}

}  // namespace

std::bitset<257> grammarLeadBytes(const llama_grammar & grammar) {
    std::bitset<257> mask;
    if (grammar.partial_utf8.n_remain != 0) return mask.set();
    for (const auto & stack : grammar.stacks) {
        if (stack.empty()) {
            mask.set(256);
            continue;
        }
        const llama_grammar_element * p = stack.back();
        if (p->type != LLAMA_GRETYPE_CHAR) return mask.set();
        do {
            uint32_t lo = p->value, hi = p->value;
            if (p[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
                hi = p[1].value;
                p += 2;
            } else {
                p += 1;
            }
            for (uint32_t b = leadByte(lo); b <= leadByte(std::max(lo, hi)) && b < 256; b++) mask.set(b);
        } while (p->type == LLAMA_GRETYPE_CHAR_ALT);
    }
    return mask;
}

// ---------------------------------------------------------------------------------------------
// Grammar automaton

namespace {

// Same rule as llama.cpp's char matcher (llama_grammar_match_char), used only to skip bytes no
// stack can take before asking llama_grammar_accept, which decides.
bool topAdmits(const llama_grammar_element * pos, uint32_t cp) {
    if (pos->type != LLAMA_GRETYPE_CHAR && pos->type != LLAMA_GRETYPE_CHAR_NOT && pos->type != LLAMA_GRETYPE_CHAR_ANY) return true;
    const bool positive = pos->type != LLAMA_GRETYPE_CHAR_NOT;
    bool found = false;
    do {
        if (pos[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
            found = found || (pos->value <= cp && cp <= pos[1].value);
            pos += 2;
        } else if (pos->type == LLAMA_GRETYPE_CHAR_ANY) {
            found = true;
            pos += 1;
        } else {
            found = found || pos->value == cp;
            pos += 1;
        }
    } while (pos->type == LLAMA_GRETYPE_CHAR_ALT);
    return found == positive;
}

bool stackLess(const llama_grammar_stack & a, const llama_grammar_stack & b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), std::less<const llama_grammar_element *>());
}

// Repetitions are right-recursive in llama.cpp and keep stacks flat; a stack this deep is nesting
// (a recursive grammar), which no finite automaton captures.
constexpr size_t kMaxStackDepth = 128;

}  // namespace

struct GrammarAutomaton::Impl {
    struct Key {
        llama_grammar_stacks stacks;  // sorted, unique
        uint32_t partial = 0;
        int32_t remain = 0;
        bool operator<(const Key & o) const {
            if (remain != o.remain) return remain < o.remain;
            if (partial != o.partial) return partial < o.partial;
            return std::lexicographical_compare(stacks.begin(), stacks.end(), o.stacks.begin(), o.stacks.end(), stackLess);
        }
    };

    GrammarPtr scratch;
    int32_t maxStates;
    std::map<Key, int32_t> ids;
    std::vector<const Key *> keys;
    std::vector<uint8_t> accepting;

    int32_t intern(llama_grammar_stacks stacks, uint32_t partial, int32_t remain) {
        std::sort(stacks.begin(), stacks.end(), stackLess);
        stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
        Key k{std::move(stacks), remain > 0 ? partial : 0, remain};
        auto found = ids.find(k);
        if (found != ids.end()) return found->second;
        if (int32_t(keys.size()) >= maxStates) {
            throw GrammarNotFinite("more than " + std::to_string(maxStates) + " automaton states (a recursive or very large grammar)");
        }
        bool accepts = false;
        for (const auto & st : k.stacks) {
            if (st.size() > kMaxStackDepth) {
                throw GrammarNotFinite("grammar rules nest deeper than " + std::to_string(kMaxStackDepth) + " (a recursive grammar)");
            }
            if (st.empty()) {
                accepts = true;
            } else if (st.back()->type == LLAMA_GRETYPE_TOKEN || st.back()->type == LLAMA_GRETYPE_TOKEN_NOT) {
                throw GrammarNotFinite("the grammar matches token ids (<[id]>), not text");
            }
        }
        const int32_t id = int32_t(keys.size());
        auto ins = ids.emplace(std::move(k), id);
        keys.push_back(&ins.first->first);
        accepting.push_back(accepts ? 1 : 0);
        return id;
    }

    int32_t afterChar(const llama_grammar_stacks & stacks, uint32_t cp) {
        bool any = false;
        for (const auto & st : stacks) any = any || (!st.empty() && topAdmits(st.back(), cp));
        if (!any) return -1;
        scratch->stacks = stacks;
        llama_grammar_accept(scratch.get(), cp);
        if (scratch->stacks.empty()) return -1;
        return intern(scratch->stacks, 0, 0);
    }

    // A partial sequence lives on while some stack could still take a character it completes to
    // (llama.cpp's check for a token that ends inside a character).
    int32_t afterPartial(const llama_grammar_stacks & stacks, uint32_t partial, int32_t remain) {
        static const uint32_t kEnd = 0;
        const llama_grammar_candidates probe{{0, &kEnd, llama_partial_utf8{partial, remain}, 0}};
        const llama_grammar_rules & rules = llama_grammar_get_rules(scratch.get());
        for (const auto & st : stacks) {
            if (llama_grammar_reject_candidates_for_stack(rules, st, probe).empty()) return intern(stacks, partial, remain);
        }
        return -1;
    }
};

GrammarAutomaton::GrammarAutomaton(const llama_grammar & grammar, int32_t maxStates) : impl_(new Impl()) {
    impl_->scratch = grammarClone(grammar);
    impl_->maxStates = maxStates;
    if (grammar.partial_utf8.n_remain != 0) throw GrammarNotFinite("the grammar state is inside a UTF-8 sequence");
    impl_->intern(grammar.stacks, 0, 0);
}

GrammarAutomaton::~GrammarAutomaton() = default;

int32_t GrammarAutomaton::states() const { return int32_t(impl_->keys.size()); }

bool GrammarAutomaton::accepting(int32_t state) const { return impl_->accepting[size_t(state)] != 0; }

// Bytes decode as in llama-grammar.cpp's decode_utf8: a multi-byte sequence waits in `partial`
// (continuation bytes checked), and completes into one code point for llama_grammar_accept.
int32_t GrammarAutomaton::step(int32_t state, uint8_t byte) {
    static const int kSeqLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
    const Impl::Key & k = *impl_->keys[size_t(state)];
    if (byte == 0) return -1;  // llama.cpp stops decoding a piece at NUL
    if (k.remain > 0) {
        if ((byte >> 6) != 2) return -1;
        const uint32_t v = (k.partial << 6) + (byte & 0x3F);
        return k.remain == 1 ? impl_->afterChar(k.stacks, v) : impl_->afterPartial(k.stacks, v, k.remain - 1);
    }
    const int remain = kSeqLen[byte >> 4] - 1;
    if (remain < 0) return -1;
    if (remain == 0) return impl_->afterChar(k.stacks, byte);
    return impl_->afterPartial(k.stacks, byte & ((1u << (7 - remain)) - 1), remain);
}

bool grammarAdmitsText(const llama_grammar & grammar, const std::string & text) {
    GrammarPtr g = grammarClone(grammar);
    try {
        llama_grammar_accept_str(*g, text);
    } catch (const std::runtime_error &) {
        return false;  // the stacks ran out: the text leaves the grammar
    }
    for (const auto & stack : g->stacks)
        if (stack.empty()) return g->partial_utf8.n_remain == 0;  // some path is complete
    return false;
}

// ---------------------------------------------------------------------------------------------
// clip

clip_ctx * clipLoad(const std::string & path, const ClipOptions & options) {
    clip_context_params cp{};
    cp.use_gpu = options.useGpu;
    cp.device = nullptr;
    cp.flash_attn_type = clip_flash_attn_type(options.flashAttention);
    cp.image_min_tokens = -1;
    cp.image_max_tokens = -1;
    cp.warmup = options.warmup;
    cp.cb_eval = options.evalCallback;
    cp.cb_eval_user_data = options.evalCallbackData;
    cp.no_alloc = false;
    cp.progress_callback = nullptr;
    cp.progress_callback_user_data = nullptr;
    clip_init_result r = clip_init(path.c_str(), cp);
    if (r.ctx_a != nullptr) clip_free(r.ctx_a);
    if (r.ctx_gen_a != nullptr) clip_free(r.ctx_gen_a);
    return r.ctx_v;
}

void clipFree(clip_ctx * ctx) { clip_free(ctx); }

int32_t clipEmbdWidth(const clip_ctx * ctx) { return clip_n_mmproj_embd(ctx); }

bool clipSupportsBatch(const clip_ctx * ctx) { return clip_support_batch(ctx); }

ClipImages::ClipImages() : batch_(std::make_unique<clip_image_f32_batch>()) {}
ClipImages::~ClipImages() = default;

void ClipImages::resize(size_t n) { batch_->entries.resize(n); }

void ClipImages::set(size_t i, int32_t width, int32_t height, const std::vector<float> & hwc) {
    clip_image_f32 & img = batch_->entries.at(i);
    img.set_size({width, height}, /*is_placeholder=*/true, /*is_audio=*/false);
    img.cpy_buf(hwc);  // reuses the entry's capacity from the last call
}

void ClipImages::clear() { batch_->entries.clear(); }

int32_t clipOutputTokens(const clip_ctx * ctx, const ClipImages & images) {
    return clip_n_output_tokens(ctx, &images.batch_->entries.at(0));
}

bool clipEncode(clip_ctx * ctx, int32_t threads, ClipImages & images, size_t first, size_t count, std::vector<float> & out) {
    auto & entries = images.batch_->entries;
    if (first == 0 && count == entries.size()) return clip_image_batch_encode(ctx, threads, images.batch_.get(), out);
    // A part of the batch: its entries are moved into a batch of their own and back (no copies).
    clip_image_f32_batch part;
    part.entries.resize(count);
    for (size_t i = 0; i < count; i++) std::swap(part.entries[i], entries.at(first + i));
    const bool ok = clip_image_batch_encode(ctx, threads, &part, out);
    for (size_t i = 0; i < count; i++) std::swap(part.entries[i], entries[first + i]);
    return ok;
}

std::vector<DeviceBytes> clipMemoryUsage(const clip_ctx * ctx) {
    std::vector<DeviceBytes> out;
    for (const auto & [dev, bytes] : clip_get_mem_usage(ctx))
        out.push_back({dev != nullptr ? ggml_backend_dev_name(dev) : "unknown", bytes});
    return out;
}

// ---------------------------------------------------------------------------------------------
// clip's vision tower

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

void * cudaEventOf(ggml_backend_event_t event) { return event != nullptr ? event->context : nullptr; }

// ---------------------------------------------------------------------------------------------
// CUDA graphs per step shape

namespace {

// Keys per backend: a decoder's steps come in a few shapes (one token, a token with a forced run of
// each length, each 256-cell KV size); the least recently used key goes to a new shape.
constexpr int kShapeKeys = 32;

using GraphCompute = ggml_status (*)(ggml_backend_t, ggml_cgraph *);

// The ops and sizes of every node, and ggml-cuda's own key (the first node's address, so the splits
// of one graph, on a partly offloaded model, keep keys of their own): two graphs of one shape get the
// same key. A collision only costs speed (ggml-cuda's own check then sees a changed graph and
// captures again).
uint64_t shapeOf(const ggml_cgraph * g) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    auto mix = [&h](uint64_t v) {
        h ^= v;
        h *= 1099511628211ull;
    };
    mix(uint64_t(uintptr_t(g->nodes[0])));
    mix(uint64_t(g->n_nodes));
    for (int i = 0; i < g->n_nodes; i++) {
        const ggml_tensor * t = g->nodes[i];
        mix(uint64_t(t->op));
        for (int d = 0; d < GGML_MAX_DIMS; d++) mix(uint64_t(t->ne[d]));
    }
    return h;
}

}  // namespace

struct ShapeGraphs::Keyed {
    ggml_backend_t backend = nullptr;
    GraphCompute compute = nullptr;  // the backend's own entry
    // The key nodes: empty (ggml_is_empty), op NONE, so ggml-cuda skips them when computing.
    std::array<ggml_tensor, kShapeKeys> keys{};
    std::array<uint64_t, kShapeKeys> shapes{};
    std::array<uint64_t, kShapeKeys> lastUse{};  // 0: free
    uint64_t tick = 0;
    std::atomic<uint64_t> keyed{0};
    std::vector<ggml_tensor *> nodes;  // the graph handed on: a key node, then the graph's nodes

    ggml_status run(ggml_cgraph * g) {
        if (g->n_nodes == 0) return compute(backend, g);
        const uint64_t shape = shapeOf(g);
        int slot = -1, oldest = 0;
        for (int i = 0; i < kShapeKeys && slot < 0; i++) {
            if (lastUse[i] != 0 && shapes[i] == shape) slot = i;
            if (lastUse[i] < lastUse[oldest]) oldest = i;
        }
        if (slot < 0) {
            slot = oldest;
            shapes[slot] = shape;
            keyed.fetch_add(1, std::memory_order_relaxed);
        }
        lastUse[slot] = ++tick;
        nodes.assign(1, &keys[slot]);
        nodes.insert(nodes.end(), g->nodes, g->nodes + g->n_nodes);
        ggml_cgraph withKey = *g;  // the same graph (its uid, use counts, hash set), one node more
        withKey.nodes = nodes.data();
        withKey.n_nodes = g->n_nodes + 1;
        return compute(backend, &withKey);
    }
};

namespace {

// graph_compute receives only the backend: the registry finds our state by it.
std::mutex gShapeMutex;
std::map<ggml_backend_t, ShapeGraphs::Keyed *> gShapeKeyed;

ggml_status shapeKeyedCompute(ggml_backend_t backend, ggml_cgraph * g) {
    ShapeGraphs::Keyed * k = nullptr;
    {
        std::lock_guard<std::mutex> lock(gShapeMutex);
        auto it = gShapeKeyed.find(backend);
        if (it != gShapeKeyed.end()) k = it->second;
    }
    // Called from ggml's C code: no exception may leave it.
    if (k == nullptr) GGML_ABORT("percept: shape graphs: graph_compute on a backend they are not installed on");
    return k->run(g);
}

bool isCuda(ggml_backend_t backend) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev != nullptr ? ggml_backend_dev_backend_reg(dev) : nullptr;
    return reg != nullptr && std::strcmp(ggml_backend_reg_name(reg), "CUDA") == 0;
}

}  // namespace

std::unique_ptr<ShapeGraphs> ShapeGraphs::install(llama_context * ctx) {
    // ggml-cuda reads it once per process and then captures nothing: keys would change nothing.
    if (std::getenv("GGML_CUDA_DISABLE_GRAPHS") != nullptr) return nullptr;
    ggml_backend_sched_t sched = ctx->get_sched();
    std::unique_ptr<ShapeGraphs> out(new ShapeGraphs());
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
        if (!isCuda(backend) || backend->iface.graph_compute == nullptr) continue;
        auto k = std::make_unique<Keyed>();
        k->backend = backend;
        k->compute = backend->iface.graph_compute;
        for (ggml_tensor & t : k->keys) {
            t.type = GGML_TYPE_F32;
            t.op = GGML_OP_NONE;
            std::snprintf(t.name, sizeof(t.name), "percept:shape-key");
        }
        // Owned by `out` from here (its destructor undoes whatever of the rest took place); the
        // backend's entry is replaced last.
        out->backends_.push_back(k.get());
        Keyed * raw = k.release();
        {
            std::lock_guard<std::mutex> lock(gShapeMutex);
            gShapeKeyed[backend] = raw;
        }
        backend->iface.graph_compute = shapeKeyedCompute;
    }
    if (out->backends_.empty()) return nullptr;
    return out;
}

ShapeGraphs::~ShapeGraphs() {
    for (Keyed * k : backends_) {
        k->backend->iface.graph_compute = k->compute;
        {
            std::lock_guard<std::mutex> lock(gShapeMutex);
            gShapeKeyed.erase(k->backend);
        }
        delete k;
    }
}

uint64_t ShapeGraphs::shapesKeyed() const {
    uint64_t n = 0;
    for (const Keyed * k : backends_) n += k->keyed.load(std::memory_order_relaxed);
    return n;
}

}  // namespace percept
