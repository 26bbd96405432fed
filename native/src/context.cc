#include "context.h"

#include "util.h"
#include "grammar.h"
#include "llama-internal.h"
#include "model.h"
#include "speculator.h"

#include "speculative.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

namespace percept {

namespace {

double msSince(int64_t t0) { return double(monotonicNs() - t0) / 1e6; }

// ------------------------------------------------------------------------------------------------
// Context creation

class CreateWorker : public PromiseWorker {
public:
    CreateWorker(Napi::Env env, Napi::Object modelObj, Model * model, ContextOptions opts)
        : PromiseWorker(env, "percept:Context.create", "ECONTEXT"), model_(model), opts_(std::move(opts)) {
        modelRef_ = Napi::Persistent(modelObj);
        model_->retain();  // the model cannot be disposed while we create on it
    }
    ~CreateWorker() override {
        if (ctx_ != nullptr) llama_free(ctx_);
        if (opts_.threadpool != nullptr) ggml_threadpool_free(opts_.threadpool);
        model_->release();
    }

protected:
    void Execute() override {
        try {
            llama_context_params cp = llama_context_default_params();
            cp.n_ctx = opts_.nCtx;
            cp.n_batch = opts_.nBatch;
            cp.n_ubatch = opts_.nUbatch;
            cp.n_seq_max = opts_.nSeq;
            cp.n_outputs_max = opts_.maxOutputs;
            int32_t threads = opts_.threads > 0 ? opts_.threads : int32_t(std::max(1u, std::thread::hardware_concurrency()));
            cp.n_threads = threads;
            cp.n_threads_batch = threads;
            cp.flash_attn_type = llama_flash_attn_type(opts_.flashAttention);
            ggml_type kv = opts_.kvType == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
            cp.type_k = kv;
            cp.type_v = kv;
            cp.swa_full = true;  // partial KV removal (prefix reuse, rejected drafts) needs the full SWA cache
            cp.no_perf = true;
            LogCapture capture;
            ctx_ = llama_init_from_model(model_->raw(), cp);
            if (ctx_ == nullptr) {
                std::string why = capture.text();
                SetError("failed to create context" + (why.empty() ? std::string() : ": " + why));
            }
            opts_.threads = threads;
            if (ctx_ != nullptr) {
                ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
                opts_.threadpool = ggml_threadpool_new(&tpp);
                if (opts_.threadpool != nullptr) llama_attach_threadpool(ctx_, opts_.threadpool, nullptr);
            }
        } catch (const std::exception & e) {
            SetError(std::string("failed to create context: ") + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        llama_context * c = ctx_;
        ctx_ = nullptr;
        auto * boxed = new ContextOptions(opts_);
        opts_.threadpool = nullptr;  // owned by the Context now
        Napi::Object obj = addonData(env).contextCtor.New(
            {modelRef_.Value(), Napi::External<llama_context>::New(env, c),
             Napi::External<ContextOptions>::New(env, boxed, [](Napi::Env, ContextOptions * p) { delete p; })});
        deferred_.Resolve(obj);
    }

private:
    Napi::ObjectReference modelRef_;
    Model * model_;
    ContextOptions opts_;
    llama_context * ctx_ = nullptr;
};

// ------------------------------------------------------------------------------------------------
// Generation

struct Segment {
    enum Kind { Text, Tokens, Image } kind = Text;
    std::string text;
    bool addSpecial = false;
    std::vector<int32_t> tokens;
    std::vector<float> embd;
    int32_t nTokens = 0;
    bool forceCausal = false;  // decode the image causally whatever the model's rule (experiments, tests)
};

struct PromptItem {
    CacheItem item;
    const float * embd = nullptr;  // image rows (nTokens × nEmbd)
    bool forceCausal = false;
};

struct GenerateOptions {
    int32_t maxTokens = 0;
    SamplingOptions sampling;
    std::vector<std::string> stopStrings;
    std::vector<int32_t> stopTokens;
    bool ignoreEos = false;
    bool jumpForward = false;
    bool speculative = true;
    int32_t nDraft = -1;  // -1: the speculator's nMax
    int64_t deadlineNs = 0;
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
    int32_t decodeCalls = 0;
    double prefillMs = 0, ttftMs = 0, decodeMs = 0, sampleMs = 0, draftMs = 0, llamaDecodeMs = 0;
};

uint64_t hashFloats(const std::vector<float> & v) {
    // FNV-1a over 64-bit words: equal images give equal hashes; used only to detect reuse.
    uint64_t h = 1469598103934665603ULL ^ uint64_t(v.size());
    const uint8_t * p = reinterpret_cast<const uint8_t *>(v.data());
    size_t n = v.size() * sizeof(float);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

void onTokensJs(Napi::Env env, Napi::Function fn, std::nullptr_t *, std::vector<llama_token> * tokens) {
    if (env != nullptr && fn != nullptr) {
        Napi::Int32Array arr = Napi::Int32Array::New(env, tokens->size());
        std::copy(tokens->begin(), tokens->end(), arr.Data());
        try {
            fn.Call({arr});
        } catch (...) {}
    }
    delete tokens;
}
using TokenTsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, std::vector<llama_token>, onTokensJs>;

// A batch of token ids owned by us (llama_batch_init/free RAII).
struct TokenBatch {
    llama_batch b;
    explicit TokenBatch(int32_t n) : b(llama_batch_init(n, 0, 1)) {}
    ~TokenBatch() { llama_batch_free(b); }
    void clear() { b.n_tokens = 0; }
    void add(llama_token t, llama_pos pos, bool logits) {
        int i = b.n_tokens++;
        b.token[i] = t;
        b.pos[i] = pos;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = logits;
    }
};

class GenerateWorker : public PromiseWorker {
public:
    GenerateWorker(Napi::Env env, Napi::Object self, Context * ctx, std::vector<Segment> segments, GenerateOptions opts, GrammarPtr grammar,
                   Napi::Object grammarObj, Napi::Value onTokens)
        : PromiseWorker(env, "percept:Context.generate", "EGENERATE"), self_(Napi::Persistent(self)), ctx_(ctx),
          segments_(std::move(segments)), opts_(std::move(opts)), grammar_(std::move(grammar)) {
        if (!grammarObj.IsEmpty()) grammarRef_ = Napi::Persistent(grammarObj);
        if (onTokens.IsFunction()) {
            tsfn_ = TokenTsfn::New(env, onTokens.As<Napi::Function>(), "percept-tokens", 0, 1);
            hasTsfn_ = true;
        }
        if (ctx_->speculator() != nullptr) specRef_ = Napi::Persistent(ctx_->speculator()->Value());
    }
    ~GenerateWorker() override {
        if (hasTsfn_) tsfn_.Release();
    }

protected:
    void Execute() override {
        try {
            run();
        } catch (const CodedFailure & e) {
            SetCodedError(e.code, e.what());
        } catch (const std::exception & e) {
            SetError(e.what());
        }
    }

    void OnOK() override {
        Napi::Env env = Env();
        ctx_->releaseBusy();
        Napi::Object o = Napi::Object::New(env);
        Napi::Int32Array toks = Napi::Int32Array::New(env, res_.tokens.size());
        std::copy(res_.tokens.begin(), res_.tokens.end(), toks.Data());
        o.Set("tokens", toks);
        o.Set("text", Napi::String::New(env, res_.text));
        o.Set("stopReason", res_.stopReason);
        o.Set("promptTokens", res_.promptTokens);
        o.Set("reusedTokens", res_.reusedTokens);
        o.Set("drafted", res_.drafted);
        o.Set("accepted", res_.accepted);
        o.Set("forced", res_.forced);
        Napi::Object t = Napi::Object::New(env);
        t.Set("prefillMs", res_.prefillMs);
        t.Set("prefillTokens", res_.prefillTokens);
        t.Set("ttftMs", res_.ttftMs);
        t.Set("decodeMs", res_.decodeMs);
        t.Set("decodeTokens", std::max<int32_t>(0, int32_t(res_.tokens.size()) - 1));
        t.Set("decodeCalls", res_.decodeCalls);
        t.Set("sampleMs", res_.sampleMs);
        t.Set("draftMs", res_.draftMs);
        t.Set("llamaDecodeMs", res_.llamaDecodeMs);
        o.Set("timings", t);
        deferred_.Resolve(o);
    }

    void OnError(const Napi::Error & e) override {
        ctx_->releaseBusy();
        PromiseWorker::OnError(e);
    }

private:
    // -- helpers ---------------------------------------------------------------------------------

    void emit(const std::vector<llama_token> & toks) {
        if (hasTsfn_ && !toks.empty()) tsfn_.NonBlockingCall(new std::vector<llama_token>(toks));
    }

    // Decodes a token batch; keeps the cache, the prompt history and the speculator in step.
    // Returns 0 on success, 2 when aborted (cancel/deadline); throws on other failures.
    int decodeTokens(TokenBatch & batch) {
        llama_context * lctx = ctx_->raw();
        const llama_pos p0 = batch.b.pos[0];
        const int64_t td0 = monotonicNs();
        int ret = llama_decode(lctx, batch.b);
        llama_synchronize(lctx);
        res_.llamaDecodeMs += msSince(td0);
        res_.decodeCalls++;
        if (ret == 2) {
            llama_memory_seq_rm(llama_get_memory(lctx), 0, p0, -1);
            return 2;
        }
        if (ret != 0) {
            llama_memory_seq_rm(llama_get_memory(lctx), 0, p0, -1);
            throw std::runtime_error(ret == 1 ? "llama_decode: no KV slot for the batch (context full)"
                                              : "llama_decode failed with code " + std::to_string(ret));
        }
        for (int i = 0; i < batch.b.n_tokens; i++) {
            CacheItem it;
            it.token = batch.b.token[i];
            ctx_->cache().push_back(it);
            history_.push_back(batch.b.token[i]);
        }
        if (Speculator * s = ctx_->speculator()) {
            if (!common_speculative_process(s->spec(), batch.b)) throw std::runtime_error("speculator failed to process a batch");
        }
        return 0;
    }

    int decodeImage(const PromptItem & p, llama_pos pos0) {
        llama_context * lctx = ctx_->raw();
        const ModelInfo & mi = ctx_->model()->info();
        const int32_t n = p.item.imageTokens;
        const bool nonCausal = mi.imageAttention != "causal" && !p.forceCausal;
        if (uint32_t(n) > ctx_->options().nBatch) {
            throw std::runtime_error("image of " + std::to_string(n) + " tokens exceeds nBatch " + std::to_string(ctx_->options().nBatch));
        }
        if (nonCausal && uint32_t(n) > ctx_->options().nUbatch) {
            throw std::runtime_error("image of " + std::to_string(n) + " tokens must fit one ubatch for " + mi.imageAttention +
                                     " attention; raise nUbatch to at least " + std::to_string(n));
        }
        std::vector<llama_pos> pos(n);
        std::vector<int32_t> nSeq(n, 1);
        llama_seq_id seq0 = 0;
        std::vector<llama_seq_id *> seqIds(n, &seq0);
        std::vector<int8_t> logits(n, 0);
        for (int32_t i = 0; i < n; i++) pos[i] = pos0 + i;
        llama_batch b{n, nullptr, const_cast<float *>(p.embd), pos.data(), nSeq.data(), seqIds.data(), logits.data()};
        if (nonCausal) llama_set_causal_attn(lctx, false);
        int ret = llama_decode(lctx, b);
        if (nonCausal) llama_set_causal_attn(lctx, true);
        res_.decodeCalls++;
        if (ret != 0) {
            llama_memory_seq_rm(llama_get_memory(lctx), 0, pos0, -1);
            if (ret == 2) return 2;
            throw std::runtime_error(ret == 1 ? "llama_decode: no KV slot for the image (context full)"
                                              : "llama_decode (image) failed with code " + std::to_string(ret));
        }
        ctx_->cache().push_back(p.item);
        for (int32_t i = 0; i < n; i++) history_.push_back(mi.imageStartToken);
        if (Speculator * s = ctx_->speculator()) {
            if (s->ownsMemory()) {
                // The draft model cannot read the target's image rows: keep its positions aligned
                // with placeholder tokens so later text lands at the same positions.
                TokenBatch ph(n);
                for (int32_t i = 0; i < n; i++) ph.add(mi.imageStartToken, pos0 + i, false);
                ph.b.logits[n - 1] = 1;
                if (llama_decode(s->draftContext(), ph.b) != 0) throw std::runtime_error("draft model failed to decode image placeholders");
            } else if (!common_speculative_process(s->spec(), b)) {
                throw std::runtime_error("speculator failed to process the image batch");
            }
        }
        return 0;
    }

    void truncateKv(llama_pos from) {
        llama_memory_seq_rm(llama_get_memory(ctx_->raw()), 0, from, -1);
        if (Speculator * s = ctx_->speculator()) {
            if (s->draftContext() != nullptr) {
                llama_memory_t m = llama_get_memory(s->draftContext());
                if (m != nullptr) llama_memory_seq_rm(m, 0, from, -1);
            }
        }
    }

    const char * stopReasonOf(int code) const { return code == 2 ? "deadline" : "cancelled"; }

    // Appends a generated token to the output; returns true when generation must stop.
    bool pushOutput(llama_token t, std::vector<llama_token> & emitted) {
        const llama_vocab * vocab = ctx_->model()->vocab();
        for (int32_t s : opts_.stopTokens) {
            if (s == t) {
                res_.stopReason = "stop";
                return true;
            }
        }
        res_.tokens.push_back(t);
        emitted.push_back(t);
        char buf[256];
        int n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, false);
        std::string piece = n >= 0 ? std::string(buf, n) : std::string();
        if (n < 0) {
            piece.resize(-n);
            llama_token_to_piece(vocab, t, piece.data(), -n, 0, false);
        }
        const size_t before = res_.text.size();
        res_.text += piece;
        for (const std::string & stop : opts_.stopStrings) {
            size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
            size_t at = res_.text.find(stop, from);
            if (at != std::string::npos) {
                res_.text.resize(at);
                res_.stopReason = "stop";
                return true;
            }
        }
        if (int32_t(res_.tokens.size()) >= opts_.maxTokens) {
            res_.stopReason = "max_tokens";
            return true;
        }
        return false;
    }

    bool isEog(llama_token t) const { return llama_vocab_is_eog(ctx_->model()->vocab(), t); }

    // -- the call --------------------------------------------------------------------------------

    void run() {
        const int64_t tStart = monotonicNs();
        Model * model = ctx_->model();
        const ModelInfo & mi = model->info();
        const llama_vocab * vocab = model->vocab();
        llama_context * lctx = ctx_->raw();
        const int32_t nCtx = int32_t(llama_n_ctx(lctx));
        const int32_t nBatch = int32_t(ctx_->options().nBatch);

        // 1. The prompt as cache items (tokenizing here, off the JS thread).
        std::vector<PromptItem> items;
        for (size_t si = 0; si < segments_.size(); si++) {
            Segment & s = segments_[si];
            if (s.kind == Segment::Text) {
                std::vector<llama_token> toks(s.text.size() + 8);
                int n = llama_tokenize(vocab, s.text.data(), int32_t(s.text.size()), toks.data(), int32_t(toks.size()), s.addSpecial, true);
                if (n < 0) {
                    toks.resize(-n);
                    n = llama_tokenize(vocab, s.text.data(), int32_t(s.text.size()), toks.data(), -n, s.addSpecial, true);
                }
                for (int i = 0; i < n; i++) items.push_back({CacheItem{toks[i], 0, 0}, nullptr});
            } else if (s.kind == Segment::Tokens) {
                for (int32_t t : s.tokens) items.push_back({CacheItem{t, 0, 0}, nullptr});
            } else {
                items.push_back({CacheItem{mi.imageStartToken, 0, 0}, nullptr});
                // The attention mode is part of the KV content: fold it into the identity.
                uint64_t h = hashFloats(s.embd) ^ (s.forceCausal ? 0x9E3779B97F4A7C15ULL : 0);
                items.push_back({CacheItem{-1, h, s.nTokens}, s.embd.data(), s.forceCausal});
                items.push_back({CacheItem{mi.imageEndToken, 0, 0}, nullptr});
            }
        }
        int32_t promptPos = 0;
        for (const auto & p : items) promptPos += p.item.positions();
        res_.promptTokens = promptPos;
        if (promptPos == 0) throw std::runtime_error("empty prompt: give at least one token");
        if (promptPos + opts_.maxTokens > nCtx) {
            throw CodedFailure("ERANGE",
                               "context overflow: prompt (" + std::to_string(promptPos) + " positions) + maxTokens (" +
                                   std::to_string(opts_.maxTokens) + ") exceeds nCtx " + std::to_string(nCtx));
        }

        // 2. Reuse the longest unchanged prefix of what the KV cache already holds.
        std::vector<CacheItem> & cache = ctx_->cache();
        size_t k = 0;
        while (k < cache.size() && k < items.size() && cache[k].sameAs(items[k].item)) k++;
        if (k == items.size()) k--;  // the last item is evaluated again for its logits
        llama_pos reusePos = 0;
        for (size_t i = 0; i < k; i++) reusePos += items[i].item.positions();
        if (!llama_memory_seq_rm(llama_get_memory(lctx), 0, reusePos, -1)) {
            llama_memory_seq_rm(llama_get_memory(lctx), 0, -1, -1);
            k = 0;
            reusePos = 0;
        }
        truncateKv(reusePos);
        cache.resize(k);
        history_.clear();
        for (const auto & c : cache) {
            if (c.imageTokens > 0) history_.insert(history_.end(), c.imageTokens, mi.imageStartToken);
            else history_.push_back(c.token);
        }
        res_.reusedTokens = reusePos;

        Speculator * spec = ctx_->speculator();
        const bool speculate = spec != nullptr && opts_.speculative;

        // 3. Prefill what is new. Logits only for the prompt's last position.
        const int64_t tPrefill = monotonicNs();
        if (int stop = ctx_->stopRequested()) {
            res_.stopReason = stopReasonOf(stop);
            return;
        }
        {
            TokenBatch batch(nBatch);
            llama_pos pos = reusePos;
            for (size_t i = k; i < items.size(); i++) {
                const PromptItem & p = items[i];
                if (p.item.imageTokens > 0) {
                    if (batch.b.n_tokens > 0) {
                        if (decodeTokens(batch) == 2) return finishAborted();
                        batch.clear();
                    }
                    if (decodeImage(p, pos) == 2) return finishAborted();
                    pos += p.item.imageTokens;
                    continue;
                }
                batch.add(p.item.token, pos++, i + 1 == items.size());
                if (batch.b.n_tokens == nBatch) {
                    if (decodeTokens(batch) == 2) return finishAborted();
                    batch.clear();
                }
            }
            if (batch.b.n_tokens > 0 && decodeTokens(batch) == 2) return finishAborted();
        }
        res_.prefillTokens = promptPos - reusePos;
        res_.decodeCalls = 0;  // from here on: generation decodes only
        res_.llamaDecodeMs = 0;
        res_.prefillMs = msSince(tPrefill);
        if (opts_.maxTokens == 0) {
            res_.stopReason = "max_tokens";
            return;
        }

        // 4. Generate.
        Sampler sampler(model, opts_.sampling, std::move(grammar_));
        std::vector<llama_token> emitted;
        llama_pos nPast = promptPos;
        int32_t logitsIdx = -1;
        int64_t tFirst = 0;

        auto sampleTimed = [&](int32_t idx) {
            int64_t ts = monotonicNs();
            llama_token t = sampler.sample(lctx, idx);
            res_.sampleMs += msSince(ts);
            return t;
        };

        // The first token comes from the prompt's logits.
        if (int stop = ctx_->stopRequested()) {
            res_.stopReason = stopReasonOf(stop);
            return;
        }
        llama_token idLast = sampleTimed(logitsIdx);
        tFirst = monotonicNs();
        res_.ttftMs = double(tFirst - tStart) / 1e6;
        if (isEog(idLast) && !opts_.ignoreEos) {
            res_.stopReason = "eos";
            return finishDecode(tFirst);
        }
        sampler.accept(idLast);
        bool done = pushOutput(idLast, emitted);
        emit(emitted);
        emitted.clear();

        if (speculate && !done) {
            common_speculative_begin(spec->spec(), 0, history_);
        }

        TokenBatch batch(std::max<int32_t>(nBatch, int32_t(ctx_->options().maxOutputs) + 1));
        std::vector<llama_token> draft;
        const int32_t nDraftCfg = speculate ? (opts_.nDraft >= 0 ? opts_.nDraft : spec->nMax()) : 0;

        while (!done) {
            if (int stop = ctx_->stopRequested()) {
                res_.stopReason = stopReasonOf(stop);
                break;
            }
            batch.clear();
            batch.add(idLast, nPast, true);
            std::vector<llama_token> forcedTail;

            // Jump-forward: tokens the grammar alone decides ride along in this decode.
            if (opts_.jumpForward && sampler.hasGrammar() && !speculate) {
                bool stopHere = false;
                while (true) {
                    if (sampler.grammarComplete() && !opts_.ignoreEos) {
                        // Only end-of-generation is admissible: any sampler would pick an EOG
                        // token next, so end here and save that decode (counted as forced).
                        res_.forced++;
                        res_.stopReason = "eos";
                        stopHere = true;
                        break;
                    }
                    int64_t ts = monotonicNs();
                    llama_token f = sampler.forcedToken();
                    res_.sampleMs += msSince(ts);
                    if (f < 0) break;
                    sampler.accept(f);
                    res_.forced++;
                    batch.b.logits[batch.b.n_tokens - 1] = 0;
                    batch.add(f, nPast + batch.b.n_tokens, true);
                    if (pushOutput(f, emitted)) {
                        stopHere = true;
                        break;
                    }
                }
                emit(emitted);
                emitted.clear();
                if (stopHere) break;
            }

            // Speculation: draft after idLast, verify all in one target decode.
            draft.clear();
            if (speculate && nDraftCfg > 0) {
                int32_t nMax = std::min<int32_t>(nDraftCfg, nCtx - nPast - 2);
                nMax = std::min<int32_t>(nMax, opts_.maxTokens - int32_t(res_.tokens.size()) - 1);
                nMax = std::min<int32_t>(nMax, int32_t(ctx_->options().maxOutputs) - 1);
                if (nMax > 0) {
                    int64_t td = monotonicNs();
                    common_speculative_get_draft_params(spec->spec(), 0) = {true, nMax, nPast, idLast, &history_, &draft};
                    common_speculative_draft(spec->spec());
                    res_.draftMs += msSince(td);
                    if (int32_t(draft.size()) > nMax) draft.resize(nMax);
                    if (spec->draftContext() != nullptr) {
                        llama_memory_t m = llama_get_memory(spec->draftContext());
                        if (m != nullptr) llama_memory_seq_rm(m, 0, nPast, -1);
                    }
                }
                for (size_t i = 0; i < draft.size(); i++) batch.add(draft[i], nPast + 1 + llama_pos(i), true);
            }

            const int32_t nInBatch = batch.b.n_tokens;
            if (decodeTokens(batch) == 2) {
                int stop = ctx_->stopRequested();
                res_.stopReason = stopReasonOf(stop == 0 ? 1 : stop);
                break;
            }
            nPast += nInBatch;

            if (draft.empty()) {
                llama_token t = sampleTimed(-1);
                if (isEog(t) && !opts_.ignoreEos) {
                    res_.stopReason = "eos";
                    break;
                }
                sampler.accept(t);
                done = pushOutput(t, emitted);
                idLast = t;
            } else {
                // Verify: sample at each drafted position until the target disagrees.
                res_.drafted += int32_t(draft.size());
                std::vector<llama_token> ids;
                bool stopEos = false;
                for (size_t i = 0; i <= draft.size(); i++) {
                    llama_token t = sampleTimed(int32_t(i));
                    if (isEog(t) && !opts_.ignoreEos) {
                        stopEos = true;
                        break;
                    }
                    sampler.accept(t);
                    ids.push_back(t);
                    if (i < draft.size() && t != draft[i]) break;
                }
                // KV holds idLast + every draft; keep idLast + the accepted drafts only.
                size_t nAcc = ids.empty() ? 0 : std::min(ids.size() - 1, draft.size());
                if (stopEos) nAcc = ids.size();  // drafts matched up to the EOS
                nAcc = std::min(nAcc, draft.size());
                res_.accepted += int32_t(nAcc);
                common_speculative_accept(spec->spec(), 0, uint16_t(nAcc));
                const llama_pos keep = nPast - nInBatch + 1 + llama_pos(nAcc);
                truncateKv(keep);
                auto & cache2 = ctx_->cache();
                cache2.resize(cache2.size() - (draft.size() - nAcc));
                history_.resize(history_.size() - (draft.size() - nAcc));
                nPast = keep;
                for (llama_token t : ids) {
                    if (pushOutput(t, emitted)) {
                        done = true;
                        break;
                    }
                }
                if (stopEos && !done) {
                    res_.stopReason = "eos";
                    done = true;
                }
                if (!ids.empty()) idLast = ids.back();
            }
            emit(emitted);
            emitted.clear();
        }
        emit(emitted);
        finishDecode(tFirst);
    }

    void finishAborted() {
        int stop = ctx_->stopRequested();
        res_.stopReason = stopReasonOf(stop == 0 ? 1 : stop);
    }

    void finishDecode(int64_t tFirst) { res_.decodeMs = tFirst > 0 ? msSince(tFirst) : 0; }

    Napi::ObjectReference self_;
    Napi::ObjectReference grammarRef_;
    Napi::ObjectReference specRef_;
    Context * ctx_;
    std::vector<Segment> segments_;
    GenerateOptions opts_;
    GrammarPtr grammar_;
    TokenTsfn tsfn_;
    bool hasTsfn_ = false;
    std::vector<llama_token> history_;
    GenerateResult res_;
};

// Parses the prompt segments on the JS thread (cheap shape checks; TS validated already).
std::vector<Segment> parseSegments(Napi::Env env, const Napi::Value & v, const ModelInfo & mi) {
    if (!v.IsArray()) throw Napi::TypeError::New(env, "generate: prompt must be an array of segments");
    Napi::Array arr = v.As<Napi::Array>();
    std::vector<Segment> out;
    for (uint32_t i = 0; i < arr.Length(); i++) {
        std::string where = "prompt[" + std::to_string(i) + "]";
        Napi::Object o = requireObject(arr.Get(i), where.c_str());
        Segment s;
        if (o.Has("text")) {
            s.kind = Segment::Text;
            s.text = requireString(o.Get("text"), (where + ".text").c_str());
            s.addSpecial = optBool(o, "addSpecial", false, where.c_str());
        } else if (o.Has("tokens")) {
            s.kind = Segment::Tokens;
            s.tokens = requireTokens(o.Get("tokens"), mi.nVocab, where + ".tokens");
        } else if (o.Has("image")) {
            s.kind = Segment::Image;
            Napi::Value img = o.Get("image");
            if (!img.IsTypedArray() || img.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array) {
                throw Napi::TypeError::New(env, where + ".image must be a Float32Array");
            }
            Napi::Float32Array f = img.As<Napi::Float32Array>();
            s.nTokens = int32_t(optInt(o, "nTokens", -1, 1, 1 << 20, where.c_str()));
            if (s.nTokens < 0) throw Napi::TypeError::New(env, where + ".nTokens is required for an image segment");
            const size_t want = size_t(s.nTokens) * size_t(mi.nEmbd);
            if (f.ElementLength() != want) {
                throw Napi::RangeError::New(env,
                                            where + ".image has " + std::to_string(f.ElementLength()) +
                                                " floats; expected nTokens × nEmbd = " + std::to_string(s.nTokens) + " × " +
                                                std::to_string(mi.nEmbd) + " = " + std::to_string(want) +
                                                " (wrong embedding width for this model?)");
            }
            if (mi.imageStartToken < 0 || mi.imageEndToken < 0) {
                throw Napi::Error::New(env, where + ": this model's vocabulary has no image start/end tokens");
            }
            s.embd.assign(f.Data(), f.Data() + f.ElementLength());
            s.forceCausal = optBool(o, "causal", false, where.c_str());
        } else {
            throw Napi::TypeError::New(env, where + " must have one of text, tokens or image");
        }
        out.push_back(std::move(s));
    }
    return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

Napi::Function Context::Init(Napi::Env env) {
    return DefineClass(env, "Context",
                       {
                           StaticMethod<&Context::Create>("create"),
                           InstanceMethod<&Context::Info>("info"),
                           InstanceMethod<&Context::MemoryBreakdown>("memoryBreakdown"),
                           InstanceMethod<&Context::Generate>("generate"),
                           InstanceMethod<&Context::Cancel>("cancel"),
                           InstanceMethod<&Context::ClearCache>("clearCache"),
                           InstanceMethod<&Context::CachedPositions>("cachedPositions"),
                           InstanceMethod<&Context::Dispose>("dispose"),
                       });
}

Context::Context(const Napi::CallbackInfo & info) : Napi::ObjectWrap<Context>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 3 || !info[1].IsExternal() || !info[2].IsExternal()) {
        throw Napi::TypeError::New(env, "Context cannot be constructed directly; use Context.create(model, options)");
    }
    modelRef_ = Napi::Persistent(info[0].As<Napi::Object>());
    model_ = Model::Unwrap(info[0].As<Napi::Object>());
    model_->retain();
    ctx_ = info[1].As<Napi::External<llama_context>>().Data();
    opts_ = *info[2].As<Napi::External<ContextOptions>>().Data();
    llama_set_abort_callback(ctx_, &Context::abortCallback, this);
}

Context::~Context() { freeNative(); }

void Context::freeNative() {
    if (ctx_ == nullptr) return;
    if (spec_ != nullptr) spec_->freeNative();  // the draft context refers to ours (ctx_other)
    llama_free(ctx_);
    ctx_ = nullptr;
    if (opts_.threadpool != nullptr) ggml_threadpool_free(opts_.threadpool);
    opts_.threadpool = nullptr;
    model_->release();
    modelRef_.Reset();
}

bool Context::abortCallback(void * data) { return static_cast<Context *>(data)->stopRequested() != 0; }

int Context::stopRequested() const {
    int64_t d = deadlineNs_.load();
    if (d > 0 && monotonicNs() >= d) return 2;
    return cancel_.load() ? 1 : 0;
}

void Context::acquire(Napi::Env env) {
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Context is disposed");
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true)) {
        throw codedError(env, "EBUSY", "Context is busy: only one operation may run at a time on a context");
    }
}

void Context::attach(Speculator * s) { spec_ = s; }
void Context::detach(Speculator * s) {
    if (spec_ == s) spec_ = nullptr;
}

Napi::Value Context::Create(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!info[0].IsObject() || !info[0].As<Napi::Object>().InstanceOf(addonData(env).modelCtor.Value())) {
        throw Napi::TypeError::New(env, "Context.create: expected a Model as the first argument");
    }
    Model * model = Model::Unwrap(info[0].As<Napi::Object>());
    model->require(env);
    if (model->info().vocabOnly) throw Napi::Error::New(env, "Context.create: the model was loaded with vocabOnly");
    if (model->info().arch == "gemma4-assistant") {
        throw Napi::Error::New(env, "Context.create: a gemma4-assistant model is a drafter; use it through a Speculator");
    }
    Napi::Object o =
        info.Length() > 1 && !info[1].IsUndefined() ? requireObject(info[1], "Context.create options") : Napi::Object::New(env);
    ContextOptions c;
    const char * w = "Context.create options";
    c.nCtx = uint32_t(optInt(o, "nCtx", 4096, 16, 1 << 24, w));
    c.nBatch = uint32_t(optInt(o, "nBatch", 512, 1, 1 << 20, w));
    c.nUbatch = uint32_t(optInt(o, "nUbatch", std::min<uint32_t>(c.nBatch, 512), 1, c.nBatch, w));
    c.nSeq = uint32_t(optInt(o, "nSeq", 1, 1, 1, w));
    c.maxOutputs = uint32_t(optInt(o, "maxOutputs", 16, 1, c.nBatch, w));
    Napi::Value fa = o.Get("flashAttention");
    if (fa.IsBoolean()) c.flashAttention = fa.As<Napi::Boolean>().Value() ? 1 : 0;
    else if (fa.IsUndefined() || (fa.IsString() && fa.As<Napi::String>().Utf8Value() == "auto")) c.flashAttention = -1;
    else throw Napi::TypeError::New(env, "Context.create options.flashAttention must be true, false or 'auto'");
    c.kvType = optString(o, "kvType", "f16", w);
    if (c.kvType != "f16" && c.kvType != "q8_0") throw Napi::TypeError::New(env, "Context.create options.kvType must be 'f16' or 'q8_0'");
    if (c.kvType == "q8_0" && c.flashAttention == 0) {
        throw Napi::Error::New(env, "Context.create: kvType 'q8_0' needs flash attention (the quantized V cache is read by the FA kernel)");
    }
    c.threads = int32_t(optInt(o, "threads", 0, 0, 1024, w));
    auto * worker = new CreateWorker(env, info[0].As<Napi::Object>(), model, c);
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
}

