// nvJPEG decode and the resampling kernel behind DeviceJpeg (device-jpeg.h). Compiled only in CUDA
// builds whose toolkit has nvJPEG (native/CMakeLists.txt); device-jpeg.cc stands in elsewhere.
#include "device-jpeg.h"

#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <stdexcept>
#include <string>

namespace percept {

namespace {

void checkCuda(cudaError_t e, const char * what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

const char * nvjpegStatusName(nvjpegStatus_t s) {
    switch (s) {
    case NVJPEG_STATUS_NOT_INITIALIZED:
        return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER:
        return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG:
        return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
        return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
        return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED:
        return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH:
        return "arch mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR:
        return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
        return "implementation not supported";
    default:
        return "error";
    }
}

void checkJpeg(nvjpegStatus_t s, const char * what) {
    if (s != NVJPEG_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what) + ": nvJPEG " + nvjpegStatusName(s) + " (" + std::to_string(int(s)) + ")");
}

// PIL's filters (Imaging/Resample.c): bilinear's triangle, bicubic with a = −0.5.
__device__ float filterAt(float x, bool cubic) {
    x = fabsf(x);
    if (!cubic) return x < 1.0f ? 1.0f - x : 0.0f;
    const float a = -0.5f;
    if (x < 1.0f) return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f;
    if (x < 2.0f) return (((x - 5.0f) * x + 8.0f) * x - 4.0f) * a;
    return 0.0f;
}

// The input samples under output sample i, as PIL's precompute_coeffs places them: centre
// (i + 0.5)·scale, the filter widened by the scale when shrinking (antialiasing).
struct Taps {
    int lo, hi;
    float centre, invWidth;
};

__device__ Taps tapsOf(int i, float scale, int inSize, float support) {
    const float widen = fmaxf(scale, 1.0f);
    const float reach = support * widen;
    const float centre = (float(i) + 0.5f) * scale;
    Taps t;
    t.lo = max(int(centre - reach + 0.5f), 0);
    t.hi = min(int(centre + reach + 0.5f), inSize);
    t.centre = centre;
    t.invWidth = 1.0f / widen;
    return t;
}

// How the decoded planes become RGB: libjpeg-turbo's "fancy" chroma upsampling and its fixed-point YCbCr → RGB.
// The upsampling (jdsample.c h2v1_fancy_upsample, h2v2_fancy_upsample) uses triangle filters in integer arithmetic.
// Edge samples are replicated, and the colour conversion is jdcolor.c's.
// So the pixels are those PIL (HF's processors) and libvips decode.
// nvJPEG's own RGB output upsamples chroma otherwise: its engines replicate samples.
enum class Chroma { Gray, Full, H2V1, H2V2 };

struct PlanesArgs {
    const uint8_t *y, *cb, *cr;
    int yPitch, cPitch;
    int width, height;    // the image
    int cWidth, cHeight;  // the chroma planes
    Chroma chroma;
    uint8_t * rgb;
};

// The upsampled chroma sample at (x, y) of one plane, exactly as libjpeg-turbo computes it.
__device__ int chromaAt(const uint8_t * c, const PlanesArgs & a, int x, int y) {
    switch (a.chroma) {
    case Chroma::Full:
        return c[y * a.cPitch + x];
    case Chroma::H2V1: {
        const int cx = x >> 1;
        const uint8_t * row = c + y * a.cPitch;
        if (a.cWidth <= 2) return row[min(cx, a.cWidth - 1)];  // libjpeg replicates below 3 columns
        if (x & 1) return cx == a.cWidth - 1 ? row[cx] : (row[cx] * 3 + row[cx + 1] + 2) >> 2;
        return cx == 0 ? row[0] : (row[cx] * 3 + row[cx - 1] + 1) >> 2;
    }
    case Chroma::H2V2: {
        const int cx = x >> 1, cy = y >> 1;
        // The nearer chroma row and the next nearer (above for even rows, below for odd), edge rows
        // repeated as libjpeg's context rows are.
        const int ny = (y & 1) ? min(cy + 1, a.cHeight - 1) : max(cy - 1, 0);
        const uint8_t * r0 = c + cy * a.cPitch;
        const uint8_t * r1 = c + ny * a.cPitch;
        if (a.cWidth <= 2) return r0[min(cx, a.cWidth - 1)];
        const int here = r0[cx] * 3 + r1[cx];
        if (x & 1) return cx == a.cWidth - 1 ? (here * 4 + 7) >> 4 : (here * 3 + r0[cx + 1] * 3 + r1[cx + 1] + 7) >> 4;
        return cx == 0 ? (here * 4 + 8) >> 4 : (here * 3 + r0[cx - 1] * 3 + r1[cx - 1] + 8) >> 4;
    }
    default:
        return 128;
    }
}

__device__ uint8_t clampByte(int v) { return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v); }

__global__ void planesToRgbKernel(PlanesArgs a) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= a.width || y >= a.height) return;
    const int luma = a.y[y * a.yPitch + x];
    uint8_t * out = a.rgb + (size_t(y) * a.width + x) * 3;
    if (a.chroma == Chroma::Gray) {
        out[0] = out[1] = out[2] = uint8_t(luma);
        return;
    }
    // jdcolor.c's tables: FIX(v) = v·2^16 rounded; red and blue rounded, green floored.
    const int cb = chromaAt(a.cb, a, x, y) - 128, cr = chromaAt(a.cr, a, x, y) - 128;
    const int half = 1 << 15;
    out[0] = clampByte(luma + ((91881 * cr + half) >> 16));
    out[1] = clampByte(luma + ((-22554 * cb + half - 46802 * cr) >> 16));
    out[2] = clampByte(luma + ((116130 * cb + half) >> 16));
}

