// Continuous batching over the sequences of one context, one sequence per camera.
// Each step is one llama_decode over every generating sequence's next token and a bounded chunk of joining prompts.
// Runs on the context's thread (context-thread.h) and knows nothing of JS.
// Policies (admission, deadlines, prefill, layout, cancel): native/README.md#batching
#pragma once

#include "context-thread.h"
#include "generate.h"
#include "grammar.h"
#include "llama.h"
#include "prompt.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace percept {

class Model;

struct BatchOptions {
    int32_t nSeq = 1;          // sequences (cameras), seq ids 0 … nSeq-1
    int32_t maxActive = 1;     // sequences per step at most
    int32_t prefillChunk = 0;  // prompt positions per step at most (admitting one at a time)
    // Requests that arrive while a group generates wait for it to end and are admitted together as the next group.
    // Its prompts are read in as few decodes as the batch takes (native/README.md#admitting-together).
    bool admitTogether = false;
    // Admitting together: the running group's tail takes the waiting requests in once no more of its members run than
    // requests wait. Their prefill then rides with the tail's steps instead of waiting for its longest member.
    bool admitTail = false;
    // Admitting the tail: the fewest waiting requests that go in beside it, so their image decode is not a frame or two.
    int64_t tailJoin = 1;
    // Admitting the tail by weight instead of by count: the waiting requests go in beside the tail when that is predicted
    // to end more requests by their deadlines, or as many sooner in all (native/README.md#the-tail-by-weight).
    bool weighTail = false;
    // Admitting together, no tail: a waiting request that would miss waiting for the group's end joins it at once (true),
    // or is dropped as a predicted miss (false).
    bool joinRunning = true;
    // Admitting together: how long an idle decoder holds its waiting requests for the frames still on their way (expect()).
    int64_t groupWaitNs = 0;
    int32_t nBatch = 0;
    int32_t nUbatch = 0;
    bool kvUnified = false;  // one KV buffer for every sequence (else a stream per sequence)
    // Tokens each generating sequence decodes per step: its sampled token and forced run, padded (1: no padding).
    // Same-shape steps let llama.cpp reuse its graph and ggml-cuda replay it.
    // With a stream per sequence, equal counts also keep the step in one ubatch.
    int32_t stepTokens = 1;
    // One KV buffer only. Every token decode gets a row and an output for every sequence (a padding row at the next
    // position of one without), and padding rows up to a multiple of stepRows (0: none of this). Its shape then
    // repeats, so llama.cpp reuses its graph. The padding's KV cells are dropped after the decode.
    int32_t stepRows = 0;
    // A step's causal image rows and its token rows in one llama_decode, a mixed batch (Gemma 4 only; with kvUnified and
    // no stepRows). A decode passes over every weight, so such a step saves one pass (native/README.md#mixed-steps).
    bool mixSteps = false;
    // Greedy requests without a grammar take their argmax in llama.cpp's graph (a backend sampler on their sequence).
    // A step whose outputs are all such requests then copies no logits to the host.
    bool backendSampling = true;
};

// KV cells a context with these options needs beyond its sequences' own: padding rows of one decode at most.
int32_t paddingCells(int32_t nSeq, int32_t stepRows);

// Where a request stood in the schedule.
struct BatchCounts {
    int32_t waitSteps = 0;  // steps run while it waited for admission
    int32_t steps = 0;      // steps from its admission to its end (prefill and generation)
    int32_t peakSeqs = 0;   // most sequences in one step it took part in (itself included)
    // Steps whose token decode it had rows in, run on llama.cpp's previous graph.
    // Same ubatch shape: no graph build, and on CUDA the captured graph replays.
    int32_t graphReuses = 0;
    double queueMs = 0;  // submit → admission
    // The time predicted at admission, or when it ended waiting, for its prefill and generation.
    // It is at the sharing it would join (native/README.md#deadlines); 0: nothing to predict from.
    double predictedMs = 0;
    bool predictedMiss = false;   // dropped before its prefill: predictedMs would pass its deadline
    bool backendSampled = false;  // its tokens were taken in llama.cpp's graph (BatchOptions::backendSampling)
};

