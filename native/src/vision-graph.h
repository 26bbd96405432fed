// percept's own compute graph for a clip vision tower (Gemma 3 SigLIP, Gemma 4), on the weights clip loaded.
// It has the ops of clip's graph builders, but is built once per image shape and laid out in one compute buffer.
// So an encode only uploads pixels, computes and reads the embeddings back. Why and how: native/README.md#vision-graph
#pragma once

#include "llama-internal.h"
#include "vision-attention.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace percept {

// How an image's floats are ordered: planar [3][H][W] ('chw'), or row-major patches of
// patch × patch × 3 interleaved values ('patches', Gemma 4's processor layout).
enum class PixelLayout { Chw, Patches };

// Flash attention in the ViT:
//   Auto     percept's kernel on CUDA (VisionAttention), where the build has it and the head size fits.
//            Else ggml's where the backend runs it, padded on CUDA where the head size has no tensor-core kernel.
//   On       ggml's at the tower's head size; refused where the backend cannot.
//   Padded   ggml's at the head size ggml-cuda's tensor-core kernels have for it (tensorCoreFlashHead), on any backend.
//            So the CPU can check the padded graph against the plain one, and a GPU can compare both kernels.
//   Percept  percept's kernel; refused off CUDA.
enum class FlashAttention { Auto, On, Off, Padded, Percept };

struct VisionGraphOptions {
    int32_t threads = 1;  // CPU backend threads
    FlashAttention flashAttention = FlashAttention::Auto;
};

// The smallest head size ≥ dHead that ggml-cuda's tensor-core (MMA) flash-attention kernels are built for.
// Those are 64, 80, 96, 112, 128 and 256 (fattn.cu); above 256, dHead itself.
// Other sizes, such as SigLIP so400m's 72 and 40, go to its slower generic tile kernel (native/README.md#measurements).
int32_t tensorCoreFlashHead(int32_t dHead);
// Whether this ggml backend is ggml-cuda's.
bool isCudaBackend(ggml_backend_t backend);

// Where one encode's time went (ms).
// A shape's first encode on a GPU runs directly, as does its first after another shape used the compute buffer.
// ggml-cuda captures a graph as a CUDA graph on its second identical run, and replays it from then on.
// Running a new shape twice more before its first real encode, as percept did first, tripled that call for a few percent.
// And with several cameras, the batch size (hence the shape) changes from call to call.
struct VisionGraphTimes {
    double build = 0, alloc = 0, upload = 0, compute = 0, read = 0;
};

// One op type's share of an encode computed node by node (synchronized after each node).
struct VisionOpTime {
    double ms = 0;
    int32_t count = 0;
    int32_t onHost = 0;  // nodes whose output lives in host memory
};

// One layer's attention weights with every head zero-padded from d_head to the flash-attention head size.
// q/k/v weights and biases gain zero output rows per head; the output projection gains zero input columns.
// Attention then runs padded with no pad or slice in the graph, with the same result.
struct PaddedHeads {
    ggml_tensor *qW = nullptr, *qB = nullptr, *kW = nullptr, *kB = nullptr, *vW = nullptr, *vB = nullptr, *oW = nullptr;
};

// One gemma4v layer's q and k weights and per-head norms, with each head's dimensions reordered.
// Then its 2-D RoPE is one GGML_ROPE_TYPE_VISION rotation.
// gemma4v rotates a head's first half by column and its second by row, NeoX-style within each half (pairs j, j + d/4).
// The vision rope pairs i, i + d/2, by column for i < d/4 and by row after.
// Swapping the second and third quarters of every head of q and k turns one into the other.
// q·k is unchanged by a permutation applied to both.
struct RopeOrderedHeads {
    ggml_tensor *qW = nullptr, *qB = nullptr, *kW = nullptr, *kB = nullptr, *qNorm = nullptr, *kNorm = nullptr;
};

// gemma4v's per-head steps before attention, which percept's attention kernel does itself (AttentionPrologue).
// They are q's and k's per-head RMS norms with their weights (RopeOrderedHeads' copies), and v's RMS norm.
// Then the 2-D RoPE at the patch positions `positions`, the graph's [columns; rows; 0; 0] input.
// kNorm null: k is not normalized.
struct HeadPrologue {
    ggml_tensor *qNorm = nullptr, *kNorm = nullptr, *positions = nullptr;
    float eps = 0, ropeTheta = 0;
};

