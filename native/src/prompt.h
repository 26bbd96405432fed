// Prompt planning: the prompt's segments (text, token ids, images) become cache items, one per token or per image.
// It finds the longest prefix the KV cache already holds, so only the rest is decoded.
// Pure: the tokenizer is passed in, and nothing calls llama.cpp. So it is tested without a model:
// native/test/plan-prompt.cc, test/native/prompt.test.ts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace percept {

// What sits in the KV cache, position by position: a text token or a whole image.
struct CacheItem {
    int32_t token = -1;       // >= 0 for a token
    uint64_t imageHash = 0;   // for an image
    int32_t imageTokens = 0;  // > 0 for an image (its number of positions)
    int32_t positions() const { return imageTokens > 0 ? imageTokens : 1; }
    bool sameAs(const CacheItem & o) const {
        return imageTokens > 0 ? (o.imageTokens == imageTokens && o.imageHash == imageHash) : o.imageTokens == 0 && o.token == token;
    }
};

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
    const float * embd = nullptr;  // image rows (nTokens × nEmbd), owned by the segment
    bool forceCausal = false;
};

struct PromptPlan {
    std::vector<PromptItem> items;  // the whole prompt
    size_t reuse = 0;               // items[0, reuse) are in the KV cache already
    int32_t reusePositions = 0;     // the positions they fill
    int32_t positions = 0;          // the whole prompt's positions
};

// Text → token ids (llama_tokenize with special tokens parsed, in the addon).
using Tokenizer = std::function<std::vector<int32_t>(const std::string & text, bool addSpecial)>;

// The tokens that wrap every image in the prompt (Gemma: <start_of_image> … <end_of_image>).
struct ImageMarkers {
    int32_t start = -1;
    int32_t end = -1;
};

// Equal images give equal hashes (FNV-1a over 64-bit words); only used to detect reuse.
uint64_t hashImage(const std::vector<float> & embd);

// The prompt as cache items and what of it `cache` holds. The last item is never reused, even
// when the whole prompt is cached: it is decoded again for the logits of the first new token.
PromptPlan planPrompt(const std::vector<Segment> & segments, const std::vector<CacheItem> & cache, const Tokenizer & tokenize,
                      ImageMarkers markers);

}  // namespace percept
