#include "batch.h"

#include "model.h"
#include "util.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <stdexcept>
#include <string>

namespace percept {

namespace {

double msBetween(int64_t t0, int64_t t1) { return double(t1 - t0) / 1e6; }

// How many recent steps (per sharing), prefills and generations admission predicts from, and how many steps
// (of any sharing) a step's time counts for.
constexpr size_t kStepSamples = 16;
constexpr int64_t kStepFresh = 256;
// What a busy decoder predicts with: the mean of a sharing's recent steps, and the median recent prefill.
// A run of steps costs about as many means, image steps included. An idle decoder predicts with the least.
constexpr double kTypical = -1;
constexpr double kLeast = 0;
// Standard deviations of a run of steps' sum that a busy decoder adds as margin.
// It admits the earliest deadline that fits; with no margin, those that just fit would miss half the time.
constexpr double kSpread = 2;
constexpr size_t kReqSamples = 16;
// Image decodes the tail's weighing fits its line through: a group's, a tail's and a lone frame's sizes.
constexpr size_t kImageSamples = 32;
// An idle decoder that has run no step for this long admits its earliest deadline not yet late, even if predicted to miss.
// That is a probe. Prefill times and generation steps never expire, and step times expire only as steps run.
// Without probes, a history from a slow spell or a tighter budget could drop every later request for good.
// 1 s is long next to a step and a camera's frame period, so a busy stream of hopeless requests is still dropped.
// It is short enough that a stalled decoder recovers within about a second.
constexpr int64_t kProbeNs = 1000000000;
// Deadlines this close count as one for admission's order (native/README.md#deadlines).
// Cameras triggered by one clock, or within half a 10 Hz period, then take turns: least recently admitted first.
// It is small next to a frame budget, so a request whose deadline is really earlier still goes first.
constexpr int64_t kFairWindowNs = 50000000;

int64_t nsOf(double ms) { return int64_t(ms * 1e6); }

template <typename T> void keepLast(std::deque<T> & d, T v, size_t n) {
    d.push_back(v);
    if (d.size() > n) d.pop_front();
}

}  // namespace

// One admitted request: its plan, where its prompt stands, its sampler and what it has in the
// batch being built.
struct BatchScheduler::Active {
    // Takes the job only once the sampler is built, which may throw: its buffers are vocab-sized.
    // Then the caller still holds the job and hands it back with the error.
    Active(std::unique_ptr<SeqJob> & j, Model * model) : seq(j->seq), sampler(model, j->opts.sampling, std::move(j->grammar)) {
        job = std::move(j);
    }

    std::unique_ptr<SeqJob> job;
    const llama_seq_id seq;
    Sampler sampler;
    PromptPlan plan;
    size_t next = 0;             // the next plan item to decode
    int32_t imageRows = 0;       // rows of plan.items[next] (an image chunked causally) in the KV already
    llama_pos nPast = 0;         // positions in the KV cache (a partial image's rows included)
    llama_token idLast = -1;     // generating: the last sampled token, decoded in the next step
    bool generating = false;     // the prompt is decoded and the first token sampled
    bool backendGreedy = false;  // its tokens are taken in llama.cpp's graph (useBackendGreedy)
    int32_t genSteps = 0;        // steps that decoded its generated tokens
    bool done = false;
    int64_t tAdmit = 0;
    int64_t tFirst = 0;
    // Generating: this step's tokens (the last sampled one, then any forced run).
    std::vector<llama_token> run;
    // In the token batch being built: its first token, how many, its logits row (-1: none).
    int32_t tokStart = 0;
    int32_t tokCount = 0;
    int32_t row = -1;
    // This step's prompt take: positions, and whether they are image rows.
    int32_t take = 0;
    bool takeImage = false;
    // Mixing: text rows after an image this step completes, decoded with it.
    int32_t takeText = 0;

    const PromptItem & item() const { return plan.items[next]; }
    bool promptDone() const { return next == plan.items.size(); }
};

BatchScheduler::BatchScheduler(llama_context * ctx, Model * model, SerialThread & thread, BatchOptions options, Done done)
    : ctx_(ctx), model_(model), thread_(thread), opts_(options), done_(std::move(done)),
      // A unified cache lets one sequence take every cell; llama_n_ctx_seq is the whole context.
      // Each gets its share instead, so every camera's prompt and new tokens fit at the same time.
      // With stepRows, the cells for padding rows are not any sequence's.
      nCtxSeq_(options.kvUnified ? (int32_t(llama_n_ctx(ctx)) - paddingCells(options.nSeq, options.stepRows)) / options.nSeq
                                 : int32_t(llama_n_ctx_seq(ctx))),
      expected_(new std::atomic<int32_t>[size_t(options.nSeq)]), caches_(size_t(options.nSeq)),
      positions_(new std::atomic<int32_t>[size_t(options.nSeq)]), tokens_(std::make_unique<TokenBatch>(options.nBatch)),
      seqRestMs_(size_t(options.nSeq), 0), admittedNs_(size_t(options.nSeq), 0), stepMs_(size_t(options.nSeq)),
      // Only gemma4's graph builds the mixed input; padded steps and per-sequence streams keep their own layouts.
      mixSteps_(options.mixSteps && options.kvUnified && options.stepRows == 0 && model->info().arch == "gemma4"),
      padFrom_(size_t(options.nSeq), -1) {
    for (int32_t s = 0; s < opts_.nSeq; s++) {
        positions_[size_t(s)].store(0);
        expected_[size_t(s)].store(0);
    }
}

BatchScheduler::~BatchScheduler() {
    std::unique_lock<std::mutex> lock(mutex_);
    closing_ = true;
    wake_.notify_all();
    idle_.wait(lock, [this]() { return !running_; });
    // The loop has stopped: take the chains off the context before they are freed.
    dropBackendSamplers();
}

// Whether a request on `seq` that `wants` it samples in llama.cpp's graph. Sets or takes off the sequence's greedy chain;
// each change makes llama.cpp reserve its scheduler again, so a chain stays while its sequence's requests want it.
bool BatchScheduler::useBackendGreedy(int32_t seq, bool wants) {
    const auto s = size_t(seq);
    if (backendGreedy_.size() <= s) backendGreedy_.resize(size_t(opts_.nSeq));
    wants = wants && opts_.backendSampling && !backendRefused_;
    if (wants && !backendGreedy_[s]) {
        SamplerChainPtr chain(llama_sampler_chain_init(llama_sampler_chain_default_params()));
        llama_sampler_chain_add(chain.get(), llama_sampler_init_greedy());
        // llama.cpp names a sampler it runs in the graph "+name"; a device without the op gets none.
        const bool set = llama_set_sampler(ctx_, seq, chain.get());
        const char * name = set ? llama_sampler_name(llama_sampler_chain_get(chain.get(), 0)) : nullptr;
        if (!name || name[0] != '+') {
            if (set) llama_set_sampler(ctx_, seq, nullptr);
            backendRefused_ = true;
            samplersChanged_ = samplersChanged_ || set;
            return false;
        }
        backendGreedy_[s] = std::move(chain);
        samplersChanged_ = true;
    } else if (!wants && backendGreedy_[s]) {
        // Off the context before it is freed; llama.cpp builds its next graph without it.
        llama_set_sampler(ctx_, seq, nullptr);
        backendGreedy_[s].reset();
        samplersChanged_ = true;
    }
    return bool(backendGreedy_[s]);
}

// Every sequence's chain off the context, as raw decodes (timeCeiling) must not sample. Only while no request runs.
void BatchScheduler::dropBackendSamplers() {
    for (size_t s = 0; s < backendGreedy_.size(); s++) {
        if (!backendGreedy_[s]) continue;
        llama_set_sampler(ctx_, llama_seq_id(s), nullptr);
        backendGreedy_[s].reset();
    }
}

void BatchScheduler::submit(std::unique_ptr<SeqJob> job) {
    job->submittedNs = monotonicNs();
    bool start = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        inbox_.push_back(Inbox{std::move(job), -1});
        start = !running_;
        running_ = true;
    }
    wake_.notify_all();
    if (start) thread_.post([this]() { loop(); });
}

void BatchScheduler::clear(int32_t seq) {
    bool start = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        inbox_.push_back(Inbox{nullptr, seq});
        start = !running_;
        running_ = true;
    }
    wake_.notify_all();
    if (start) thread_.post([this]() { loop(); });
}

void BatchScheduler::expect(int32_t seq, int32_t delta) {
    {
        // Under the lock, so a loop about to wait sees it or is woken.
        std::lock_guard<std::mutex> lock(mutex_);
        expected_[size_t(seq)].fetch_add(delta, std::memory_order_relaxed);
    }
    wake_.notify_all();
}

// ------------------------------------------------------------------------------------------------
// The loop: runs on the context's thread while there is work, then stops (a later submit posts it
// again).

