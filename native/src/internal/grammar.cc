// Grammar state (llama-internal.h): parse, clone, apply, accept, and what the stacks expect next.
#include "../llama-internal.h"

#include "llama-grammar.h"

#include <algorithm>
#include <bitset>
#include <cstdint>
#include <string>

namespace percept {

void GrammarDeleter::operator()(llama_grammar * g) const { llama_grammar_free_impl(g); }

GrammarPtr grammarParse(const llama_vocab * vocab, const std::string & gbnf, const std::string & root) {
    return GrammarPtr(llama_grammar_init_impl(vocab, gbnf.c_str(), root.c_str(), false, nullptr, 0, nullptr, 0));
}

GrammarPtr grammarClone(const llama_grammar & grammar) { return GrammarPtr(llama_grammar_clone_impl(grammar)); }

void grammarApply(const llama_grammar & grammar, llama_token_data_array * candidates) { llama_grammar_apply_impl(grammar, candidates); }

void grammarAccept(llama_grammar & grammar, llama_token token) { llama_grammar_accept_impl(grammar, token); }

bool grammarComplete(const llama_grammar & grammar) {
    if (grammar.stacks.empty()) return false;
    for (const auto & stack : grammar.stacks)
        if (!stack.empty()) return false;
    return true;
}

int64_t grammarSingleChar(const llama_grammar & grammar) {
    if (grammar.partial_utf8.n_remain != 0 || grammar.stacks.empty()) return -1;
    int64_t chr = -1;
    for (const auto & stack : grammar.stacks) {
        if (stack.empty()) return -1;  // end of grammar is admissible too
        const llama_grammar_element * pos = stack.back();
        if (pos->type != LLAMA_GRETYPE_CHAR) return -1;
        if (pos[1].type == LLAMA_GRETYPE_CHAR_ALT || pos[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) return -1;
        if (chr >= 0 && int64_t(pos->value) != chr) return -1;
        chr = pos->value;
    }
    return chr;
}

namespace {

uint8_t leadByte(uint32_t cp) {
    return cp < 0x80   ? uint8_t(cp)
        : cp < 0x800   ? uint8_t(0xC0 | (cp >> 6))
        : cp < 0x10000 ? uint8_t(0xE0 | (cp >> 12))
                       : uint8_t(0xF0 | (cp >> 18));
}

}  // namespace

std::bitset<257> grammarLeadBytes(const llama_grammar & grammar) {
    std::bitset<257> mask;
    if (grammar.partial_utf8.n_remain != 0) return mask.set();
    for (const auto & stack : grammar.stacks) {
        if (stack.empty()) {
            mask.set(256);
            continue;
        }
        const llama_grammar_element * p = stack.back();
        if (p->type != LLAMA_GRETYPE_CHAR) return mask.set();
        do {
            uint32_t lo = p->value, hi = p->value;
            if (p[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
                hi = p[1].value;
                p += 2;
            } else {
                p += 1;
            }
            for (uint32_t b = leadByte(lo); b <= leadByte(std::max(lo, hi)) && b < 256; b++) mask.set(b);
        } while (p->type == LLAMA_GRETYPE_CHAR_ALT);
    }
    return mask;
}

}  // namespace percept