struct KernelArgs {
    const uint8_t * src;
    size_t pitch;
    int srcW, srcH;  // stored image
    int outW, outH;  // display-oriented target
    int resW, resH;  // target in stored orientation
    int orientation;
    bool cubic, patches;
    int patch;
    float a, b;  // value = v·a + b
    float * out;
};

// One thread per output pixel. It finds where it sits in the stored image: the EXIF orientation, as the host layout pass's orient().
// Then it takes the two-dimensional filter sum there, with separable weights rounded to 8 bits once, as the host path's libvips output is.
// Then it writes the normalized values in the encoder's layout.
__global__ void resampleKernel(KernelArgs k) {
    const int X = blockIdx.x * blockDim.x + threadIdx.x;
    const int Y = blockIdx.y * blockDim.y + threadIdx.y;
    if (X >= k.outW || Y >= k.outH) return;
    int x = X, y = Y;
    switch (k.orientation) {
    case 2:
        x = k.resW - 1 - X;
        break;
    case 3:
        x = k.resW - 1 - X;
        y = k.resH - 1 - Y;
        break;
    case 4:
        y = k.resH - 1 - Y;
        break;
    case 5:
        x = Y;
        y = X;
        break;
    case 6:
        x = Y;
        y = k.resH - 1 - X;
        break;
    case 7:
        x = k.resW - 1 - Y;
        y = k.resH - 1 - X;
        break;
    case 8:
        x = k.resW - 1 - Y;
        y = X;
        break;
    default:
        break;
    }
    const float support = k.cubic ? 2.0f : 1.0f;
    const Taps tx = tapsOf(x, float(k.srcW) / float(k.resW), k.srcW, support);
    const Taps ty = tapsOf(y, float(k.srcH) / float(k.resH), k.srcH, support);
    float sumX = 0.0f;
    for (int i = tx.lo; i < tx.hi; i++) sumX += filterAt((float(i) - tx.centre + 0.5f) * tx.invWidth, k.cubic);
    float sumY = 0.0f, r = 0.0f, g = 0.0f, bl = 0.0f;
    for (int j = ty.lo; j < ty.hi; j++) {
        const float wy = filterAt((float(j) - ty.centre + 0.5f) * ty.invWidth, k.cubic);
        if (wy == 0.0f) continue;
        sumY += wy;
        const uint8_t * row = k.src + size_t(j) * k.pitch;
        float rr = 0.0f, gg = 0.0f, bb = 0.0f;
        for (int i = tx.lo; i < tx.hi; i++) {
            const float wx = filterAt((float(i) - tx.centre + 0.5f) * tx.invWidth, k.cubic);
            const uint8_t * p = row + 3 * i;
            rr += wx * float(p[0]);
            gg += wx * float(p[1]);
            bb += wx * float(p[2]);
        }
        r += wy * rr;
        g += wy * gg;
        bl += wy * bb;
    }
    const float norm = 1.0f / (sumX * sumY);
    const float v[3] = {fminf(fmaxf(rintf(r * norm), 0.0f), 255.0f), fminf(fmaxf(rintf(g * norm), 0.0f), 255.0f),
                        fminf(fmaxf(rintf(bl * norm), 0.0f), 255.0f)};
    if (k.patches) {
        const int P = k.patch, cols = k.outW / P;
        float * d = k.out + ((size_t((Y / P) * cols + X / P) * P + Y % P) * P + X % P) * 3;
        for (int c = 0; c < 3; c++) d[c] = v[c] * k.a + k.b;
    } else {
        const size_t n = size_t(k.outW) * k.outH, i = size_t(Y) * k.outW + X;
        for (int c = 0; c < 3; c++) k.out[c * n + i] = v[c] * k.a + k.b;
    }
}

}  // namespace

