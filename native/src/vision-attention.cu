// The kernels behind VisionAttention (vision-attention.h): pack, then attend.
// Compiled only in CUDA builds (native/CMakeLists.txt); vision-attention.cc stands in elsewhere.
// How the two steps work: native/README.md#vision-attention
#include "vision-attention.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace percept {

namespace {

void checkCuda(cudaError_t e, const char * what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

constexpr int kKeys = 64;  // keys per shared-memory tile
// Warps per block (16 query rows each), and blocks an SM must hold.
// Two blocks of eight warps (128 registers a thread) beat one block (162 registers) and four blocks of four warps.
constexpr int kWarps = 8;
constexpr int kBlocksPerSm = 2;

struct Source {
    const char * data;
    bool f16;
    int64_t nb0, nb1, nb2, nb3;
};

// What pack does to each row besides copying it (AttentionPrologue, for one operand).
struct RowOps {
    bool norm;
    const float * weight;  // may be null
    float eps;
    const int32_t * positions;  // null: no RoPE
    float ropeTheta;
};

// One head's values of one position, a warp each: dst[(image·heads + head)·positions + position][c] for c < D.
// For c < d they are the source's values × mul, RMS-normalized, weighted and rotated as `ops` says. Zero after d.
__global__ void pack(Source src, __half * dst, int d, int D, int positions, int heads, int64_t rows, float mul, RowOps ops) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
    for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
        const int pos = int(row % positions);
        const int64_t bh = row / positions;
        const int head = int(bh % heads);
        const int64_t image = bh / heads;
        const char * base = src.data + pos * src.nb1 + head * src.nb2 + image * src.nb3;
        auto at = [&](int c) {
            const char * p = base + c * src.nb0;
            return src.f16 ? __half2float(*reinterpret_cast<const __half *>(p)) : *reinterpret_cast<const float *>(p);
        };
        float scale = mul;
        if (ops.norm) {
            float ss = 0.0f;
            for (int c = lane; c < d; c += 32) {
                const float x = at(c);
                ss += x * x;
            }
            for (int x = 16; x > 0; x /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, x);
            scale *= rsqrtf(ss / float(d) + ops.eps);
        }
        __half * out = dst + row * D;
        if (ops.positions != nullptr) {
            // pairs (i, i + d/2): by column for i < d/4, by row after; the j-th of each part at ropeTheta^(−4j/d)
            const int half = d / 2, quarter = d / 4;
            const float colPos = float(ops.positions[pos]), rowPos = float(ops.positions[positions + pos]);
            for (int i = lane; i < half; i += 32) {
                float a = at(i) * scale, b = at(i + half) * scale;
                if (ops.weight != nullptr) {
                    a *= ops.weight[i];
                    b *= ops.weight[i + half];
                }
                const bool col = i < quarter;
                const float theta = (col ? colPos : rowPos) * powf(ops.ropeTheta, -2.0f * float(col ? i : i - quarter) / float(half));
                float sn, cs;
                sincosf(theta, &sn, &cs);
                out[i] = __float2half_rn(a * cs - b * sn);
                out[i + half] = __float2half_rn(a * sn + b * cs);
            }
            for (int c = d + lane; c < D; c += 32) out[c] = __float2half_rn(0.0f);
        } else {
            for (int c = lane; c < D; c += 32) {
                float x = 0.0f;
                if (c < d) {
                    x = at(c) * scale;
                    if (ops.weight != nullptr) x *= ops.weight[c];
                }
                out[c] = __float2half_rn(x);
            }
        }
    }
}

__device__ __forceinline__ uint32_t sharedAddress(const void * p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 bytes from global to shared memory, asynchronously; `bytes` 0 writes zeros.
__device__ __forceinline__ void copyAsync16(void * dst, const void * src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(dst)), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void commitAsync() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N> __device__ __forceinline__ void waitAsync() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void loadMatrices(uint32_t (&r)[4], const __half * p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(p)));
}

__device__ __forceinline__ void loadMatricesTransposed(uint32_t (&r)[4], const __half * p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(p)));
}

