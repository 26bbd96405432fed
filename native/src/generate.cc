#include "generate.h"

#include "context.h"
#include "model.h"
#include "speculator.h"
#include "util.h"

#include "speculative.h"

#include <algorithm>
#include <cmath>

namespace percept {

namespace {

double msSince(int64_t t0) { return double(monotonicNs() - t0) / 1e6; }

const char * stopReasonOf(int code) { return code == 2 ? "deadline" : "cancelled"; }

}  // namespace

// ------------------------------------------------------------------------------------------------
// Shared steps

Tokenizer vocabTokenizer(const llama_vocab * vocab) {
    return [vocab](const std::string & text, bool addSpecial) {
        std::vector<llama_token> toks(text.size() + 8);
        int n = llama_tokenize(vocab, text.data(), int32_t(text.size()), toks.data(), int32_t(toks.size()), addSpecial, true);
        if (n < 0) {
            toks.resize(size_t(-n));
            n = llama_tokenize(vocab, text.data(), int32_t(text.size()), toks.data(), -n, addSpecial, true);
        }
        toks.resize(size_t(std::max(n, 0)));
        return toks;
    };
}

PromptPlan planChecked(const Model & model, const std::vector<Segment> & segments, const std::vector<CacheItem> & cache, int32_t maxTokens,
                       int32_t nCtxSeq) {
    const ModelInfo & mi = model.info();
    PromptPlan p = planPrompt(segments, cache, vocabTokenizer(model.vocab()), ImageMarkers{mi.imageStartToken, mi.imageEndToken});
    if (p.positions == 0) throw std::runtime_error("empty prompt: give at least one token");
    if (p.positions + maxTokens > nCtxSeq) {
        throw CodedFailure("ERANGE",
                           "context overflow: prompt (" + std::to_string(p.positions) + " positions) + maxTokens (" +
                               std::to_string(maxTokens) + ") exceeds nCtx " + std::to_string(nCtxSeq));
    }
    return p;
}

bool imageNonCausal(const ModelInfo & mi, const PromptItem & p) { return mi.imageAttention != "causal" && !p.forceCausal; }

bool appendOutput(const llama_vocab * vocab, const GenerateOptions & opts, GenerateResult & res, llama_token t) {
    for (int32_t s : opts.stopTokens) {
        if (s == t) {
            res.stopReason = "stop";
            return true;
        }
    }
    res.tokens.push_back(t);
    char buf[256];
    const int n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, false);
    std::string piece = n >= 0 ? std::string(buf, size_t(n)) : std::string(size_t(-n), '\0');
    if (n < 0) llama_token_to_piece(vocab, t, piece.data(), -n, 0, false);
    const size_t before = res.text.size();
    res.text += piece;
    for (const std::string & stop : opts.stopStrings) {
        const size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
        const size_t at = res.text.find(stop, from);
        if (at != std::string::npos) {
            res.text.resize(at);
            res.stopReason = "stop";
            return true;
        }
    }
    if (int32_t(res.tokens.size()) >= opts.maxTokens) {
        res.stopReason = "max_tokens";
        return true;
    }
    return false;
}

// ------------------------------------------------------------------------------------------------
// One generation

Generation::Generation(Context & ctx, std::vector<Segment> segments, GenerateOptions options, GrammarInstance grammar, TokenSink sink)
    : ctx_(ctx), segments_(std::move(segments)), opts_(std::move(options)), sampler_(ctx.model(), opts_.sampling, std::move(grammar)),
      sink_(std::move(sink)), speculate_(ctx.speculator() != nullptr && opts_.speculative) {}

GenerateResult Generation::run() {
    const int64_t tStart = monotonicNs();
    const PromptPlan p = plan();
    reuseCache(p);
    const int64_t tPrefill = monotonicNs();
    if (stopped() || !prefill(p)) return res_;
    res_.prefillTokens = p.positions - p.reusePositions;
    res_.prefillDecodeCalls = res_.decodeCalls;
    res_.decodeCalls = 0;  // from here on: generation decodes only
    res_.llamaDecodeMs = 0;
    res_.singleDecodeCalls = 0;
    res_.singleDecodeMs = 0;
    res_.graphReuses = 0;
    res_.prefillMs = msSince(tPrefill);
    nPast_ = p.positions + openingRun_;
    if (opts_.maxTokens > 0 && !stoppedEarly_) generate(tStart);
    return res_;
}

