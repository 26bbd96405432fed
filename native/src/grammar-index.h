// A token index per grammar state. The grammar (llama.cpp GBNF) becomes a byte automaton, the vocabulary a byte trie.
// For every automaton state, the index lists the tokens it admits and the state each one leads to.
// Sampling under a grammar then looks at a few dozen logits instead of the whole vocabulary.
// The per-state forced text gives jump-forward its tokens. More: native/README.md#grammar-index
#pragma once

#include "llama.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct llama_grammar;
struct llama_vocab;

namespace percept {

// The vocabulary's pieces (as llama.cpp's grammar matches them) in a byte trie, built once per model.
class TokenTrie {
public:
    explicit TokenTrie(const llama_vocab * vocab);

    static constexpr uint32_t kRoot = 0;
    uint32_t nodeCount() const { return uint32_t(label_.size()); }
    uint8_t label(uint32_t node) const { return label_[node]; }
    // Children of a node, in increasing byte order.
    const uint32_t * kidsBegin(uint32_t node) const { return kids_.data() + kidStart_[node]; }
    const uint32_t * kidsEnd(uint32_t node) const { return kids_.data() + kidStart_[node + 1]; }
    // Tokens whose piece ends at this node.
    const llama_token * tokensBegin(uint32_t node) const { return tokens_.data() + tokStart_[node]; }
    const llama_token * tokensEnd(uint32_t node) const { return tokens_.data() + tokStart_[node + 1]; }
    // The child reached by `byte`, or -1.
    int64_t child(uint32_t node, uint8_t byte) const;
    // End-of-generation tokens (admitted exactly where the grammar may end).
    const std::vector<llama_token> & eog() const { return eog_; }
    double buildMs() const { return buildMs_; }

private:
    std::vector<uint8_t> label_;
    std::vector<uint32_t> kidStart_;  // nodeCount + 1
    std::vector<uint32_t> kids_;
    std::vector<uint32_t> tokStart_;  // nodeCount + 1
    std::vector<llama_token> tokens_;
    std::vector<llama_token> eog_;
    double buildMs_ = 0;
};

struct GrammarIndexLimits {
    int32_t maxStates = 0;  // automaton states (a recursive grammar never stops growing)
    size_t maxEntries = 0;  // (token, next state) pairs over all states
};

struct GrammarIndexStats {
    int32_t states = 0;            // byte-automaton states
    int32_t tokenStates = 0;       // states reachable at token boundaries
    size_t entries = 0;            // (token, next) pairs
    int32_t maxAllowed = 0;        // most tokens admitted in one state
    int32_t forcedStates = 0;      // token-boundary states with jump-forward tokens
    size_t prunedEntries = 0;      // tokens dropped because no completion follows them
    int32_t worstCaseTokens = -1;  // worst-case tokens of a complete output; -1: unbounded (a cycle)
    int32_t maxChoices = -1;       // worst-case tokens the model picks in one (end included); -1: unbounded
    double buildMs = 0;            // automaton + index (not the trie)
    double trieMs = 0;             // the model's trie (0 when it was already built)
};

class GrammarIndex {
public:
    // Builds the index of `grammar`, a freshly initialised llama_grammar, over `trie`.
    // Returns null and sets `why` when the grammar has no small finite automaton, or cannot complete with this vocabulary.
    // No small automaton means recursion, token references, or more than the limits.
    static std::shared_ptr<const GrammarIndex> build(const llama_grammar & grammar, const llama_vocab * vocab, const TokenTrie & trie,
                                                     const GrammarIndexLimits & limits, std::string & why);

    int32_t start() const { return 0; }
    bool accepting(int32_t s) const { return accepting_[size_t(s)] != 0; }
    // Admitted tokens of a state, by increasing id, and the state each leads to.
    // EOG tokens are not listed: they are admitted iff the state is accepting.
    const llama_token * tokensBegin(int32_t s) const { return tok_.data() + start_[size_t(s)]; }
    const llama_token * tokensEnd(int32_t s) const { return tok_.data() + start_[size_t(s) + 1]; }
    const int32_t * nextBegin(int32_t s) const { return next_.data() + start_[size_t(s)]; }
    size_t allowedCount(int32_t s) const { return start_[size_t(s) + 1] - start_[size_t(s)]; }
    // The state after `token`, or -1 when the state does not admit it (EOG included: -1).
    int32_t next(int32_t s, llama_token token) const;
    // Tokens the grammar alone decides from this state (canonical tokenization of its forced text),
    // and the state after them. Empty when the model has a choice.
    const llama_token * forcedBegin(int32_t s) const { return forced_.data() + forcedStart_[size_t(s)]; }
    const llama_token * forcedEnd(int32_t s) const { return forced_.data() + forcedStart_[size_t(s) + 1]; }
    // Only end-of-generation is admissible.
    bool complete(int32_t s) const { return accepting(s) && allowedCount(s) == 0; }
    const std::vector<llama_token> & eog() const { return eog_; }
    const GrammarIndexStats & stats() const { return stats_; }

private:
    GrammarIndex() = default;
    friend class IndexBuilder;

    std::vector<uint8_t> accepting_;
    std::vector<uint32_t> start_;  // states + 1
    std::vector<llama_token> tok_;
    std::vector<int32_t> next_;
    std::vector<uint32_t> forcedStart_;  // states + 1
    std::vector<llama_token> forced_;
    std::vector<llama_token> eog_;
    GrammarIndexStats stats_;
};

// A position in a grammar's token index during one generation: the state, and the forced run being emitted.
// A forced run is taken whole, so it is fixed when it starts. Cheap to copy: drafting walks a copy.
class IndexCursor {
public:
    IndexCursor() = default;
    explicit IndexCursor(std::shared_ptr<const GrammarIndex> index);
    explicit operator bool() const { return index_ != nullptr; }

    // The next token of the forced run (starting the state's run when none is pending), or -1 when
    // the model has a choice.
    llama_token forced();
    // Only end-of-generation can follow.
    bool complete() const { return pendingAt_ == pendingEnd_ && index_->complete(state_); }
    // The admitted token with the best logit, the first by id among equals, as a greedy sampler over a masked vocabulary picks it.
    // End-of-generation tokens count where the grammar may end.
    llama_token best(const float * logits) const;
    // Appends every admitted token with its logit.
    void candidates(const float * logits, std::vector<llama_token_data> & out) const;
    // Moves past `token`; false when the grammar does not admit it here. An end-of-generation
    // token where the grammar may end is admitted and changes nothing.
    bool advance(llama_token token);

private:
    std::shared_ptr<const GrammarIndex> index_;
    int32_t state_ = 0;
    const llama_token * pendingAt_ = nullptr;  // the rest of the forced run
    const llama_token * pendingEnd_ = nullptr;
};

// Per model: the trie, built on first use, and the indexes built on it, keyed by grammar text, root and limits.
// So a grammar built twice from the same schema costs nothing the second time.
class GrammarIndexCache {
public:
    struct Result {
        std::shared_ptr<const GrammarIndex> index;  // null: not indexable, see why
        std::string why;
        GrammarIndexStats stats;  // of the index (trieMs: of this call)
    };
    Result get(const llama_grammar & grammar, const llama_vocab * vocab, const std::string & key, const GrammarIndexLimits & limits);

private:
    std::mutex mu_;
    std::unique_ptr<TokenTrie> trie_;
    std::map<std::string, Result> built_;
};

}  // namespace percept