void BatchScheduler::loop() {
    for (;;) {
        std::deque<Inbox> items;
        bool closing = false;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            // Holding a group: sleep until a request or an expect() comes, or the hold ends.
            if (holdUntilNs_ > 0 && inbox_.empty() && !closing_) {
                const int64_t t0 = monotonicNs();
                const int64_t left = holdUntilNs_ - t0;
                if (left > 0) wake_.wait_for(lock, std::chrono::nanoseconds(left));
                account_.holdMs += msBetween(t0, monotonicNs());
            }
            items.swap(inbox_);
            closing = closing_;
            if (items.empty() && waiting_.empty() && active_.empty()) {
                running_ = false;
                idle_.notify_all();
                return;
            }
        }
        try {
            intake(items);
            if (closing) {
                for (auto & j : waiting_) j->cancelled.store(true);
                for (auto & a : active_) a->job->cancelled.store(true);
            }
            const bool idle = active_.empty();
            admit();
            if (idle && !active_.empty()) account_.groups++;
            step();
            publishPrediction();  // the sharing and step times as of this step
        } catch (const std::exception & e) {
            // Nothing a request did: the loop itself failed (allocation). Every request learns why.
            for (auto & a : active_) fail(*a, std::string("batch scheduler: ") + e.what());
            removeFinished();
        }
    }
}

void BatchScheduler::intake(std::deque<Inbox> & items) {
    for (Inbox & it : items) {
        if (it.job) {
            waiting_.push_back(std::move(it.job));
            continue;
        }
        llama_memory_seq_rm(llama_get_memory(ctx_), it.clearSeq, -1, -1);
        caches_[size_t(it.clearSeq)].clear();
        syncPositions(it.clearSeq);
    }
}

// Admission, by the rule in native/README.md#deadlines.
// First, every waiting request that is cancelled, out of time or predicted to miss at today's sharing ends.
// Then, while there is room, the earliest deadline that can still make it at that sharing is admitted.
// That holds only while one more sequence would make none of the admitted ones miss.
void BatchScheduler::admit() {
    holdUntilNs_ = 0;
    if (waiting_.empty()) {
        lastAdmitQueued_ = false;  // see below
        return;
    }
    const int64_t now = monotonicNs();
    // Ends a waiting request before its prefill: cancelled, late, or a predicted miss (predictedMs > 0).
    auto endWaiting = [&](auto it, const char * reason, double predictedMs) {
        std::unique_ptr<SeqJob> job = std::move(*it);
        it = waiting_.erase(it);
        job->result.stopReason = reason;
        job->counts.queueMs = msBetween(job->submittedNs, now);
        if (predictedMs > 0) {
            job->counts.predictedMs = predictedMs;
            job->counts.predictedMiss = true;
        }
        done_(std::move(job));
        return it;
    };
    const int32_t sharing = std::max(int32_t(active_.size()), 1);
    // An idle decoder drops only what its fastest recent times could not finish in time.
    // Only running corrects a prediction, so one from a slow spell must not drop every request for good.
    // A busy decoder drops by the typical prediction.
    auto q = [this]() { return active_.empty() ? kLeast : kTypical; };
    const double hopelessMs = predictMs(sharing, nullptr, false, q());
    // Idle and no step for kProbeNs: the earliest deadline that is not late runs whatever its
    // prediction (its run refreshes the history).
    auto key = [](const SeqJob & j) { return std::make_pair(j.opts.deadlineNs > 0 ? j.opts.deadlineNs : INT64_MAX, j.submittedNs); };
    const SeqJob * probe = nullptr;
    if (active_.empty() && now - lastDecodeNs_ >= kProbeNs) {
        for (const auto & j : waiting_) {
            const int64_t dl = j->opts.deadlineNs;
            if (j->cancelled.load() || (dl > 0 && now >= dl)) continue;
            if (!probe || key(*j) < key(*probe)) probe = j.get();
        }
    }
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        SeqJob & j = **it;
        const int64_t dl = j.opts.deadlineNs;
        const bool cancelled = j.cancelled.load();
        const bool late = dl > 0 && now >= dl;
        const bool predicted = !cancelled && !late && dl > 0 && hopelessMs > 0 && now + nsOf(hopelessMs) > dl && &j != probe;
        if (!cancelled && !late && !predicted) {
            ++it;
            continue;
        }
        it = endWaiting(it, cancelled ? "cancelled" : "deadline", predicted ? hopelessMs : 0);
    }
    // The queue emptied without an admission: the next gap would measure idle time, not its pace.
    if (waiting_.empty()) lastAdmitQueued_ = false;
    bool deadlines = false;
    for (const auto & j : waiting_) deadlines = deadlines || j->opts.deadlineNs > 0;
    for (const auto & a : active_) deadlines = deadlines || a->job->opts.deadlineNs > 0;
    // Admitting together, an idle decoder may hold its waiting requests for those on their way.
    if (opts_.admitTogether && active_.empty() && holdForComing(now)) return;
    // Admitting together: while a group runs, a waiting request waits for its end and the next group, unless it would then miss.
    // holdMs is that wait and the request's own time in the next group; below 0, nothing is held (no group, or no history).
    double holdMs = -1;
    // The group's tail: the waiting requests go in beside its last members, not after the longest of them.
    bool tail = joinsTail(int64_t(waiting_.size())) && active_.size() <= waiting_.size();
    if (opts_.weighTail && !active_.empty() && !waiting_.empty() && int32_t(active_.size()) < opts_.maxActive) {
        tail = tailPays(now, joiners(false));
        (tail ? account_.tailJoins : account_.tailHolds)++;
    }
    if (opts_.admitTogether && !active_.empty() && !tail) {
        const double own = predictMs(std::min(opts_.maxActive, int32_t(waiting_.size())), nullptr, true, kTypical);
        if (own > 0) holdMs = groupRestMs() + own;
    }
    // Without joinRunning, every waiting request waits for the group's end; one that would then miss is dropped now.
    const bool holdAll = opts_.admitTogether && !opts_.joinRunning && !active_.empty() && !tail;
    for (auto it = waiting_.begin(); holdAll && holdMs >= 0 && it != waiting_.end();) {
        const int64_t dl = (*it)->opts.deadlineNs;
        if (dl == 0 || now + nsOf(holdMs) <= dl) {
            ++it;
            continue;
        }
        it = endWaiting(it, "deadline", holdMs);
        if (waiting_.empty()) lastAdmitQueued_ = false;
    }
    auto held = [&](const SeqJob & j) {
        return holdAll || (holdMs >= 0 && (j.opts.deadlineNs == 0 || now + nsOf(holdMs) <= j.opts.deadlineNs));
    };
    const bool joining = !active_.empty();  // admissions now go in beside a running group
    while (!waiting_.empty() && int32_t(active_.size()) < opts_.maxActive) {
        const int32_t seqs = int32_t(active_.size()) + 1;
        // With deadlines, the sharing grows one step at a time, to one past the most that has been timed.
        // So a burst is not admitted whole before anything says what a step of that many costs.
        // A group is admitted whole: the check below keeps it to what its members can make in time.
        if (!opts_.admitTogether && deadlines && seqs > 2 && stepMsAt(seqs, kLeast).ms == 0 && stepMsAt(seqs - 1, kLeast).ms == 0) return;
        // One more sequence must not make an admitted request miss that would make it as things are.
        const double ms = predictMs(seqs, nullptr, seqs > 1, kTypical);
        if (ms > 0 && seqs > 1) {
            for (const auto & a : active_) {
                const int64_t dl = a->job->opts.deadlineNs;
                if (dl > 0 && now + nsOf(predictMs(seqs - 1, a.get(), true, kTypical)) <= dl &&
                    now + nsOf(predictMs(seqs, a.get(), true, kTypical)) > dl)
                    return;
            }
        }
        // The earliest deadline that fits `within` at this sharing (the others wait for less); among
        // deadlines within kFairWindowNs of it, the sequence admitted least recently.
        auto earliest = [&](double within) {
            auto fits = [&](const SeqJob & j) {
                const int64_t dl = j.opts.deadlineNs;
                return !held(j) && !(within > 0 && dl > 0 && now + nsOf(within) > dl);
            };
            auto first = waiting_.end();
            for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
                if (fits(**it) && (first == waiting_.end() || key(**it) < key(**first))) first = it;
            }
            // Without a deadline: arrival order (FIFO, see Admission).
            if (first == waiting_.end() || key(**first).first == INT64_MAX) return first;
            const int64_t horizon = key(**first).first > INT64_MAX - kFairWindowNs ? INT64_MAX : key(**first).first + kFairWindowNs;
            auto turn = [&](const SeqJob & j) { return std::make_pair(admittedNs_[size_t(j.seq)], key(j)); };
            auto pick = first;
            for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
                if (fits(**it) && key(**it).first <= horizon && turn(**it) < turn(**pick)) pick = it;
            }
            return pick;
        };
        auto pick = earliest(ms);
        // An idle decoder serves one that may still make it rather than none.
        if (pick == waiting_.end() && active_.empty()) pick = earliest(predictMs(1, nullptr, false, kLeast));
        if (pick == waiting_.end() && active_.empty() && probe) {
            pick = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto & j) { return j.get() == probe; });
        }
        if (pick == waiting_.end()) return;
        std::unique_ptr<SeqJob> j = std::move(*pick);
        waiting_.erase(pick);
        j->counts.predictedMs = ms;
        // The queue's pace: gaps between admissions while requests kept waiting.
        if (lastAdmitQueued_) keepLast(admitGapMs_, msBetween(lastAdmitNs_, now), kReqSamples);
        lastAdmitNs_ = now;
        lastAdmitQueued_ = !waiting_.empty();
        if (joining) account_.joins++;
        start(std::move(j));
    }
}