// ------------------------------------------------------------------------------------------------
// The prompt

PromptPlan Generation::plan() {
    const PromptPlan p = planChecked(*ctx_.model(), segments_, ctx_.cache(), opts_.maxTokens, int32_t(llama_n_ctx(ctx_.raw())));
    res_.promptTokens = p.positions;
    return p;
}

// Drops what the KV cache holds past the reused prefix; when the memory cannot remove a partial
// range, starts from an empty cache instead.
void Generation::reuseCache(const PromptPlan & p) {
    size_t reuse = p.reuse;
    llama_pos reusePos = p.reusePositions;
    if (!llama_memory_seq_rm(llama_get_memory(ctx_.raw()), 0, reusePos, -1)) {
        llama_memory_seq_rm(llama_get_memory(ctx_.raw()), 0, -1, -1);
        reuse = 0;
        reusePos = 0;
    }
    truncateKv(reusePos);
    std::vector<CacheItem> & cache = ctx_.cache();
    cache.resize(reuse);
    const int32_t placeholder = ctx_.model()->info().imageStartToken;
    history_.clear();
    for (const CacheItem & c : cache) {
        if (c.imageTokens > 0) history_.insert(history_.end(), size_t(c.imageTokens), placeholder);
        else history_.push_back(c.token);
    }
    res_.reusedTokens = reusePos;
}

// Decodes the items past the reused prefix: tokens in batches of nBatch, each image in its own
// decode, or with the text after it where they mix; logits only for the prompt's last position.
// False when stopped (cancel, deadline).
bool Generation::prefill(const PromptPlan & p) {
    const int32_t nBatch = int32_t(ctx_.options().nBatch);
    TokenBatch batch(nBatch);
    llama_pos pos = p.reusePositions;
    // An image waiting to share its decode with the text after it, and its first position.
    const PromptItem * image = nullptr;
    llama_pos imagePos = 0;
    const auto imageRows = [&]() { return image ? image->item.imageTokens : 0; };
    const auto flushBatch = [&]() {
        bool ok = true;
        if (image) ok = decodeImageWithText(*image, imagePos, batch) == 0;
        else if (batch.b.n_tokens > 0) ok = decodeTokens(batch) == 0;
        image = nullptr;
        batch.clear();
        return ok;
    };
    for (size_t i = p.reuse; i < p.items.size(); i++) {
        const PromptItem & item = p.items[i];
        if (item.item.imageTokens > 0) {
            if (!flushBatch()) return false;
            if (mixesWithText(item)) {
                image = &item;
                imagePos = pos;
            } else if (decodeImage(item, pos) != 0) {
                return false;
            }
            pos += item.item.imageTokens;
            continue;
        }
        batch.add(item.item.token, pos++, i + 1 == p.items.size());
        if (imageRows() + batch.b.n_tokens == nBatch && !flushBatch()) return false;
    }
    // The grammar's opening forced run (the action's `{"action":"`) rides in the prompt's last decode.
    // Jump-forward runs ride with the token before them the same way.
    // The model's first pick then comes from the prefill's logits, not from a decode of its own.
    if (opts_.jumpForward && sampler_.hasGrammar() && opts_.maxTokens > 0 && batch.b.n_tokens > 0) {
        const int32_t before = batch.b.n_tokens;
        nPast_ = batch.b.pos[0];  // jumpForward places its tokens after the batch, which starts at nPast_
        stoppedEarly_ = jumpForward(batch, nBatch - imageRows());
        openingRun_ = batch.b.n_tokens - before;
    }
    return flushBatch();
}

// ------------------------------------------------------------------------------------------------
// Generation steps

