// Conversion kernels: layout (permutation, HCWNCk channel grouping with zero padding) fused with dtype
// conversion (float32 / float16 / bfloat16 / quantized int8 / uint8) in one pass over memory.
//
// Python describes a conversion as an iteration space: extents, and for each axis the element stride in
// the source and in the destination (formats.py derives them from the two NpuTensorInfo views). Here the
// space is normalised (unit axes dropped, axes ordered by destination stride, contiguous axes merged),
// a kernel is picked for the two innermost axes (contiguous run, short groups, interleave / deinterleave
// / tiled transpose, or element by element), and the loop runs without the GIL in the best clone for
// this CPU (AVX-512, AVX2+F16C, portable).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "errors.hpp"

#if defined(__x86_64__) || defined(__i386__)
// gcc 12 warns "__Y may be used uninitialized" inside its own AVX-512 intrinsics, once per use and clone
// (the _mm512_undefined_* idiom, gcc bug 105593): silenced for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define NPURT_X86 1
#endif

namespace py = pybind11;

namespace {

using npurt::ArgError;

constexpr int MAX_AXES = 16;

// Destinations of at least this many bytes are written with streaming (non-temporal) stores where a kernel
// has them: a frame this large is evicted before anyone reads it, and streaming saves the read-for-ownership
// of every destination line (glibc's memcpy streams above a similar threshold, 3/4 of a thread's L3 share).
// A fixed size, not sysconf(_SC_LEVEL3_CACHE_SIZE): a VM may report the host's whole L3 there.
constexpr int64_t STREAM_MIN_BYTES = int64_t(8) << 20;

// Element kinds the converters know (anything else of equal type is a raw copy by element size).
enum Kind { K_NONE = 0, K_F32, K_F16, K_BF16, K_U8, K_I8 };
enum Mode { MODE_RUN, MODE_GROUPS, MODE_TRANSPOSE, MODE_STRIDED, MODE_ELEMENTWISE };

struct Quant {
    float scale;  // dequantized = (q - zero) * scale; quantized = round(x / scale) + zero, saturated
    float zero;
};

struct Plan {
    const char *src = nullptr;
    char *dst = nullptr;
    int nd = 0;
    int64_t n[MAX_AXES] = {};
    int64_t ss[MAX_AXES] = {};  // source strides, elements
    int64_t ds[MAX_AXES] = {};  // destination strides, elements
    // Channel padding: element (.., g, .., l, ..) is real iff g * pad_k + l < pad_limit. The padded side
    // gets zeros there (dst_padded) or is not read there (padding removed).
    int pad_group = -1, pad_lane = -1;
    int64_t pad_limit = 0, pad_k = 1;
    bool dst_padded = false;
    Mode mode = MODE_ELEMENTWISE;
    int inner[2] = {0, 0};
    int n_inner = 0;
    int outer[MAX_AXES] = {};
    int n_outer = 0;
    Quant q{1.0f, 0.0f};
    Kind in_kind = K_NONE, out_kind = K_NONE;
    bool toward_zero = false;
    int raw_size = 0;  // same dtype on both sides: copy elements of this many bytes
    bool stream = false;  // destination large enough for streaming (non-temporal) stores
};

// ---- the kernels, once per instruction set ---------------------------------------------------------
#if NPURT_X86
#define NPURT_SUBSET 1
#define NPURT_SSSE3 1
#define NPURT_F16C 1
namespace isa_avx512 {
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2")
#define NPURT_AVX512 1
#include "convert_kernels.inc"
#undef NPURT_AVX512
#pragma GCC pop_options
}  // namespace isa_avx512

namespace isa_avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#define NPURT_AVX512 0
#include "convert_kernels.inc"
#undef NPURT_AVX512
#pragma GCC pop_options
}  // namespace isa_avx2
#undef NPURT_SUBSET
#undef NPURT_SSSE3
#undef NPURT_F16C
#endif

