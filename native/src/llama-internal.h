// The one header for llama.cpp's internals (src/llama-*.h, tools/mtmd/clip*.h,
// ggml/src/ggml-backend-impl.h, ggml-impl.h).
// Those change between llama.cpp versions without notice; with every use behind this header, an
// upgrade touches internal/ alone: one file there per section below, named at the section.
// Every other file includes public headers only (llama.h, ggml*.h, gguf.h, mtmd.h, common/*.h);
// CMake gives llama.cpp's src/ and ggml/src/ include paths to internal/*.cc alone, and
// test/native/headers.test.ts checks the rule, tools/mtmd's headers included.
#pragma once

#include "ggml-backend.h"
#include "llama.h"

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct llama_grammar;         // src/llama-grammar.h
struct clip_ctx;              // tools/mtmd/clip.h
struct clip_image_f32_batch;  // tools/mtmd/clip-impl.h

namespace percept {

// ---------------------------------------------------------------------------------------------
// Memory per buffer type (internal/memory-breakdown.cc; src/llama-ext.h, a staging C++ API: there
// is no C function for KV bytes).

struct BufferBytes {
    std::string bufferType;
    size_t model = 0;
    size_t context = 0;  // KV (or recurrent) cache
    size_t compute = 0;
};
std::vector<BufferBytes> memoryBreakdown(const llama_context * ctx);

// ---------------------------------------------------------------------------------------------
// Graphs kept per step shape (internal/graph-slots.cc; native/patches/llama-graph-slots.diff): up
// to `slots` built graphs with outputs besides the current one, each with the scheduler that
// allocated it, so decode steps that alternate between shapes reuse their graph instead of
// rebuilding it. 0: upstream's behaviour.

void setGraphSlots(llama_context * ctx, uint32_t slots);

// ---------------------------------------------------------------------------------------------
// Grammar (internal/grammar.cc; src/llama-grammar.h). llama.h only offers the grammar as a sampler,
// which tests the whole vocabulary each time; percept needs the state itself: clone it per
// generation, test a few candidate tokens, and look at what the grammar's stacks expect next.

struct GrammarDeleter {
    void operator()(llama_grammar * g) const;
};
using GrammarPtr = std::unique_ptr<llama_grammar, GrammarDeleter>;

// Parses GBNF; null on a syntax error (llama.cpp logs the reason: use LogCapture).
GrammarPtr grammarParse(const llama_vocab * vocab, const std::string & gbnf, const std::string & root);
GrammarPtr grammarClone(const llama_grammar & grammar);
// Sets the logit of every candidate the grammar rejects to -inf.
void grammarApply(const llama_grammar & grammar, llama_token_data_array * candidates);
// Advances the grammar past `token` (not an end-of-generation token).
void grammarAccept(llama_grammar & grammar, llama_token token);
// Every stack is complete: only end-of-generation can follow.
bool grammarComplete(const llama_grammar & grammar);
// The one literal code point every stack demands next, or -1 (alternatives, classes, the end of
// the grammar, a partial UTF-8 sequence).
int64_t grammarSingleChar(const llama_grammar & grammar);
// First bytes the grammar can accept next (bit 256: end of generation). Character classes on the
// stack tops become byte ranges; anything else (negated classes, tokens, a partial UTF-8
// sequence) admits every byte.
std::bitset<257> grammarLeadBytes(const llama_grammar & grammar);

// ---------------------------------------------------------------------------------------------
// Grammar automaton (internal/grammar-automaton.cc; src/llama-grammar.h), for the token index
// (grammar-index.cc): the grammar explored byte by byte. A state is llama.cpp's stack set plus the
// pending partial UTF-8 sequence; a byte is decoded the way llama.cpp decodes a token's piece, so a
// token's piece walked byte by byte is admitted exactly when llama.cpp's grammar admits the token.

// The grammar has no small finite automaton: recursion, token references, or more states than allowed.
struct GrammarNotFinite : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class GrammarAutomaton {
public:
    // State 0 is the grammar's own state. Throws GrammarNotFinite when a state beyond `maxStates`
    // would be needed.
    GrammarAutomaton(const llama_grammar & grammar, int32_t maxStates);
    ~GrammarAutomaton();
    GrammarAutomaton(const GrammarAutomaton &) = delete;
    GrammarAutomaton & operator=(const GrammarAutomaton &) = delete;

