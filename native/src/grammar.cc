#include "grammar.h"

#include "model.h"
#include "util.h"

#include <algorithm>
#include <bitset>
#include <cmath>

namespace percept {

Napi::Function Grammar::Init(Napi::Env env) {
    return DefineClass(env, "Grammar",
                       {
                           InstanceMethod<&Grammar::Source>("source"),
                           InstanceMethod<&Grammar::BuildIndex>("buildIndex"),
                           InstanceMethod<&Grammar::IndexInfo>("indexInfo"),
                           InstanceMethod<&Grammar::AllowedTokens>("allowedTokens"),
                           InstanceMethod<&Grammar::ForcedTokens>("forcedTokens"),
                           InstanceMethod<&Grammar::Admits>("admits"),
                       });
}

// new Grammar(model, gbnf, root): parses now (cheap, on the JS thread), so a bad grammar throws here.
Grammar::Grammar(const Napi::CallbackInfo & info) : Napi::ObjectWrap<Grammar>(info) {
    Napi::Env env = info.Env();
    if (!info[0].IsObject() || !info[0].As<Napi::Object>().InstanceOf(addonData(env).modelCtor.Value())) {
        throw Napi::TypeError::New(env, "Grammar: expected a Model as the first argument");
    }
    model_ = Model::Unwrap(info[0].As<Napi::Object>());
    model_->require(env);
    gbnf_ = requireString(info[1], "Grammar gbnf");
    std::string root = info.Length() > 2 && !info[2].IsUndefined() ? requireString(info[2], "Grammar root") : "root";
    LogCapture capture;
    proto_ = grammarParse(model_->vocab(), gbnf_, root);
    if (!proto_) {
        std::string why = capture.text();
        throw Napi::Error::New(env, "Grammar: failed to parse GBNF" + (why.empty() ? std::string() : ": " + why));
    }
    key_ = gbnf_ + std::string(1, '\0') + root;
    modelRef_ = Napi::Persistent(info[0].As<Napi::Object>());
}

Napi::Value Grammar::Source(const Napi::CallbackInfo & info) { return Napi::String::New(info.Env(), gbnf_); }

GrammarInstance Grammar::instantiate() const {
    GrammarInstance g;
    if (index_) g.index = index_;
    else g.grammar = grammarClone(*proto_);
    return g;
}

void Grammar::setIndex(GrammarIndexCache::Result r) {
    built_ = true;
    index_ = std::move(r.index);
    why_ = std::move(r.why);
    stats_ = r.stats;
}

namespace {

// {index: {states, ..., worstCaseTokens}, fallback: null} or {index: null, fallback: why}.
Napi::Object indexInfoObject(Napi::Env env, const GrammarIndexStats & st, bool indexed, const std::string & why) {
    Napi::Object o = Napi::Object::New(env);
    if (indexed) {
        Napi::Object i = Napi::Object::New(env);
        i.Set("states", st.states);
        i.Set("tokenStates", st.tokenStates);
        i.Set("entries", double(st.entries));
        i.Set("maxAllowed", st.maxAllowed);
        i.Set("forcedStates", st.forcedStates);
        i.Set("prunedEntries", double(st.prunedEntries));
        i.Set("worstCaseTokens", st.worstCaseTokens >= 0 ? Napi::Value(Napi::Number::New(env, st.worstCaseTokens)) : env.Null());
        i.Set("maxChoices", st.maxChoices >= 0 ? Napi::Value(Napi::Number::New(env, st.maxChoices)) : env.Null());
        i.Set("buildMs", st.buildMs);
        i.Set("trieMs", st.trieMs);
        o.Set("index", i);
        o.Set("fallback", env.Null());
    } else {
        o.Set("index", env.Null());
        o.Set("fallback", why);
    }
    return o;
}

class BuildIndexWorker : public PromiseWorker {
public:
    BuildIndexWorker(Napi::Env env, Napi::Object self, Grammar * g, GrammarIndexLimits limits)
        : PromiseWorker(env, "percept:Grammar.buildIndex", "EGRAMMAR"), self_(Napi::Persistent(self)), g_(g), limits_(limits) {
        g_->model()->retain();  // the vocabulary stays while the index is built
    }
    ~BuildIndexWorker() override { g_->model()->release(); }

protected:
    void Execute() override {
        try {
            const std::string key = g_->key() + '\0' + std::to_string(limits_.maxStates) + '/' + std::to_string(limits_.maxEntries);
            result_ = g_->model()->grammarIndexCache().get(g_->proto(), g_->model()->vocab(), key, limits_);
        } catch (const std::exception & e) {
            SetError(std::string("grammar index: ") + e.what());
        }
    }
    void OnOK() override {
        const bool indexed = result_.index != nullptr;
        Napi::Object info = indexInfoObject(Env(), result_.stats, indexed, result_.why);
        g_->setIndex(std::move(result_));
        deferred_.Resolve(info);
    }

private:
    Napi::ObjectReference self_;
    Grammar * g_;
    GrammarIndexLimits limits_;
    GrammarIndexCache::Result result_;
};

// The tokens admitted after `prefix`, by the index or by llama.cpp's own check over the whole
// vocabulary (the reference the index is tested against).
class AllowedWorker : public PromiseWorker {
public:
    AllowedWorker(Napi::Env env, Napi::Object self, Grammar * g, std::vector<int32_t> prefix, bool viaLlama)
        : PromiseWorker(env, "percept:Grammar.allowedTokens", "EGRAMMAR"), self_(Napi::Persistent(self)), g_(g), index_(g->index()),
          prefix_(std::move(prefix)), viaLlama_(viaLlama) {
        g_->model()->retain();
    }
    ~AllowedWorker() override { g_->model()->release(); }

protected:
    void Execute() override {
        try {
            if (viaLlama_) byLlama();
            else byIndex();
        } catch (const std::exception & e) {
            SetError(e.what());
        }
    }
    void OnOK() override {
        Napi::Int32Array a = Napi::Int32Array::New(Env(), out_.size());
        std::copy(out_.begin(), out_.end(), a.Data());
        deferred_.Resolve(a);
    }

private:
    void byIndex() {
        int32_t s = index_->start();
        for (size_t i = 0; i < prefix_.size(); i++) {
            s = index_->next(s, prefix_[i]);
            if (s < 0)
                throw std::runtime_error("prefix[" + std::to_string(i) + "] = " + std::to_string(prefix_[i]) +
                                         " is not admitted by the grammar");
        }
        out_.assign(index_->tokensBegin(s), index_->tokensEnd(s));
        if (index_->accepting(s)) out_.insert(out_.end(), index_->eog().begin(), index_->eog().end());
        std::sort(out_.begin(), out_.end());
    }
    void byLlama() {
        GrammarPtr g = grammarClone(g_->proto());
        const llama_vocab * vocab = g_->model()->vocab();
        for (size_t i = 0; i < prefix_.size(); i++) {
            llama_token_data one{prefix_[i], 0.0f, 0.0f};
            llama_token_data_array arr{&one, 1, -1, false};
            grammarApply(*g, &arr);
            if (!std::isfinite(one.logit) || llama_vocab_is_eog(vocab, prefix_[i])) {
                throw std::runtime_error("prefix[" + std::to_string(i) + "] = " + std::to_string(prefix_[i]) +
                                         " is not admitted by the grammar");
            }
            grammarAccept(*g, prefix_[i]);
        }
        const int32_t n = llama_vocab_n_tokens(vocab);
        std::vector<llama_token_data> cur(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; i++) cur[size_t(i)] = llama_token_data{i, 0.0f, 0.0f};
        llama_token_data_array arr{cur.data(), cur.size(), -1, false};
        grammarApply(*g, &arr);
        for (const auto & c : cur) {
            if (std::isfinite(c.logit)) out_.push_back(c.id);
        }
    }