// Admitting together, an idle decoder holds its waiting requests for the frames on their way to the sequences without one.
// It holds at most groupWaitNs from the oldest waiting request, and ends while each still has twice its predicted time left.
bool BatchScheduler::holdForComing(int64_t now) {
    if (opts_.groupWaitNs <= 0) return false;
    std::vector<bool> waits(size_t(opts_.nSeq), false);
    int64_t oldest = now;
    for (const auto & j : waiting_) {
        waits[size_t(j->seq)] = true;
        oldest = std::min(oldest, j->submittedNs);
    }
    int32_t coming = 0;
    for (int32_t s = 0; s < opts_.nSeq; s++)
        coming += !waits[size_t(s)] && expected_[size_t(s)].load(std::memory_order_relaxed) > 0 ? 1 : 0;
    int64_t until = oldest + opts_.groupWaitNs;
    if (coming == 0 || now >= until) return false;
    // The hold ends where the first waiting request would have but twice its time left in the group it makes with those
    // coming: the other half is margin for a slower run than predicted.
    const int32_t size = std::min(opts_.maxActive, int32_t(waiting_.size()) + coming);
    const double own = predictMs(size, nullptr, true, kTypical);
    for (const auto & j : waiting_) {
        const int64_t dl = j->opts.deadlineNs;
        if (j->cancelled.load()) return false;
        // Without a history (own 0), only a hold that ends before the deadline.
        if (dl > 0 && own == 0 && until > dl) return false;
        if (dl > 0) until = std::min(until, dl - 2 * nsOf(own));
    }
    if (now >= until) return false;
    holdUntilNs_ = until;
    return true;
}

// Plans the prompt against the sequence's cache and drops the KV cells past the reused prefix.
void BatchScheduler::start(std::unique_ptr<SeqJob> job) {
    const int64_t now = monotonicNs();
    admittedNs_[size_t(job->seq)] = now;
    job->counts.queueMs = msBetween(job->submittedNs, now);
    std::unique_ptr<Active> a;
    try {
        a = std::make_unique<Active>(job, model_);
    } catch (const CodedFailure & e) {
        job->error = e.what();
        job->errorCode = e.code;
        done_(std::move(job));
        return;
    } catch (const std::exception & e) {
        // The request learns why; its sequence is free again.
        job->error = e.what();
        done_(std::move(job));
        return;
    }
    a->tAdmit = now;
    SeqJob & j = *a->job;
    std::vector<CacheItem> & cache = caches_[size_t(a->seq)];
    try {
        a->plan = planChecked(*model_, j.segments, cache, j.opts.maxTokens, nCtxSeq_);
        const ModelInfo & mi = model_->info();
        for (size_t i = a->plan.reuse; i < a->plan.items.size(); i++) {
            const PromptItem & p = a->plan.items[i];
            if (p.item.imageTokens > 0 && imageNonCausal(mi, p) && p.item.imageTokens > opts_.nUbatch) {
                throw std::runtime_error("image of " + std::to_string(p.item.imageTokens) + " tokens must fit one ubatch for " +
                                         mi.imageAttention + " attention; raise nUbatch to at least " + std::to_string(p.item.imageTokens));
            }
        }
    } catch (const CodedFailure & e) {
        j.error = e.what();
        j.errorCode = e.code;
        done_(std::move(a->job));
        return;
    } catch (const std::exception & e) {
        j.error = e.what();
        done_(std::move(a->job));
        return;
    }
    int32_t imageRows = 0;
    for (size_t i = a->plan.reuse; i < a->plan.items.size(); i++) imageRows += a->plan.items[i].item.imageTokens;
    keepLast(imageRows_, imageRows, kReqSamples);
    const int32_t opening = appendOpeningRun(*a);
    size_t reuse = a->plan.reuse;
    llama_pos reusePos = a->plan.reusePositions;
    llama_memory_t mem = llama_get_memory(ctx_);
    if (!llama_memory_seq_rm(mem, a->seq, reusePos, -1)) {
        llama_memory_seq_rm(mem, a->seq, -1, -1);
        reuse = 0;
        reusePos = 0;
    }
    cache.resize(reuse);
    syncPositions(a->seq);
    a->next = reuse;
    a->nPast = reusePos;
    j.result.promptTokens = a->plan.positions - opening;
    j.result.reusedTokens = reusePos;
    j.result.prefillTokens = a->plan.positions - opening - reusePos;
    const bool greedy = j.opts.sampling.temperature <= 0.0f && !a->sampler.hasGrammar() && j.opts.topLogits == 0;
    a->backendGreedy = useBackendGreedy(a->seq, greedy);
    j.counts.backendSampled = a->backendGreedy;
    active_.push_back(std::move(a));
}

// The grammar's opening forced run joins the prompt, as one sequence's does (Generation::appendOpeningRun).
// The first pick then comes from the prompt's last row, not from a step of its own.
// Only tokens that cannot stop generation join: below max tokens, and no stop strings or tokens.
// The steps take the rest. Returns the tokens appended.
int32_t BatchScheduler::appendOpeningRun(Active & a) {
    const GenerateOptions & o = a.job->opts;
    GenerateResult & res = a.job->result;
    if (!o.jumpForward || !a.sampler.cursor() || !o.stopStrings.empty() || !o.stopTokens.empty()) return 0;
    int32_t n = 0;
    for (llama_token f = a.sampler.forcedToken(); f >= 0 && int32_t(res.tokens.size()) + 1 < o.maxTokens; f = a.sampler.forcedToken()) {
        a.sampler.accept(f);
        res.forced++;
        appendOutput(model_->vocab(), o, res, f);
        a.plan.items.push_back(PromptItem{CacheItem{f, 0, 0}, nullptr, false});
        a.plan.positions++;
        n++;
    }
    return n;
}

namespace {
// The q-quantile of the samples (nearest rank).
template <typename T> T quantile(const std::deque<T> & d, double q) {
    std::vector<T> v(d.begin(), d.end());
    const size_t i = std::min(v.size() - 1, size_t(q * double(v.size())));
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(i), v.end());
    return v[i];
}
}  // namespace

// How long one step takes with `seqs` sequences in it: the q-quantile of the last kStepFresh steps with as many.
// kTypical asks for their mean and standard deviation instead.
// Without such steps it uses the nearest fewer, else with orMore the nearest more; 0 ms: none.
// Old samples expire, so a sharing once timed slow, such as a cold first step, is tried again.
BatchScheduler::StepTime BatchScheduler::stepMs(int32_t seqs, bool orMore, double q) const {
    const int32_t n = int32_t(stepMs_.size());
    seqs = std::min(std::max(seqs, 1), n);
    for (int32_t k = seqs; k >= 1; k--) {
        if (const StepTime t = stepMsAt(k, q); t.ms > 0) return t;
    }
    if (orMore) {
        for (int32_t k = seqs + 1; k <= n; k++) {
            if (const StepTime t = stepMsAt(k, q); t.ms > 0) return t;
        }
    }
    return {};
}

// The recent steps of exactly `seqs` sequences, as stepMs says; 0 ms: none.
BatchScheduler::StepTime BatchScheduler::stepMsAt(int32_t seqs, double q) const {
    if (seqs < 1 || seqs > int32_t(stepMs_.size())) return {};
    std::deque<double> fresh;
    for (const StepSample & x : stepMs_[size_t(seqs - 1)]) {
        if (x.step + kStepFresh >= stepIndex_) fresh.push_back(x.ms);
    }
    if (fresh.empty()) return {};
    if (q >= 0) return {quantile(fresh, q), 0};
    double sum = 0, sq = 0;
    for (double ms : fresh) sum += ms;
    const double mean = sum / double(fresh.size());
    for (double ms : fresh) sq += (ms - mean) * (ms - mean);
    return {mean, std::sqrt(sq / double(fresh.size()))};
}

