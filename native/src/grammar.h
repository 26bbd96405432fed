// Grammar: a parsed GBNF grammar bound to a model's vocabulary (JS class), and Sampler: the
// per-generation sampling state (chain + grammar clone + jump-forward detection), C++ only.
#pragma once

#include <napi.h>

#include "llama-internal.h"
#include "llama.h"

#include <bitset>
#include <memory>
#include <string>
#include <vector>

namespace percept {

class Model;

struct SamplerChainDeleter {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using SamplerChainPtr = std::unique_ptr<llama_sampler, SamplerChainDeleter>;

class Grammar : public Napi::ObjectWrap<Grammar> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Grammar(const Napi::CallbackInfo & info);

    // A fresh grammar state for one generation.
    GrammarPtr instantiate() const { return grammarClone(*proto_); }
    Model * model() const { return model_; }

private:
    Napi::Value Source(const Napi::CallbackInfo & info);

    Napi::ObjectReference modelRef_;
    Model * model_ = nullptr;
    std::string gbnf_;
    GrammarPtr proto_;
};

struct SamplingOptions {
    float temperature = 0.0f;  // 0: greedy
    int32_t topK = 0;          // 0: off
    float topP = 1.0f;
    float minP = 0.0f;
    uint32_t seed = 0;
};

// Sampling for one generation, the way common_sampler does it (sample, then check the grammar
// only on the chosen token, and resample with the grammar applied to the whole vocabulary only
// when rejected), plus a fast argmax path for greedy decoding without a grammar.
class Sampler {
public:
    Sampler(Model * model, const SamplingOptions & opts, GrammarPtr grammar);

    llama_token sample(llama_context * ctx, int32_t idx);
    void accept(llama_token token);
    bool hasGrammar() const { return grammar_ != nullptr; }

    // The grammar admits nothing but end-of-generation (every stack is complete).
    bool grammarComplete() const;
    // If the grammar admits exactly one next token, returns it; -1 otherwise. Cheap check first:
    // every grammar stack must demand the same single literal character, and only tokens whose
    // piece starts with that character's first byte are then tested against the grammar.
    llama_token forcedToken();

private:
    bool grammarAllows(llama_token token);
    // The k highest-logit tokens the grammar admits, best first (ties: lower id first), found by
    // testing candidates in growing chunks of the logit order instead of the whole vocabulary.
    std::vector<llama_token_data> topAllowed(const float * logits, size_t k);

    Model * model_;
    SamplingOptions opts_;
    GrammarPtr grammar_;
    SamplerChainPtr chain_;  // null when greedy
    int32_t nVocab_;
    std::vector<llama_token_data> cur_;
    std::vector<llama_token> order_;
};

}  // namespace percept
