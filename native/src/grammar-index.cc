#include "grammar-index.h"

#include "llama-internal.h"
#include "util.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <stdexcept>

namespace percept {

namespace {

double msSince(int64_t t0) { return double(monotonicNs() - t0) / 1e6; }

// Too big to index, or no completion with this vocabulary (the automaton's own limits throw
// GrammarNotFinite).
struct NotIndexable : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A token's piece as llama.cpp's grammar matches it: special tokens rendered as their text.
std::string pieceOf(const llama_vocab * vocab, llama_token id) {
    std::string piece(32, '\0');
    int32_t n = llama_token_to_piece(vocab, id, piece.data(), int32_t(piece.size()), 0, true);
    if (n < 0) {
        piece.resize(size_t(-n));
        n = llama_token_to_piece(vocab, id, piece.data(), int32_t(piece.size()), 0, true);
    }
    piece.resize(size_t(std::max(n, 0)));
    return piece;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Trie

TokenTrie::TokenTrie(const llama_vocab * vocab) {
    const int64_t t0 = monotonicNs();
    const int32_t nVocab = llama_vocab_n_tokens(vocab);
    std::vector<std::string> pieces(static_cast<size_t>(nVocab));
    std::vector<llama_token> order;
    order.reserve(size_t(nVocab));
    for (llama_token id = 0; id < nVocab; id++) {
        if (llama_vocab_is_eog(vocab, id)) {
            eog_.push_back(id);
            continue;
        }
        // llama.cpp's grammar never admits a token whose piece is empty or starts with NUL.
        pieces[size_t(id)] = pieceOf(vocab, id);
        if (!pieces[size_t(id)].empty() && pieces[size_t(id)][0] != 0) order.push_back(id);
    }
    std::stable_sort(order.begin(), order.end(), [&pieces](llama_token a, llama_token b) { return pieces[size_t(a)] < pieces[size_t(b)]; });

    // Sorted pieces share prefixes with their predecessor: nodes are created in preorder, each
    // child after its parent and siblings in byte order.
    std::vector<uint32_t> parent{0};
    label_.push_back(0);
    std::vector<uint32_t> tokenNode;  // node of each token in `order`
    tokenNode.reserve(order.size());
    std::vector<uint32_t> path{kRoot};
    const std::string * prev = nullptr;
    for (llama_token id : order) {
        const std::string & p = pieces[size_t(id)];
        size_t lcp = 0;
        if (prev != nullptr) {
            while (lcp < prev->size() && lcp < p.size() && (*prev)[lcp] == p[lcp]) lcp++;
        }
        path.resize(lcp + 1);
        for (size_t d = lcp; d < p.size(); d++) {
            parent.push_back(path.back());
            label_.push_back(uint8_t(p[d]));
            path.push_back(uint32_t(label_.size() - 1));
        }
        tokenNode.push_back(path[p.size()]);
        prev = &p;
    }
    const uint32_t n = uint32_t(label_.size());
    // Children lists: a stable counting sort of nodes by parent keeps byte order.
    kidStart_.assign(n + 1, 0);
    for (uint32_t c = 1; c < n; c++) kidStart_[parent[c] + 1]++;
    std::partial_sum(kidStart_.begin(), kidStart_.end(), kidStart_.begin());
    kids_.resize(n > 0 ? n - 1 : 0);
    std::vector<uint32_t> fill(kidStart_.begin(), kidStart_.end() - 1);
    for (uint32_t c = 1; c < n; c++) kids_[fill[parent[c]]++] = c;
    // Tokens per node (equal pieces are adjacent in `order`, and so are their nodes).
    tokStart_.assign(n + 1, 0);
    for (uint32_t node : tokenNode) tokStart_[node + 1]++;
    std::partial_sum(tokStart_.begin(), tokStart_.end(), tokStart_.begin());
    tokens_.resize(order.size());
    std::vector<uint32_t> tfill(tokStart_.begin(), tokStart_.end() - 1);
    for (size_t i = 0; i < order.size(); i++) tokens_[tfill[tokenNode[i]]++] = order[i];
    for (uint32_t node = 0; node < n; node++) std::sort(tokens_.begin() + tokStart_[node], tokens_.begin() + tokStart_[node + 1]);
    buildMs_ = msSince(t0);
}

int64_t TokenTrie::child(uint32_t node, uint8_t byte) const {
    const uint32_t * b = kidsBegin(node);
    const uint32_t * e = kidsEnd(node);
    const uint32_t * it = std::lower_bound(b, e, byte, [this](uint32_t c, uint8_t v) { return label_[c] < v; });
    return it != e && label_[*it] == byte ? int64_t(*it) : -1;
}

// ------------------------------------------------------------------------------------------------
// Index

class IndexBuilder {
public:
    IndexBuilder(const llama_grammar & grammar, const llama_vocab * vocab, const TokenTrie & trie, const GrammarIndexLimits & limits)
        : automaton_(grammar, limits.maxStates), vocab_(vocab), trie_(trie), limits_(limits) {}

    std::shared_ptr<const GrammarIndex> run() {
        const int64_t t0 = monotonicNs();
        out_.reset(new GrammarIndex());
        exploreBytes();
        markByteUseful();
        indexTokens();
        pruneDeadEnds();
        computeForced();
        longestPaths();
        out_->eog_ = trie_.eog();
        out_->stats_.states = automaton_.states();
        out_->stats_.buildMs = msSince(t0);
        return std::shared_ptr<const GrammarIndex>(out_.release());
    }

private:
    // Every state and its 256 byte transitions, breadth-first from the grammar's own state.
    void exploreBytes() {
        for (int32_t s = 0; s < automaton_.states(); s++) {  // the automaton grows as states are found
            for (int b = 0; b < 256; b++) delta_.push_back(automaton_.step(s, uint8_t(b)));
            accepting_.push_back(automaton_.accepting(s) ? 1 : 0);
        }
    }

    int32_t delta(int32_t s, uint8_t b) const { return delta_[size_t(s) * 256 + b]; }

    // States from which some byte string reaches an accepting state.
    void markByteUseful() {
        const size_t n = accepting_.size();
        std::vector<uint32_t> predStart(n + 1, 0);
        for (int32_t t : delta_) {
            if (t >= 0) predStart[size_t(t) + 1]++;
        }
        std::partial_sum(predStart.begin(), predStart.end(), predStart.begin());
        std::vector<int32_t> pred(predStart[n]);
        std::vector<uint32_t> fill(predStart.begin(), predStart.end() - 1);
        for (size_t i = 0; i < delta_.size(); i++) {
            if (delta_[i] >= 0) pred[fill[size_t(delta_[i])]++] = int32_t(i / 256);
        }
        byteUseful_.assign(n, 0);
        std::vector<int32_t> todo;
        for (size_t s = 0; s < n; s++) {
            if (accepting_[s]) {
                byteUseful_[s] = 1;
                todo.push_back(int32_t(s));
            }
        }
        while (!todo.empty()) {
            int32_t t = todo.back();
            todo.pop_back();
            for (uint32_t i = predStart[size_t(t)]; i < predStart[size_t(t) + 1]; i++) {
                if (!byteUseful_[size_t(pred[i])]) {
                    byteUseful_[size_t(pred[i])] = 1;
                    todo.push_back(pred[i]);
                }
            }
        }
    }

    // For every state reachable at a token boundary, walk the trie with the automaton and list the
    // tokens whose whole piece it accepts.
    void indexTokens() {
        const size_t n = accepting_.size();
        std::vector<std::vector<std::pair<llama_token, int32_t>>> rows(n);
        boundary_.assign(n, 0);
        std::deque<int32_t> todo{0};
        boundary_[0] = 1;
        std::vector<std::pair<uint32_t, int32_t>> stack;
        size_t total = 0;
        while (!todo.empty()) {
            const int32_t s = todo.front();
            todo.pop_front();
            auto & row = rows[size_t(s)];
            stack.assign(1, {TokenTrie::kRoot, s});
            while (!stack.empty()) {
                auto [node, st] = stack.back();
                stack.pop_back();
                for (const uint32_t * c = trie_.kidsBegin(node); c != trie_.kidsEnd(node); c++) {
                    // (tokens into states that cannot complete are kept here and counted when pruned)
                    const int32_t t = delta(st, trie_.label(*c));
                    if (t < 0) continue;
                    for (const llama_token * tok = trie_.tokensBegin(*c); tok != trie_.tokensEnd(*c); tok++) row.emplace_back(*tok, t);
                    if (trie_.kidsBegin(*c) != trie_.kidsEnd(*c)) stack.emplace_back(*c, t);
                }
            }
            total += row.size();
            if (total > limits_.maxEntries) {
                throw NotIndexable("more than " + std::to_string(limits_.maxEntries) +
                                   " (token, state) entries (free text admits most of the vocabulary)");
            }
            std::sort(row.begin(), row.end());
            for (const auto & e : row) {
                if (!boundary_[size_t(e.second)]) {
                    boundary_[size_t(e.second)] = 1;
                    todo.push_back(e.second);
                }
            }
        }
        rows_ = std::move(rows);
    }

    // Drops tokens after which no completion exists (llama.cpp would admit them and get stuck),
    // then lays the rows out flat.
    void pruneDeadEnds() {
        const size_t n = accepting_.size();
        std::vector<std::vector<int32_t>> pred(n);
        for (size_t s = 0; s < n; s++) {
            for (const auto & e : rows_[s]) pred[size_t(e.second)].push_back(int32_t(s));
        }
        useful_.assign(n, 0);
        std::vector<int32_t> todo;
        for (size_t s = 0; s < n; s++) {
            if (boundary_[s] && accepting_[s]) {
                useful_[s] = 1;
                todo.push_back(int32_t(s));
            }
        }
        while (!todo.empty()) {
            int32_t t = todo.back();
            todo.pop_back();
            for (int32_t p : pred[size_t(t)]) {
                if (!useful_[size_t(p)]) {
                    useful_[size_t(p)] = 1;
                    todo.push_back(p);
                }
            }
        }
        if (!useful_[0]) throw NotIndexable("no sequence of this vocabulary's tokens completes the grammar");
        GrammarIndex & ix = *out_;
        GrammarIndexStats & st = ix.stats_;
        ix.accepting_ = accepting_;
        ix.start_.assign(n + 1, 0);
        for (size_t s = 0; s < n; s++) {
            if (boundary_[s]) st.tokenStates++;
            for (const auto & e : rows_[s]) {
                if (!useful_[size_t(e.second)] || !useful_[s]) {
                    st.prunedEntries++;
                    continue;
                }
                ix.tok_.push_back(e.first);
                ix.next_.push_back(e.second);
            }
            ix.start_[s + 1] = uint32_t(ix.tok_.size());
            st.maxAllowed = std::max<int32_t>(st.maxAllowed, int32_t(ix.start_[s + 1] - ix.start_[s]));
        }
        st.entries = ix.tok_.size();
        rows_.clear();
    }

    // Whether a token longer than `suffix`, a piece that starts with it, is admitted from the state after `suffix`.
    // Then a tokenizer could have put a boundary elsewhere, and `suffix`'s first token is not canonical.
    bool extendable(const std::string & suffix, int32_t after) const {
        int64_t node = TokenTrie::kRoot;
        for (char c : suffix) {
            node = trie_.child(uint32_t(node), uint8_t(c));
            if (node < 0) return false;
        }
        std::vector<std::pair<uint32_t, int32_t>> stack{{uint32_t(node), after}};
        while (!stack.empty()) {
            auto [nd, st] = stack.back();
            stack.pop_back();
            for (const uint32_t * c = trie_.kidsBegin(nd); c != trie_.kidsEnd(nd); c++) {
                const int32_t t = delta(st, trie_.label(*c));
                if (t < 0 || !byteUseful_[size_t(t)]) continue;
                if (trie_.tokensBegin(*c) != trie_.tokensEnd(*c)) return true;
                stack.emplace_back(*c, t);
            }
        }
        return false;
    }

    // Per token-boundary state: the text the grammar forces, one possible byte at a time, not accepting.
    // The model's tokenizer tokenizes it, cut before the first token that a longer admissible token could replace.
    // A state admitting exactly one token forces that one.
    void computeForced() {
        GrammarIndex & ix = *out_;
        const size_t n = accepting_.size();
        ix.forcedStart_.assign(n + 1, 0);
        for (size_t s = 0; s < n; s++) {
            std::vector<llama_token> kept;
            if (boundary_[s] && useful_[s] && !accepting_[s]) {
                std::string text;
                int32_t e = int32_t(s);
                while (!accepting_[size_t(e)] && text.size() < 256) {
                    int only = -1;
                    for (int b = 0; b < 256; b++) {
                        const int32_t t = delta(e, uint8_t(b));
                        if (t < 0 || !byteUseful_[size_t(t)]) continue;
                        if (only >= 0) {
                            only = -2;
                            break;
                        }
                        only = b;
                    }
                    if (only < 0) break;
                    text.push_back(char(only));
                    e = delta(e, uint8_t(only));
                }
                if (!text.empty()) kept = canonicalPrefix(text, int32_t(s), e);
                if (kept.empty() && ix.allowedCount(int32_t(s)) == 1) kept.push_back(*ix.tokensBegin(int32_t(s)));
            }
            if (!kept.empty()) ix.stats_.forcedStates++;
            ix.forced_.insert(ix.forced_.end(), kept.begin(), kept.end());
            ix.forcedStart_[s + 1] = uint32_t(ix.forced_.size());
        }
    }

    std::vector<llama_token> canonicalPrefix(const std::string & text, int32_t from, int32_t end) const {
        std::vector<llama_token> toks(text.size() + 4);
        int32_t nt = llama_tokenize(vocab_, text.data(), int32_t(text.size()), toks.data(), int32_t(toks.size()), false, false);
        if (nt <= 0) return {};
        toks.resize(size_t(nt));
        // The tokenizer must spell exactly the forced text (no added prefix space, no specials).
        std::vector<size_t> offset;
        std::string spelled;
        for (llama_token t : toks) {
            offset.push_back(spelled.size());
            spelled += pieceOf(vocab_, t);
        }
        if (spelled != text) return {};
        std::vector<llama_token> kept;
        int32_t s = from;
        for (size_t j = 0; j < toks.size(); j++) {
            if (extendable(text.substr(offset[j]), end)) break;
            const int32_t t = out_->next(s, toks[j]);
            if (t < 0) break;
            kept.push_back(toks[j]);
            s = t;
        }
        return kept;
    }

    // The worst case of a complete output, into the stats. First its tokens: a forced run counts its length, taken whole.
    // Then the tokens the model picks on the way, with the end of generation where the grammar may end but need not.
    // With jump-forward, each pick after the first costs one decode. -1 for both when a cycle makes them unbounded.
    void longestPaths() {
        const GrammarIndex & ix = *out_;
        const size_t n = accepting_.size();
        // Successor i of s and the tokens it costs, or {-1, 0} past the last.
        auto succ = [&](int32_t s, size_t i) -> std::pair<int32_t, int32_t> {
            const size_t nForced = size_t(ix.forcedEnd(s) - ix.forcedBegin(s));
            if (nForced > 0) {
                if (i > 0) return {-1, 0};
                int32_t t = s;
                for (const llama_token * f = ix.forcedBegin(s); f != ix.forcedEnd(s); f++) t = ix.next(t, *f);
                return {t, int32_t(nForced)};
            }
            return i < ix.allowedCount(s) ? std::pair<int32_t, int32_t>{ix.nextBegin(s)[i], 1} : std::pair<int32_t, int32_t>{-1, 0};
        };
        std::vector<uint8_t> color(n, 0);  // 0 unseen, 1 on the current path, 2 done
        std::vector<int32_t> postorder;
        std::vector<std::pair<int32_t, size_t>> path{{0, 0}};
        color[0] = 1;
        while (!path.empty()) {
            const int32_t s = path.back().first;
            const int32_t c = succ(s, path.back().second++).first;
            if (c < 0) {
                color[size_t(s)] = 2;
                postorder.push_back(s);
                path.pop_back();
            } else if (color[size_t(c)] == 1) {
                out_->stats_.worstCaseTokens = -1;
                out_->stats_.maxChoices = -1;
                return;
            } else if (color[size_t(c)] == 0) {
                color[size_t(c)] = 1;
                path.emplace_back(c, 0);
            }
        }
        std::vector<int32_t> longest(n, 0);
        std::vector<int32_t> choices(n, 0);
        for (int32_t s : postorder) {
            int32_t best = 0;  // every kept state completes: accepting, or a successor that does
            const bool forced = ix.forcedBegin(s) != ix.forcedEnd(s);
            // Where the model has a choice and the grammar may end, ending is one more pick: the end-of-generation token.
            // Where only the end is left, generation stops unasked.
            int32_t most = !forced && ix.accepting(s) && ix.allowedCount(s) > 0 ? 1 : 0;
            for (size_t i = 0;; i++) {
                auto [c, cost] = succ(s, i);
                if (c < 0) break;
                best = std::max(best, cost + longest[size_t(c)]);
                most = std::max(most, (forced ? 0 : 1) + choices[size_t(c)]);
            }
            longest[size_t(s)] = best;
            choices[size_t(s)] = most;
        }
        out_->stats_.worstCaseTokens = longest[0];
        out_->stats_.maxChoices = choices[0];
    }

    GrammarAutomaton automaton_;
    const llama_vocab * vocab_;
    const TokenTrie & trie_;
    GrammarIndexLimits limits_;
    std::vector<uint8_t> accepting_;
    std::vector<int32_t> delta_;
    std::vector<uint8_t> byteUseful_;
    std::vector<uint8_t> boundary_;
    std::vector<uint8_t> useful_;
    std::vector<std::vector<std::pair<llama_token, int32_t>>> rows_;
    std::unique_ptr<GrammarIndex> out_;
};

int32_t GrammarIndex::next(int32_t s, llama_token token) const {
    const llama_token * b = tokensBegin(s);
    const llama_token * e = tokensEnd(s);
    const llama_token * it = std::lower_bound(b, e, token);
    return it != e && *it == token ? nextBegin(s)[it - b] : -1;
}

IndexCursor::IndexCursor(std::shared_ptr<const GrammarIndex> index) : index_(std::move(index)), state_(index_->start()) {}

llama_token IndexCursor::forced() {
    if (pendingAt_ == pendingEnd_) {
        pendingAt_ = index_->forcedBegin(state_);
        pendingEnd_ = index_->forcedEnd(state_);
    }
    return pendingAt_ != pendingEnd_ ? *pendingAt_ : -1;
}

llama_token IndexCursor::best(const float * logits) const {
    llama_token bestTok = -1;
    float bestLogit = 0.0f;
    auto consider = [&](llama_token t) {
        if (bestTok < 0 || logits[t] > bestLogit || (logits[t] == bestLogit && t < bestTok)) {
            bestTok = t;
            bestLogit = logits[t];
        }
    };
    for (const llama_token * t = index_->tokensBegin(state_); t != index_->tokensEnd(state_); t++) consider(*t);
    if (index_->accepting(state_)) {
        for (llama_token t : index_->eog()) consider(t);
    }
    return bestTok;
}

void IndexCursor::candidates(const float * logits, std::vector<llama_token_data> & out) const {
    for (const llama_token * t = index_->tokensBegin(state_); t != index_->tokensEnd(state_); t++) out.push_back({*t, logits[*t], 0.0f});
    if (index_->accepting(state_)) {
        for (llama_token t : index_->eog()) out.push_back({t, logits[t], 0.0f});
    }
}

bool IndexCursor::advance(llama_token token) {
    const int32_t next = index_->next(state_, token);
    if (next < 0) return index_->accepting(state_) && std::binary_search(index_->eog().begin(), index_->eog().end(), token);
    if (pendingAt_ != pendingEnd_ && *pendingAt_ == token) pendingAt_++;
    else pendingAt_ = pendingEnd_ = nullptr;
    state_ = next;
    return true;
}

std::shared_ptr<const GrammarIndex> GrammarIndex::build(const llama_grammar & grammar, const llama_vocab * vocab, const TokenTrie & trie,
                                                        const GrammarIndexLimits & limits, std::string & why) {
    try {
        return IndexBuilder(grammar, vocab, trie, limits).run();
    } catch (const NotIndexable & e) {
        why = e.what();
    } catch (const GrammarNotFinite & e) {
        why = e.what();
    }
    return nullptr;
}

GrammarIndexCache::Result GrammarIndexCache::get(const llama_grammar & grammar, const llama_vocab * vocab, const std::string & key,
                                                 const GrammarIndexLimits & limits) {
    std::lock_guard<std::mutex> lock(mu_);
    double trieMs = 0;
    if (!trie_) {
        trie_.reset(new TokenTrie(vocab));
        trieMs = trie_->buildMs();
    }
    auto found = built_.find(key);
    if (found == built_.end()) {
        Result r;
        r.index = GrammarIndex::build(grammar, vocab, *trie_, limits, r.why);
        if (r.index) r.stats = r.index->stats();
        found = built_.emplace(key, std::move(r)).first;
    }
    Result r = found->second;
    r.stats.trieMs = trieMs;
    return r;
}

}  // namespace percept