// The time a request still needs with `seqs` sequences per step. `a` is an admitted request; null is one that waits.
// Prefill: the median (q: the q-quantile) of recent prefill times, less what it has spent in its prefill.
// Generation: the median generation steps of recent requests, less those it has run, at least one.
// Those requests ended on their own or passed their deadline generating. Steps take the time stepMs says.
// The margin is kSpread standard deviations of the sum. 0: no history.
double BatchScheduler::predictMs(int32_t seqs, const Active * a, bool orMore, double q) const {
    if (genSteps_.empty() || prefillMs_.empty()) return 0;
    const StepTime step = stepMs(seqs, orMore, q);
    if (step.ms == 0) return 0;
    double prefill = 0;
    const double prefillMs = quantile(prefillMs_, q < 0 ? 0.5 : q);
    if (!a) prefill = prefillMs;
    else if (!a->generating) prefill = std::max(0.0, prefillMs - msBetween(a->tAdmit, monotonicNs()));
    const int32_t gen = std::max(quantile(genSteps_, 0.5) - (a ? a->genSteps : 0), 1);
    return prefill + double(gen) * step.ms + kSpread * step.sd * std::sqrt(double(gen));
}

// Admitting together: the time the running group still needs, until its longest member ends (0: none runs, or no history).
// Its members' prefill rest, then groupStepsLeft() steps at today's sharing, with predictMs's margin.
// A member with a deadline leaves by it, so where every member has one, the rest ends by the latest.
double BatchScheduler::groupRestMs() const {
    const int32_t steps = groupStepsLeft();
    const StepTime step = stepMs(int32_t(active_.size()), false, kTypical);
    if (steps == 0 || step.ms == 0 || prefillMs_.empty()) return 0;
    const int64_t now = monotonicNs();
    double prefill = 0;
    int64_t lastDeadline = 0;
    for (const auto & a : active_) {
        if (a->done) continue;
        if (!a->generating) prefill = std::max(prefill, quantile(prefillMs_, 0.5) - msBetween(a->tAdmit, now));
        const int64_t dl = a->job->opts.deadlineNs;
        lastDeadline = (dl == 0 || lastDeadline == INT64_MAX) ? INT64_MAX : std::max(lastDeadline, dl);
    }
    double rest = prefill + double(steps) * step.ms + kSpread * step.sd * std::sqrt(double(steps));
    if (lastDeadline > 0 && lastDeadline < INT64_MAX) rest = std::min(rest, std::max(0.0, msBetween(now, lastDeadline)));
    return rest;
}

// The steps until the running group's longest member ends: the median of the longest of its members' rests.
// A member that has run d steps ends like the recent requests that ran longer, and by its maxTokens at the latest.
int32_t BatchScheduler::groupStepsLeft() const {
    if (genSteps_.empty()) return 0;
    std::vector<int32_t> sorted(genSteps_.begin(), genSteps_.end());
    std::sort(sorted.begin(), sorted.end());
    struct Member {
        int32_t ran;
        int32_t most;  // steps it may still take (its tokens left), INT32_MAX: no bound
    };
    std::vector<Member> members;
    for (const auto & a : active_) {
        if (a->done) continue;
        const int32_t maxTokens = a->job->opts.maxTokens;
        const auto tokens = int32_t(a->job->result.tokens.size());
        members.push_back({a->genSteps, maxTokens > 0 ? std::max(1, maxTokens - tokens) : INT32_MAX});
    }
    if (members.empty()) return 0;
    // P(longest rest <= r) is the product of the members' P(rest <= r); the first r past one half (the upper median).
    for (int32_t r = 1; r < sorted.back(); r++) {
        double p = 1;
        for (const Member & m : members) {
            if (r >= m.most) continue;
            const auto longer = std::upper_bound(sorted.begin(), sorted.end(), m.ran);
            const auto n = sorted.end() - longer;
            if (n > 0) p *= double(std::upper_bound(longer, sorted.end(), m.ran + r) - longer) / double(n);
        }
        if (p > 0.5) return r;
    }
    return std::max(sorted.back(), 1);
}

// What admission would predict for a request that arrived now, by its drop rule at today's sharing.
// It serves callers that decide before they submit (predicted()).
void BatchScheduler::publishPrediction() {
    const bool idle = active_.empty();
    const double ms = idle ? predictMs(1, nullptr, false, kLeast) : predictMs(int32_t(active_.size()), nullptr, false, kTypical);
    predicted_.store(ms, std::memory_order_relaxed);
    std::vector<double> own;
    if (opts_.admitTogether) {
        for (int32_t k = 1; k <= opts_.maxActive; k++) own.push_back(predictMs(k, nullptr, k > 1, idle ? kLeast : kTypical));
    }
    // Each sequence's request: running, its own rest; waiting, after the running group (or at today's sharing) its own run.
    std::vector<double> seqRest(size_t(opts_.nSeq), 0);
    std::vector<double> memberRest;  // the running members' rests, shortest first
    const int32_t n = int32_t(active_.size());
    for (const auto & a : active_) {
        if (a->done) continue;
        seqRest[size_t(a->seq)] = predictMs(n, a.get(), false, kTypical);
        memberRest.push_back(seqRest[size_t(a->seq)]);
    }
    std::sort(memberRest.begin(), memberRest.end());
    // The longest member's rest is the group's (groupRestMs), as admission holds for it; no member's is longer.
    if (!memberRest.empty()) {
        memberRest.back() = groupRestMs();
        for (double & rest : memberRest) rest = std::min(rest, memberRest.back());
    }
    // Weighing the tail: whether the waiting requests and one more would join it now.
    const bool wouldJoin = opts_.weighTail && n > 0 && n < opts_.maxActive && tailPays(monotonicNs(), joiners(true));
    if (!waiting_.empty()) {
        const auto next = int32_t(std::min<size_t>(size_t(opts_.maxActive), opts_.admitTogether ? waiting_.size() : size_t(n) + 1));
        const double wait = opts_.admitTogether ? groupWaitMs(memberRest, int64_t(waiting_.size()), wouldJoin) : 0;
        const double after = wait + predictMs(next, nullptr, false, idle ? kLeast : kTypical);
        for (const auto & j : waiting_) seqRest[size_t(j->seq)] = after;
    }
    {
        std::lock_guard<std::mutex> lock(queueMutex_);
        groupOwnMs_.swap(own);
        seqRestMs_.swap(seqRest);
        memberRestMs_.swap(memberRest);
        tailWouldJoin_ = wouldJoin;
        publishedNs_ = monotonicNs();
        accountPublished_ = account_;
        queueGapMs_ = admitGapMs_.empty() ? 0 : quantile(admitGapMs_, 0.5);
        waitingDeadlines_.clear();
        for (const auto & j : waiting_) waitingDeadlines_.push_back(j->opts.deadlineNs > 0 ? j->opts.deadlineNs : INT64_MAX);
        std::sort(waitingDeadlines_.begin(), waitingDeadlines_.end());
    }
    idleSinceNs_.store(idle ? std::max<int64_t>(lastDecodeNs_, 1) : 0, std::memory_order_relaxed);
}

BatchScheduler::Prediction BatchScheduler::predicted(int64_t deadlineNs, int32_t reservedAhead) const {
    const int64_t idleSince = idleSinceNs_.load(std::memory_order_relaxed);
    // An idle decoder past kProbeNs admits a request whatever its prediction (see admit()).
    if (idleSince > 0 && monotonicNs() - idleSince >= kProbeNs) return {};
    const double ms = predicted_.load(std::memory_order_relaxed);
    if (ms == 0) return {};
    std::lock_guard<std::mutex> lock(queueMutex_);
    // Admission's order (native/README.md#deadlines): earlier deadlines first, ties taken by turns and counted as ahead.
    // A request without a deadline comes after every one with.
    const int64_t key = deadlineNs > 0 ? deadlineNs : INT64_MAX;
    const auto ahead = std::upper_bound(waitingDeadlines_.begin(), waitingDeadlines_.end(), key) - waitingDeadlines_.begin();
    if (!opts_.admitTogether) return {double(ahead + reservedAhead) * queueGapMs_, ms};
    // Admitting together: after the running group, every waiting and reserved request goes in the next one.
    // Past maxActive, those admitted before it fill whole groups first.
    const int64_t before = ahead + reservedAhead;
    const int64_t all = int64_t(waitingDeadlines_.size()) + reservedAhead + 1;
    const int64_t groupsBefore = before / opts_.maxActive;
    const int64_t size = std::min<int64_t>(opts_.maxActive, all - groupsBefore * opts_.maxActive);
    const double own = groupOwnMs_.empty() ? 0 : groupOwnMs_[size_t(size - 1)];
    if (own == 0) return {};
    // Those on their way and this one count as waiting.
    return {groupWaitMs(memberRestMs_, all, tailWouldJoin_) + double(groupsBefore) * groupOwnMs_.back(), own};
}