Napi::Value Context::Info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Context is disposed");
    Napi::Object o = Napi::Object::New(env);
    o.Set("nCtx", llama_n_ctx(ctx_));
    o.Set("nBatch", llama_n_batch(ctx_));
    o.Set("nUbatch", llama_n_ubatch(ctx_));
    o.Set("nSeq", llama_n_seq_max(ctx_));
    o.Set("maxOutputs", opts_.maxOutputs);
    o.Set("threads", opts_.threads);
    o.Set("flashAttention",
          opts_.flashAttention == -1 ? Napi::Value(Napi::String::New(env, "auto")) : Napi::Boolean::New(env, opts_.flashAttention == 1));
    o.Set("kvType", opts_.kvType);
    return o;
}

Napi::Value Context::MemoryBreakdown(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Context is disposed");
    double model = 0, context = 0, compute = 0;
    Napi::Array per = Napi::Array::New(env);
    uint32_t i = 0;
    for (const BufferBytes & b : percept::memoryBreakdown(ctx_)) {
        model += double(b.model);
        context += double(b.context);
        compute += double(b.compute);
        Napi::Object e = Napi::Object::New(env);
        e.Set("bufferType", b.bufferType);
        e.Set("model", double(b.model));
        e.Set("context", double(b.context));
        e.Set("compute", double(b.compute));
        per.Set(i++, e);
    }
    Napi::Object o = Napi::Object::New(env);
    o.Set("model", model);
    o.Set("context", context);
    o.Set("compute", compute);
    o.Set("byBufferType", per);
    return o;
}

