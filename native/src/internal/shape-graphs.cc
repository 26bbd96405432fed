// CUDA graphs per step shape (llama-internal.h): ShapeGraphs, in front of each CUDA backend's graph_compute.
#include "../llama-internal.h"

#include "ggml-backend-impl.h"  // ggml_backend's entries
#include "ggml-impl.h"          // ggml_cgraph
#include "llama-context.h"      // llama_context::get_sched

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace percept {

namespace {

// Keys per backend: a decoder's steps come in a few shapes (one token, a token with a forced run of
// each length, each 256-cell KV size); the least recently used key goes to a new shape.
constexpr int kShapeKeys = 32;

using GraphCompute = ggml_status (*)(ggml_backend_t, ggml_cgraph *);

// The ops and sizes of every node, and ggml-cuda's own key (the first node's address, so the splits
// of one graph, on a partly offloaded model, keep keys of their own): two graphs of one shape get the
// same key. A collision only costs speed (ggml-cuda's own check then sees a changed graph and
// captures again).
uint64_t shapeOf(const ggml_cgraph * g) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    auto mix = [&h](uint64_t v) {
        h ^= v;
        h *= 1099511628211ull;
    };
    mix(uint64_t(uintptr_t(g->nodes[0])));
    mix(uint64_t(g->n_nodes));
    for (int i = 0; i < g->n_nodes; i++) {
        const ggml_tensor * t = g->nodes[i];
        mix(uint64_t(t->op));
        for (int d = 0; d < GGML_MAX_DIMS; d++) mix(uint64_t(t->ne[d]));
    }
    return h;
}

}  // namespace

struct ShapeGraphs::Keyed {
    ggml_backend_t backend = nullptr;
    GraphCompute compute = nullptr;  // the backend's own entry
    // The key nodes: empty (ggml_is_empty), op NONE, so ggml-cuda skips them when computing.
    std::array<ggml_tensor, kShapeKeys> keys{};
    std::array<uint64_t, kShapeKeys> shapes{};
    std::array<uint64_t, kShapeKeys> lastUse{};  // 0: free
    uint64_t tick = 0;
    std::atomic<uint64_t> keyed{0};
    std::vector<ggml_tensor *> nodes;  // the graph handed on: a key node, then the graph's nodes

    ggml_status run(ggml_cgraph * g) {
        if (g->n_nodes == 0) return compute(backend, g);
        const uint64_t shape = shapeOf(g);
        int slot = -1, oldest = 0;
        for (int i = 0; i < kShapeKeys && slot < 0; i++) {
            if (lastUse[i] != 0 && shapes[i] == shape) slot = i;
            if (lastUse[i] < lastUse[oldest]) oldest = i;
        }
        if (slot < 0) {
            slot = oldest;
            shapes[slot] = shape;
            keyed.fetch_add(1, std::memory_order_relaxed);
        }
        lastUse[slot] = ++tick;
        nodes.assign(1, &keys[slot]);
        nodes.insert(nodes.end(), g->nodes, g->nodes + g->n_nodes);
        ggml_cgraph withKey = *g;  // the same graph (its uid, use counts, hash set), one node more
        withKey.nodes = nodes.data();
        withKey.n_nodes = g->n_nodes + 1;
        return compute(backend, &withKey);
    }
};

namespace {

// graph_compute receives only the backend: the registry finds our state by it.
std::mutex gShapeMutex;
std::map<ggml_backend_t, ShapeGraphs::Keyed *> gShapeKeyed;

ggml_status shapeKeyedCompute(ggml_backend_t backend, ggml_cgraph * g) {
    ShapeGraphs::Keyed * k = nullptr;
    {
        std::lock_guard<std::mutex> lock(gShapeMutex);
        auto it = gShapeKeyed.find(backend);
        if (it != gShapeKeyed.end()) k = it->second;
    }
    // Called from ggml's C code: no exception may leave it.
    if (k == nullptr) GGML_ABORT("percept: shape graphs: graph_compute on a backend they are not installed on");
    return k->run(g);
}

bool isCuda(ggml_backend_t backend) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev != nullptr ? ggml_backend_dev_backend_reg(dev) : nullptr;
    return reg != nullptr && std::strcmp(ggml_backend_reg_name(reg), "CUDA") == 0;
}

}  // namespace

std::unique_ptr<ShapeGraphs> ShapeGraphs::install(llama_context * ctx) {
    // ggml-cuda reads it once per process and then captures nothing: keys would change nothing.
    if (std::getenv("GGML_CUDA_DISABLE_GRAPHS") != nullptr) return nullptr;
    ggml_backend_sched_t sched = ctx->get_sched();
    std::unique_ptr<ShapeGraphs> out(new ShapeGraphs());
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
        if (!isCuda(backend) || backend->iface.graph_compute == nullptr) continue;
        auto k = std::make_unique<Keyed>();
        k->backend = backend;
        k->compute = backend->iface.graph_compute;
        for (ggml_tensor & t : k->keys) {
            t.type = GGML_TYPE_F32;
            t.op = GGML_OP_NONE;
            std::snprintf(t.name, sizeof(t.name), "percept:shape-key");
        }
        // Owned by `out` from here (its destructor undoes whatever of the rest took place); the
        // backend's entry is replaced last.
        out->backends_.push_back(k.get());
        Keyed * raw = k.release();
        {
            std::lock_guard<std::mutex> lock(gShapeMutex);
            gShapeKeyed[backend] = raw;
        }
        backend->iface.graph_compute = shapeKeyedCompute;
    }
    if (out->backends_.empty()) return nullptr;
    return out;
}

ShapeGraphs::~ShapeGraphs() {
    for (Keyed * k : backends_) {
        k->backend->iface.graph_compute = k->compute;
        {
            std::lock_guard<std::mutex> lock(gShapeMutex);
            gShapeKeyed.erase(k->backend);
        }
        delete k;
    }
}

uint64_t ShapeGraphs::shapesKeyed() const {
    uint64_t n = 0;
    for (const Keyed * k : backends_) n += k->keyed.load(std::memory_order_relaxed);
    return n;
}

}  // namespace percept