// Admitting together, how long `waiting` requests wait for the running members (their rests, shortest first):
// the whole group's rest, or with admitTail (and tailJoin waiting) until no more members run than requests wait.
// Weighing the tail, none where the weighing said they would join it (weighed), else the whole rest.
double BatchScheduler::groupWaitMs(const std::vector<double> & memberRest, int64_t waiting, bool weighed) const {
    const auto k = int64_t(memberRest.size());
    if (opts_.weighTail) return weighed || k == 0 ? 0 : memberRest.back();
    const int64_t left = joinsTail(waiting) ? std::min(waiting, k) : 0;  // members still running when they go in
    return left >= k ? 0 : memberRest[size_t(k - left - 1)];
}

// The waiting requests the tail would take, in admission's order (deadlines first), as many as there is room for.
// With `another`, one more like the last admitted ones and without a deadline: a caller asking before it submits.
std::vector<BatchScheduler::Joiner> BatchScheduler::joiners(bool another) const {
    std::vector<Joiner> all;
    auto rowsOf = [](const SeqJob & j) {
        int32_t rows = 0;
        for (const Segment & s : j.segments) rows += s.kind == Segment::Image ? s.nTokens : 0;
        return rows;
    };
    for (const auto & j : waiting_) all.push_back(Joiner{j->opts.deadlineNs, rowsOf(*j), j->opts.maxTokens});
    if (another) all.push_back(Joiner{0, imageRows_.empty() ? 0 : quantile(imageRows_, 0.5), 0});
    std::stable_sort(all.begin(), all.end(), [](const Joiner & x, const Joiner & y) {
        return (x.deadlineNs > 0 ? x.deadlineNs : INT64_MAX) < (y.deadlineNs > 0 ? y.deadlineNs : INT64_MAX);
    });
    all.resize(std::min(all.size(), size_t(std::max(opts_.maxActive - int32_t(active_.size()), 0))));
    return all;
}

// Weighing the tail: whether the joiners go in beside the running members now, or wait for the group's end.
// Both sides are predicted from the steps' recent medians, the image decodes' line and the generation steps.
// Joining, the members wait for the joiners' image decode and then share wider steps while both run; waiting, the
// joiners start after the longest member's rest. It joins where more end by their deadlines, or as many sooner in all.
// While a member still reads its prompt in, or without a history, the joiners wait, as admitting together does.
bool BatchScheduler::tailPays(int64_t now, const std::vector<Joiner> & joiners) const {
    if (joiners.empty() || genSteps_.empty()) return false;
    const int32_t gen = quantile(genSteps_, 0.5);
    auto stepsLeft = [&](int32_t done, int32_t maxTokens, int32_t tokens) {
        const int32_t steps = gen - done;
        return std::max(1, maxTokens > 0 ? std::min(steps, maxTokens - tokens) : steps);
    };
    // Each running member's steps left and deadline; a member still reading its prompt in ends the weighing.
    std::vector<std::pair<int32_t, int64_t>> members;
    for (const auto & a : active_) {
        if (a->done) continue;
        if (!a->generating) return false;
        members.emplace_back(stepsLeft(a->genSteps, a->job->opts.maxTokens, int32_t(a->job->result.tokens.size())),
                             a->job->opts.deadlineNs);
    }
    const auto k = int32_t(members.size()), w = int32_t(joiners.size());
    if (k == 0) return false;
    const double stepNow = stepMs(k, true, 0.5).ms, stepShared = stepMs(k + w, true, 0.5).ms, stepAlone = stepMs(w, true, 0.5).ms;
    if (stepNow == 0 || stepShared == 0 || stepAlone == 0) return false;
    int32_t rows = 0;
    for (const Joiner & j : joiners) rows += j.imageRows;
    double image = 0;  // the joiners' image decodes, a ubatch each
    for (int32_t left = rows; left > 0; left -= opts_.nUbatch) {
        const double ms = imageDecodeMs(std::min(left, opts_.nUbatch));
        if (ms == 0) return false;
        image += ms;
    }
    // The wider steps last while both sides still run.
    int32_t longestMember = 0, longestJoiner = 0;
    for (const auto & m : members) longestMember = std::max(longestMember, m.first);
    for (const Joiner & j : joiners) longestJoiner = std::max(longestJoiner, stepsLeft(0, j.maxTokens, 0));
    int32_t inTimeJoin = 0, inTimeWait = 0;
    double sumJoin = 0, sumWait = 0;
    auto count = [&](int64_t deadlineNs, double waitMs, double joinMs) {
        inTimeWait += deadlineNs == 0 || now + nsOf(waitMs) <= deadlineNs ? 1 : 0;
        inTimeJoin += deadlineNs == 0 || now + nsOf(joinMs) <= deadlineNs ? 1 : 0;
        sumWait += waitMs;
        sumJoin += joinMs;
    };
    for (const auto & [steps, deadlineNs] : members) {
        const int32_t shared = std::min(steps, longestJoiner);
        count(deadlineNs, steps * stepNow, image + shared * stepShared + (steps - shared) * stepNow);
    }
    for (const Joiner & j : joiners) {
        const int32_t steps = stepsLeft(0, j.maxTokens, 0);
        const int32_t shared = std::min(steps, longestMember);
        count(j.deadlineNs, longestMember * stepNow + image + steps * stepAlone,
              image + shared * stepShared + (steps - shared) * stepAlone);
    }
    return inTimeJoin > inTimeWait || (inTimeJoin == inTimeWait && sumJoin < sumWait);
}

// An image decode of `rows` rows: the least-squares line ms = a + b·rows through the recent image decodes.
// With one size among them, its mean: scaled up for more rows, kept for fewer (a smaller decode costs no more). 0: none timed.
double BatchScheduler::imageDecodeMs(int32_t rows) const {
    if (imageMs_.empty()) return 0;
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const ImageSample & x : imageMs_) {
        n++;
        sx += x.rows;
        sy += x.ms;
        sxx += double(x.rows) * x.rows;
        sxy += double(x.rows) * x.ms;
    }
    const double spread = n * sxx - sx * sx;
    const double slope = spread > 0 ? (n * sxy - sx * sy) / spread : 0;
    if (spread <= 0 || slope <= 0) return sy / n * std::max(1.0, rows / (sx / n));
    const double intercept = (sy - slope * sx) / n;
    // A line below the origin: the one through it instead.
    return intercept >= 0 ? intercept + slope * rows : sxy / sxx * rows;
}

BatchScheduler::TimeAccount BatchScheduler::timeAccount() const {
    std::lock_guard<std::mutex> lock(queueMutex_);
    return accountPublished_;
}

double BatchScheduler::restMs(int32_t seq) const {
    std::lock_guard<std::mutex> lock(queueMutex_);
    const double ms = seqRestMs_[size_t(seq)];
    return ms > 0 ? std::max(0.0, ms - msBetween(publishedNs_, monotonicNs())) : -1;
}

// ------------------------------------------------------------------------------------------------
// One step

void BatchScheduler::step() {
    dropStopped();
    removeFinished();
    if (active_.empty()) return;
    const int64_t t0 = monotonicNs();
    for (auto & j : waiting_) j->counts.waitSteps++;
    steps_.fetch_add(1, std::memory_order_relaxed);
    rotation_++;
    const size_t n = active_.size();
    for (auto & a : active_) {
        a->run.clear();
        a->tokCount = 0;
        a->row = -1;
        a->job->counts.steps++;
        a->job->counts.peakSeqs = std::max(a->job->counts.peakSeqs, int32_t(n));
    }
    // Decided in a rotating order, so the jump-forward room and the prefill shares go round.
    std::vector<Active *> order;
    for (size_t i = 0; i < n; i++) order.push_back(active_[(i + rotation_) % n].get());
    // Laid out in ascending sequence order. With a KV stream per sequence, llama.cpp cuts a batch into ubatches of consecutive ids.
    // Any other order costs one graph per run of consecutive ids, and a graph that changes shape every step is never reused.
    std::vector<Active *> bySeq = order;
    std::sort(bySeq.begin(), bySeq.end(), [](const Active * x, const Active * y) { return x->seq < y->seq; });

    int32_t generating = 0;
    for (Active * a : order) generating += a->generating ? 1 : 0;
    // Rows the token decode may take before stepRows pads it.
    const int32_t nBatch = opts_.nBatch - paddingCells(opts_.nSeq, opts_.stepRows);
    int32_t used = 0;
    for (Active * a : order) {
        if (!a->generating) continue;
        generating--;
        const int32_t room = nBatch - used - generating * opts_.stepTokens;
        planGeneration(*a, opts_.stepTokens > 1 ? std::min(room, opts_.stepTokens) : room);
        used += std::max(int32_t(a->run.size()), opts_.stepTokens);
    }
    planPrefill(order, nBatch - used);
    TokenBatch & tokens = *tokens_;
    // Image rows that may carry the token rows: those are laid out first (no stepRows padding reads positions then).
    const int32_t mixRows = imageRowsToMix(bySeq);
    if (mixRows > 0) buildTokenBatch(bySeq);
    bool images = false;
    if (mixRows > 0 && tokens.b.n_tokens > 0 && mixRows + tokens.b.n_tokens <= opts_.nBatch) {
        decodeMixed(bySeq);
        images = true;
    } else {
        const int64_t tImages = monotonicNs();
        images = decodeImages(bySeq);
        if (images) account_.imageMs += msBetween(tImages, monotonicNs());
        if (mixRows == 0) {
            buildTokenBatch(bySeq);
            if (tokens.b.n_tokens > 0 && opts_.stepRows > 0) padToEverySequence();
        }
        if (tokens.b.n_tokens > 0) decodeTokens(bySeq);
    }
    // Only a step that decoded rows is timed.
    // One whose requests all ended in planning, such as a grammar its forced run completed, costs next to nothing.
    // Timing it would make steps look fast.
    // Nor is one after a sampler chain was set or taken off: llama.cpp reserved its scheduler again in it.
    if (images || tokens.b.n_tokens > 0) {
        const int64_t t1 = monotonicNs();
        if (!samplersChanged_) keepLast(stepMs_[n - 1], StepSample{++stepIndex_, msBetween(t0, t1)}, kStepSamples);
        samplersChanged_ = false;
        lastDecodeNs_ = t1;
    }
    account_.steps++;
    account_.stepMs += msBetween(t0, monotonicNs());
    removeFinished();
}

