// percept-plan-prompt: runs planPrompt (native/src/prompt.cc) on cases read as JSON from stdin and
// prints the plans as JSON, so test/native/prompt.test.ts checks the planner without a model.
// Text is "tokenized" byte by byte (token = byte + 100; BOS = 1 when addSpecial).
// stdin:  [{"markers": [start, end], "segments": [SEG...], "cache": [SEG...]}, ...]
//         SEG = {"text": s, "addSpecial": b} | {"tokens": [t...]} | {"image": [f...], "nTokens": n, "causal": b}
//         (a cache is written as the segments that filled it)
// stdout: [{"items": [{"token": t} | {"image": n, "hash": "hex"}], "reuse": k, "reusePositions": p, "positions": n}, ...]
#include "prompt.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

using nlohmann::json;
using namespace percept;

namespace {

std::vector<int32_t> byteTokens(const std::string & text, bool addSpecial) {
    std::vector<int32_t> out;
    if (addSpecial) out.push_back(1);
    for (unsigned char c : text) out.push_back(int32_t(c) + 100);
    return out;
}

std::vector<Segment> segmentsOf(const json & list) {
    std::vector<Segment> out;
    for (const json & j : list) {
        Segment s;
        if (j.contains("text")) {
            s.kind = Segment::Text;
            s.text = j.at("text").get<std::string>();
            s.addSpecial = j.value("addSpecial", false);
        } else if (j.contains("tokens")) {
            s.kind = Segment::Tokens;
            s.tokens = j.at("tokens").get<std::vector<int32_t>>();
        } else {
            s.kind = Segment::Image;
            s.embd = j.at("image").get<std::vector<float>>();
            s.nTokens = j.at("nTokens").get<int32_t>();
            s.forceCausal = j.value("causal", false);
        }
        out.push_back(std::move(s));
    }
    return out;
}

std::string hex(uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace

int main() {
    json cases = json::parse(std::cin);
    json results = json::array();
    for (const json & c : cases) {
        const ImageMarkers markers{c.at("markers").at(0).get<int32_t>(), c.at("markers").at(1).get<int32_t>()};
        // The cache holds what planning its segments from an empty cache yields.
        const std::vector<Segment> cacheSegments = segmentsOf(c.value("cache", json::array()));
        std::vector<CacheItem> cache;
        for (const PromptItem & p : planPrompt(cacheSegments, {}, byteTokens, markers).items) cache.push_back(p.item);
        const std::vector<Segment> segments = segmentsOf(c.at("segments"));
        const PromptPlan plan = planPrompt(segments, cache, byteTokens, markers);
        json items = json::array();
        for (const PromptItem & p : plan.items) {
            if (p.item.imageTokens > 0) items.push_back({{"image", p.item.imageTokens}, {"hash", hex(p.item.imageHash)}});
            else items.push_back({{"token", p.item.token}});
        }
        results.push_back(
            {{"items", items}, {"reuse", plan.reuse}, {"reusePositions", plan.reusePositions}, {"positions", plan.positions}});
    }
    std::cout << results.dump() << std::endl;
    return 0;
}