struct DeviceJpeg::Impl {
    int device = 0;
    cudaStream_t stream = nullptr;
    nvjpegHandle_t handle = nullptr;
    nvjpegJpegState_t state = nullptr;
    uint8_t * rgb = nullptr;  // the last decoded image, interleaved RGB
    size_t rgbBytes = 0;
    uint8_t * planes = nullptr;  // nvJPEG's Y, Cb, Cr output before the conversion
    size_t planeBytes = 0;
    int width = 0, height = 0;

    ~Impl() {
        if (state != nullptr) nvjpegJpegStateDestroy(state);
        if (handle != nullptr) nvjpegDestroy(handle);
        if (rgb != nullptr) cudaFree(rgb);
        if (planes != nullptr) cudaFree(planes);
        if (stream != nullptr) cudaStreamDestroy(stream);
    }

    // Device memory of at least `bytes` at `buf` (grown, never shrunk).
    static void reserve(uint8_t *& buf, size_t & have, size_t bytes, const char * what) {
        if (bytes <= have) return;
        if (buf != nullptr) checkCuda(cudaFree(buf), "cudaFree");
        buf = nullptr;
        have = 0;
        checkCuda(cudaMalloc(reinterpret_cast<void **>(&buf), bytes), what);
        have = bytes;
    }
};

bool DeviceJpeg::built() { return true; }

DeviceJpeg::DeviceJpeg(int32_t device) : impl_(std::make_unique<Impl>()) {
    impl_->device = device;
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
    checkCuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // The default backend: the JPEG engines where the chip has them (A100, H100, H200), else the GPU
    // with Huffman decoding on this thread.
    checkJpeg(nvjpegCreateSimple(&impl_->handle), "nvjpegCreateSimple");
    checkJpeg(nvjpegJpegStateCreate(impl_->handle, &impl_->state), "nvjpegJpegStateCreate");
}

DeviceJpeg::~DeviceJpeg() = default;

