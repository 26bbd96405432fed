#include "grammar.h"

#include "model.h"
#include "util.h"

#include <algorithm>
#include <bitset>
#include <cmath>

namespace percept {

Napi::Function Grammar::Init(Napi::Env env) { return DefineClass(env, "Grammar", {InstanceMethod<&Grammar::Source>("source")}); }

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
    modelRef_ = Napi::Persistent(info[0].As<Napi::Object>());
}

Napi::Value Grammar::Source(const Napi::CallbackInfo & info) { return Napi::String::New(info.Env(), gbnf_); }

// ---------------------------------------------------------------------------------------------

Sampler::Sampler(Model * model, const SamplingOptions & opts, GrammarPtr grammar)
    : model_(model), opts_(opts), grammar_(std::move(grammar)), nVocab_(model->info().nVocab) {
    if (opts_.temperature > 0.0f) {
        llama_sampler * c = llama_sampler_chain_init(llama_sampler_chain_default_params());
        if (opts_.topK > 0) llama_sampler_chain_add(c, llama_sampler_init_top_k(opts_.topK));
        if (opts_.topP < 1.0f) llama_sampler_chain_add(c, llama_sampler_init_top_p(opts_.topP, 1));
        if (opts_.minP > 0.0f) llama_sampler_chain_add(c, llama_sampler_init_min_p(opts_.minP, 1));
        llama_sampler_chain_add(c, llama_sampler_init_temp(opts_.temperature));
        llama_sampler_chain_add(c, llama_sampler_init_dist(opts_.seed));
        chain_.reset(c);
    }
    cur_.resize(nVocab_);
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
    const float * logits = llama_get_logits_ith(ctx, idx);
    if (logits == nullptr) throw std::runtime_error("no logits for batch index " + std::to_string(idx));

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
    if (grammar_ && !llama_vocab_is_eog(model_->vocab(), token)) grammarAccept(*grammar_, token);
    if (chain_) llama_sampler_accept(chain_.get(), token);
}

bool Sampler::grammarComplete() const { return grammar_ && percept::grammarComplete(*grammar_); }

llama_token Sampler::forcedToken() {
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