    Napi::ObjectReference self_;
    Grammar * g_;
    std::shared_ptr<const GrammarIndex> index_;
    std::vector<int32_t> prefix_;
    bool viaLlama_;
    std::vector<int32_t> out_;
};

}  // namespace

// buildIndex({maxStates, maxEntries}) → Promise<{index, fallback}>: builds (or takes from the
// model's cache) the token index off the JS thread. Without one, generations use the llama_grammar path.
Napi::Value Grammar::BuildIndex(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    model_->require(env);
    Napi::Object o = requireObject(info[0], "buildIndex limits");
    GrammarIndexLimits limits;
    limits.maxStates = int32_t(requireInt(o, "maxStates", 1, 1 << 24, "buildIndex limits"));
    limits.maxEntries = size_t(requireInt(o, "maxEntries", 1, int64_t(1) << 32, "buildIndex limits"));
    auto * w = new BuildIndexWorker(env, Value(), this, limits);
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

Napi::Value Grammar::IndexInfo(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!built_) return env.Undefined();
    return indexInfoObject(env, stats_, index_ != nullptr, why_);
}

// allowedTokens(prefix, via: 'index' | 'llama') → Promise<Int32Array>, sorted.
Napi::Value Grammar::AllowedTokens(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    model_->require(env);
    std::vector<int32_t> prefix = requireTokens(info[0], model_->info().nVocab, "allowedTokens prefix");
    std::string via = requireString(info[1], "allowedTokens via");
    if (via != "index" && via != "llama") throw Napi::TypeError::New(env, "allowedTokens: via must be 'index' or 'llama'");
    if (via == "index" && !index_) throw Napi::Error::New(env, "allowedTokens: this grammar has no token index");
    auto * w = new AllowedWorker(env, Value(), this, std::move(prefix), via == "llama");
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

// admits(text) → whether llama.cpp's grammar takes exactly this text (character by character, no
// tokens involved): what tests of the GBNF itself compare against.
Napi::Value Grammar::Admits(const Napi::CallbackInfo & info) {
    return Napi::Boolean::New(info.Env(), grammarAdmitsText(*proto_, requireString(info[0], "admits text")));
}

// forcedTokens(prefix) → Int32Array: the forced run at the state after prefix (index walk, µs).
Napi::Value Grammar::ForcedTokens(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!index_) throw Napi::Error::New(env, "forcedTokens: this grammar has no token index");
    std::vector<int32_t> prefix = requireTokens(info[0], model_->info().nVocab, "forcedTokens prefix");
    int32_t s = index_->start();
    for (size_t i = 0; i < prefix.size(); i++) {
        s = index_->next(s, prefix[i]);
        if (s < 0) throw Napi::RangeError::New(env, "forcedTokens: prefix[" + std::to_string(i) + "] is not admitted by the grammar");
    }
    Napi::Int32Array a = Napi::Int32Array::New(env, size_t(index_->forcedEnd(s) - index_->forcedBegin(s)));
    std::copy(index_->forcedBegin(s), index_->forcedEnd(s), a.Data());
    return a;
}

// ---------------------------------------------------------------------------------------------

Sampler::Sampler(Model * model, const SamplingOptions & opts, GrammarInstance grammar)
    : model_(model), opts_(opts), grammar_(std::move(grammar.grammar)), nVocab_(model->info().nVocab) {
    if (grammar.index) cursor_ = IndexCursor(std::move(grammar.index));
    if (opts_.temperature > 0.0f) {
        llama_sampler * c = llama_sampler_chain_init(llama_sampler_chain_default_params());
        if (opts_.topK > 0) llama_sampler_chain_add(c, llama_sampler_init_top_k(opts_.topK));
        if (opts_.topP < 1.0f) llama_sampler_chain_add(c, llama_sampler_init_top_p(opts_.topP, 1));
        if (opts_.minP > 0.0f) llama_sampler_chain_add(c, llama_sampler_init_min_p(opts_.minP, 1));
        llama_sampler_chain_add(c, llama_sampler_init_temp(opts_.temperature));
        llama_sampler_chain_add(c, llama_sampler_init_dist(opts_.seed));
        chain_.reset(c);
    }
    if (!cursor_) cur_.resize(size_t(nVocab_));
}

bool Sampler::grammarAllows(llama_token token) {
    llama_token_data one{token, 0.0f, 0.0f};
    llama_token_data_array arr{&one, 1, -1, false};
    grammarApply(*grammar_, &arr);
    return std::isfinite(one.logit);
}

namespace {

// Finite-math lets GCC/Clang use packed max instructions (logits are never NaN in practice; a
// NaN row would make argmax meaningless anyway).
__attribute__((optimize("finite-math-only", "no-signed-zeros"))) float maxOf(const float * x, int32_t n) {
    float m0 = x[0], m1 = x[0], m2 = x[0], m3 = x[0], m4 = x[0], m5 = x[0], m6 = x[0], m7 = x[0];
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        m0 = x[i] > m0 ? x[i] : m0;
        m1 = x[i + 1] > m1 ? x[i + 1] : m1;
        m2 = x[i + 2] > m2 ? x[i + 2] : m2;
        m3 = x[i + 3] > m3 ? x[i + 3] : m3;
        m4 = x[i + 4] > m4 ? x[i + 4] : m4;
        m5 = x[i + 5] > m5 ? x[i + 5] : m5;
        m6 = x[i + 6] > m6 ? x[i + 6] : m6;
        m7 = x[i + 7] > m7 ? x[i + 7] : m7;
    }
    float m = std::max(std::max(std::max(m0, m1), std::max(m2, m3)), std::max(std::max(m4, m5), std::max(m6, m7)));
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

}  // namespace

std::vector<llama_token_data> Sampler::topAllowed(const float * logits, size_t k) {
    // Only tokens whose first byte the grammar can take are candidates.
    const auto & buckets = model_->tokensByFirstByte();
    const std::bitset<257> mask = grammarLeadBytes(*grammar_);
    order_.clear();
    for (size_t b = 0; b < 257; b++) {
        if (mask.test(b)) order_.insert(order_.end(), buckets[b].begin(), buckets[b].end());
    }
    auto better = [logits](llama_token a, llama_token b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::vector<llama_token_data> found;
    std::vector<llama_token_data> cand;
    size_t done = 0;
    size_t chunk = std::max<size_t>(64, k * 4);
    while (done < order_.size() && found.size() < k) {
        size_t end = std::min(order_.size(), done + chunk);
        std::partial_sort(order_.begin() + done, order_.begin() + end, order_.end(), better);
        cand.clear();
        for (size_t i = done; i < end; i++) cand.push_back({order_[i], logits[order_[i]], 0.0f});
        llama_token_data_array arr{cand.data(), cand.size(), -1, true};
        grammarApply(*grammar_, &arr);
        for (const auto & c : cand) {
            if (std::isfinite(c.logit) && found.size() < k) found.push_back(c);
        }
        done = end;
        chunk *= 8;
    }
    return found;
}

llama_token Sampler::sample(llama_context * ctx, int32_t idx) {
    if (cursor_) {
        // Forced tokens and the end need no logits.
        const llama_token f = cursor_.forced();
        if (f >= 0) return f;
        const llama_token eos = llama_vocab_eos(model_->vocab());
        if (cursor_.complete() && eos >= 0) return eos;
    }
    const float * logits = llama_get_logits_ith(ctx, idx);
    if (logits == nullptr) throw std::runtime_error("no logits for batch index " + std::to_string(idx));
    if (cursor_) {
        // Only the admitted tokens are looked at: greedy as llama.cpp's greedy sampler picks from a
        // masked vocabulary, sampling through the chain over the admitted candidates.
        if (!chain_) return cursor_.best(logits);
        cur_.clear();
        cursor_.candidates(logits, cur_);
        llama_token_data_array a{cur_.data(), cur_.size(), -1, false};
        llama_sampler_apply(chain_.get(), &a);
        return a.data[a.selected].id;
    }

    auto fill = [&]() {
        for (int32_t i = 0; i < nVocab_; i++) cur_[i] = llama_token_data{i, logits[i], 0.0f};
        return llama_token_data_array{cur_.data(), size_t(nVocab_), -1, false};
    };

    if (!chain_) {
        // Greedy: same tie rule as llama_sampler_init_greedy (first maximum wins).
        // Two passes (max, then its first index): the max reduction vectorizes, an
        // index-tracking loop does not. This is most of our per-token overhead over llama-bench.
        const float mx = maxOf(logits, nVocab_);
        llama_token best = 0;
        while (best < nVocab_ && !(logits[best] == mx)) best++;
        if (best == nVocab_) best = 0;  // all NaN: degenerate, keep token 0 like the greedy sampler
        if (!grammar_ || grammarAllows(best)) return best;
        std::vector<llama_token_data> top = topAllowed(logits, 1);
        if (top.empty()) throw std::runtime_error("the grammar admits no token here");
        return top[0].id;
    }

    llama_token_data_array a = fill();
    llama_sampler_apply(chain_.get(), &a);
    llama_token t = a.data[a.selected].id;
    if (!grammar_ || grammarAllows(t)) return t;
    if (opts_.topK > 0) {
        // top-k after the grammar keeps the k best admissible tokens: find just those.
        std::vector<llama_token_data> top = topAllowed(logits, size_t(opts_.topK));
        if (top.empty()) throw std::runtime_error("the grammar admits no token here");
        llama_token_data_array ta{top.data(), top.size(), -1, true};
        llama_sampler_apply(chain_.get(), &ta);
        return ta.data[ta.selected].id;
    }
    a = fill();
    grammarApply(*grammar_, &a);
    bool any = false;
    for (size_t i = 0; i < a.size && !any; i++) any = std::isfinite(a.data[i].logit);
    if (!any) throw std::runtime_error("the grammar admits no token here");
    llama_sampler_apply(chain_.get(), &a);
    return a.data[a.selected].id;
}

void Sampler::accept(llama_token token) {
    const bool eog = llama_vocab_is_eog(model_->vocab(), token);
    if (cursor_ && !eog && !cursor_.advance(token)) {
        throw std::runtime_error("token " + std::to_string(token) + " is not admitted by the grammar here");
    }
    if (grammar_ && !eog) grammarAccept(*grammar_, token);
    if (chain_) llama_sampler_accept(chain_.get(), token);
}

bool Sampler::grammarComplete() const {
    if (cursor_) return cursor_.complete();
    return grammar_ && percept::grammarComplete(*grammar_);
}

llama_token Sampler::forcedToken() {
    if (cursor_) return cursor_.forced();
    if (!grammar_) return -1;
    const int64_t chr = grammarSingleChar(*grammar_);
    if (chr < 0) return -1;
    // First byte of chr's UTF-8 encoding.
    uint8_t lead = chr < 0x80 ? uint8_t(chr)
        : chr < 0x800         ? uint8_t(0xC0 | (chr >> 6))
        : chr < 0x10000       ? uint8_t(0xE0 | (chr >> 12))
                              : uint8_t(0xF0 | (chr >> 18));
    const std::vector<llama_token> & bucket = model_->tokensByFirstByte()[lead];
    if (bucket.empty()) return -1;
    std::vector<llama_token_data> cand(bucket.size());
    for (size_t i = 0; i < bucket.size(); i++) cand[i] = llama_token_data{bucket[i], 0.0f, 0.0f};
    llama_token_data_array arr{cand.data(), cand.size(), -1, false};
    grammarApply(*grammar_, &arr);
    llama_token only = -1;
    for (const auto & c : cand) {
        if (!std::isfinite(c.logit)) continue;
        if (only >= 0) return -1;
        only = c.id;
    }
    return only;
}

}  // namespace percept
