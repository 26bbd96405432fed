// One generation on a Context, as small steps in the shape of mtmd-helper's eval_chunks → eval_chunk_single → decode_image_chunk.
// Plan the prompt (prompt.h), prefill what the KV cache lacks, and sample the first token.
// Then per step: jump forward over tokens the grammar alone decides, draft, decode, and verify.
// Runs off the JS thread and knows nothing of JS.
#pragma once

#include "grammar.h"
#include "llama.h"
#include "prompt.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace percept {

class Context;
class Model;
struct ModelInfo;

// A batch of token ids owned by us (llama_batch_init/free RAII); each token names its sequence.
struct TokenBatch {
    llama_batch b;
    explicit TokenBatch(int32_t n) : b(llama_batch_init(n, 0, 1)) {}
    ~TokenBatch() { llama_batch_free(b); }
    TokenBatch(const TokenBatch &) = delete;
    TokenBatch & operator=(const TokenBatch &) = delete;
    void clear() { b.n_tokens = 0; }
    void add(llama_token t, llama_pos pos, bool logits, llama_seq_id seq = 0) {
        int i = b.n_tokens++;
        b.token[i] = t;
        b.pos[i] = pos;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = seq;
        b.logits[i] = logits;
    }
};

struct GenerateOptions {
    int32_t maxTokens = 0;
    SamplingOptions sampling;
    std::vector<std::string> stopStrings;
    std::vector<int32_t> stopTokens;
    bool ignoreEos = false;
    bool jumpForward = false;
    bool recordSampleTimes = false;
    int32_t topLogits = 0;  // K > 0: record the K largest raw logits of every sampled row (parity tests)
    bool speculative = false;
    int32_t nDraft = -1;  // -1: the speculator's nMax
    int64_t deadlineNs = 0;
    bool cancellable = false;  // a cancel may come while llama.cpp computes
};

// The K largest raw logits of one sampled row, highest first; step indexes the token it sampled in tokens.
struct TopLogits {
    int32_t step = 0;
    std::vector<llama_token> ids;
    std::vector<float> logits;
};

struct GenerateResult {
    std::vector<llama_token> tokens;
    std::string text;
    std::string stopReason = "max_tokens";
    int32_t promptTokens = 0;
    int32_t reusedTokens = 0;
    int32_t prefillTokens = 0;
    int32_t drafted = 0;
    int32_t accepted = 0;
    int32_t forced = 0;
    int32_t draftsCut = 0;  // draft tokens the grammar refused, cut before verification
    int32_t decodeCalls = 0;
    int32_t prefillDecodeCalls = 0;  // llama_decode calls of the prefill (single sequence; batched: 0, shared steps)
    // Generation decodes of one token, apart from those with more: a token and its forced run, or drafts.
    // llama.cpp reuses its graph, and ggml-cuda its CUDA graph, only while the shape stays.
    int32_t singleDecodeCalls = 0;
    int32_t graphReuses = 0;
    int32_t paddedSteps = 0;  // steps padded to the context's stepTokens
    double singleDecodeMs = 0;
    std::vector<float> sampleUs;       // per sampling step, with recordSampleTimes
    std::vector<TopLogits> topLogits;  // per sampled row, with topLogits > 0
    double prefillMs = 0, ttftMs = 0, decodeMs = 0, sampleMs = 0, draftMs = 0, llamaDecodeMs = 0;
};

// Receives accepted tokens as they come (streaming); called on the generating thread.
using TokenSink = std::function<void(const std::vector<llama_token> & tokens)>;

// Steps every generation shares (one sequence here, many in batch.h).

// llama_tokenize with special tokens parsed, as planPrompt wants it.
Tokenizer vocabTokenizer(const llama_vocab * vocab);
// The prompt planned against what the sequence's cache holds, checked against the context size
// (nCtxSeq positions per sequence). Throws on an empty prompt, CodedFailure ERANGE on overflow.
PromptPlan planChecked(const Model & model, const std::vector<Segment> & segments, const std::vector<CacheItem> & cache, int32_t maxTokens,
                       int32_t nCtxSeq);
// Whether an image is decoded with bidirectional attention (the model's rule, unless forced causal).
bool imageNonCausal(const ModelInfo & mi, const PromptItem & p);
// Attention reads both ways while alive (an image under its model's rule), causal again after, thrown or not.
struct NonCausalScope {
    llama_context * ctx;
    bool on;
    NonCausalScope(llama_context * c, bool enabled) : ctx(c), on(enabled) {
        if (on) llama_set_causal_attn(ctx, false);
    }
    ~NonCausalScope() {
        if (on) llama_set_causal_attn(ctx, true);
    }
    NonCausalScope(const NonCausalScope &) = delete;
    NonCausalScope & operator=(const NonCausalScope &) = delete;
};
// Appends a generated token's id and text to the result. True when generation must stop, with the stop reason set.
// A stop token is not appended. At a stop string the text is cut before it. Max tokens also stops.
bool appendOutput(const llama_vocab * vocab, const GenerateOptions & opts, GenerateResult & res, llama_token t);

class Generation {
public:
    Generation(Context & ctx, std::vector<Segment> segments, GenerateOptions options, GrammarInstance grammar, TokenSink sink);
    // Runs to a stop reason; throws std::runtime_error (CodedFailure for ERANGE) on failure.
    GenerateResult run();

private:
    // Steps, in order.
    PromptPlan plan();
    void reuseCache(const PromptPlan & plan);
    bool prefill(const PromptPlan & plan);
    void generate(int64_t tStart);
    bool sampleFirst(int64_t tStart);
    int32_t paddedWidth() const;
    bool jumpForward(TokenBatch & batch, int32_t width);
    std::vector<llama_token> draft(const TokenBatch & batch);
    std::vector<llama_token> draftUnderGrammar(const TokenBatch & batch, int32_t nMax);
    void cutInvalidDrafts(std::vector<llama_token> & drafted);
    bool acceptSampled();
    bool verify(const std::vector<llama_token> & draft, int32_t firstRow);

    // Helpers.
    bool grammarEnded();
    bool stopped();
    int aborted();
    int decodeTokens(TokenBatch & batch, int32_t nReal = -1);
    int decodeCounted(const llama_batch & b, llama_pos pos0, const char * what, bool single = false);
    int decodeImage(const PromptItem & p, llama_pos pos0);
    bool mixesWithText(const PromptItem & p) const;
    int decodeImageWithText(const PromptItem & p, llama_pos pos0, TokenBatch & text);
    void keepImage(const PromptItem & p);
    void keepTokens(const TokenBatch & batch, int32_t n);
    void truncateKv(llama_pos from);
    llama_token sampleAt(int32_t idx, int32_t ahead = 0);
    void recordTopLogits(int32_t idx, int32_t step);
    bool pushOutput(llama_token t);
    void flush();
    bool isEog(llama_token t) const;

    Context & ctx_;
    std::vector<Segment> segments_;
    GenerateOptions opts_;
    Sampler sampler_;
    TokenSink sink_;
    bool speculate_ = false;
    bool commonDraft_ = false;          // the last drafts came from common_speculative_draft
    std::vector<llama_token> history_;  // every token in the KV cache (images as placeholders), for the speculator
    std::vector<llama_token> emitted_;  // accepted since the last flush
    llama_pos nPast_ = 0;
    llama_token idLast_ = -1;
    int32_t openingRun_ = 0;     // forced tokens decoded with the prompt
    bool stoppedEarly_ = false;  // the opening run ended generation (an output stopped it, or the grammar is complete)
    int64_t tFirst_ = 0;
    GenerateResult res_;
};

}  // namespace percept