class VisionGraph {
public:
    // Throws std::runtime_error naming what percept's graph does not mirror, or the op the
    // backend cannot run.
    VisionGraph(clip_ctx * clip, const VisionGraphOptions & options);
    ~VisionGraph();
    VisionGraph(const VisionGraph &) = delete;
    VisionGraph & operator=(const VisionGraph &) = delete;

    bool flashAttention() const { return flashHead_ > 0; }
    // Whether percept's attention kernel (VisionAttention) runs the flash-attention nodes, not ggml.
    bool perceptAttention() const { return attention_ != nullptr; }
    // The head size flash attention runs at (the tower's, or padded above it); 0 without it.
    int32_t flashAttentionHead() const { return flashHead_; }
    // Bytes of weights copied at load in another layout, on the weights' device: gemma3's transposed
    // input projection, PaddedHeads, RopeOrderedHeads.
    size_t copiedWeightBytes() const;
    int32_t nOutEmbd() const { return tower_.nOutEmbd; }
    // Nodes of one image's graph (the same for every size of one layout).
    int32_t graphNodes() const { return graphNodes_; }
    std::string bufferName() const;
    // The host buffer type of the graph's device (pinned memory on CUDA), or null where there is none, as on the CPU.
    // Pixels in such memory are uploaded by DMA, not staged through pageable memory.
    ggml_backend_buffer_type_t hostBufferType() const;
    size_t computeBytes() const;
    int32_t outputTokens(int32_t width, int32_t height) const;

    // Builds and lays out the graph of this shape without computing (at load, so the compute
    // buffer is sized for it before the first frame).
    void reserve(PixelLayout layout, int32_t width, int32_t height, int32_t images);
    // Encodes images of one size: pixels[i] holds width × height × 3 floats in `layout`; `out`
    // receives images × outputTokens × nOutEmbd floats. `ops` (may be null) asks for per-op times.
    void encode(const std::vector<const float *> & pixels, PixelLayout layout, int32_t width, int32_t height, float * out,
                VisionGraphTimes & times, std::map<std::string, VisionOpTime> * ops);
    // Encodes images whose pixels `fill` writes into the graph's input tensor itself, timed as the upload.
    // On a GPU that is device memory, so the pixels never cross to the host.
    void encodeFilled(const std::function<void(ggml_tensor * pixels)> & fill, PixelLayout layout, int32_t width, int32_t height,
                      int32_t images, float * out, VisionGraphTimes & times, std::map<std::string, VisionOpTime> * ops);
    // ggml-cuda's index of the graph's device, or −1 when it is not a CUDA device.
    int32_t cudaDevice() const;

private:
    struct Shape {
        PixelLayout layout;
        int32_t width, height, images;
        bool operator<(const Shape & o) const;
    };
    struct Graph;

    std::unique_ptr<Graph> build(const Shape & shape, int32_t flashHead) const;
    Graph & laidOut(const Shape & shape, VisionGraphTimes & times);
    void computeAndRead(Graph & g, float * out, VisionGraphTimes & times, std::map<std::string, VisionOpTime> * ops);
    void checkSupported(const Graph & g) const;
    void cutAtAttention(Graph & g) const;
    void runAttention(const Graph & g, ggml_tensor * node, bool wait);
    void transposeProjection();
    bool padHeads();
    bool orderHeadsForRope();

    ClipVisionTower tower_;
    ggml_backend_ptr backend_;
    int32_t flashHead_ = 0;
    int32_t graphNodes_ = 0;
    ggml_gallocr_ptr galloc_;
    std::unique_ptr<VisionAttention> attention_;  // percept's kernel for the flash-attention nodes
    // Where ggml's stream reaches a cut, and where the kernel is done. The two streams wait for each other on the device.
    // Null where ggml-cuda makes no events; host waits stand in.
    ggml_backend_event_ptr pieceDone_, attentionDone_;
    // gemma3's input projection transposed, made once from clip's.
    ggml_context_ptr derivedCtx_;
    ggml_backend_buffer_ptr derivedBuf_;
    ggml_tensor * projT_ = nullptr;
    ggml_context_ptr paddedCtx_;
    ggml_backend_buffer_ptr paddedBuf_;
    std::vector<PaddedHeads> padded_;
    ggml_context_ptr ropeCtx_;
    ggml_backend_buffer_ptr ropeBuf_;
    std::vector<RopeOrderedHeads> ropeOrdered_;
    std::map<Shape, std::unique_ptr<Graph>> graphs_;
    Graph * laidOut_ = nullptr;  // the graph the compute buffer holds now
};

}  // namespace percept