// One generate call on one sequence. The scheduler fills result/counts (or error) and hands the job
// back through its done callback.
struct SeqJob {
    virtual ~SeqJob() = default;
    int32_t seq = 0;
    std::vector<Segment> segments;
    GenerateOptions opts;
    GrammarInstance grammar;
    std::atomic<bool> cancelled{false};
    int64_t submittedNs = 0;

    GenerateResult result;
    BatchCounts counts;
    std::string error;                 // non-empty: the request failed
    const char * errorCode = nullptr;  // e.g. ERANGE; null: the default
};

// The engine's ceiling for one shape, timed as llama-batched-bench times it, without sampling.
// Each repeat clears the KV cells, decodes nSeq prompts of promptTokens random tokens in n_batch chunks,
// then `steps` steps of one token per sequence. One unrecorded run goes first.
// Context thread only, with no request in flight; it leaves the KV cells empty.
struct CeilingTimes {
    std::vector<double> prefillMs;  // per repeat: every prompt
    std::vector<double> decodeMs;   // per repeat: every step
};
CeilingTimes timeCeiling(llama_context * ctx, int32_t nSeq, int32_t promptTokens, int32_t steps, int32_t repeats);

class BatchScheduler {
public:
    using Done = std::function<void(std::unique_ptr<SeqJob>)>;

    // `done` is called on the context's thread for every finished job.
    BatchScheduler(llama_context * ctx, Model * model, SerialThread & thread, BatchOptions options, Done done);
    ~BatchScheduler();  // cancels what runs and waits until the loop has stopped
    BatchScheduler(const BatchScheduler &) = delete;
    BatchScheduler & operator=(const BatchScheduler &) = delete;

    // Any thread. The caller guarantees one request per sequence at a time.
    void submit(std::unique_ptr<SeqJob> job);
    // Drops the sequence's KV cells and prompt cache (applied before any later request).
    void clear(int32_t seq);
    // KV positions the sequence holds (as of the last step).
    int32_t cachedPositions(int32_t seq) const { return positions_[size_t(seq)].load(std::memory_order_relaxed); }
    // KV positions one sequence may hold (prompt + new tokens): its stream, or its share of a unified cache.
    int32_t nCtxSeq() const { return nCtxSeq_; }
    // Steps run so far (every llama_decode round over the active sequences).
    int64_t steps() const { return steps_.load(std::memory_order_relaxed); }
    // Any thread. The time (ms) admission would predict for a request submitted now with deadline `deadlineNs`, in two
    // parts: the wait before its own run starts (the running group's rest, the requests admission takes first), and that run.
    // It applies the rule that drops a request before its prefill, as of the last step.
    // So a caller with work before it submits (preprocess, encode) overlaps it with the wait, and drops a frame that
    // would be dropped anyway. Both 0: nothing to predict from, or an idle decoder that would admit anything (a probe).
    // Why the wait counts: native/README.md#predicting-before-submit
    struct Prediction {
        double waitMs = 0;
        double ownMs = 0;
    };
    Prediction predicted(int64_t deadlineNs = 0, int32_t reservedAhead = 0) const;
    // Any thread. When the request of `seq` that admission knew of at the last step ends, predicted from now (ms):
    // running, its own rest; waiting, the running group's rest and its own run. -1: none known.
    double restMs(int32_t seq) const;
    // Where the loop's time went since it was created (ms), as of the last step: the steps, and within them the image
    // decodes, the token decodes (llama_decode to synchronize) and the sampling after them; the holds for frames on their way.
    // `groups`: admissions into an idle decoder (admitting together, the groups); `joins`, beside a running one. The counts say what the
    // times bought: decodes, their rows, the sequences a token decode covered, and the token decodes that reused llama.cpp's graph.
    struct TimeAccount {
        int64_t groups = 0;
        int64_t joins = 0;  // admissions beside a running group, by any rule
        int64_t steps = 0;
        double stepMs = 0;
        double imageMs = 0;
        double tokenMs = 0;
        double sampleMs = 0;
        double holdMs = 0;
        int64_t imageDecodes = 0;
        int64_t imageRows = 0;
        int64_t tokenDecodes = 0;
        int64_t tokenRows = 0;
        int64_t tokenSeqs = 0;
        int64_t reusedDecodes = 0;
        double reusedMs = 0;
        // Image decodes that carried the step's token rows too (mixSteps), and those rows. Timed within imageMs.
        int64_t mixedDecodes = 0;
        int64_t mixedTokenRows = 0;
        int64_t tailJoins = 0;  // weighing the tail: admissions beside a running group
        int64_t tailHolds = 0;  // weighing the tail: steps that held the waiting requests for the group's end
    };
    // Takes every backend sampler chain off the context (native/README.md#backend-sampling). Only while no request runs.
    void dropBackendSamplers();
    TimeAccount timeAccount() const;
    // Any thread. Frames on their way to `seq` (reserved before preprocess): +1 when one is reserved, -1 when it is
    // submitted or dropped. Admitting together, an idle decoder holds its waiting requests for them (groupWaitNs at most).
    void expect(int32_t seq, int32_t delta);

private:
    struct Active;
    struct Inbox {
        std::unique_ptr<SeqJob> job;  // null: a clear of clearSeq
        int32_t clearSeq = -1;
    };