    // States found so far (they are numbered in the order step() finds them).
    int32_t states() const;
    // End-of-generation is admissible (some stack is complete).
    bool accepting(int32_t state) const;
    // The state after `byte`, or -1 when no stack takes it.
    int32_t step(int32_t state, uint8_t byte);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Whether the grammar takes exactly `text`, character by character (no tokens involved).
bool grammarAdmitsText(const llama_grammar & grammar, const std::string & text);

// ---------------------------------------------------------------------------------------------
// clip vision encoder (internal/clip.cc; tools/mtmd/clip.h, clip-impl.h). mtmd.h encodes only
// images it preprocesses itself; percept preprocesses in JS (sharp) and hands clip the pixels.

struct ClipOptions {
    bool useGpu = false;
    int32_t flashAttention = -1;  // -1 auto, 0 off, 1 on
    bool warmup = true;           // allocate compute buffers at load with a full-size dummy image
    // Asked by ggml's scheduler about every graph node of an encode (profiling), or null.
    ggml_backend_sched_eval_callback evalCallback = nullptr;
    void * evalCallbackData = nullptr;
};
// Loads the vision tower of an mmproj GGUF; null on failure (llama.cpp logs the reason).
clip_ctx * clipLoad(const std::string & path, const ClipOptions & options);
void clipFree(clip_ctx * ctx);
// Output width (the decoder's n_embd).
int32_t clipEmbdWidth(const clip_ctx * ctx);
// Whether one graph encodes several images (gemma4v); otherwise each image takes its own graph.
bool clipSupportsBatch(const clip_ctx * ctx);

class ClipImages;
// Output tokens of each image (they all have one size).
int32_t clipOutputTokens(const clip_ctx * ctx, const ClipImages & images);
// Encodes images [first, first + count) in one graph: `out` receives count × tokens × width floats.
// False on failure (llama.cpp logs why).
bool clipEncode(clip_ctx * ctx, int32_t threads, ClipImages & images, size_t first, size_t count, std::vector<float> & out);

// Images of one size as clip takes them: interleaved RGB rows (HWC, row-major). Kept from one encode
// to the next, so each image's buffer keeps its capacity.
class ClipImages {
public:
    ClipImages();
    ~ClipImages();
    ClipImages(const ClipImages &) = delete;
    ClipImages & operator=(const ClipImages &) = delete;

