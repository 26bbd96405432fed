// layoutPixels: the layout pass of preprocessing, percept's own code without llama.cpp.
// It turns 8-bit interleaved pixels, as sharp returns them, into the encoder's float tensor.
// One pass on a libuv worker thread does it all:
//   - rows enlarged on PIL's sample grid, when asked;
//   - EXIF orientation applied as an index mapping;
//   - B/G/R swapped, then (v/255 − offset)/scale;
//   - planar CHW, or 16×16 HWC patches in row-major patch order, zero-padded after the last patch.
#include "pixels.h"

#include "util.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace percept {
namespace {

struct LayoutSpec {
    int64_t width = 0, height = 0, channels = 0, stride = 0;  // the stored image
    int64_t rows = 0;                                         // rows after enlargement (= height: none)
    bool cubic = false;
    int32_t orientation = 1;
    bool bgr = false;
    bool patches = false;
    int64_t patch = 16;
    float scale = 1, offset = 0;
};

// PIL's filters (ImagingResample): triangle for bilinear, Catmull-Rom (a = −0.5) for bicubic.
double filterWeight(bool cubic, double x) {
    x = std::fabs(x);
    if (!cubic) return x < 1 ? 1 - x : 0;
    return x < 1 ? (1.5 * x - 2.5) * x * x + 1 : x < 2 ? ((-0.5 * x + 2.5) * x - 4) * x + 2 : 0;
}

// x86-64 builds are portable, without -march.
// So the loops below are also compiled for AVX2 and picked at load time (GCC function multi-versioning).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PERCEPT_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PERCEPT_AVX2_CLONES
#endif

// One row of packed RGB or BGR bytes → three planes of (v·a + b).
// The strides are constants here, so the compiler unrolls and vectorizes what the general loop cannot.
PERCEPT_AVX2_CLONES void splitRgbRow(const uint8_t * p, int64_t n, bool bgr, float a, float b, float * r, float * g, float * bl) {
    if (bgr) std::swap(r, bl);
    for (int64_t x = 0; x < n; x++) {
        r[x] = float(p[3 * x]) * a + b;
        g[x] = float(p[3 * x + 1]) * a + b;
        bl[x] = float(p[3 * x + 2]) * a + b;
    }
}

// Bilinear, with two non-negative weights, so no clamping. The bytes are those of w₀·p₀ + w₁·p₁ + 0.5 in double, rounded down.
// Each run is blended in float first, for twice the SIMD lanes. The float sum is within `margin` of the double one.
// Where no value of the run is that close to a rounding boundary, the bytes are the same.
// A run where one is gets blended again in double. Exact ties are common: weights in 112ths for 720 → 896 rows.
// Both loops vectorize.
PERCEPT_AVX2_CLONES void blendTwoRows(const uint8_t * r0, const uint8_t * r1, double w0, double w1, float margin, int64_t n, uint8_t * o) {
    constexpr int64_t kRun = 64;
    const float f0 = float(w0), f1 = float(w1);
    for (int64_t start = 0; start < n; start += kRun) {
        const int64_t end = std::min(n, start + kRun);
        int near = 0;
        for (int64_t j = start; j < end; j++) {
            const float v = f0 * float(r0[j]) + f1 * float(r1[j]) + 0.5f;
            const int32_t t = int32_t(v);
            const float frac = v - float(t);
            near |= int(frac < margin) | int(frac > 1.0f - margin);
            o[j] = uint8_t(t);
        }
        if (near)
            for (int64_t j = start; j < end; j++) o[j] = uint8_t(w0 * r0[j] + w1 * r1[j] + 0.5);
    }
}

// Any taps (bicubic: weights can be negative, so the result is clamped), in double.
void blendRows(const uint8_t * r0, int64_t stride, const double * taps, int nTaps, int64_t n, uint8_t * o) {
    for (int64_t j = 0; j < n; j++) {
        double v = 0;
        const uint8_t * p = r0 + j;
        for (int k = 0; k < nTaps; k++, p += stride) v += taps[k] * *p;
        v += 0.5;
        o[j] = v <= 0 ? 0 : v >= 255 ? 255 : uint8_t(v);
    }
}

// PIL's vertical pass, one output row at a time, so an enlarged image need never exist whole.
// Taps are centre-aligned and clipped at the edges, with weights normalized to sum 1.
// Σ wₖ·pₖ is summed in double and rounded half up to 8 bits. The taps of every output row are computed once, up front.
class RowEnlarger {
public:
    RowEnlarger(const uint8_t * src, int64_t rowBytes, int64_t stride, int64_t inRows, int64_t outRows, bool cubic)
        : src_(src), rowBytes_(rowBytes), stride_(stride), rows_(size_t(outRows)) {
        const double support = cubic ? 2 : 1;
        const double scale = double(inRows) / double(outRows);
        for (int64_t y = 0; y < outRows; y++) {
            Taps & t = rows_[size_t(y)];
            const double centre = (double(y) + 0.5) * scale;
            t.first = std::max<int64_t>(0, int64_t(centre - support + 0.5));
            const int64_t last = std::min<int64_t>(inRows, int64_t(centre + support + 0.5));
            t.n = int(last - t.first);
            double sum = 0;
            for (int k = 0; k < t.n; k++) sum += t.w[k] = filterWeight(cubic, double(t.first + k) - centre + 0.5);
            for (int k = 0; k < t.n; k++) t.w[k] /= sum;
            // A cubic row clipped at an edge can have two taps, one of them negative.
            t.bilinear = t.n == 2 && t.w[0] >= 0 && t.w[1] >= 0;
        }
    }

