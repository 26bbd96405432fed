// Grammar: a parsed GBNF grammar bound to a model's vocabulary, with its token index when it has
// one (JS class); and Sampler: the per-generation sampling state (chain, grammar state, forced
// tokens), C++ only.
#pragma once

#include <napi.h>

#include "grammar-index.h"
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

// One generation's grammar: the token index when the grammar has one (a state number is all the
// generation keeps), else a clone of the llama_grammar (the full-vocabulary path).
struct GrammarInstance {
    std::shared_ptr<const GrammarIndex> index;
    GrammarPtr grammar;
    explicit operator bool() const { return index != nullptr || grammar != nullptr; }
};

class Grammar : public Napi::ObjectWrap<Grammar> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Grammar(const Napi::CallbackInfo & info);

    GrammarInstance instantiate() const;
    Model * model() const { return model_; }
    const llama_grammar & proto() const { return *proto_; }
    const std::string & key() const { return key_; }
    // Set once by the index build (on the JS thread).
    void setIndex(GrammarIndexCache::Result r);
    const std::shared_ptr<const GrammarIndex> & index() const { return index_; }

private:
    Napi::Value Source(const Napi::CallbackInfo & info);
    Napi::Value BuildIndex(const Napi::CallbackInfo & info);
    Napi::Value IndexInfo(const Napi::CallbackInfo & info);
    Napi::Value AllowedTokens(const Napi::CallbackInfo & info);
    Napi::Value ForcedTokens(const Napi::CallbackInfo & info);
    Napi::Value Admits(const Napi::CallbackInfo & info);

    Napi::ObjectReference modelRef_;
    Model * model_ = nullptr;
    std::string gbnf_;
    std::string key_;  // gbnf + root: the index cache key
    GrammarPtr proto_;
    bool built_ = false;
    std::shared_ptr<const GrammarIndex> index_;
    std::string why_;  // why there is no index
    GrammarIndexStats stats_;
};

struct SamplingOptions {
    float temperature = 0.0f;  // 0: greedy
    int32_t topK = 0;          // 0: off
    float topP = 1.0f;
    float minP = 0.0f;
    uint32_t seed = 0;
};

// Sampling for one generation. With a token index: greedy takes the best logit among the tokens
// the grammar state admits, sampling runs the chain over those candidates only, and the tokens
// the grammar alone decides (a forced run) are returned without looking at the logits, the same
// with or without jump-forward. Without an index, the way common_sampler does it (sample, then
// check the grammar only on the chosen token, and resample with the grammar applied to the whole
// vocabulary only when rejected). Greedy without a grammar is a fast argmax.
class Sampler {
public:
    Sampler(Model * model, const SamplingOptions & opts, GrammarInstance grammar);

    llama_token sample(llama_context * ctx, int32_t idx);
    void accept(llama_token token);
    bool hasGrammar() const { return bool(cursor_) || grammar_ != nullptr; }
    // The grammar's token index position (empty without an index): drafting walks a copy.
    const IndexCursor & cursor() const { return cursor_; }

    // The grammar admits nothing but end-of-generation.
    bool grammarComplete() const;
    // The next token the grammar alone decides, or -1 when the model has a choice. With an index:
    // the pending forced run. Without: a token that is the only admissible one (every grammar
    // stack must demand the same single literal character, and only tokens whose piece starts
    // with that character's first byte are tested against the grammar).
    llama_token forcedToken();

private:
    bool grammarAllows(llama_token token);
    // The k highest-logit tokens the grammar admits, best first (ties: lower id first), found by
    // testing candidates in growing chunks of the logit order instead of the whole vocabulary.
    std::vector<llama_token_data> topAllowed(const float * logits, size_t k);

    Model * model_;
    SamplingOptions opts_;
    IndexCursor cursor_;
    GrammarPtr grammar_;
    SamplerChainPtr chain_;  // null when greedy
    int32_t nVocab_;
    std::vector<llama_token_data> cur_;
    std::vector<llama_token> order_;
};

}  // namespace percept