    void resize(size_t n);
    // Image i becomes width × height with these pixels (width × height × 3 floats, copied).
    void set(size_t i, int32_t width, int32_t height, const std::vector<float> & hwc);
    // Frees every image's buffer.
    void clear();

private:
    friend int32_t clipOutputTokens(const clip_ctx * ctx, const ClipImages & images);
    friend bool clipEncode(clip_ctx * ctx, int32_t threads, ClipImages & images, size_t first, size_t count, std::vector<float> & out);
    std::unique_ptr<clip_image_f32_batch> batch_;
};

struct DeviceBytes {
    std::string device;
    size_t bytes = 0;
};
std::vector<DeviceBytes> clipMemoryUsage(const clip_ctx * ctx);

// ---------------------------------------------------------------------------------------------
// clip's vision tower as data (internal/clip-tower.cc; tools/mtmd clip-model.h), for percept's own
// persistent graph (vision-graph.cc). clip keeps ownership of the tensors (they live in its weight
// buffer, on its backend); this is a view of them plus the hyperparameters clip's graph builders
// read, so that both graphs compute the same ops on the same weights.

enum class ClipFfnOp { Gelu, GeluErf, GeluQuick, Silu };
enum class ClipProjector { Gemma3, Gemma4v };

// Gemma 4's "clippable" linear: one matrix product with its input and output clamped.
struct ClipClamp {
    float inMin, inMax, outMin, outMax;
};

// One transformer block; absent tensors are null (clip builds only what exists).
struct ClipVitLayer {
    ggml_tensor *ln1W = nullptr, *ln1B = nullptr;
    ggml_tensor *qW = nullptr, *qB = nullptr, *kW = nullptr, *kB = nullptr, *vW = nullptr, *vB = nullptr;
    ggml_tensor *qNorm = nullptr, *kNorm = nullptr;
    ggml_tensor *oW = nullptr, *oB = nullptr;
    ggml_tensor * attnPostNorm = nullptr;
    ggml_tensor *ls1 = nullptr, *ls2 = nullptr, *lsOut = nullptr;  // layer scales
    ggml_tensor *ln2W = nullptr, *ln2B = nullptr;
    ggml_tensor *upW = nullptr, *upB = nullptr, *gateW = nullptr, *gateB = nullptr, *downW = nullptr, *downB = nullptr;
    ggml_tensor * ffnPostNorm = nullptr;
};

struct ClipVisionTower {
    ClipProjector projector = ClipProjector::Gemma3;
    int32_t nEmbd = 0, nHead = 0, nHeadKv = 0, dHead = 0, patchSize = 0, merge = 0, nOutEmbd = 0;
    float eps = 0, ropeTheta = 0;
    ClipFfnOp ffn = ClipFfnOp::Gelu;
    ggml_tensor *patchW = nullptr, *patchB = nullptr, *posEmbd = nullptr;
    ggml_tensor *preLnW = nullptr, *preLnB = nullptr, *postLnW = nullptr, *postLnB = nullptr;
    ggml_tensor *projW = nullptr, *softEmbNormW = nullptr, *stdBias = nullptr, *stdScale = nullptr;
    std::vector<ClipVitLayer> layers;
    // gemma4v: the clamps of the products whose bounds are finite, by weight. clip clamps every
    // gemma4v product; bounds of ±FLT_MAX (no clamp in the checkpoint) leave finite values as they are.
    std::vector<std::pair<const ggml_tensor *, ClipClamp>> clamps;
};

// The tower of a loaded clip context. Throws std::runtime_error naming the first part that
// percept's graph does not mirror (another projector, fused QKV, a class token, MoE...).
ClipVisionTower clipVisionTower(clip_ctx * ctx);

// ---------------------------------------------------------------------------------------------
// Backend events (internal/backend-event.cc; ggml/src/ggml-backend-impl.h): ggml-cuda keeps a
// cudaEvent_t as a backend event's context. percept's own CUDA kernels order themselves against
// ggml-cuda's stream through it (recorded there by ggml_backend_event_record, waited for there by
// ggml_backend_event_wait), with no host synchronization in between. ggml.h has no accessor for it.
void * cudaEventOf(ggml_backend_event_t event);

// ---------------------------------------------------------------------------------------------
// CUDA graphs per step shape (internal/shape-graphs.cc; ggml/src/ggml-backend-impl.h, ggml-impl.h,
// src/llama-context.h).
// ggml-cuda keeps one CUDA graph per graph key, the address of the graph's first node. llama.cpp
// builds every graph of a context in the same memory, so all its shapes share one key: when steps
// alternate between one token and a token with its grammar-forced run, ggml-cuda sees a changed
// graph at every step and never replays (or pays a capture it then throws away). ShapeGraphs sits
// in front of the graph_compute entry of each CUDA backend of a llama_context and hands ggml-cuda
// the graph with an empty node of its own in front, one per shape (the ops and sizes of every
// node, and the first node's address, ggml-cuda's own key), so each shape gets its own key, hence its own graph, captured and replayed by
// ggml-cuda's own rules: its property check over every node decides, as it does for one shape, whether a graph may be replayed. The empty
// node computes nothing (ggml-cuda skips it).
class ShapeGraphs {
public:
    // Installs itself on every CUDA backend of `ctx`; null where it has none. Destroy it before
    // the llama_context: it puts the backends' own entries back.
    static std::unique_ptr<ShapeGraphs> install(llama_context * ctx);
    ~ShapeGraphs();
    ShapeGraphs(const ShapeGraphs &) = delete;
    ShapeGraphs & operator=(const ShapeGraphs &) = delete;

    // CUDA backends it is installed on.
    size_t backends() const { return backends_.size(); }
    // Shapes given a key so far (a shape seen again after its key went to another counts again).
    uint64_t shapesKeyed() const;

    struct Keyed;

private:
    ShapeGraphs() = default;
    std::vector<Keyed *> backends_;
};

}  // namespace percept