    /** Writes output row y (rowBytes bytes) to `out`. */
    void row(int64_t y, uint8_t * out) const {
        const Taps & t = rows_[size_t(y)];
        const uint8_t * r0 = src_ + t.first * stride_;
        if (t.bilinear) blendTwoRows(r0, r0 + stride_, t.w[0], t.w[1], kBilinearMargin, rowBytes_, out);
        else blendRows(r0, stride_, t.w, t.n, rowBytes_, out);
    }

private:
    // Two float products and two sums of values below 256, each off by at most 2⁻²⁴ of 256.
    // The weights rounded to float add as much again: 6·2⁻¹⁶ < 1e-4.
    static constexpr float kBilinearMargin = 1e-4f;
    struct Taps {
        int64_t first = 0;
        int n = 0;
        bool bilinear = false;
        double w[8] = {};  // at most 2·support + 1 = 5 taps
    };
    const uint8_t * src_;
    int64_t rowBytes_, stride_;
    std::vector<Taps> rows_;
};

// The stored pixel shown at display (x, y) is at base + y·dy + x·dx (bytes; dx, dy may be negative).
struct View {
    int64_t base, dx, dy, width, height;
};

View orient(int64_t w, int64_t h, int64_t channels, int64_t stride, int32_t orientation) {
    const int64_t right = (w - 1) * channels, bottom = (h - 1) * stride;
    switch (orientation) {
    case 2:
        return {right, -channels, stride, w, h};  // mirrored left↔right
    case 3:
        return {bottom + right, -channels, -stride, w, h};  // rotated 180°
    case 4:
        return {bottom, channels, -stride, w, h};  // mirrored top↔bottom
    case 5:
        return {0, stride, channels, h, w};  // transposed
    case 6:
        return {bottom, -stride, channels, h, w};  // rotated 90° clockwise
    case 7:
        return {bottom + right, -stride, -channels, h, w};  // transversed
    case 8:
        return {right, stride, -channels, h, w};  // rotated 90° counter-clockwise
    default:
        return {0, channels, stride, w, h};  // as stored
    }
}

// Returns the number of patches (patches) or pixels (chw) written.
int64_t layout(const uint8_t * src, const LayoutSpec & s, float * out, size_t outLength) {
    const int64_t rowBytes = s.width * s.channels;
    std::vector<uint8_t> enlarged;   // the whole enlarged image: only when a transposing orientation needs it
    std::vector<uint8_t> rowBuffer;  // else one enlarged row at a time, made as the loops below reach it
    std::optional<RowEnlarger> enlarger;
    int64_t stride = s.stride;
    if (s.rows != s.height) {
        enlarger.emplace(src, rowBytes, s.stride, s.height, s.rows, s.cubic);
        if (s.orientation >= 5) {
            enlarged.resize(size_t(rowBytes * s.rows));
            for (int64_t y = 0; y < s.rows; y++) enlarger->row(y, enlarged.data() + y * rowBytes);
            enlarger.reset();
            src = enlarged.data();
        } else {
            rowBuffer.resize(size_t(rowBytes));
        }
        stride = rowBytes;
    }
    const View v = orient(s.width, s.rows, s.channels, stride, s.orientation);
    // The first stored pixel of display row y (then v.dx bytes a pixel). Orientations 1–4 keep stored
    // rows as display rows, so an enlarged row is made here, just before it is read.
    auto rowStart = [&](int64_t y) -> const uint8_t * {
        if (!enlarger) return src + v.base + y * v.dy;
        enlarger->row(v.dy > 0 ? y : s.rows - 1 - y, rowBuffer.data());
        return rowBuffer.data() + (v.dx > 0 ? 0 : rowBytes - s.channels);
    };
    const int64_t oR = s.channels < 3 ? 0 : s.bgr ? 2 : 0, oG = s.channels < 3 ? 0 : 1, oB = s.channels < 3 ? 0 : s.bgr ? 0 : 2;
    const float a = 1.0f / (255.0f * s.scale), b = -s.offset / s.scale;
    if (!s.patches) {
        const int64_t n = v.width * v.height;
        float * r = out;
        float * g = out + n;
        float * bl = out + 2 * n;
        for (int64_t y = 0, i = 0; y < v.height; y++, i += v.width) {
            const uint8_t * p = rowStart(y);
            if (v.dx == 3 && s.channels == 3) splitRgbRow(p, v.width, s.bgr, a, b, r + i, g + i, bl + i);
            else
                for (int64_t x = 0; x < v.width; x++, p += v.dx) {
                    r[i + x] = float(p[oR]) * a + b;
                    g[i + x] = float(p[oG]) * a + b;
                    bl[i + x] = float(p[oB]) * a + b;
                }
        }
        return n;
    }
    const int64_t P = s.patch, cols = v.width / P, rows = v.height / P, patchValues = P * P * 3;
    const bool contiguousRgb = v.dx == 3 && s.channels == 3 && !s.bgr;
    for (int64_t y = 0; y < v.height; y++) {
        // Each display row is `cols` runs of P pixels, one run per patch of this patch row.
        float * d = out + ((y / P) * cols * P * P + (y % P) * P) * 3;
        const uint8_t * row = rowStart(y);
        for (int64_t pc = 0; pc < cols; pc++, d += patchValues) {
            const uint8_t * p = row + pc * P * v.dx;
            if (contiguousRgb) {
                for (int64_t k = 0; k < P * 3; k++) d[k] = float(p[k]) * a + b;  // vectorized
            } else {
                for (int64_t k = 0; k < P; k++, p += v.dx) {
                    d[3 * k] = float(p[oR]) * a + b;
                    d[3 * k + 1] = float(p[oG]) * a + b;
                    d[3 * k + 2] = float(p[oB]) * a + b;
                }
            }
        }
    }
    const size_t written = size_t(cols * rows * patchValues);
    std::fill(out + written, out + outLength, 0.0f);
    return cols * rows;
}

class LayoutWorker : public PromiseWorker {
public:
    LayoutWorker(Napi::Env env, Napi::Uint8Array src, Napi::Float32Array out, LayoutSpec spec)
        : PromiseWorker(env, "percept:layoutPixels", "ELAYOUT"), srcRef_(Napi::Persistent(src.As<Napi::Object>())),
          outRef_(Napi::Persistent(out.As<Napi::Object>())), src_(src.Data()), out_(out.Data()), outLength_(out.ElementLength()),
          spec_(spec) {}

protected:
    void Execute() override { written_ = layout(src_, spec_, out_, outLength_); }
    void OnOK() override { deferred_.Resolve(Napi::Number::New(Env(), double(written_))); }

private:
    Napi::ObjectReference srcRef_, outRef_;  // keep both arrays alive while the worker reads/writes them
    const uint8_t * src_;
    float * out_;
    size_t outLength_;
    LayoutSpec spec_;
    int64_t written_ = 0;
};

}  // namespace