// c += a·b for one 16×8 tile: a 16×16 (row-major fragment), b 16×8 (column-major fragment).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t packHalves(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// q, k, v: packed rows (pack); out: [d, heads, positions, images] f32.
template <int D, int W>
__global__ void __launch_bounds__(32 * W, kBlocksPerSm)
    attend(const __half * __restrict__ q, const __half * __restrict__ k, const __half * __restrict__ v, float * __restrict__ out,
           int positions, int heads, int kvHeads, int d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // cp.async and m16n8k16 need sm_80; the constructor refuses older devices
#else
    constexpr int S = D + 8;  // shared row stride in halves: ldmatrix's eight rows fall in distinct banks
    constexpr int chunks = D / 8;
    extern __shared__ __align__(16) unsigned char shared[];
    __half * sk = reinterpret_cast<__half *>(shared);  // [2][kKeys][S]
    __half * sv = sk + 2 * kKeys * S;                  // [2][kKeys][S]

    const int bh = blockIdx.y;
    const int image = bh / heads, head = bh % heads;
    const int kvHead = head / (heads / kvHeads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * 16 * W + warp * 16 + g, row1 = row0 + 8;
    const __half * qh = q + int64_t(bh) * positions * D;
    const __half * kh = k + (int64_t(image) * kvHeads + kvHead) * positions * D;
    const __half * vh = v + (int64_t(image) * kvHeads + kvHead) * positions * D;

    auto loadTile = [&](int tile) {
        const int buf = tile & 1;
        const int key0 = tile * kKeys;
        for (int i = threadIdx.x; i < kKeys * chunks; i += 32 * W) {
            const int r = i / chunks, c = (i % chunks) * 8;
            const bool inside = key0 + r < positions;
            const int64_t at = int64_t(inside ? key0 + r : 0) * D + c;
            copyAsync16(sk + (buf * kKeys + r) * S + c, kh + at, inside ? 16 : 0);
            copyAsync16(sv + (buf * kKeys + r) * S + c, vh + at, inside ? 16 : 0);
        }
        commitAsync();
    };

    const int tiles = (positions + kKeys - 1) / kKeys;
    loadTile(0);

    uint32_t qa[D / 16][4];
    for (int kc = 0; kc < D / 16; kc++) {
        const int c = kc * 16 + 2 * t;
        auto at = [&](int row, int col) { return row < positions ? *reinterpret_cast<const uint32_t *>(qh + int64_t(row) * D + col) : 0u; };
        qa[kc][0] = at(row0, c);
        qa[kc][1] = at(row1, c);
        qa[kc][2] = at(row0, c + 8);
        qa[kc][3] = at(row1, c + 8);
    }

    float o[D / 8][4];
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.0f, sum1 = 0.0f;  // rows g and g + 8; sums per thread

    // ldmatrix lanes: lane / 8 picks the matrix, lane % 8 its row.
    const int mat = lane / 8, mrow = lane % 8;

    for (int tile = 0; tile < tiles; tile++) {
        if (tile + 1 < tiles) {
            loadTile(tile + 1);
            waitAsync<1>();
        } else {
            waitAsync<0>();
        }
        __syncthreads();
        const __half * kt = sk + (tile & 1) * kKeys * S;
        const __half * vt = sv + (tile & 1) * kKeys * S;

        // S = q·kᵀ: 8 tiles of 8 keys; matrices (keys +0, cols +0), (+0, +8), (+8, +0), (+8, +8)
        float s[8][4];
        for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        for (int kc = 0; kc < D / 16; kc++) {
            for (int np = 0; np < 4; np++) {
                uint32_t b[4];
                loadMatrices(b, kt + (np * 16 + mrow + (mat / 2) * 8) * S + kc * 16 + (mat % 2) * 8);
                mma(s[2 * np], qa[kc], b[0], b[1]);
                mma(s[2 * np + 1], qa[kc], b[2], b[3]);
            }
        }
        if ((tile + 1) * kKeys > positions) {
            for (int i = 0; i < 8; i++) {
                const int key = tile * kKeys + i * 8 + 2 * t;
                if (key >= positions) s[i][0] = s[i][2] = -INFINITY;
                if (key + 1 >= positions) s[i][1] = s[i][3] = -INFINITY;
            }
        }

        float m0 = max0, m1 = max1;
        for (int i = 0; i < 8; i++) {
            m0 = fmaxf(m0, fmaxf(s[i][0], s[i][1]));
            m1 = fmaxf(m1, fmaxf(s[i][2], s[i][3]));
        }
        for (int x = 1; x < 4; x *= 2) {
            m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x));
            m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x));
        }
        // Every tile has a key inside, so m0 and m1 are finite from the first tile on.
        const float a0 = exp2f(max0 - m0), a1 = exp2f(max1 - m1);
        max0 = m0;
        max1 = m1;
        sum0 *= a0;
        sum1 *= a1;
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a1;
            o[i][3] *= a1;
        }
        for (int i = 0; i < 8; i++) {
            s[i][0] = exp2f(s[i][0] - m0);
            s[i][1] = exp2f(s[i][1] - m0);
            s[i][2] = exp2f(s[i][2] - m1);
            s[i][3] = exp2f(s[i][3] - m1);
            sum0 += s[i][0] + s[i][1];
            sum1 += s[i][2] + s[i][3];
        }

        // O += P·v: P's C fragments are the A fragments of 16-key chunks; v through transposed
        // matrices (keys +0, cols +0), (+8, +0), (+0, +8), (+8, +8)
        for (int kc = 0; kc < kKeys / 16; kc++) {
            const uint32_t pa[4] = {packHalves(s[2 * kc][0], s[2 * kc][1]), packHalves(s[2 * kc][2], s[2 * kc][3]),
                                    packHalves(s[2 * kc + 1][0], s[2 * kc + 1][1]), packHalves(s[2 * kc + 1][2], s[2 * kc + 1][3])};
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                loadMatricesTransposed(b, vt + (kc * 16 + mrow + (mat % 2) * 8) * S + dp * 16 + (mat / 2) * 8);
                mma(o[2 * dp], pa, b[0], b[1]);
                mma(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();  // the buffer is loaded again two tiles on
    }

    for (int x = 1; x < 4; x *= 2) {
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, x);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, x);
    }
    const float inv0 = 1.0f / sum0, inv1 = 1.0f / sum1;
    const int64_t rowStride = int64_t(heads) * d;
    float * out0 = out + (int64_t(image) * positions + row0) * rowStride + int64_t(head) * d;
    float * out1 = out0 + 8 * rowStride;
    for (int i = 0; i < D / 8; i++) {
        const int c = i * 8 + 2 * t;
        for (int j = 0; j < 2; j++) {
            if (c + j >= d) break;
            if (row0 < positions) out0[c + j] = o[i][j] * inv0;
            if (row1 < positions) out1[c + j] = o[i][2 + j] * inv1;
        }
    }
