// Grammar automaton (llama-internal.h): the grammar explored byte by byte, for the token index.
#include "../llama-internal.h"

#include "llama-grammar.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace percept {

namespace {

// Same rule as llama.cpp's char matcher (llama_grammar_match_char), used only to skip bytes no
// stack can take before asking llama_grammar_accept, which decides.
bool topAdmits(const llama_grammar_element * pos, uint32_t cp) {
    if (pos->type != LLAMA_GRETYPE_CHAR && pos->type != LLAMA_GRETYPE_CHAR_NOT && pos->type != LLAMA_GRETYPE_CHAR_ANY) return true;
    const bool positive = pos->type != LLAMA_GRETYPE_CHAR_NOT;
    bool found = false;
    do {
        if (pos[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
            found = found || (pos->value <= cp && cp <= pos[1].value);
            pos += 2;
        } else if (pos->type == LLAMA_GRETYPE_CHAR_ANY) {
            found = true;
            pos += 1;
        } else {
            found = found || pos->value == cp;
            pos += 1;
        }
    } while (pos->type == LLAMA_GRETYPE_CHAR_ALT);
    return found == positive;
}

bool stackLess(const llama_grammar_stack & a, const llama_grammar_stack & b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), std::less<const llama_grammar_element *>());
}

// Repetitions are right-recursive in llama.cpp and keep stacks flat; a stack this deep is nesting
// (a recursive grammar), which no finite automaton captures.
constexpr size_t kMaxStackDepth = 128;

}  // namespace

struct GrammarAutomaton::Impl {
    struct Key {
        llama_grammar_stacks stacks;  // sorted, unique
        uint32_t partial = 0;
        int32_t remain = 0;
        bool operator<(const Key & o) const {
            if (remain != o.remain) return remain < o.remain;
            if (partial != o.partial) return partial < o.partial;
            return std::lexicographical_compare(stacks.begin(), stacks.end(), o.stacks.begin(), o.stacks.end(), stackLess);
        }
    };

    GrammarPtr scratch;
    int32_t maxStates;
    std::map<Key, int32_t> ids;
    std::vector<const Key *> keys;
    std::vector<uint8_t> accepting;

    int32_t intern(llama_grammar_stacks stacks, uint32_t partial, int32_t remain) {
        std::sort(stacks.begin(), stacks.end(), stackLess);
        stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
        Key k{std::move(stacks), remain > 0 ? partial : 0, remain};
        auto found = ids.find(k);
        if (found != ids.end()) return found->second;
        if (int32_t(keys.size()) >= maxStates) {
            throw GrammarNotFinite("more than " + std::to_string(maxStates) + " automaton states (a recursive or very large grammar)");
        }
        bool accepts = false;
        for (const auto & st : k.stacks) {
            if (st.size() > kMaxStackDepth) {
                throw GrammarNotFinite("grammar rules nest deeper than " + std::to_string(kMaxStackDepth) + " (a recursive grammar)");
            }
            if (st.empty()) {
                accepts = true;
            } else if (st.back()->type == LLAMA_GRETYPE_TOKEN || st.back()->type == LLAMA_GRETYPE_TOKEN_NOT) {
                throw GrammarNotFinite("the grammar matches token ids (<[id]>), not text");
            }
        }
        const int32_t id = int32_t(keys.size());
        auto ins = ids.emplace(std::move(k), id);
        keys.push_back(&ins.first->first);
        accepting.push_back(accepts ? 1 : 0);
        return id;
    }

    int32_t afterChar(const llama_grammar_stacks & stacks, uint32_t cp) {
        bool any = false;
        for (const auto & st : stacks) any = any || (!st.empty() && topAdmits(st.back(), cp));
        if (!any) return -1;
        scratch->stacks = stacks;
        llama_grammar_accept(scratch.get(), cp);
        if (scratch->stacks.empty()) return -1;
        return intern(scratch->stacks, 0, 0);
    }

    // A partial sequence lives on while some stack could still take a character it completes to
    // (llama.cpp's check for a token that ends inside a character).
    int32_t afterPartial(const llama_grammar_stacks & stacks, uint32_t partial, int32_t remain) {
        static const uint32_t kEnd = 0;
        const llama_grammar_candidates probe{{0, &kEnd, llama_partial_utf8{partial, remain}, 0}};
        const llama_grammar_rules & rules = llama_grammar_get_rules(scratch.get());
        for (const auto & st : stacks) {
            if (llama_grammar_reject_candidates_for_stack(rules, st, probe).empty()) return intern(stacks, partial, remain);
        }
        return -1;
    }
};

GrammarAutomaton::GrammarAutomaton(const llama_grammar & grammar, int32_t maxStates) : impl_(new Impl()) {
    impl_->scratch = grammarClone(grammar);
    impl_->maxStates = maxStates;
    if (grammar.partial_utf8.n_remain != 0) throw GrammarNotFinite("the grammar state is inside a UTF-8 sequence");
    impl_->intern(grammar.stacks, 0, 0);
}

GrammarAutomaton::~GrammarAutomaton() = default;

int32_t GrammarAutomaton::states() const { return int32_t(impl_->keys.size()); }

bool GrammarAutomaton::accepting(int32_t state) const { return impl_->accepting[size_t(state)] != 0; }

// Bytes decode as in llama-grammar.cpp's decode_utf8: a multi-byte sequence waits in `partial`
// (continuation bytes checked), and completes into one code point for llama_grammar_accept.
int32_t GrammarAutomaton::step(int32_t state, uint8_t byte) {
    static const int kSeqLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
    const Impl::Key & k = *impl_->keys[size_t(state)];
    if (byte == 0) return -1;  // llama.cpp stops decoding a piece at NUL
    if (k.remain > 0) {
        if ((byte >> 6) != 2) return -1;
        const uint32_t v = (k.partial << 6) + (byte & 0x3F);
        return k.remain == 1 ? impl_->afterChar(k.stacks, v) : impl_->afterPartial(k.stacks, v, k.remain - 1);
    }
    const int remain = kSeqLen[byte >> 4] - 1;
    if (remain < 0) return -1;
    if (remain == 0) return impl_->afterChar(k.stacks, byte);
    return impl_->afterPartial(k.stacks, byte & ((1u << (7 - remain)) - 1), remain);
}

bool grammarAdmitsText(const llama_grammar & grammar, const std::string & text) {
    GrammarPtr g = grammarClone(grammar);
    try {
        llama_grammar_accept_str(*g, text);
    } catch (const std::runtime_error &) {
        return false;  // the stacks ran out: the text leaves the grammar
    }
    for (const auto & stack : g->stacks)
        if (stack.empty()) return g->partial_utf8.n_remain == 0;  // some path is complete
    return false;
}

}  // namespace percept