void Generation::generate(int64_t tStart) {
    bool done = sampleFirst(tStart);
    if (speculate_ && !done) common_speculative_begin(ctx_.speculator()->spec(), 0, history_);
    TokenBatch batch(std::max<int32_t>(int32_t(ctx_.options().nBatch), int32_t(ctx_.options().maxOutputs) + 1));
    while (!done && !stopped() && !grammarEnded()) {
        batch.clear();
        batch.add(idLast_, nPast_, true);
        const int32_t width = paddedWidth();
        if (opts_.jumpForward && sampler_.hasGrammar() && jumpForward(batch, width)) break;
        // Drafts follow the last certain token (idLast, or the end of a forced run), whose logits
        // verify the first draft.
        const int32_t firstRow = batch.b.n_tokens - 1;
        const std::vector<llama_token> drafted = draft(batch);
        for (llama_token d : drafted) batch.add(d, nPast_ + batch.b.n_tokens, true);
        const int32_t nInBatch = batch.b.n_tokens;
        // Padding rows come after every real one: causal attention keeps them out of the real
        // rows' logits, and decodeTokens removes them from the KV cache.
        for (llama_pos pos = nPast_ + nInBatch; batch.b.n_tokens < width; pos++) batch.add(idLast_, pos, false);
        if (decodeTokens(batch, nInBatch) != 0) break;
        nPast_ += nInBatch;
        done = drafted.empty() ? acceptSampled() : verify(drafted, firstRow);
        flush();
    }
    flush();
    if (tFirst_ > 0) res_.decodeMs = msSince(tFirst_);
}

// The first token comes from the prompt's logits. True when generation is over.
bool Generation::sampleFirst(int64_t tStart) {
    if (stopped()) return true;
    idLast_ = sampleAt(-1);
    tFirst_ = monotonicNs();
    res_.ttftMs = double(tFirst_ - tStart) / 1e6;
    if (isEog(idLast_) && !opts_.ignoreEos) {
        res_.stopReason = "eos";
        return true;
    }
    sampler_.accept(idLast_);
    const bool done = pushOutput(idLast_);
    flush();
    return done;
}

// The tokens of this step once padded to the context's stepTokens, or 0 for no padding.
// There is none while a speculator reads the target's batches, as it would take the padding for text.
// Nor is there when the context has no room left for it.
int32_t Generation::paddedWidth() const {
    const int32_t width = int32_t(ctx_.options().stepTokens);
    if (width <= 1 || ctx_.speculator() != nullptr) return 0;
    return nPast_ + width <= int32_t(llama_n_ctx(ctx_.raw())) ? width : 0;
}

// Tokens the grammar alone decides ride along in this decode, each one a decode saved (counted in forced).
// They leave room for drafts. A padded step takes them up to its width, and the rest go next step.
// True when generation is over.
bool Generation::jumpForward(TokenBatch & batch, int32_t width) {
    const int32_t room = width > 0 ? width : int32_t(ctx_.options().nBatch) - int32_t(ctx_.options().maxOutputs);
    bool stop = false;
    while (!stop && batch.b.n_tokens < room) {
        if (grammarEnded()) {
            stop = true;  // the forced run completed the grammar: nothing left to decode
            break;
        }
        const int64_t ts = monotonicNs();
        const llama_token f = sampler_.forcedToken();
        res_.sampleMs += msSince(ts);
        if (f < 0) break;
        sampler_.accept(f);
        res_.forced++;
        batch.b.logits[batch.b.n_tokens - 1] = 0;
        batch.add(f, nPast_ + batch.b.n_tokens, true);
        stop = pushOutput(f);
    }
    flush();
    return stop;
}