Napi::Value LayoutPixels(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    const char * where = "layoutPixels options";
    if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
        throw Napi::TypeError::New(env, "layoutPixels: src must be a Uint8Array");
    if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
        throw Napi::TypeError::New(env, "layoutPixels: out must be a Float32Array");
    Napi::Uint8Array src = info[0].As<Napi::Uint8Array>();
    Napi::Float32Array out = info[1].As<Napi::Float32Array>();
    Napi::Object o = requireObject(info[2], where);
    // Every field is required (native/pixels.ts owns the defaults); checked again because a wrong
    // value here would be out-of-bounds access, not a friendly error.
    LayoutSpec s;
    s.width = requireInt(o, "width", 1, 1 << 16, where);
    s.height = requireInt(o, "height", 1, 1 << 16, where);
    s.channels = requireInt(o, "channels", 1, 4, where);
    s.stride = requireInt(o, "stride", s.width * s.channels, int64_t(1) << 40, where);
    s.rows = requireInt(o, "rows", s.height, 1 << 16, where);
    s.cubic = requireChoice(o, "kernel", {"linear", "cubic"}, where) == 1;
    s.orientation = int32_t(requireInt(o, "orientation", 1, 8, where));
    s.bgr = requireBool(o, "bgr", where);
    s.patches = requireChoice(o, "layout", {"chw", "patches"}, where) == 1;
    s.patch = requireInt(o, "patch", 1, 1024, where);
    s.scale = float(requireNumber(o, "scale", -FLT_MAX, FLT_MAX, where));
    s.offset = float(requireNumber(o, "offset", -FLT_MAX, FLT_MAX, where));
    if (s.scale == 0)
        throw Napi::RangeError::New(env, "Expected a non-zero number for layoutPixels options.scale but received 0 of type number");

    const size_t need = size_t(s.stride * (s.height - 1) + s.width * s.channels);
    if (src.ElementLength() < need)
        throw Napi::RangeError::New(
            env, "layoutPixels: src has " + std::to_string(src.ElementLength()) + " bytes, need " + std::to_string(need));
    const bool transposed = s.orientation >= 5;
    const int64_t dw = transposed ? s.rows : s.width, dh = transposed ? s.width : s.rows;
    if (s.patches && (dw % s.patch != 0 || dh % s.patch != 0)) {
        throw Napi::RangeError::New(env,
                                    "layoutPixels: " + std::to_string(dw) + "x" + std::to_string(dh) +
                                        " is not a multiple of the patch size " + std::to_string(s.patch));
    }
    const size_t values = size_t(dw * dh * 3);
    if (s.patches ? out.ElementLength() < values : out.ElementLength() != values) {
        throw Napi::RangeError::New(env,
                                    "layoutPixels: out has " + std::to_string(out.ElementLength()) + " values, " +
                                        (s.patches ? "need at least " : "need ") + std::to_string(values));
    }
    auto * worker = new LayoutWorker(env, src, out, s);
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
}

}  // namespace percept
