// Continuous batching over the sequences of one context (one sequence per camera): each step is
// one llama_decode over the next token of every sequence that is generating (with its jump-forward
// run) and a bounded chunk of the prompts of sequences that joined, plus one decode of image rows
// when a joining prompt is at an image. Every sequence keeps its own KV cells, prompt cache (prefix
// reuse), grammar state, sampler, deadline and cancel flag; one that finishes, is cancelled or
// passes its deadline leaves between two steps and changes only its own rows. Runs on the
// context's thread (context-thread.h); knows nothing of JS.
//
// Policies:
// - Admission: at most maxActive sequences take part in a step; a sequence has at most one request
//   at a time. Without deadlines requests are admitted in arrival order (FIFO: a camera that gets
//   an action and asks again queues behind every camera already waiting, so none starves).
// - Deadlines (overload): sharing a step among more sequences makes each step longer, so admitting
//   every request at once can make every one of them miss (processor sharing: on a CPU, 8 sequences
//   per step made 0 of 104 requests meet a deadline that 1 sequence met 39 times out of 39). So,
//   between steps and from measured times only:
//   · predicted time of a request at a sharing of k sequences = the median of the last prefill
//     times (admission to first token; less what it has spent in its own) + the generation steps
//     of the last requests that ended on their own or passed their deadline generating (those it
//     ran so far: a lower bound; median; less those it has run) × the mean of
//     the last steps of k sequences (image steps included; else of the nearest fewer timed; for
//     admission past one, of the nearest more), plus two standard deviations of that sum (the
//     earliest deadline that just fits would otherwise miss half the time); a step's time expires
//     after 256 steps, so a sharing once timed slow is tried again;
//   · a waiting request that would miss even at today's sharing (max(1, active)) ends at once,
//     before any prefill (predictedMiss; its prompt cache untouched), so its camera sends a fresher
//     frame; cancelled and late ones end too, wherever they are in the queue;
//   · one more sequence is admitted only if no admitted request that would make its deadline at
//     today's sharing would miss at one more (its remaining steps at the longer step), and the
//     sharing grows at most one past the largest that has been timed (one step at a time);
//   · among the waiting requests that can make it at that sharing, the earliest deadline goes
//     first (then arrival); one that cannot waits for less sharing, or ends when it cannot make it.
//     Deadlines within kFairWindowNs (50 ms) of the earliest count as one: among those the
//     sequence admitted least recently goes first, so cameras triggered together take turns under
//     overload instead of the one whose frames happen to be stamped a few µs earlier always winning.
//   An idle decoder drops only certain misses (by its fastest recent prefill and step) and, when
//   no waiting request fits the prediction, serves the earliest deadline that fits those fastest
//   times rather than none, so it is never idle while a request waits that could still make it.
//   A prediction is corrected only by running, and prefill times and generation steps never
//   expire (step times only as steps run): so when the decoder is idle and has run no step for
//   kProbeNs (1 s), the earliest deadline that is not yet late is admitted even if predicted to
//   miss (a probe), and its run refreshes the history; a history from a slow spell cannot drop
//   every later request for good. Nothing is predicted without history: the first request is
//   admitted unless it is already late or cancelled.
// - Prefill: at most prefillChunk prompt positions per step, given to the joining prompt with the
//   fewest positions left first (a short prompt is never held behind a long one), then to the
//   earliest deadline, then in arrival order; each takes what it needs and leaves the rest to the
//   next. Prompts of equal length (cameras) thus finish their prefill one after another, oldest
//   frame first, instead of all together at the end. An image that must be attended
//   bidirectionally is taken whole (it must sit in one ubatch): beside other whole images of as
//   many rows while they fit the chunk and the ubatch, alone when it does not fit the chunk.
// - Layout: each step's rows go in ascending sequence order (with a KV stream per sequence,
//   llama.cpp cuts a batch into ubatches of consecutive sequence ids). Even so, with a stream per
//   sequence a step whose sequences skip an id (a camera between two frames) or that reads a prompt
//   chunk beside other sequences' tokens (split_equal takes as many tokens from each sequence) runs
//   as two or more ubatches: each a pass over the weights, and a graph that is never reused (the
//   previous one had the other shape). One KV buffer (kvUnified) takes any step in one ubatch.
// - Deadlines and cancels are checked between steps: a decode in flight is never aborted, because
//   it serves every other sequence too.
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
    int32_t prefillChunk = 0;  // prompt positions per step at most
    int32_t nBatch = 0;
    int32_t nUbatch = 0;
    bool kvUnified = false;  // one KV buffer for every sequence (else a stream per sequence)
    // Tokens each generating sequence decodes per step: its sampled token and forced run, padded
    // (1: no padding). Same-shape steps let llama.cpp reuse its graph and ggml-cuda replay it, and
    // with a stream per sequence equal counts keep the step in one ubatch.
    int32_t stepTokens = 1;
};