// Speculation: draft tokens after the batch's last token, verified in the same target decode.
// Under a grammar with an index, a draft model drafts among the admitted tokens (draftUnderGrammar).
// Other drafts are cut at the first token the grammar refuses, so no verify row is spent on them.
std::vector<llama_token> Generation::draft(const TokenBatch & batch) {
    std::vector<llama_token> out;
    if (!speculate_) return out;
    SpecState * spec = ctx_.speculator();
    const int32_t last = batch.b.n_tokens - 1;
    const llama_pos pos0 = batch.b.pos[last];
    const int32_t nCtx = int32_t(llama_n_ctx(ctx_.raw()));
    int32_t nMax = opts_.nDraft >= 0 ? opts_.nDraft : spec->nMax();
    nMax = std::min<int32_t>(nMax, nCtx - pos0 - 2);
    nMax = std::min<int32_t>(nMax, opts_.maxTokens - int32_t(res_.tokens.size()) - 1);
    nMax = std::min<int32_t>(nMax, int32_t(ctx_.options().maxOutputs) - 1);
    nMax = std::min<int32_t>(nMax, int32_t(ctx_.options().nBatch) - batch.b.n_tokens);
    if (nMax <= 0) return out;
    const int64_t td = monotonicNs();
    commonDraft_ = !(sampler_.cursor() && spec->ownsMemory());
    if (!commonDraft_) {
        out = draftUnderGrammar(batch, nMax);
    } else if (last == 0 || spec->draftContext() == nullptr) {
        // A model drafter reads the target's state at its last decoded token.
        // So it cannot draft past a forced run the target has not decoded yet. n-gram lookup can: the run joins the history.
        const size_t known = history_.size();
        history_.insert(history_.end(), batch.b.token, batch.b.token + last);
        common_speculative_get_draft_params(spec->spec(), 0) = {true, nMax, pos0, batch.b.token[last], &history_, &out};
        common_speculative_draft(spec->spec());
        history_.resize(known);
        if (int32_t(out.size()) > nMax) out.resize(size_t(nMax));
        cutInvalidDrafts(out);
    }
    res_.draftMs += msSince(td);
    spec->truncate(nPast_);
    return out;
}

// The draft model under the grammar. It decodes what the target is about to decode: idLast and any forced run.
// Then it drafts greedily among the admitted tokens. Forced runs become drafts as they are: the target takes them without a choice.
// It stops below the speculator's pMin, measured among the admitted tokens.
std::vector<llama_token> Generation::draftUnderGrammar(const TokenBatch & batch, int32_t nMax) {
    SpecState * spec = ctx_.speculator();
    llama_context * dft = spec->draftContext();
    const llama_vocab * vocab = ctx_.model()->vocab();
    IndexCursor cursor = sampler_.cursor();
    std::vector<llama_token> out;
    std::vector<llama_token_data> cand;
    TokenBatch pending(batch.b.n_tokens + nMax + 1);  // tokens the draft model has not seen yet
    for (int32_t i = 0; i < batch.b.n_tokens; i++) pending.add(batch.b.token[i], batch.b.pos[i], false);
    llama_pos pos = batch.b.pos[batch.b.n_tokens - 1] + 1;
    while (int32_t(out.size()) < nMax) {
        for (llama_token f = cursor.forced(); f >= 0 && int32_t(out.size()) < nMax; f = cursor.forced()) {
            cursor.advance(f);
            out.push_back(f);
            pending.add(f, pos++, false);
        }
        if (int32_t(out.size()) >= nMax || cursor.complete()) break;
        pending.b.logits[pending.b.n_tokens - 1] = 1;
        if (llama_decode(dft, pending.b) != 0) break;
        pending.clear();
        const float * logits = llama_get_logits_ith(dft, -1);
        const llama_token t = cursor.best(logits);
        if (t < 0 || llama_vocab_is_eog(vocab, t)) break;
        if (spec->pMin() > 0.0f) {
            cand.clear();
            cursor.candidates(logits, cand);
            double sum = 0;
            for (const auto & c : cand) sum += std::exp(double(c.logit) - double(logits[t]));
            if (1.0 / sum < double(spec->pMin())) break;
        }
        cursor.advance(t);
        out.push_back(t);
        pending.add(t, pos++, false);
    }
    return out;
}