#endif
}

template <int D>
void launchAttend(const __half * q, const __half * k, const __half * v, float * out, int positions, int heads, int kvHeads, int images,
                  int d, cudaStream_t stream) {
    constexpr size_t sharedBytes = size_t(4) * kKeys * (D + 8) * sizeof(__half);
    // Above 48 KiB (D = 96 and up) a kernel must ask for its shared memory.
    checkCuda(cudaFuncSetAttribute(attend<D, kWarps>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sharedBytes)),
              "attention kernel attribute");
    const dim3 grid((positions + 16 * kWarps - 1) / (16 * kWarps), heads * images);
    attend<D, kWarps><<<grid, 32 * kWarps, sharedBytes, stream>>>(q, k, v, out, positions, heads, kvHeads, d);
}

Source sourceOf(const DeviceTensorView & t) {
    return Source{static_cast<const char *>(t.data), t.f16, int64_t(t.nb[0]), int64_t(t.nb[1]), int64_t(t.nb[2]), int64_t(t.nb[3])};
}

}  // namespace

struct VisionAttention::Impl {
    int32_t device = 0;
    cudaStream_t stream = nullptr;
    __half * packed = nullptr;  // q, k, v rows, one allocation
    size_t packedBytes = 0;
    ~Impl() {
        if (packed != nullptr) cudaFree(packed);
        if (stream != nullptr) cudaStreamDestroy(stream);
    }
};

bool VisionAttention::built() { return true; }

