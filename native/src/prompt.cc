#include "prompt.h"

#include <cstring>

namespace percept {

uint64_t hashImage(const std::vector<float> & embd) {
    uint64_t h = 1469598103934665603ULL ^ uint64_t(embd.size());
    const uint8_t * p = reinterpret_cast<const uint8_t *>(embd.data());
    const size_t n = embd.size() * sizeof(float);
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

namespace {

// The attention mode is part of the KV content of an image: fold it into the image's identity.
constexpr uint64_t kCausalImageSalt = 0x9E3779B97F4A7C15ULL;

void appendItems(const Segment & s, const Tokenizer & tokenize, ImageMarkers markers, std::vector<PromptItem> & items) {
    const auto token = [](int32_t t) { return PromptItem{CacheItem{t, 0, 0}, nullptr, false}; };
    switch (s.kind) {
    case Segment::Text:
        for (int32_t t : tokenize(s.text, s.addSpecial)) items.push_back(token(t));
        break;
    case Segment::Tokens:
        for (int32_t t : s.tokens) items.push_back(token(t));
        break;
    case Segment::Image: {
        const uint64_t h = hashImage(s.embd) ^ (s.forceCausal ? kCausalImageSalt : 0);
        items.push_back(token(markers.start));
        items.push_back(PromptItem{CacheItem{-1, h, s.nTokens}, s.embd.data(), s.forceCausal});
        items.push_back(token(markers.end));
        break;
    }
    }
}

}  // namespace

PromptPlan planPrompt(const std::vector<Segment> & segments, const std::vector<CacheItem> & cache, const Tokenizer & tokenize,
                      ImageMarkers markers) {
    PromptPlan plan;
    for (const Segment & s : segments) appendItems(s, tokenize, markers, plan.items);
    for (const PromptItem & p : plan.items) plan.positions += p.item.positions();

    size_t k = 0;
    while (k < cache.size() && k < plan.items.size() && cache[k].sameAs(plan.items[k].item)) k++;
    if (k > 0 && k == plan.items.size()) k--;
    plan.reuse = k;
    for (size_t i = 0; i < k; i++) plan.reusePositions += plan.items[i].item.positions();
    return plan;
}

}  // namespace percept