// Cancelled or past the deadline: the sequence leaves before the next decode.
void BatchScheduler::dropStopped() {
    const int64_t now = monotonicNs();
    for (auto & a : active_) {
        if (a->done) continue;
        const GenerateOptions & o = a->job->opts;
        if (a->job->cancelled.load()) a->job->result.stopReason = "cancelled";
        else if (o.deadlineNs > 0 && now >= o.deadlineNs) a->job->result.stopReason = "deadline";
        else continue;
        finish(*a);
    }
}

// The sequence's next token, and the tokens the grammar alone decides after it (jump-forward), at
// most `room` in all.
void BatchScheduler::planGeneration(Active & a, int32_t room) {
    if (a.done) return;
    if (grammarEnded(a)) return finish(a);
    GenerateResult & res = a.job->result;
    const GenerateOptions & o = a.job->opts;
    a.run.push_back(a.idLast);
    if (!o.jumpForward || !a.sampler.hasGrammar()) return;
    bool stop = false;
    while (!stop && int32_t(a.run.size()) < room) {
        if (grammarEnded(a)) {
            stop = true;  // the forced run completed the grammar: nothing left to decode
            break;
        }
        const int64_t ts = monotonicNs();
        const llama_token f = a.sampler.forcedToken();
        res.sampleMs += msBetween(ts, monotonicNs());
        if (f < 0) break;
        a.sampler.accept(f);
        res.forced++;
        a.run.push_back(f);
        stop = appendOutput(model_->vocab(), o, res, f);
    }
    if (stop) {
        a.run.clear();  // the output is complete: its tokens need no decode
        finish(a);
    }
}

// How much of each joining prompt this step decodes, by the rule in native/README.md#batching.
// One kind (text or image rows) per sequence, except that mixing, a causal image completed here takes the text after it.
// Bidirectional and causal image rows never share the image decode.
void BatchScheduler::planPrefill(const std::vector<Active *> & order, int32_t tokenRoom) {
    std::vector<Active *> joining;
    for (Active * a : order) {
        a->take = 0;
        a->takeImage = false;
        a->takeText = 0;
        if (!a->done && !a->generating && !a->promptDone()) joining.push_back(a);
    }
    if (joining.empty()) return;
    auto deadline = [](const Active * a) { return a->job->opts.deadlineNs > 0 ? a->job->opts.deadlineNs : INT64_MAX; };
    std::sort(joining.begin(), joining.end(), [&](const Active * x, const Active * y) {
        const int32_t lx = x->plan.positions - x->nPast, ly = y->plan.positions - y->nPast;
        if (lx != ly) return lx < ly;
        if (deadline(x) != deadline(y)) return deadline(x) < deadline(y);
        return x->job->submittedNs < y->job->submittedNs;
    });
    const ModelInfo & mi = model_->info();
    // The text positions of a's prompt from item i up to its next image.
    auto textFrom = [](const Active * a, size_t i) {
        int32_t n = 0;
        for (; i < a->plan.items.size() && a->plan.items[i].item.imageTokens == 0; i++) n++;
        return n;
    };
    // A group's prompts are read in as few decodes as the batch and the ubatch take.
    int32_t budget = opts_.admitTogether ? opts_.nBatch : opts_.prefillChunk;
    int32_t imageRows = 0;  // in this step's image decode
    int32_t wholeRows = 0;  // rows of the whole images there (0: none)
    bool causalRows = false;
    for (Active * a : joining) {
        if (budget <= 0) break;
        const PromptItem & p = a->item();
        if (p.item.imageTokens > 0) {
            const int32_t rest = p.item.imageTokens - a->imageRows;
            if (imageNonCausal(mi, p)) {
                // With a stream per sequence llama.cpp cuts a batch into equal parts per sequence,
                // which would cut images of other sizes.
                const bool fits = rest <= budget && imageRows + rest <= opts_.nUbatch && (opts_.kvUnified || rest == wholeRows);
                if (causalRows || (imageRows > 0 && !fits)) continue;
                a->take = rest;
                wholeRows = rest;
            } else {
                if (wholeRows > 0) continue;
                a->take = std::min({rest, budget, opts_.nUbatch - imageRows});
                causalRows = a->take > 0;
                if (mixSteps_ && a->take > 0 && a->take == rest) {
                    a->takeText = std::min({textFrom(a, a->next + 1), budget - a->take, tokenRoom});
                    tokenRoom -= a->takeText;
                    budget -= a->takeText;
                }
            }
            a->takeImage = a->take > 0;
            imageRows += a->take;
        } else {
            a->take = std::min({textFrom(a, a->next), budget, tokenRoom});
            tokenRoom -= a->take;
        }
        budget -= a->take;
    }
}

// The image rows this step takes, in one decode; bidirectional when the one image there needs it.
// false: there were none.
bool BatchScheduler::decodeImages(const std::vector<Active *> & order) {
    RowsOf rowsOf;
    bool bidirectional = false;
    const int32_t rows = fillImageRows(order, rowsOf, bidirectional);
    if (rows == 0) return false;
    llama_batch b{rows, nullptr, embd_.data(), pos_.data(), nSeqId_.data(), seqIdPtrs_.data(), logits_.data()};
    account_.imageDecodes++;
    account_.imageRows += rows;
    int ret = 0;
    {
        const NonCausalScope scope(ctx_, bidirectional);
        const int64_t t0 = monotonicNs();
        ret = llama_decode(ctx_, b);
        llama_synchronize(ctx_);
        if (ret == 0) keepLast(imageMs_, ImageSample{rows, msBetween(t0, monotonicNs())}, kImageSamples);
    }
    afterImageDecode(order, ret, rowsOf);
    return true;
}

// The rows of this step's image decode when it may carry the step's token rows: mixSteps, and every image
// there read causally. 0: it may not, or there is none.
int32_t BatchScheduler::imageRowsToMix(const std::vector<Active *> & order) const {
    if (!mixSteps_) return 0;
    const ModelInfo & mi = model_->info();
    int32_t rows = 0;
    for (const Active * a : order) {
        if (!a->takeImage || a->take == 0) continue;
        if (imageNonCausal(mi, a->item())) return 0;
        rows += a->take;
    }
    return rows;
}

// Lays this step's image rows out in embd_, pos_, seqIds_ and logits_ (rows 0 …), with each sequence whose
// prompt ends in its image and that row. Returns the rows; `bidirectional` when an image there needs it.
int32_t BatchScheduler::fillImageRows(const std::vector<Active *> & order, RowsOf & rowsOf, bool & bidirectional) {
    const ModelInfo & mi = model_->info();
    const size_t nEmbd = size_t(mi.nEmbd);
    int32_t rows = 0;
    for (Active * a : order) {
        if (a->takeImage && a->take > 0) {
            rows += a->take;
            bidirectional = bidirectional || imageNonCausal(mi, a->item());
        }
    }
    if (rows == 0) return 0;
    embd_.resize(size_t(rows) * nEmbd);
    pos_.resize(size_t(rows));
    nSeqId_.assign(size_t(rows), 1);
    seqIds_.resize(size_t(rows));
    seqIdPtrs_.resize(size_t(rows));
    logits_.assign(size_t(rows), 0);
    int32_t r = 0;
    for (Active * a : order) {
        if (!a->takeImage || a->take == 0) continue;
        const PromptItem & p = a->item();
        std::copy(p.embd + size_t(a->imageRows) * nEmbd, p.embd + size_t(a->imageRows + a->take) * nEmbd,
                  embd_.begin() + std::ptrdiff_t(size_t(r) * nEmbd));
        for (int32_t k = 0; k < a->take; k++) {
            pos_[size_t(r + k)] = a->nPast + k;
            seqIds_[size_t(r + k)] = a->seq;
        }
        r += a->take;
        const bool imageEnds = a->imageRows + a->take == p.item.imageTokens;
        if (imageEnds && a->next + 1 == a->plan.items.size()) {
            logits_[size_t(r - 1)] = 1;
            rowsOf.emplace_back(a, r - 1);
        }
    }
    for (int32_t i = 0; i < rows; i++) seqIdPtrs_[size_t(i)] = &seqIds_[size_t(i)];
    return rows;
}