VisionAttention::VisionAttention(int32_t device) : impl_(std::make_unique<Impl>()) {
    impl_->device = device;
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
    int major = 0;
    checkCuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
    if (major < 8) throw std::runtime_error("percept's attention kernel needs compute capability 8.0 or newer (Ampere, Orin, Hopper)");
    checkCuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

VisionAttention::~VisionAttention() = default;

void VisionAttention::run(const DeviceTensorView & q, const DeviceTensorView & k, const DeviceTensorView & v, float scale, float * out,
                          const AttentionPrologue * prologue) {
    enqueue(q, k, v, scale, out, prologue, nullptr, nullptr);
    checkCuda(cudaStreamSynchronize(impl_->stream), "attention");
}

void VisionAttention::enqueue(const DeviceTensorView & q, const DeviceTensorView & k, const DeviceTensorView & v, float scale, float * out,
                              const AttentionPrologue * prologue, void * after, void * done) {
    const int64_t d = q.ne[0], positions = q.ne[1], heads = q.ne[2], images = q.ne[3];
    const int64_t kvHeads = k.ne[2];
    if (d < 1 || d > maxHead) throw std::invalid_argument("attention: head size " + std::to_string(d) + " is outside 1–128");
    if (k.ne[0] != d || v.ne[0] != d) throw std::invalid_argument("attention: q, k and v head sizes differ");
    if (k.ne[1] != positions || v.ne[1] != positions) throw std::invalid_argument("attention: as many keys as queries are needed");
    if (v.ne[2] != kvHeads || kvHeads < 1 || heads % kvHeads != 0)
        throw std::invalid_argument("attention: heads are not a multiple of kv heads");
    if (k.ne[3] != images || v.ne[3] != images) throw std::invalid_argument("attention: q, k and v differ in images");
    if (positions < 1 || positions > (int64_t(1) << 30)) throw std::invalid_argument("attention: positions out of range");
    if (prologue != nullptr && prologue->positions != nullptr && d % 4 != 0)
        throw std::invalid_argument("attention: a 2-D RoPE needs a head size divisible by 4, not " + std::to_string(d));
    const int D = int((std::max<int64_t>(d, 64) + 15) / 16 * 16);

    Impl & m = *impl_;
    checkCuda(cudaSetDevice(m.device), "cudaSetDevice");
    if (after != nullptr) checkCuda(cudaStreamWaitEvent(m.stream, static_cast<cudaEvent_t>(after), 0), "attention: wait for its inputs");
    const size_t qRows = size_t(images * heads * positions), kvRows = size_t(images * kvHeads * positions);
    const size_t need = (qRows + 2 * kvRows) * D * sizeof(__half);
    if (need > m.packedBytes) {
        if (m.packed != nullptr) cudaFree(m.packed);
        m.packed = nullptr;
        m.packedBytes = 0;
        checkCuda(cudaMalloc(&m.packed, need), "attention buffers");
        m.packedBytes = need;
    }
    __half * pq = m.packed;
    __half * pk = pq + qRows * D;
    __half * pv = pk + kvRows * D;
    const float log2e = 1.4426950408889634f;
    auto packOne = [&](int which, const DeviceTensorView & t, __half * dst, int64_t rows, int64_t h, float mul) {
        RowOps ops{false, nullptr, 0.0f, nullptr, 0.0f};
        if (prologue != nullptr) {
            ops.norm = prologue->norm[which];
            ops.weight = prologue->weight[which];
            ops.eps = prologue->eps;
            if (which < 2) {
                ops.positions = prologue->positions;
                ops.ropeTheta = prologue->ropeTheta;
            }
        }
        const int blocks = int(std::min<int64_t>((rows + 7) / 8, 65535));
        pack<<<blocks, 256, 0, m.stream>>>(sourceOf(t), dst, int(d), D, int(positions), int(h), rows, mul, ops);
    };
    packOne(0, q, pq, int64_t(qRows), heads, scale * log2e);
    packOne(1, k, pk, int64_t(kvRows), kvHeads, 1.0f);
    packOne(2, v, pv, int64_t(kvRows), kvHeads, 1.0f);
    checkCuda(cudaGetLastError(), "attention pack kernel");
    // one instantiation per padded head size: 64, 80, 96, 112, 128
    constexpr decltype(&launchAttend<64>) launches[] = {launchAttend<64>, launchAttend<80>, launchAttend<96>, launchAttend<112>,
                                                        launchAttend<128>};
    launches[(D - 64) / 16](pq, pk, pv, out, int(positions), int(heads), int(kvHeads), int(images), int(d), m.stream);
    checkCuda(cudaGetLastError(), "attention kernel");
    if (done != nullptr) checkCuda(cudaEventRecord(static_cast<cudaEvent_t>(done), m.stream), "attention: record its end");
}

}  // namespace percept
