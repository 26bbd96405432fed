#include "speculator.h"

#include "model.h"
#include "util.h"

#include "speculative.h"

#include <algorithm>
#include <stdexcept>

namespace percept {

namespace {

common_params_speculative speculativeParams(llama_context * target, const SpecOptions & o) {
    common_params_speculative params;
    params.types = {common_speculative_type_from_name(o.type)};
    params.draft.n_max = o.nMax;
    params.draft.n_min = o.nMin;
    params.draft.p_min = o.pMin;
    params.draft.backend_sampling = false;  // draft sampling on the CPU sampler: same on every backend
    params.draft.ctx_tgt = target;
    params.ngram_simple.size_n = uint16_t(o.ngramN);
    params.ngram_simple.size_m = uint16_t(o.nMax);
    params.ngram_map_k.size_n = uint16_t(o.ngramN);
    params.ngram_map_k.size_m = uint16_t(o.nMax);
    params.ngram_map_k4v.size_n = uint16_t(o.ngramN);
    params.ngram_map_k4v.size_m = uint16_t(o.nMax);
    return params;
}

}  // namespace

SpecState::SpecState(llama_context * target, Model * draft, llama_context_params draftParams, ggml_threadpool * threadpool,
                     const SpecOptions & options) {
    try {
        common_params_speculative params = speculativeParams(target, options);
        if (draft != nullptr) {
            draft_ = draft;
            draft_->retain();
            draftParams.n_seq_max = 1;
            draftParams.n_outputs_max = 1;
            if (options.type == "draft-mtp") {
                draftParams.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
                draftParams.ctx_other = target;  // the assistant reads the target's KV and token embeddings
            }
            LogCapture capture;
            ctxDft_ = llama_init_from_model(draft->raw(), draftParams);
            if (ctxDft_ == nullptr) {
                std::string why = capture.text();
                throw std::runtime_error("failed to create the draft context" + (why.empty() ? std::string() : ": " + why));
            }
            if (threadpool != nullptr) llama_attach_threadpool(ctxDft_, threadpool, nullptr);
            params.draft.ctx_dft = ctxDft_;
        }
        spec_ = common_speculative_init(params, 1);
        if (spec_ == nullptr) throw std::runtime_error("common_speculative_init returned no implementation for '" + options.type + "'");
        type_ = options.type;
        pMin_ = options.pMin;
        const int32_t nMax = common_speculative_n_max(spec_);
        nMax_ = nMax > 0 ? std::min(nMax, options.nMax) : options.nMax;
        llama_memory_seq_rm(llama_get_memory(target), 0, -1, -1);
        truncate(0);
    } catch (...) {
        free();
        throw;
    }
}

SpecState::~SpecState() { free(); }

void SpecState::free() {
    if (spec_ != nullptr) common_speculative_free(spec_);
    spec_ = nullptr;
    if (ctxDft_ != nullptr) llama_free(ctxDft_);
    ctxDft_ = nullptr;
    if (draft_ != nullptr) draft_->release();
    draft_ = nullptr;
}

void SpecState::truncate(llama_pos from) {
    if (ctxDft_ == nullptr) return;
    llama_memory_t m = llama_get_memory(ctxDft_);
    if (m != nullptr) llama_memory_seq_rm(m, 0, from, -1);
}

}  // namespace percept