void DeviceJpeg::decode(const uint8_t * data, size_t size, int32_t & width, int32_t & height) {
    Impl & m = *impl_;
    checkCuda(cudaSetDevice(m.device), "cudaSetDevice");
    int components = 0;
    nvjpegChromaSubsampling_t subsampling;
    int widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
    checkJpeg(nvjpegGetImageInfo(m.handle, data, size, &components, &subsampling, widths, heights), "JPEG header");
    if (components != 1 && components != 3)
        throw std::runtime_error("JPEG has " + std::to_string(components) + " components; decoding on the GPU takes 1 (grey) or 3");
    const int w = widths[0], h = heights[0];
    Impl::reserve(m.rgb, m.rgbBytes, size_t(w) * size_t(h) * 3, "cudaMalloc (decoded JPEG)");
    Chroma chroma = Chroma::Gray;
    if (components == 3) {
        switch (subsampling) {
        case NVJPEG_CSS_444:
            chroma = Chroma::Full;
            break;
        case NVJPEG_CSS_422:
            chroma = Chroma::H2V1;
            break;
        case NVJPEG_CSS_420:
            chroma = Chroma::H2V2;
            break;
        default: {
            // Rarer layouts (4:4:0, 4:1:1, 4:1:0): nvJPEG's own RGB, its upsampling.
            nvjpegImage_t image{};
            image.channel[0] = m.rgb;
            image.pitch[0] = size_t(w) * 3;
            checkJpeg(nvjpegDecode(m.handle, m.state, data, size, NVJPEG_OUTPUT_RGBI, &image, m.stream), "JPEG decode");
            checkCuda(cudaStreamSynchronize(m.stream), "JPEG decode");
            m.width = width = w;
            m.height = height = h;
            return;
        }
        }
    }
    const size_t yBytes = size_t(w) * size_t(h);
    const size_t cBytes = components == 3 ? size_t(widths[1]) * size_t(heights[1]) : 0;
    Impl::reserve(m.planes, m.planeBytes, yBytes + 2 * cBytes, "cudaMalloc (JPEG planes)");
    nvjpegImage_t image{};
    image.channel[0] = m.planes;
    image.pitch[0] = size_t(w);
    if (components == 3) {
        image.channel[1] = m.planes + yBytes;
        image.channel[2] = m.planes + yBytes + cBytes;
        image.pitch[1] = image.pitch[2] = size_t(widths[1]);
    }
    checkJpeg(nvjpegDecode(m.handle, m.state, data, size, components == 3 ? NVJPEG_OUTPUT_YUV : NVJPEG_OUTPUT_Y, &image, m.stream),
              "JPEG decode");
    PlanesArgs a{};
    a.y = image.channel[0];
    a.cb = image.channel[1];
    a.cr = image.channel[2];
    a.yPitch = w;
    a.cPitch = components == 3 ? widths[1] : 0;
    a.width = w;
    a.height = h;
    a.cWidth = components == 3 ? widths[1] : 0;
    a.cHeight = components == 3 ? heights[1] : 0;
    a.chroma = chroma;
    a.rgb = m.rgb;
    const dim3 block(32, 8);
    const dim3 grid((unsigned(w) + block.x - 1) / block.x, (unsigned(h) + block.y - 1) / block.y);
    planesToRgbKernel<<<grid, block, 0, m.stream>>>(a);
    checkCuda(cudaGetLastError(), "YCbCr kernel launch");
    checkCuda(cudaStreamSynchronize(m.stream), "JPEG decode");
    m.width = width = w;
    m.height = height = h;
}

void DeviceJpeg::layout(float * out, const DeviceJpegPlan & plan) {
    Impl & m = *impl_;
    if (m.width <= 0) throw std::runtime_error("DeviceJpeg::layout before a decode");
    if (plan.width <= 0 || plan.height <= 0 || plan.orientation < 1 || plan.orientation > 8 || plan.scale == 0)
        throw std::runtime_error("DeviceJpeg::layout: bad plan");
    if (plan.patches && (plan.patch <= 0 || plan.width % plan.patch != 0 || plan.height % plan.patch != 0))
        throw std::runtime_error("DeviceJpeg::layout: the size is not a whole number of patches");
    checkCuda(cudaSetDevice(m.device), "cudaSetDevice");
    const bool transposed = plan.orientation >= 5;
    KernelArgs k{};
    k.src = m.rgb;
    k.pitch = size_t(m.width) * 3;
    k.srcW = m.width;
    k.srcH = m.height;
    k.outW = plan.width;
    k.outH = plan.height;
    k.resW = transposed ? plan.height : plan.width;
    k.resH = transposed ? plan.width : plan.height;
    k.orientation = plan.orientation;
    k.cubic = plan.cubic;
    k.patches = plan.patches;
    k.patch = plan.patch;
    k.a = 1.0f / (255.0f * plan.scale);
    k.b = -plan.offset / plan.scale;
    k.out = out;
    const dim3 block(32, 8);
    const dim3 grid((unsigned(plan.width) + block.x - 1) / block.x, (unsigned(plan.height) + block.y - 1) / block.y);
    resampleKernel<<<grid, block, 0, m.stream>>>(k);
    checkCuda(cudaGetLastError(), "resample kernel launch");
    checkCuda(cudaStreamSynchronize(m.stream), "resample kernel");
}

void DeviceJpeg::layoutToHost(float * out, const DeviceJpegPlan & plan) {
    const size_t bytes = size_t(plan.width) * size_t(plan.height) * 3 * sizeof(float);
    checkCuda(cudaSetDevice(impl_->device), "cudaSetDevice");
    float * dev = nullptr;
    checkCuda(cudaMalloc(reinterpret_cast<void **>(&dev), bytes), "cudaMalloc (pixels)");
    try {
        layout(dev, plan);
        checkCuda(cudaMemcpy(out, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (pixels)");
    } catch (...) {
        cudaFree(dev);
        throw;
    }
    cudaFree(dev);
}

}  // namespace percept