// The image rows are in the KV cache (ret 0), or their sequences fail.
void BatchScheduler::afterImageDecode(const std::vector<Active *> & order, int ret, const RowsOf & rowsOf) {
    for (Active * a : order) {
        if (!a->takeImage || a->take == 0) continue;
        if (ret != 0) {
            llama_memory_seq_rm(llama_get_memory(ctx_), a->seq, a->nPast, -1);
            fail(*a,
                 ret == 1 ? "llama_decode: no KV slot for the image (context full)"
                          : "llama_decode (image) failed with code " + std::to_string(ret));
            continue;
        }
        a->imageRows += a->take;
        a->nPast += a->take;
        if (a->imageRows == a->item().item.imageTokens) {
            caches_[size_t(a->seq)].push_back(a->item().item);
            a->next++;
            a->imageRows = 0;
            syncPositions(a->seq);
        }
        a->take = 0;
    }
    for (auto & [a, row] : rowsOf) {
        if (!a->done) afterPromptDecoded(*a, row);
    }
}

// The image rows and then the token rows in one llama_decode: a mixed batch, where a row with LLAMA_TOKEN_NULL
// reads its embedding. The image-time predictor learns from its rows and time, as the image decode it replaces.
void BatchScheduler::decodeMixed(const std::vector<Active *> & order) {
    TokenBatch & tokens = *tokens_;
    RowsOf rowsOf;
    bool bidirectional = false;
    const int32_t nImage = fillImageRows(order, rowsOf, bidirectional);
    const int32_t nText = tokens.b.n_tokens;
    const int32_t n = nImage + nText;
    const size_t nEmbd = size_t(model_->info().nEmbd);
    embd_.resize(size_t(n) * nEmbd);  // the token rows' embeddings are not read
    pos_.resize(size_t(n));
    nSeqId_.assign(size_t(n), 1);
    seqIds_.resize(size_t(n));
    seqIdPtrs_.resize(size_t(n));
    logits_.resize(size_t(n));
    mixedTokens_.assign(size_t(n), LLAMA_TOKEN_NULL);
    for (int32_t i = 0; i < nText; i++) {
        const size_t r = size_t(nImage + i);
        mixedTokens_[r] = tokens.b.token[i];
        pos_[r] = tokens.b.pos[i];
        seqIds_[r] = tokens.b.seq_id[i][0];
        logits_[r] = tokens.b.logits[i];
    }
    for (int32_t i = 0; i < n; i++) seqIdPtrs_[size_t(i)] = &seqIds_[size_t(i)];
    // A sequence's output row moves past the image rows.
    for (Active * a : order) {
        if (a->tokCount > 0 && a->row >= 0) a->row += nImage;
    }
    llama_batch b{n, mixedTokens_.data(), embd_.data(), pos_.data(), nSeqId_.data(), seqIdPtrs_.data(), logits_.data()};
    const int64_t t0 = monotonicNs();
    const int ret = llama_decode(ctx_, b);
    llama_synchronize(ctx_);
    dropPadding();
    const int64_t tDecoded = monotonicNs();
    const double ms = msBetween(t0, tDecoded);
    if (ret == 0) keepLast(imageMs_, ImageSample{n, ms}, kImageSamples);
    account_.imageDecodes++;
    account_.imageRows += nImage;
    account_.imageMs += ms;
    account_.mixedDecodes++;
    account_.mixedTokenRows += nText;
    afterImageDecode(order, ret, rowsOf);
    afterTokenDecode(order, ret, ms, false);
    account_.sampleMs += msBetween(tDecoded, monotonicNs());
}

int32_t paddingCells(int32_t nSeq, int32_t stepRows) { return stepRows > 0 ? nSeq + stepRows - 1 : 0; }

// stepRows: a row and an output for every sequence, then rows up to a multiple of stepRows.
// llama.cpp reuses a graph only for as many rows, outputs and distinct sequences as the last one.
// A sequence without rows gets one at its next position; the rounding rows go after the batch's last row.
// Each sequence's rows keep consecutive positions, and causal attention keeps padding out of real rows.
void BatchScheduler::padToEverySequence() {
    llama_batch & b = tokens_->b;
    // Per sequence, its last row in the batch (-1: none), and whether one of its rows is an output.
    std::vector<int32_t> last(size_t(opts_.nSeq), -1);
    std::vector<bool> output(size_t(opts_.nSeq), false);
    for (int32_t i = 0; i < b.n_tokens; i++) {
        last[size_t(b.seq_id[i][0])] = i;
        if (b.logits[i]) output[size_t(b.seq_id[i][0])] = true;
    }
    llama_memory_t mem = llama_get_memory(ctx_);
    const llama_token pad = b.token[0];
    for (int32_t s = 0; s < opts_.nSeq; s++) {
        if (last[size_t(s)] >= 0) {
            if (!output[size_t(s)]) b.logits[last[size_t(s)]] = 1;  // a prompt chunk's, never read
            continue;
        }
        padFrom_[size_t(s)] = llama_memory_seq_pos_max(mem, s) + 1;
        tokens_->add(pad, padFrom_[size_t(s)], true, s);
    }
    const int32_t s = b.seq_id[b.n_tokens - 1][0];
    for (llama_pos p = b.pos[b.n_tokens - 1] + 1; b.n_tokens % opts_.stepRows != 0; p++) {
        if (padFrom_[size_t(s)] < 0) padFrom_[size_t(s)] = p;
        tokens_->add(pad, p, false, s);
    }
}

// This step's token rows: every generating sequence's next token(s) and the text chunks of joining prompts,
// in sequence order, each sequence's output row kept in its `row`.
void BatchScheduler::buildTokenBatch(const std::vector<Active *> & order) {
    TokenBatch & tokens = *tokens_;
    tokens.clear();
    for (Active * a : order) {
        if (a->done) continue;
        a->tokStart = tokens.b.n_tokens;
        if (a->generating) {
            a->tokCount = int32_t(a->run.size());
            for (int32_t k = 0; k < a->tokCount; k++) tokens.add(a->run[size_t(k)], a->nPast + k, k + 1 == a->tokCount, a->seq);
        } else if (a->take > 0 && !a->takeImage) {
            a->tokCount = a->take;
            for (int32_t k = 0; k < a->take; k++) {
                const size_t i = a->next + size_t(k);
                tokens.add(a->plan.items[i].item.token, a->nPast + k, i + 1 == a->plan.items.size(), a->seq);
            }
        } else if (a->takeText > 0) {
            // The text after this step's image rows: laid out before the image decode moves `next` and `nPast`.
            a->tokCount = a->takeText;
            for (int32_t k = 0; k < a->takeText; k++) {
                const size_t i = a->next + 1 + size_t(k);
                tokens.add(a->plan.items[i].item.token, a->nPast + a->take + k, i + 1 == a->plan.items.size(), a->seq);
            }
        }
        if (a->tokCount > 0 && tokens.b.logits[tokens.b.n_tokens - 1]) a->row = tokens.b.n_tokens - 1;
        // Padding rows come after the sequence's real ones: causal attention keeps them out of the
        // real rows' logits. Only where the sequence has room for them.
        if (a->generating && a->tokCount > 0 && a->tokCount < opts_.stepTokens && a->nPast + opts_.stepTokens <= nCtxSeq_) {
            padFrom_[size_t(a->seq)] = a->nPast + a->tokCount;
            for (int32_t k = a->tokCount; k < opts_.stepTokens; k++) tokens.add(a->run.back(), a->nPast + k, false, a->seq);
        }
    }
}

// Every padding row's KV cell goes, stepTokens' and stepRows' alike, before positions are read again.
void BatchScheduler::dropPadding() {
    for (int32_t s = 0; s < opts_.nSeq; s++) {
        if (padFrom_[size_t(s)] < 0) continue;
        llama_memory_seq_rm(llama_get_memory(ctx_), s, padFrom_[size_t(s)], -1);
        padFrom_[size_t(s)] = -1;
    }
}

// The token decode of the token batch.
void BatchScheduler::decodeTokens(const std::vector<Active *> & order) {
    TokenBatch & tokens = *tokens_;
    const int64_t t0 = monotonicNs();
    const int32_t reusedBefore = llama_perf_context(ctx_).n_reused;
    const int ret = llama_decode(ctx_, tokens.b);
    llama_synchronize(ctx_);
    dropPadding();
    const int64_t tDecoded = monotonicNs();
    const double ms = msBetween(t0, tDecoded);
    account_.tokenMs += ms;
    const bool reused = llama_perf_context(ctx_).n_reused > reusedBefore;
    account_.tokenDecodes++;
    account_.tokenRows += tokens.b.n_tokens;
    if (reused) {
        account_.reusedDecodes++;
        account_.reusedMs += ms;
    }
    account_.tokenSeqs += afterTokenDecode(order, ret, ms, reused);
    account_.sampleMs += msBetween(tDecoded, monotonicNs());
}

