// Speculative decoding state of one Context, through llama.cpp's common/speculative.
// Drafts come from a draft model, a Gemma 4 MTP assistant, or n-gram lookup.
// It holds the draft llama_context, if any, and the common_speculative. The Context owns it; the generation loop drives it.
#pragma once

#include "llama.h"

#include <cstdint>
#include <string>

struct common_speculative;
struct ggml_threadpool;

namespace percept {

class Model;

struct SpecOptions {
    std::string type;  // a common_speculative type name: draft-simple, draft-mtp, ngram-simple, ...
    int32_t nMax = 0;
    int32_t nMin = 0;
    float pMin = 0.0f;
    int32_t ngramN = 0;
};

class SpecState {
public:
    // Creates the draft context on `draft` (draft-simple, draft-mtp; `draftParams` as the target's) and the common_speculative.
    // Then it clears the target's KV, since the draft state must see every target batch from now on.
    // Slow, so it runs off the JS thread. Throws std::runtime_error on failure.
    SpecState(llama_context * target, Model * draft, llama_context_params draftParams, ggml_threadpool * threadpool,
              const SpecOptions & options);
    ~SpecState();
    SpecState(const SpecState &) = delete;
    SpecState & operator=(const SpecState &) = delete;

    common_speculative * spec() const { return spec_; }
    llama_context * draftContext() const { return ctxDft_; }
    const std::string & type() const { return type_; }
    int32_t nMax() const { return nMax_; }
    // Drafts stop below this probability (draft models).
    float pMin() const { return pMin_; }
    // draft-simple keeps its own KV, which must mirror the target's positions.
    bool ownsMemory() const { return type_ == "draft-simple"; }
    // Removes KV positions [from, end) of the draft context, if it has its own memory.
    void truncate(llama_pos from);

private:
    void free();

    Model * draft_ = nullptr;  // retained while the draft context lives
    llama_context * ctxDft_ = nullptr;
    common_speculative * spec_ = nullptr;
    std::string type_;
    int32_t nMax_ = 0;
    float pMin_ = 0.0f;
};

}  // namespace percept