#define NPURT_SUBSET 0
#define NPURT_SSSE3 0
#define NPURT_F16C 0
#define NPURT_AVX512 0
namespace isa_portable {
#include "convert_kernels.inc"
}  // namespace isa_portable

enum Isa { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
const char *const ISA_NAMES[] = {"portable", "avx2", "avx512"};

int best_isa() {
#if NPURT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
        return ISA_AVX2;  // every AVX2 CPU has F16C
#endif
    return ISA_PORTABLE;
}

std::atomic<int> g_isa{-1};

int current_isa() {
    int isa = g_isa.load(std::memory_order_relaxed);
    if (isa < 0) {
        isa = best_isa();
        g_isa.store(isa, std::memory_order_relaxed);
    }
    return isa;
}

bool dispatch(const Plan &p) {
    switch (current_isa()) {
#if NPURT_X86
        case ISA_AVX512: if (isa_avx512::run_plan(p)) return true; break;
        case ISA_AVX2: if (isa_avx2::run_plan(p)) return true; break;
#endif
        default: break;
    }
    return isa_portable::run_plan(p);  // every pair of kinds, for what the SIMD clones leave out
}

// ---- dtypes (npurt.DataType values) --------------------------------------------------------------------
struct TypeDesc {
    const char *name;
    int size;
    Kind kind;
    const char *formats;  // buffer-protocol format characters that hold this type
};

TypeDesc type_desc(int code) {
    switch (code) {
        case 1: return {"BOOLEAN", 1, K_NONE, "?"};
        case 2: return {"INT8", 1, K_I8, "b"};
        case 3: return {"UINT8", 1, K_U8, "B"};
        case 4: return {"INT16", 2, K_NONE, "h"};
        case 5: return {"UINT16", 2, K_NONE, "H"};
        case 6: return {"BF16", 2, K_BF16, "H"};
        case 7: return {"FP16", 2, K_F16, "e"};
        case 8: return {"INT32", 4, K_NONE, "iIl"};
        case 9: return {"UINT32", 4, K_NONE, "IL"};
        case 10: return {"FLOAT32", 4, K_F32, "f"};
        case 11: return {"INT64", 8, K_NONE, "lq"};
        case 12: return {"UINT64", 8, K_NONE, "LQ"};
        default: throw ArgError("convert: unknown data type code " + std::to_string(code));
    }
}

// A buffer-protocol object as one contiguous block of bytes; raw bytes (itemsize 1) fit any dtype.
struct Block {
    py::buffer_info info;
    char *ptr = nullptr;
    int64_t nbytes = 0;
};

Block take_block(const py::buffer &obj, const TypeDesc &t, const char *what, bool writable) {
    Block b;
    b.info = obj.request(false);
    const py::buffer_info &bi = b.info;
    if (writable && bi.readonly) throw ArgError(std::string("convert: the ") + what + " buffer is read-only");
    // C-contiguous as a whole; a strided tensor is described by the strides argument, not by the buffer.
    int64_t expect = bi.itemsize;
    for (int k = static_cast<int>(bi.ndim) - 1; k >= 0; --k) {
        if (bi.shape[k] != 1 && bi.strides[k] != expect)
            throw ArgError(std::string("convert: the ") + what +
                           " buffer is not C-contiguous; pass a contiguous block and give the tensor's "
                           "layout as element strides");
        expect *= bi.shape[k];
    }
    if (bi.itemsize != 1) {
        std::string fmt = bi.format;
        while (!fmt.empty() && std::strchr("@=<>!", fmt[0])) fmt.erase(0, 1);
        if (bi.itemsize != t.size || fmt.size() != 1 || !std::strchr(t.formats, fmt[0]))
            throw ArgError(std::string("convert: the ") + what + " buffer holds elements of format '" +
                           bi.format + "' and " + std::to_string(bi.itemsize) + " bytes, expected " +
                           t.name + " (" + std::to_string(t.size) + " bytes) or raw bytes");
    }
    b.ptr = static_cast<char *>(bi.ptr);
    b.nbytes = bi.size * bi.itemsize;
    return b;
}

struct Axis {
    int64_t n, ss, ds;
    int tag;  // 0, or 1 = channel group axis, 2 = lane axis of a padded group
};

std::string list_str(const std::vector<int64_t> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

// a * b + c, or a ValueError where int64 would overflow: hostile extents and strides must not wrap the
// bounds checks around to a small size.
int64_t mul_add(int64_t a, int64_t b, int64_t c) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r))
        throw ArgError("convert: the shape and strides address more than 2**63 elements");
    return r;
}