// Drops drafts from the first one the grammar refuses (a forced run admits only its own tokens).
void Generation::cutInvalidDrafts(std::vector<llama_token> & drafted) {
    IndexCursor cursor = sampler_.cursor();
    if (!cursor) return;
    size_t ok = 0;
    for (; ok < drafted.size(); ok++) {
        const llama_token f = cursor.forced();
        const llama_token d = drafted[ok];
        if ((f >= 0 && d != f) || llama_vocab_is_eog(ctx_.model()->vocab(), d) || !cursor.advance(d)) break;
    }
    res_.draftsCut += int32_t(drafted.size() - ok);
    drafted.resize(ok);
}

// No draft: sample the one new position. True when generation is over.
bool Generation::acceptSampled() {
    const llama_token t = sampleAt(-1);
    if (isEog(t) && !opts_.ignoreEos) {
        res_.stopReason = "eos";
        return true;
    }
    sampler_.accept(t);
    idLast_ = t;
    return pushOutput(t);
}

// Samples at each drafted position until the target disagrees. Rows start at firstRow, the last certain token.
// Keeps the certain tokens and the accepted drafts in the KV cache. True when generation is over.
bool Generation::verify(const std::vector<llama_token> & drafted, int32_t firstRow) {
    res_.drafted += int32_t(drafted.size());
    std::vector<llama_token> ids;
    bool eos = false;
    for (size_t i = 0; i <= drafted.size(); i++) {
        const llama_token t = sampleAt(firstRow + int32_t(i), int32_t(i));
        if (isEog(t) && !opts_.ignoreEos) {
            eos = true;
            break;
        }
        sampler_.accept(t);
        ids.push_back(t);
        if (i < drafted.size() && t != drafted[i]) break;
    }
    size_t nAcc = ids.empty() ? 0 : std::min(ids.size() - 1, drafted.size());
    if (eos) nAcc = std::min(ids.size(), drafted.size());  // drafts matched up to the EOS
    res_.accepted += int32_t(nAcc);
    // (draftUnderGrammar drafts without common_speculative, which then has nothing to account)
    if (commonDraft_) common_speculative_accept(ctx_.speculator()->spec(), 0, uint16_t(nAcc));
    const size_t rejected = drafted.size() - nAcc;
    const llama_pos keep = nPast_ - llama_pos(rejected);
    truncateKv(keep);
    ctx_.cache().resize(ctx_.cache().size() - rejected);
    history_.resize(history_.size() - rejected);
    nPast_ = keep;
    if (!ids.empty()) idLast_ = ids.back();
    for (llama_token t : ids)
        if (pushOutput(t)) return true;
    if (eos) res_.stopReason = "eos";
    return eos;
}

// ------------------------------------------------------------------------------------------------
// Helpers

// Only end-of-generation is admissible: any sampler would pick an EOG token, so generation ends
// without the decode that would give its logits. Sets the stop reason.
bool Generation::grammarEnded() {
    if (opts_.ignoreEos || !sampler_.grammarComplete()) return false;
    res_.stopReason = "eos";
    return true;
}

// Sets the stop reason and returns true when cancelled or past the deadline.
bool Generation::stopped() {
    const int stop = ctx_.stopRequested();
    if (stop != 0) res_.stopReason = stopReasonOf(stop);
    return stop != 0;
}

// llama_decode returned 2: the abort callback saw a cancel or the deadline. Returns 2.
int Generation::aborted() {
    const int stop = ctx_.stopRequested();
    res_.stopReason = stopReasonOf(stop == 0 ? 1 : stop);
    return 2;
}

// Decodes a token batch whose first nReal tokens are real (-1: all). The rest is padding, removed from the KV cache after.
// Keeps the cache, the prompt history and the speculator in step.
// Returns 0 on success, 2 when aborted (cancel, deadline); throws on other failures.
int Generation::decodeTokens(TokenBatch & batch, int32_t nReal) {
    if (nReal < 0) nReal = batch.b.n_tokens;
    llama_context * lctx = ctx_.raw();
    const llama_pos p0 = batch.b.pos[0];
    if (const int ret = decodeCounted(batch.b, p0, "the batch", nReal == 1); ret != 0) return ret;
    if (nReal < batch.b.n_tokens) {
        llama_memory_seq_rm(llama_get_memory(lctx), 0, p0 + nReal, -1);
        res_.paddedSteps++;
    }
    keepTokens(batch, nReal);
    if (SpecState * s = ctx_.speculator()) {
        if (!common_speculative_process(s->spec(), batch.b)) throw std::runtime_error("speculator failed to process a batch");
    }
    return 0;
}