Napi::Value Context::Generate(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Context is disposed");
    model_->require(env);
    const ModelInfo & mi = model_->info();
    std::vector<Segment> segments = parseSegments(env, info[0], mi);
    Napi::Object o = info.Length() > 1 && !info[1].IsUndefined() ? requireObject(info[1], "generate options") : Napi::Object::New(env);
    const char * w = "generate options";
    GenerateOptions g;
    g.maxTokens = int32_t(optInt(o, "maxTokens", 0, 0, 1 << 24, w));
    g.sampling.temperature = float(optNumber(o, "temperature", 0.0, w));
    if (g.sampling.temperature < 0) throw Napi::RangeError::New(env, "generate options.temperature must be >= 0");
    g.sampling.topK = int32_t(optInt(o, "topK", 0, 0, mi.nVocab, w));
    g.sampling.topP = float(optNumber(o, "topP", 1.0, w));
    g.sampling.minP = float(optNumber(o, "minP", 0.0, w));
    if (!(g.sampling.topP > 0 && g.sampling.topP <= 1)) throw Napi::RangeError::New(env, "generate options.topP must be in (0, 1]");
    g.sampling.seed = uint32_t(optInt(o, "seed", 0, 0, 0xFFFFFFFFLL, w));
    g.ignoreEos = optBool(o, "ignoreEos", false, w);
    g.jumpForward = optBool(o, "jumpForward", false, w);
    g.speculative = optBool(o, "speculative", true, w);
    g.nDraft = int32_t(optInt(o, "nDraft", -1, -1, 256, w));
    Napi::Value stops = o.Get("stopStrings");
    if (!stops.IsUndefined()) {
        if (!stops.IsArray()) throw Napi::TypeError::New(env, "generate options.stopStrings must be an array of strings");
        Napi::Array a = stops.As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
            std::string s = requireString(a.Get(i), "generate options.stopStrings[]");
            if (s.empty()) throw Napi::TypeError::New(env, "generate options.stopStrings[] must not be empty");
            g.stopStrings.push_back(s);
        }
    }
    if (!o.Get("stopTokens").IsUndefined()) g.stopTokens = requireTokens(o.Get("stopTokens"), mi.nVocab, "generate options.stopTokens");
    Napi::Value dl = o.Get("deadlineNs");
    if (dl.IsBigInt()) {
        bool lossless = true;
        g.deadlineNs = dl.As<Napi::BigInt>().Int64Value(&lossless);
        if (g.deadlineNs <= 0) g.deadlineNs = 1;  // already passed
    } else if (!dl.IsUndefined()) {
        throw Napi::TypeError::New(env, "generate options.deadlineNs must be a bigint (process.hrtime.bigint() clock)");
    }
    GrammarPtr grammar;
    Napi::Object grammarObj;
    Napi::Value gv = o.Get("grammar");
    if (!gv.IsUndefined() && !gv.IsNull()) {
        if (!gv.IsObject() || !gv.As<Napi::Object>().InstanceOf(addonData(env).grammarCtor.Value())) {
            throw Napi::TypeError::New(env, "generate options.grammar must be a Grammar");
        }
        Grammar * gr = Grammar::Unwrap(gv.As<Napi::Object>());
        if (gr->model() != model_) throw Napi::Error::New(env, "generate options.grammar was built for another model");
        grammar = gr->instantiate();
        grammarObj = gv.As<Napi::Object>();
    }
    Napi::Value onTokens = info.Length() > 2 ? info[2] : env.Undefined();
    if (!onTokens.IsUndefined() && !onTokens.IsFunction()) throw Napi::TypeError::New(env, "generate: onTokens must be a function");

    acquire(env);
    resetStop(g.deadlineNs);
    auto * worker = new GenerateWorker(env, Value(), this, std::move(segments), std::move(g), std::move(grammar), grammarObj, onTokens);
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
}

Napi::Value Context::Cancel(const Napi::CallbackInfo & info) {
    cancel_.store(true);
    return info.Env().Undefined();
}

Napi::Value Context::ClearCache(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    acquire(env);
    llama_memory_seq_rm(llama_get_memory(ctx_), 0, -1, -1);
    if (spec_ != nullptr && spec_->draftContext() != nullptr) {
        llama_memory_t m = llama_get_memory(spec_->draftContext());
        if (m != nullptr) llama_memory_seq_rm(m, 0, -1, -1);
    }
    cache_.clear();
    releaseBusy();
    return env.Undefined();
}

Napi::Value Context::CachedPositions(const Napi::CallbackInfo & info) {
    int32_t n = 0;
    for (const auto & c : cache_) n += c.positions();
    return Napi::Number::New(info.Env(), n);
}

Napi::Value Context::Dispose(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) return env.Undefined();
    if (busy_.load()) throw codedError(env, "EBUSY", "Context is busy; cancel and await the running operation before dispose()");
    freeNative();
    return env.Undefined();
}

}  // namespace percept