// Highest element offset touched, over the real elements only where padding is skipped.
int64_t max_offset(const std::vector<Axis> &axes, const std::vector<int64_t> &strides, bool full, int64_t limit,
                   int64_t k) {
    int64_t off = 0, g_stride = 0, l_stride = 0;
    for (size_t i = 0; i < axes.size(); ++i) {
        if (!full && axes[i].tag == 1) { g_stride = strides[i]; continue; }
        if (!full && axes[i].tag == 2) { l_stride = strides[i]; continue; }
        off = mul_add(axes[i].n - 1, strides[i], off);
    }
    if (!full && limit > 0) {
        // Strides are not negative: the farthest real channel is the last one, or the last lane of the group
        // before its group.
        auto at = [&](int64_t c) { return mul_add(c / k, g_stride, mul_add(c % k, l_stride, 0)); };
        int64_t best = at(limit - 1);
        const int64_t prev = (limit - 1) / k * k - 1;
        if (prev >= 0) best = std::max(best, at(prev));
        off = mul_add(1, best, off);
    }
    return off;
}

void convert_strided(const py::buffer &src_obj, int src_code, const py::buffer &dst_obj, int dst_code,
                     const std::vector<int64_t> &shape, const std::vector<int64_t> &src_strides,
                     const std::vector<int64_t> &dst_strides, double scale, double zero_point, int rounding,
                     const py::object &pad) {
    const TypeDesc st = type_desc(src_code), dt = type_desc(dst_code);
    const size_t nd = shape.size();
    if (src_strides.size() != nd || dst_strides.size() != nd)
        throw ArgError("convert: shape " + list_str(shape) + " has " + std::to_string(nd) +
                       " axes but the strides are " + list_str(src_strides) + " and " +
                       list_str(dst_strides));
    if (nd + 1 > MAX_AXES) throw ArgError("convert: at most 15 axes are supported, got " + std::to_string(nd));
    Plan p;
    if (src_code == dst_code) {
        p.raw_size = st.size;
    } else {
        if (st.kind == K_NONE || dt.kind == K_NONE)
            throw ArgError(std::string("convert: no native conversion from ") + st.name + " to " + dt.name);
    }
    p.in_kind = st.kind;
    p.out_kind = dt.kind;
    if (!(scale > 0.0) || !std::isfinite(scale))
        throw ArgError("convert: scale must be a positive finite number, got " + std::to_string(scale));
    if (rounding != 1 && rounding != 2)
        throw ArgError("convert: rounding mode must be ROUND_TO_NEAREST_EVEN (1) or ROUND_TOWARD_ZERO (2), got " +
                       std::to_string(rounding));
    p.q = Quant{static_cast<float>(scale), static_cast<float>(zero_point)};
    p.toward_zero = rounding == 2;

    std::vector<Axis> axes(nd);
    for (size_t i = 0; i < nd; ++i) {
        if (shape[i] < 0 || src_strides[i] < 0 || dst_strides[i] < 0)
            throw ArgError("convert: negative extent or stride in shape " + list_str(shape) + ", strides " +
                           list_str(src_strides) + " / " + list_str(dst_strides));
        if (shape[i] > 1 && dst_strides[i] == 0)
            throw ArgError("convert: destination stride 0 on axis " + std::to_string(i) +
                           " would write elements over each other");
        axes[i] = {shape[i], src_strides[i], dst_strides[i], 0};
    }
    int64_t pad_limit = 0, pad_k = 1;
    bool dst_padded = false, padded = false;
    if (!pad.is_none()) {
        auto t = pad.cast<std::vector<int64_t>>();
        if (t.size() != 5 || t[0] < 0 || t[1] < 0 || t[0] >= static_cast<int64_t>(nd) ||
            t[1] >= static_cast<int64_t>(nd) || t[0] == t[1] || t[3] < 1)
            throw ArgError("convert: pad must be (group_axis, lane_axis, channels, group_size, dst_padded)");
        axes[t[0]].tag = 1;
        axes[t[1]].tag = 2;
        pad_limit = t[2];
        pad_k = t[3];
        int64_t lanes = 0;  // (an overflow: more lanes than any channel count)
        const bool huge = __builtin_mul_overflow(shape[t[0]], pad_k, &lanes);
        if (shape[t[1]] != pad_k || (!huge && pad_limit > lanes))
            throw ArgError("convert: pad of " + std::to_string(pad_limit) + " channels in groups of " +
                           std::to_string(pad_k) + " does not fit shape " + list_str(shape));
        dst_padded = t[4] != 0;
        padded = true;
    }

    Block src = take_block(src_obj, st, "source", false);
    Block dst = take_block(dst_obj, dt, "destination", true);
    for (auto e : shape)
        if (e == 0) return;  // nothing to convert
    const int64_t src_need = mul_add(max_offset(axes, src_strides, !padded, pad_limit, pad_k), st.size, st.size);
    const int64_t dst_need =
        mul_add(max_offset(axes, dst_strides, !padded || dst_padded, pad_limit, pad_k), dt.size, dt.size);
    if (src.nbytes < src_need)
        throw ArgError("convert: the source buffer holds " + std::to_string(src.nbytes) + " bytes, shape " +
                       list_str(shape) + " with strides " + list_str(src_strides) + " needs " +
                       std::to_string(src_need));
    if (dst.nbytes < dst_need)
        throw ArgError("convert: the destination buffer holds " + std::to_string(dst.nbytes) +
                       " bytes, shape " + list_str(shape) + " with strides " + list_str(dst_strides) +
                       " needs " + std::to_string(dst_need));
    if (src.ptr < dst.ptr + dst_need && dst.ptr < src.ptr + src_need)
        throw ArgError("convert: source and destination memory overlap");
    p.stream = dst_need >= STREAM_MIN_BYTES;

    // ---- normalise: drop unit axes, order by destination stride, merge contiguous neighbours
    std::vector<Axis> kept;
    for (const Axis &a : axes)
        if (a.n != 1 || a.tag) kept.push_back(a);
    std::stable_sort(kept.begin(), kept.end(), [](const Axis &x, const Axis &y) {
        return x.ds != y.ds ? x.ds > y.ds : x.ss > y.ss;
    });
    std::vector<Axis> merged;
    for (const Axis &a : kept) {
        if (!merged.empty()) {
            Axis &o = merged.back();
            if (!o.tag && !a.tag && o.ss == a.ss * a.n && o.ds == a.ds * a.n) {
                o.n *= a.n;
                o.ss = a.ss;
                o.ds = a.ds;
                continue;
            }
        }
        merged.push_back(a);
    }
    if (merged.empty()) merged.push_back({1, 1, 1, 0});
    p.nd = static_cast<int>(merged.size());
    for (int i = 0; i < p.nd; ++i) {
        p.n[i] = merged[i].n;
        p.ss[i] = merged[i].ss;
        p.ds[i] = merged[i].ds;
        if (merged[i].tag == 1) p.pad_group = i;
        if (merged[i].tag == 2) p.pad_lane = i;
    }
    if (padded && pad_limit >= p.n[p.pad_group] * pad_k) p.pad_group = p.pad_lane = -1;  // nothing is padding
    p.pad_limit = pad_limit;
    p.pad_k = pad_k;
    p.dst_padded = p.pad_lane >= 0 && dst_padded;

    // ---- pick the kernel for the innermost axes
    const int A = p.nd - 1;
    int B = -1;
    for (int i = 0; i < p.nd; ++i)
        if (i != A && p.ss[i] == 1 && p.n[i] > 1 && (B < 0 || p.n[i] > p.n[B])) B = i;
    if (A == p.pad_group) {
        p.mode = MODE_ELEMENTWISE;
    } else if (p.ds[A] == 1 && p.ss[A] == 1) {
        const int R = A - 1;
        if (p.n[A] <= 4 && R >= 0 && R != p.pad_group && R != p.pad_lane) {
            p.mode = MODE_GROUPS;
            p.inner[0] = A, p.inner[1] = R, p.n_inner = 2;
        } else {
            p.mode = MODE_RUN;
            p.inner[0] = A, p.n_inner = 1;
        }
    } else if (p.ds[A] == 1 && B >= 0 && B != p.pad_group) {
        p.mode = MODE_TRANSPOSE;
        p.inner[0] = A, p.inner[1] = B, p.n_inner = 2;
    } else {
        p.mode = MODE_STRIDED;
        p.inner[0] = A, p.n_inner = 1;
    }
    if (p.mode != MODE_ELEMENTWISE) {
        for (int i = 0; i < p.nd; ++i)
            if (i != p.inner[0] && !(p.n_inner == 2 && i == p.inner[1])) p.outer[p.n_outer++] = i;
    }
    p.src = src.ptr;
    p.dst = dst.ptr;
    bool ok;
    {
        py::gil_scoped_release nogil;
        ok = dispatch(p);
    }
    if (!ok) throw ArgError(std::string("convert: no kernel for ") + st.name + " -> " + dt.name);
}

}  // namespace