// One llama_decode to its end (synchronized), counted in the result; `single` counts it as a one-token call too.
// On failure the KV cache drops the rows from pos0 on. Returns 0, or 2 when aborted; throws naming `what` otherwise.
int Generation::decodeCounted(const llama_batch & b, llama_pos pos0, const char * what, bool single) {
    llama_context * lctx = ctx_.raw();
    const int32_t reusedBefore = llama_perf_context(lctx).n_reused;
    const int64_t t0 = monotonicNs();
    const int ret = llama_decode(lctx, b);
    llama_synchronize(lctx);
    const double ms = msSince(t0);
    res_.llamaDecodeMs += ms;
    res_.decodeCalls++;
    if (single) {
        res_.singleDecodeCalls++;
        res_.singleDecodeMs += ms;
    }
    if (llama_perf_context(lctx).n_reused > reusedBefore) res_.graphReuses++;
    if (ret == 0) return 0;
    llama_memory_seq_rm(llama_get_memory(lctx), 0, pos0, -1);
    if (ret == 2) return aborted();
    throw std::runtime_error(ret == 1 ? std::string("llama_decode: no KV slot for ") + what + " (context full)"
                                      : std::string("llama_decode (") + what + ") failed with code " + std::to_string(ret));
}

// The prompt cache and history take a decoded batch's first n tokens.
void Generation::keepTokens(const TokenBatch & batch, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        ctx_.cache().push_back(CacheItem{batch.b.token[i], 0, 0});
        history_.push_back(batch.b.token[i]);
    }
}

// The prompt cache and history take a decoded image.
void Generation::keepImage(const PromptItem & p) {
    ctx_.cache().push_back(p.item);
    history_.insert(history_.end(), size_t(p.item.imageTokens), ctx_.model()->info().imageStartToken);
}

// Whether an image's rows may share a decode with the text after it: a Gemma 4 image read causally,
// where the patch builds the mixed input, and no speculator that must see the image on its own.
bool Generation::mixesWithText(const PromptItem & p) const {
    const ModelInfo & mi = ctx_.model()->info();
    return ctx_.options().mixedPrefill && mi.arch == "gemma4" && !imageNonCausal(mi, p) && ctx_.speculator() == nullptr &&
        uint32_t(p.item.imageTokens) < ctx_.options().nBatch;
}

// Decodes an image's rows and then the text rows of `text` in one llama_decode (a mixed batch: a row with
// LLAMA_TOKEN_NULL reads its embedding). Returns 0 on success, 2 when aborted; throws on other failures.
int Generation::decodeImageWithText(const PromptItem & p, llama_pos pos0, TokenBatch & text) {
    const size_t nEmbd = size_t(ctx_.model()->info().nEmbd);
    const int32_t nImage = p.item.imageTokens;
    const int32_t n = nImage + text.b.n_tokens;
    std::vector<llama_token> tokens(size_t(n), LLAMA_TOKEN_NULL);
    std::vector<float> embd(size_t(n) * nEmbd, 0.0f);
    std::copy(p.embd, p.embd + size_t(nImage) * nEmbd, embd.begin());
    std::vector<llama_pos> pos(static_cast<size_t>(n));
    std::vector<int32_t> nSeq(size_t(n), 1);
    llama_seq_id seq0 = 0;
    std::vector<llama_seq_id *> seqIds(size_t(n), &seq0);
    std::vector<int8_t> logits(size_t(n), 0);
    for (int32_t i = 0; i < nImage; i++) pos[size_t(i)] = pos0 + i;
    for (int32_t i = 0; i < text.b.n_tokens; i++) {
        tokens[size_t(nImage + i)] = text.b.token[i];
        pos[size_t(nImage + i)] = text.b.pos[i];
        logits[size_t(nImage + i)] = text.b.logits[i];
    }
    llama_batch b{n, tokens.data(), embd.data(), pos.data(), nSeq.data(), seqIds.data(), logits.data()};
    if (const int ret = decodeCounted(b, pos0, "the image and its text"); ret != 0) return ret;
    keepImage(p);
    keepTokens(text, text.b.n_tokens);
    return 0;
}