    void loop();
    bool holdForComing(int64_t now);
    void intake(std::deque<Inbox> & items);
    void admit();
    void start(std::unique_ptr<SeqJob> job);
    void step();
    void dropStopped();
    void planGeneration(Active & a, int32_t room);
    int32_t appendOpeningRun(Active & a);
    void planPrefill(const std::vector<Active *> & order, int32_t tokenRoom);
    bool decodeImages(const std::vector<Active *> & order);
    int32_t imageRowsToMix(const std::vector<Active *> & order) const;
    void buildTokenBatch(const std::vector<Active *> & order);
    void decodeMixed(const std::vector<Active *> & order);
    using RowsOf = std::vector<std::pair<Active *, int32_t>>;
    int32_t fillImageRows(const std::vector<Active *> & order, RowsOf & rowsOf, bool & bidirectional);
    void afterImageDecode(const std::vector<Active *> & order, int ret, const RowsOf & rowsOf);
    void padToEverySequence();
    void decodeTokens(const std::vector<Active *> & order);
    int32_t afterTokenDecode(const std::vector<Active *> & order, int ret, double ms, bool reused);
    void dropPadding();
    void afterPromptDecoded(Active & a, int32_t row);
    void sampleNext(Active & a);
    llama_token sampleAt(Active & a, int32_t row);
    bool grammarEnded(Active & a);
    void finish(Active & a);
    void fail(Active & a, const std::string & why, const char * code = nullptr);
    void removeFinished();
    void publishPrediction();
    void rollbackPartialImage(Active & a);
    void syncPositions(int32_t seq);
    struct StepTime {
        double ms = 0;
        double sd = 0;
    };
    StepTime stepMs(int32_t seqs, bool orMore, double q) const;
    StepTime stepMsAt(int32_t seqs, double q) const;
    double predictMs(int32_t seqs, const Active * a, bool orMore, double q) const;
    double groupRestMs() const;
    int32_t groupStepsLeft() const;
    double groupWaitMs(const std::vector<double> & memberRest, int64_t waiting, bool weighed) const;
    // Admitting the tail: `waiting` requests are enough to go in beside it (once no more members run than they).
    bool joinsTail(int64_t waiting) const { return opts_.admitTail && !opts_.weighTail && waiting >= opts_.tailJoin; }
    struct Joiner {
        int64_t deadlineNs;  // 0: none
        int32_t imageRows;
        int32_t maxTokens;
    };
    std::vector<Joiner> joiners(bool another) const;
    bool tailPays(int64_t now, const std::vector<Joiner> & joiners) const;
    double imageDecodeMs(int32_t rows) const;

    llama_context * ctx_;
    Model * model_;
    SerialThread & thread_;
    const BatchOptions opts_;
    const Done done_;
    const int32_t nCtxSeq_;

    std::mutex mutex_;
    std::condition_variable idle_;
    std::deque<Inbox> inbox_;                           // guarded by mutex_
    bool running_ = false;                              // guarded by mutex_: the loop is queued or running
    bool closing_ = false;                              // guarded by mutex_
    std::condition_variable wake_;                      // a submit, clear or expect() while the loop holds a group
    std::unique_ptr<std::atomic<int32_t>[]> expected_;  // per sequence: frames on their way (expect())
    int64_t holdUntilNs_ = 0;                           // the loop's: an idle decoder holds its waiting requests until then (0: no hold)