void register_convert(py::module_ &m) {
    m.def("convert_strided", &convert_strided, py::arg("src"), py::arg("src_type"), py::arg("dst"),
          py::arg("dst_type"), py::arg("shape"), py::arg("src_strides"), py::arg("dst_strides"),
          py::arg("scale") = 1.0, py::arg("zero_point") = 0.0, py::arg("rounding") = 1, py::arg("pad") = py::none(),
          R"doc(Convert a tensor between layouts and dtypes in one pass, without the GIL.

src, dst: contiguous buffer-protocol objects (raw bytes, or elements of the dtype), never copied.
src_type, dst_type: npurt.DataType values. Same type: an element copy. Otherwise both must be FLOAT32,
FP16, BF16, INT8 or UINT8 (through float32; int8/uint8 are (de)quantized with scale and zero_point).
shape, src_strides, dst_strides: the iteration space and each axis' stride in elements, per side.
rounding: npurt.RoundingMode value used when quantizing.
pad: None, or (group_axis, lane_axis, channels, group_size, dst_padded): channel c = group * group_size +
lane is padding when c >= channels; a padded destination gets zeros there, a padded source is not read
there.)doc");
    m.def("convert_isa", []() { return std::string(ISA_NAMES[current_isa()]); },
          "The instruction set the conversion kernels use: 'avx512', 'avx2' or 'portable'.");
    m.def(
        "set_convert_isa",
        [](const std::string &name) {
            int want = -1;
            if (name == "auto") want = best_isa();
            for (int i = 0; i < 3; ++i)
                if (name == ISA_NAMES[i]) want = i;
            if (want < 0) throw ArgError("set_convert_isa: unknown instruction set '" + name + "'");
            if (want > best_isa())
                throw ArgError("set_convert_isa: this CPU cannot run '" + name + "' (best: " +
                               ISA_NAMES[best_isa()] + ")");
            g_isa.store(want, std::memory_order_relaxed);
        },
        py::arg("name"), "Choose the kernels' instruction set ('auto', 'avx512', 'avx2', 'portable'), for tests.");
}
