// The one place that reaches into llama.cpp's internal headers (src/llama-*.h, tools/mtmd/clip*.h).
// Those change between llama.cpp versions without notice; with every use behind this file, an
// upgrade touches one translation unit. Every other file includes public headers only (llama.h,
// ggml*.h, gguf.h, mtmd.h, common/*.h); CMake gives llama.cpp's src/ include path to
// llama-internal.cc alone, and test/native-headers.test.ts checks the rule for tools/mtmd.
#pragma once

#include "llama.h"

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct llama_grammar;  // src/llama-grammar.h
struct clip_ctx;       // tools/mtmd/clip.h

namespace percept {

// ---------------------------------------------------------------------------------------------
// Memory per buffer type (src/llama-ext.h, a staging C++ API: there is no C function for KV bytes).

struct BufferBytes {
    std::string bufferType;
    size_t model = 0;
    size_t context = 0;  // KV (or recurrent) cache
    size_t compute = 0;
};
std::vector<BufferBytes> memoryBreakdown(const llama_context * ctx);

// ---------------------------------------------------------------------------------------------
// Grammar (src/llama-grammar.h). llama.h only offers the grammar as a sampler, which tests the
// whole vocabulary each time; percept needs the state itself: clone it per generation, test a
// few candidate tokens, and look at what the grammar's stacks expect next.

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
// clip vision encoder (tools/mtmd/clip.h, clip-impl.h). mtmd.h encodes only images it
// preprocesses itself; percept preprocesses in JS (sharp) and hands clip the pixels.

struct ClipOptions {
    bool useGpu = false;
    int32_t flashAttention = -1;  // -1 auto, 0 off, 1 on
    bool warmup = true;           // allocate compute buffers at load with a full-size dummy image
};
// Loads the vision tower of an mmproj GGUF; null on failure (llama.cpp logs the reason).
clip_ctx * clipLoad(const std::string & path, const ClipOptions & options);
void clipFree(clip_ctx * ctx);
// Output width (the decoder's n_embd).
int32_t clipEmbdWidth(const clip_ctx * ctx);
// Encodes one image given as interleaved RGB rows (HWC, row-major; consumed): fills `out` with
// nTokens × clipEmbdWidth floats and returns nTokens, or -1 on failure (llama.cpp logs why).
int32_t clipEncode(clip_ctx * ctx, int32_t threads, int32_t width, int32_t height, std::vector<float> && hwc, std::vector<float> & out);

struct DeviceBytes {
    std::string device;
    size_t bytes = 0;
};
std::vector<DeviceBytes> clipMemoryUsage(const clip_ctx * ctx);

}  // namespace percept