    // The loop's own state (context thread only).
    std::deque<std::unique_ptr<SeqJob>> waiting_;
    std::vector<std::unique_ptr<Active>> active_;
    std::vector<std::vector<CacheItem>> caches_;  // per sequence
    std::unique_ptr<std::atomic<int32_t>[]> positions_;
    std::atomic<int64_t> steps_{0};
    std::atomic<double> predicted_{0};  // without the wait behind waiting requests
    // What predicted() takes the wait from, as of the last step.
    // The queue's pace (0: unknown), and the waiting requests' sorted deadlines (INT64_MAX: none).
    mutable std::mutex queueMutex_;
    double queueGapMs_ = 0;                  // guarded by queueMutex_
    std::vector<int64_t> waitingDeadlines_;  // guarded by queueMutex_
    // Admitting together: a request's own time per group size (index: size less one).
    std::vector<double> groupOwnMs_;       // guarded by queueMutex_
    std::vector<double> seqRestMs_;        // guarded by queueMutex_: per sequence, restMs() as of the last step
    std::vector<double> memberRestMs_;     // guarded by queueMutex_: the running members' rests, shortest first
    TimeAccount account_;                  // the loop's own
    TimeAccount accountPublished_;         // guarded by queueMutex_
    int64_t publishedNs_ = 0;              // guarded by queueMutex_: when they were published
    std::atomic<int64_t> idleSinceNs_{0};  // the last step's end while idle; 0: busy
    std::vector<int64_t> admittedNs_;      // per sequence: when its last request was admitted (0: never)
    uint64_t rotation_ = 0;
    // What admission predicts from (native/README.md#deadlines).
    // Per sharing, the last steps' ms; the index is the step's sequences less one.
    // Also the last prefill times and generation steps.
    struct StepSample {
        int64_t step;  // stepIndex_ when it ran
        double ms;
    };
    std::vector<std::deque<StepSample>> stepMs_;
    int64_t stepIndex_ = 0;
    int64_t lastDecodeNs_ = 0;      // when the last step ended (0: none yet)
    std::deque<double> prefillMs_;  // admission → first token
    std::deque<int32_t> genSteps_;  // generation steps of requests that ended on their own or late generating
    struct ImageSample {
        int32_t rows;
        double ms;
    };
    std::deque<ImageSample> imageMs_;  // the last image decodes: rows and time
    std::deque<int32_t> imageRows_;    // the last admitted requests' image rows
    bool tailWouldJoin_ = false;       // guarded by queueMutex_: weighing the tail, one more waiting request would join it
    // Admissions while requests waited: how fast the queue drains (see predicted()).
    std::deque<double> admitGapMs_;  // time from one such admission to the next
    int64_t lastAdmitNs_ = 0;        // the last admission (0: none yet)
    bool lastAdmitQueued_ = false;   // whether requests still waited after it
    // Backend sampling: each sequence's greedy chain set on ctx_ (null: none). A chain is set once, as llama.cpp
    // initializes it on the backend then; taking it off makes llama.cpp build its graphs anew.
    std::vector<SamplerChainPtr> backendGreedy_;
    bool backendRefused_ = false;   // llama.cpp would not take a greedy chain: not asked again
    bool samplersChanged_ = false;  // a chain was set or taken off since the last timed step
    bool useBackendGreedy(int32_t seq, bool wants);
    // Batches reused from step to step.
    std::unique_ptr<TokenBatch> tokens_;
    std::vector<float> embd_;
    std::vector<llama_pos> pos_;
    std::vector<int32_t> nSeqId_;
    std::vector<llama_seq_id> seqIds_;
    std::vector<llama_seq_id *> seqIdPtrs_;
    std::vector<int8_t> logits_;
    std::vector<llama_token> mixedTokens_;  // a mixed decode's tokens: LLAMA_TOKEN_NULL for its image rows
    const bool mixSteps_;                   // opts_.mixSteps where the model and the layout allow it
    // Per sequence, the first position of its padding rows (stepTokens', stepRows') in this step's token decode (-1: none).
    std::vector<llama_pos> padFrom_;
};

}  // namespace percept
