#include "llama-internal.h"

#include "clip-impl.h"  // clip_image_f32 (its buffer is interleaved RGB, row-major)
#include "clip.h"
#include "ggml-backend.h"
#include "llama-ext.h"  // llama_get_memory_breakdown
#include "llama-grammar.h"

#include <algorithm>

namespace percept {

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
// clip

clip_ctx * clipLoad(const std::string & path, const ClipOptions & options) {
    clip_context_params cp{};
    cp.use_gpu = options.useGpu;
    cp.device = nullptr;
    cp.flash_attn_type = clip_flash_attn_type(options.flashAttention);
    cp.image_min_tokens = -1;
    cp.image_max_tokens = -1;
    cp.warmup = options.warmup;
    cp.cb_eval = nullptr;
    cp.cb_eval_user_data = nullptr;
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

int32_t clipEncode(clip_ctx * ctx, int32_t threads, int32_t width, int32_t height, std::vector<float> && hwc, std::vector<float> & out) {
    clip_image_f32 img;
    img.set_size({width, height}, /*is_placeholder=*/true, /*is_audio=*/false);
    img.cpy_buf(hwc);
    std::vector<float>().swap(hwc);  // free the staging copy before the encode allocates
    const int32_t nTokens = clip_n_output_tokens(ctx, &img);
    out.assign(size_t(nTokens) * size_t(clip_n_mmproj_embd(ctx)), 0.0f);
    return clip_image_encode(ctx, threads, &img, out) ? nTokens : -1;
}

std::vector<DeviceBytes> clipMemoryUsage(const clip_ctx * ctx) {
    std::vector<DeviceBytes> out;
    for (const auto & [dev, bytes] : clip_get_mem_usage(ctx))
        out.push_back({dev != nullptr ? ggml_backend_dev_name(dev) : "unknown", bytes});
    return out;
}

}  // namespace percept