// Where a request stood in the schedule.
struct BatchCounts {
    int32_t waitSteps = 0;  // steps run while it waited for admission
    int32_t steps = 0;      // steps from its admission to its end (prefill and generation)
    int32_t peakSeqs = 0;   // most sequences in one step it took part in (itself included)
    // Steps whose token decode it had rows in and llama.cpp ran on its previous graph (same ubatch
    // shape: no graph build, and on CUDA the captured graph replays).
    int32_t graphReuses = 0;
    double queueMs = 0;  // submit → admission
    // At admission (or when it ended waiting), the time predicted for its prefill and generation at
    // the sharing it would join (see Deadlines); 0: nothing to predict from.
    double predictedMs = 0;
    bool predictedMiss = false;  // dropped before its prefill: predictedMs would pass its deadline
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
    // Any thread. The time (ms) admission would predict for a request submitted now with deadline
    // `deadlineNs` (0: none), by the rule that drops it before its prefill (see Deadlines; as of the
    // last step), plus its wait behind the waiting requests admission takes first (those with an
    // earlier deadline; every one for a request without), each at the median recent gap between
    // admissions while requests waited: a caller with work to do before it submits (preprocess,
    // encode) can drop a frame that would be dropped anyway. Without the wait, a saturated decoder
    // let every camera's frame through to the shared encoder, and most were then dropped at
    // admission after they were encoded (16 cameras on an H200: 369 of 587 encoded frames), the
    // encoder's GPU work competing with the decoder's; counting requests it would overtake instead
    // would drop the frames of a camera with a tighter budget than the others.
    // 0: nothing to predict from, or an idle decoder that would admit anything (a probe).
    double predictedMs(int64_t deadlineNs = 0, int32_t reservedAhead = 0) const;

private:
    struct Active;
    struct Inbox {
        std::unique_ptr<SeqJob> job;  // null: a clear of clearSeq
        int32_t clearSeq = -1;
    };

    void loop();
    void intake(std::deque<Inbox> & items);
    void admit();
    void start(std::unique_ptr<SeqJob> job);
    void step();
    void dropStopped();
    void planGeneration(Active & a, int32_t room);
    int32_t appendOpeningRun(Active & a);
    void planPrefill(const std::vector<Active *> & order, int32_t tokenRoom);
    bool decodeImages(const std::vector<Active *> & order);
    void decodeTokens(const std::vector<Active *> & order);
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

    llama_context * ctx_;
    Model * model_;
    SerialThread & thread_;
    const BatchOptions opts_;
    const Done done_;
    const int32_t nCtxSeq_;

    std::mutex mutex_;
    std::condition_variable idle_;
    std::deque<Inbox> inbox_;  // guarded by mutex_
    bool running_ = false;     // guarded by mutex_: the loop is queued or running
    bool closing_ = false;     // guarded by mutex_

    // The loop's own state (context thread only).
    std::deque<std::unique_ptr<SeqJob>> waiting_;
    std::vector<std::unique_ptr<Active>> active_;
    std::vector<std::vector<CacheItem>> caches_;  // per sequence
    std::unique_ptr<std::atomic<int32_t>[]> positions_;
    std::atomic<int64_t> steps_{0};
    std::atomic<double> predicted_{0};  // without the wait behind waiting requests
    // What predictedMs() adds the wait from, as of the last step: the queue's pace (0: unknown) and
    // the waiting requests' deadlines (INT64_MAX: none), sorted.
    mutable std::mutex queueMutex_;
    double queueGapMs_ = 0;                  // guarded by queueMutex_
    std::vector<int64_t> waitingDeadlines_;  // guarded by queueMutex_
    std::atomic<int64_t> idleSinceNs_{0};    // the last step's end while idle; 0: busy
    std::vector<int64_t> admittedNs_;        // per sequence: when its last request was admitted (0: never)
    uint64_t rotation_ = 0;
    // What admission predicts from (see Deadlines): per sharing (index: sequences in the step less
    // one) the last steps' ms; the last prefill times and generation steps.
    struct StepSample {
        int64_t step;  // stepIndex_ when it ran
        double ms;
    };
    std::vector<std::deque<StepSample>> stepMs_;
    int64_t stepIndex_ = 0;
    int64_t lastDecodeNs_ = 0;      // when the last step ended (0: none yet)
    std::deque<double> prefillMs_;  // admission → first token
    std::deque<int32_t> genSteps_;  // generation steps of requests that ended on their own or late generating
    // Admissions while requests waited: how fast the queue drains (see predictedMs()).
    std::deque<double> admitGapMs_;  // time from one such admission to the next
    int64_t lastAdmitNs_ = 0;        // the last admission (0: none yet)
    bool lastAdmitQueued_ = false;   // whether requests still waited after it
    // Batches reused from step to step.
    std::unique_ptr<TokenBatch> tokens_;
    std::vector<float> embd_;
    std::vector<llama_pos> pos_;
    std::vector<int32_t> nSeqId_;
    std::vector<llama_seq_id> seqIds_;
    std::vector<llama_seq_id *> seqIdPtrs_;
    std::vector<int8_t> logits_;
};

}  // namespace percept