// The token rows are in the KV cache (ret 0): generating sequences sample their next token, joining prompts move on.
// Otherwise their sequences fail. Returns the sequences that had rows there.
int32_t BatchScheduler::afterTokenDecode(const std::vector<Active *> & order, int ret, double ms, bool reused) {
    TokenBatch & tokens = *tokens_;
    int32_t seqs = 0;
    for (Active * a : order) {
        if (a->done || a->tokCount == 0) continue;
        const int32_t count = a->tokCount;
        a->tokCount = 0;
        seqs++;
        if (reused) a->job->counts.graphReuses++;
        if (a->generating) {
            a->job->result.llamaDecodeMs += ms;
            a->job->result.decodeCalls++;
            a->genSteps++;
        }
        if (ret != 0) {
            llama_memory_seq_rm(llama_get_memory(ctx_), a->seq, a->nPast, -1);
            fail(*a,
                 ret == 1 ? "llama_decode: no KV slot for the batch (context full)"
                          : "llama_decode failed with code " + std::to_string(ret));
            continue;
        }
        std::vector<CacheItem> & cache = caches_[size_t(a->seq)];
        for (int32_t k = 0; k < count; k++) cache.push_back(CacheItem{tokens.b.token[a->tokStart + k], 0, 0});
        a->nPast += count;
        syncPositions(a->seq);
        if (a->generating) {
            sampleNext(*a);
        } else {
            a->next += size_t(count);
            if (a->promptDone()) afterPromptDecoded(*a, a->row);
        }
        a->row = -1;
    }
    return seqs;
}

// The prompt is in the KV cache: sample the first token from its last row (or stop: maxTokens 0).
void BatchScheduler::afterPromptDecoded(Active & a, int32_t row) {
    GenerateResult & res = a.job->result;
    const GenerateOptions & o = a.job->opts;
    const int64_t now = monotonicNs();
    res.prefillMs = msBetween(a.tAdmit, now);
    a.generating = true;
    if (o.maxTokens == 0) return finish(a);
    a.idLast = sampleAt(a, row);
    a.tFirst = monotonicNs();
    res.ttftMs = msBetween(a.job->submittedNs, a.tFirst);
    if (llama_vocab_is_eog(model_->vocab(), a.idLast) && !o.ignoreEos) {
        res.stopReason = "eos";
        return finish(a);
    }
    a.sampler.accept(a.idLast);
    if (appendOutput(model_->vocab(), o, res, a.idLast)) finish(a);
}

// After a decode of the sequence's next token(s): sample the one after them.
void BatchScheduler::sampleNext(Active & a) {
    GenerateResult & res = a.job->result;
    const GenerateOptions & o = a.job->opts;
    const llama_token t = sampleAt(a, a.row);
    if (llama_vocab_is_eog(model_->vocab(), t) && !o.ignoreEos) {
        res.stopReason = "eos";
        return finish(a);
    }
    a.sampler.accept(t);
    a.idLast = t;
    if (appendOutput(model_->vocab(), o, res, t)) finish(a);
}

llama_token BatchScheduler::sampleAt(Active & a, int32_t row) {
    GenerateResult & res = a.job->result;
    const int64_t ts = monotonicNs();
    const llama_token t = a.backendGreedy ? llama_get_sampled_token_ith(ctx_, row) : a.sampler.sample(ctx_, row);
    if (t == LLAMA_TOKEN_NULL) throw std::runtime_error("no token sampled in the graph for batch index " + std::to_string(row));
    const int64_t te = monotonicNs();
    res.sampleMs += msBetween(ts, te);
    if (a.job->opts.recordSampleTimes) res.sampleUs.push_back(float(te - ts) / 1e3f);
    return t;
}

// Only end-of-generation is admissible: the output is complete without another decode.
bool BatchScheduler::grammarEnded(Active & a) {
    if (a.job->opts.ignoreEos || !a.sampler.grammarComplete()) return false;
    a.job->result.stopReason = "eos";
    return true;
}

// ------------------------------------------------------------------------------------------------
// Leaving the batch

void BatchScheduler::finish(Active & a) {
    rollbackPartialImage(a);
    GenerateResult & res = a.job->result;
    if (a.tFirst > 0) res.decodeMs = msBetween(a.tFirst, monotonicNs());
    a.done = true;
}

void BatchScheduler::fail(Active & a, const std::string & why, const char * code) {
    rollbackPartialImage(a);
    a.job->error = why;
    a.job->errorCode = code;
    a.done = true;
}

// A request that leaves in the middle of a chunked image: its rows go (the cache holds whole images).
void BatchScheduler::rollbackPartialImage(Active & a) {
    if (a.imageRows == 0) return;
    a.nPast -= a.imageRows;
    a.imageRows = 0;
    llama_memory_seq_rm(llama_get_memory(ctx_), a.seq, a.nPast, -1);
}

void BatchScheduler::removeFinished() {
    std::vector<std::unique_ptr<SeqJob>> finished;
    for (auto it = active_.begin(); it != active_.end();) {
        if ((*it)->done) {
            const SeqJob & ended = *(*it)->job;
            if (ended.error.empty() && (*it)->tFirst > 0) keepLast(prefillMs_, ended.result.prefillMs, kReqSamples);
            // Generation steps: those run by a request that ended on its own, or passed its deadline while generating.
            // The late ones ran at least as many as they needed. Leaving them out would keep only the short requests.
            // Predictions under overload would then be optimistic.
            const bool late = ended.result.stopReason == "deadline";
            if (ended.error.empty() && ended.result.stopReason != "cancelled" && (!late || (*it)->tFirst > 0))
                keepLast(genSteps_, (*it)->genSteps, kReqSamples);
            std::unique_ptr<SeqJob> j = std::move((*it)->job);
            syncPositions(j->seq);
            it = active_.erase(it);
            finished.push_back(std::move(j));
        } else {
            ++it;
        }
    }
    if (finished.empty()) return;
    // Before the callers hear of it: one that asks predicted() next sees this history.
    publishPrediction();
    for (auto & j : finished) done_(std::move(j));
}

void BatchScheduler::syncPositions(int32_t seq) {
    int32_t n = 0;
    for (const CacheItem & c : caches_[size_t(seq)]) n += c.positions();
    positions_[size_t(seq)].store(n, std::memory_order_relaxed);
}

// ------------------------------------------------------------------------------------------------
// The engine's ceiling (batch.h), as llama-batched-bench's loop over one (pp, tg, pl).

CeilingTimes timeCeiling(llama_context * ctx, int32_t nSeq, int32_t promptTokens, int32_t steps, int32_t repeats) {
    const auto nVocab = uint32_t(llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx))));
    const int32_t nBatch = int32_t(llama_n_batch(ctx));
    TokenBatch batch(std::max(nBatch, nSeq));
    uint32_t state = 1;
    const auto randomToken = [&]() {
        state = state * 1664525u + 1013904223u;  // an LCG: any token ids do
        return llama_token((state >> 8) % nVocab);
    };
    const auto decode = [&](const char * what) {
        const int32_t rc = llama_decode(ctx, batch.b);
        if (rc != 0) throw std::runtime_error(std::string("ceiling: llama_decode failed in the ") + what + " (" + std::to_string(rc) + ")");
        batch.clear();
    };
    llama_memory_t memory = llama_get_memory(ctx);
    CeilingTimes times;
    for (int32_t r = -1; r < repeats; r++) {
        llama_memory_clear(memory, false);
        const int64_t t0 = monotonicNs();
        batch.clear();
        for (int32_t s = 0; s < nSeq; s++) {
            for (int32_t i = 0; i < promptTokens; i++) {
                batch.add(randomToken(), i, i == promptTokens - 1, s);
                if (batch.b.n_tokens == nBatch) decode("prefill");
            }
        }
        if (batch.b.n_tokens > 0) decode("prefill");
        llama_synchronize(ctx);
        const int64_t t1 = monotonicNs();
        for (int32_t d = 0; d < steps; d++) {
            for (int32_t s = 0; s < nSeq; s++) batch.add(randomToken(), promptTokens + d, true, s);
            decode("decode step");
            llama_synchronize(ctx);
        }
        const int64_t t2 = monotonicNs();
        if (r < 0) continue;  // the warm-up: first touch of the weights, graph allocation
        times.prefillMs.push_back(msBetween(t0, t1));
        times.decodeMs.push_back(msBetween(t1, t2));
    }
    llama_memory_clear(memory, false);
    return times;
}

}  // namespace percept