// Decodes one image's rows in a single batch, non-causally when the model's rule says so.
// Returns 0 on success, 2 when aborted; throws on other failures.
int Generation::decodeImage(const PromptItem & p, llama_pos pos0) {
    llama_context * lctx = ctx_.raw();
    const ModelInfo & mi = ctx_.model()->info();
    const ContextOptions & co = ctx_.options();
    const int32_t n = p.item.imageTokens;
    const bool nonCausal = imageNonCausal(mi, p);
    if (uint32_t(n) > co.nBatch) {
        throw std::runtime_error("image of " + std::to_string(n) + " tokens exceeds nBatch " + std::to_string(co.nBatch));
    }
    if (nonCausal && uint32_t(n) > co.nUbatch) {
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
    {
        const NonCausalScope scope(lctx, nonCausal);
        if (const int ret = decodeCounted(b, pos0, "the image"); ret != 0) return ret;
    }
    keepImage(p);
    if (SpecState * s = ctx_.speculator()) {
        if (s->ownsMemory()) {
            // The draft model cannot read the target's image rows: keep its positions aligned with
            // placeholder tokens so later text lands at the same positions.
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

void Generation::truncateKv(llama_pos from) {
    llama_memory_seq_rm(llama_get_memory(ctx_.raw()), 0, from, -1);
    if (SpecState * s = ctx_.speculator()) s->truncate(from);
}

// ahead: rows sampled earlier in this decode whose tokens are not yet in the output (verify).
llama_token Generation::sampleAt(int32_t idx, int32_t ahead) {
    if (opts_.topLogits > 0) recordTopLogits(idx, int32_t(res_.tokens.size()) + ahead);
    const int64_t ts = monotonicNs();
    const llama_token t = sampler_.sample(ctx_.raw(), idx);
    res_.sampleMs += msSince(ts);
    if (opts_.recordSampleTimes) res_.sampleUs.push_back(float(monotonicNs() - ts) / 1e3f);
    return t;
}

// Keeps the row's K largest raw logits (before any sampler), highest first, ties by lower id. Outside sampleMs.
void Generation::recordTopLogits(int32_t idx, int32_t step) {
    const float * logits = llama_get_logits_ith(ctx_.raw(), idx);
    if (logits == nullptr) return;
    const int32_t n = llama_vocab_n_tokens(ctx_.model()->vocab());
    const size_t k = size_t(std::min(opts_.topLogits, n));
    auto better = [logits](llama_token a, llama_token b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::vector<llama_token> top;
    top.reserve(k + 1);
    for (llama_token i = 0; i < n; i++) {
        if (top.size() == k && !better(i, top.back())) continue;
        top.insert(std::upper_bound(top.begin(), top.end(), i, better), i);
        if (top.size() > k) top.pop_back();
    }
    TopLogits r;
    r.step = step;
    r.ids = top;
    for (llama_token t : top) r.logits.push_back(logits[t]);
    res_.topLogits.push_back(std::move(r));
}

// Appends a generated token to the output (and to what the sink gets next); true when generation
// must stop.
bool Generation::pushOutput(llama_token t) {
    const size_t before = res_.tokens.size();
    const bool stop = appendOutput(ctx_.model()->vocab(), opts_, res_, t);
    if (res_.tokens.size() > before) emitted_.push_back(t);
    return stop;
}

void Generation::flush() {
    if (!emitted_.empty() && sink_) sink_(emitted_);
    emitted_.clear();
}

bool Generation::isEog(llama_token t) const { return llama_vocab_is_eog(ctx_.model()->vocab(), t); }

}  // namespace percept
