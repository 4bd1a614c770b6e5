// Conversion kernels: layout (permutation, HCWNCk channel grouping with zero padding) fused with dtype
// conversion (float32 / float16 / bfloat16 / quantized int8 / uint8 / uint16) in one pass over memory.
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
#include <optional>
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
enum class Kind { None, F32, F16, BF16, U8, I8, U16 };
// The loop over the two innermost axes (convert_strided picks it, Engine::run_inner runs it).
enum class Mode { Run, Groups, Transpose, Strided, Elementwise };

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
    Mode mode = Mode::Elementwise;
    int inner[2] = {0, 0};
    int n_inner = 0;
    int outer[MAX_AXES] = {};
    int n_outer = 0;
    Quant q{1.0f, 0.0f};
    Kind in_kind = Kind::None, out_kind = Kind::None;
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

// Ordered: a CPU that runs one of them runs those before it too.
enum class Isa { Portable, Avx2, Avx512 };
struct IsaName {
    Isa isa;
    const char *name;
};
constexpr IsaName ISA_NAMES[] = {{Isa::Portable, "portable"}, {Isa::Avx2, "avx2"}, {Isa::Avx512, "avx512"}};

const char *isa_name(Isa isa) {
    for (const IsaName &n : ISA_NAMES)
        if (n.isa == isa) return n.name;
    return "?";
}

Isa best_isa() {
#if NPURT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
        return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
        return Isa::Avx2;  // every AVX2 CPU has F16C
#endif
    return Isa::Portable;
}

std::atomic<Isa> g_isa{best_isa()};  // set_convert_isa changes it (tests, benchmarks)

bool dispatch(const Plan &p) {
    switch (g_isa.load(std::memory_order_relaxed)) {
#if NPURT_X86
        case Isa::Avx512: if (isa_avx512::run_plan(p)) return true; break;
        case Isa::Avx2: if (isa_avx2::run_plan(p)) return true; break;
#endif
        default: break;
    }
    return isa_portable::run_plan(p);  // every pair of kinds, for what the SIMD clones leave out
}

// ---- the boundary's types ------------------------------------------------------------------------------
// Element types: npurt.DataType's members, with its names and values (formats.py maps one to the other by
// name). Any of them can be copied; those with a Kind are also converted into each other.
enum class ElementType {
    Boolean = 1, Int8, UInt8, Int16, UInt16, BF16, FP16, Int32, UInt32, Float32, Int64, UInt64, Float64
};

struct TypeDesc {
    ElementType type;
    const char *name;  // the Python member name
    int size;
    Kind kind;
    const char *formats;  // buffer-protocol format characters that hold this type
};

constexpr TypeDesc TYPES[] = {
    {ElementType::Boolean, "BOOLEAN", 1, Kind::None, "?"},
    {ElementType::Int8, "INT8", 1, Kind::I8, "b"},
    {ElementType::UInt8, "UINT8", 1, Kind::U8, "B"},
    {ElementType::Int16, "INT16", 2, Kind::None, "h"},
    {ElementType::UInt16, "UINT16", 2, Kind::U16, "H"},
    {ElementType::BF16, "BF16", 2, Kind::BF16, "H"},
    {ElementType::FP16, "FP16", 2, Kind::F16, "e"},
    {ElementType::Int32, "INT32", 4, Kind::None, "iIl"},
    {ElementType::UInt32, "UINT32", 4, Kind::None, "IL"},
    {ElementType::Float32, "FLOAT32", 4, Kind::F32, "f"},
    {ElementType::Int64, "INT64", 8, Kind::None, "lq"},
    {ElementType::UInt64, "UINT64", 8, Kind::None, "LQ"},
    {ElementType::Float64, "FLOAT64", 8, Kind::None, "d"},
};

const TypeDesc &type_desc(ElementType type) {
    for (const TypeDesc &t : TYPES)
        if (t.type == type) return t;
    throw ArgError("convert: unknown data type code " + std::to_string(static_cast<int>(type)));
}

// Rounding of quantization: npurt.RoundingMode's members that the kernels implement, with its values.
enum class Rounding { ToNearestEven = 1, TowardZero = 2 };

// Channel grouping with zero padding: the iteration space splits C into (group, lane) axes of
// group_size lanes; channel group * group_size + lane is padding when it is >= channels.
struct ChannelPadding {
    int group_axis;
    int lane_axis;
    int64_t channels;
    int64_t group_size;
    bool dst_padded;  // true: the destination is the padded side (gets zeros there); false: the source is
                      // (not read there)
};

ChannelPadding make_channel_padding(int group_axis, int lane_axis, int64_t channels, int64_t group_size,
                                    bool dst_padded) {
    if (group_axis < 0 || lane_axis < 0 || group_axis == lane_axis)
        throw ArgError("ChannelPadding: group_axis and lane_axis must be two different axes, got " +
                       std::to_string(group_axis) + " and " + std::to_string(lane_axis));
    if (channels < 0)
        throw ArgError("ChannelPadding: channels must not be negative, got " + std::to_string(channels));
    if (group_size < 1)
        throw ArgError("ChannelPadding: group_size must be at least 1, got " + std::to_string(group_size));
    return {group_axis, lane_axis, channels, group_size, dst_padded};
}

std::string padding_repr(const ChannelPadding &p) {
    return "ChannelPadding(group_axis=" + std::to_string(p.group_axis) + ", lane_axis=" +
           std::to_string(p.lane_axis) + ", channels=" + std::to_string(p.channels) + ", group_size=" +
           std::to_string(p.group_size) + ", dst_padded=" + (p.dst_padded ? "True" : "False") + ")";
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

// What an axis of the iteration space is to the channel padding.
enum class AxisRole { Plain, Group, Lane };

struct Axis {
    int64_t n, ss, ds;
    AxisRole role;
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
        if (!full && axes[i].role == AxisRole::Group) { g_stride = strides[i]; continue; }
        if (!full && axes[i].role == AxisRole::Lane) { l_stride = strides[i]; continue; }
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

void convert_strided(const py::buffer &src_obj, ElementType src_type, const py::buffer &dst_obj,
                     ElementType dst_type, const std::vector<int64_t> &shape, const std::vector<int64_t> &src_strides,
                     const std::vector<int64_t> &dst_strides, double scale, double zero_point, Rounding rounding,
                     const std::optional<ChannelPadding> &pad) {
    const TypeDesc &st = type_desc(src_type), &dt = type_desc(dst_type);
    const size_t nd = shape.size();
    if (src_strides.size() != nd || dst_strides.size() != nd)
        throw ArgError("convert: shape " + list_str(shape) + " has " + std::to_string(nd) +
                       " axes but the strides are " + list_str(src_strides) + " and " +
                       list_str(dst_strides));
    if (nd + 1 > MAX_AXES) throw ArgError("convert: at most 15 axes are supported, got " + std::to_string(nd));
    Plan p;
    if (src_type == dst_type) {
        p.raw_size = st.size;
    } else {
        if (st.kind == Kind::None || dt.kind == Kind::None)
            throw ArgError(std::string("convert: no native conversion from ") + st.name + " to " + dt.name);
    }
    p.in_kind = st.kind;
    p.out_kind = dt.kind;
    if (!(scale > 0.0) || !std::isfinite(scale))
        throw ArgError("convert: scale must be a positive finite number, got " + std::to_string(scale));
    if (rounding != Rounding::ToNearestEven && rounding != Rounding::TowardZero)
        throw ArgError("convert: rounding mode must be ROUND_TO_NEAREST_EVEN (1) or ROUND_TOWARD_ZERO (2), got " +
                       std::to_string(static_cast<int>(rounding)));
    p.q = Quant{static_cast<float>(scale), static_cast<float>(zero_point)};
    p.toward_zero = rounding == Rounding::TowardZero;

    std::vector<Axis> axes(nd);
    for (size_t i = 0; i < nd; ++i) {
        if (shape[i] < 0 || src_strides[i] < 0 || dst_strides[i] < 0)
            throw ArgError("convert: negative extent or stride in shape " + list_str(shape) + ", strides " +
                           list_str(src_strides) + " / " + list_str(dst_strides));
        if (shape[i] > 1 && dst_strides[i] == 0)
            throw ArgError("convert: destination stride 0 on axis " + std::to_string(i) +
                           " would write elements over each other");
        axes[i] = {shape[i], src_strides[i], dst_strides[i], AxisRole::Plain};
    }
    int64_t pad_limit = 0, pad_k = 1;
    bool dst_padded = false, padded = false;
    if (pad) {
        // (ChannelPadding's constructor checked the rest: two different axes >= 0, group_size >= 1)
        const int64_t group_axis = pad->group_axis, lane_axis = pad->lane_axis;
        if (group_axis >= static_cast<int64_t>(nd) || lane_axis >= static_cast<int64_t>(nd))
            throw ArgError("convert: pad axes " + std::to_string(group_axis) + " (group) and " +
                           std::to_string(lane_axis) + " (lane) are not both axes of shape " + list_str(shape));
        axes[group_axis].role = AxisRole::Group;
        axes[lane_axis].role = AxisRole::Lane;
        pad_limit = pad->channels;
        pad_k = pad->group_size;
        int64_t lanes = 0;  // (an overflow: more lanes than any channel count)
        const bool huge = __builtin_mul_overflow(shape[group_axis], pad_k, &lanes);
        if (shape[lane_axis] != pad_k || (!huge && pad_limit > lanes))
            throw ArgError("convert: pad of " + std::to_string(pad_limit) + " channels in groups of " +
                           std::to_string(pad_k) + " does not fit shape " + list_str(shape));
        dst_padded = pad->dst_padded;
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
        if (a.n != 1 || a.role != AxisRole::Plain) kept.push_back(a);
    std::stable_sort(kept.begin(), kept.end(), [](const Axis &x, const Axis &y) {
        return x.ds != y.ds ? x.ds > y.ds : x.ss > y.ss;
    });
    std::vector<Axis> merged;
    for (const Axis &a : kept) {
        if (!merged.empty()) {
            Axis &o = merged.back();
            if (o.role == AxisRole::Plain && a.role == AxisRole::Plain && o.ss == a.ss * a.n &&
                o.ds == a.ds * a.n) {
                o.n *= a.n;
                o.ss = a.ss;
                o.ds = a.ds;
                continue;
            }
        }
        merged.push_back(a);
    }
    if (merged.empty()) merged.push_back({1, 1, 1, AxisRole::Plain});
    p.nd = static_cast<int>(merged.size());
    for (int i = 0; i < p.nd; ++i) {
        p.n[i] = merged[i].n;
        p.ss[i] = merged[i].ss;
        p.ds[i] = merged[i].ds;
        if (merged[i].role == AxisRole::Group) p.pad_group = i;
        if (merged[i].role == AxisRole::Lane) p.pad_lane = i;
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
        p.mode = Mode::Elementwise;
    } else if (p.ds[A] == 1 && p.ss[A] == 1) {
        const int R = A - 1;
        if (p.n[A] <= 4 && R >= 0 && R != p.pad_group && R != p.pad_lane) {
            p.mode = Mode::Groups;
            p.inner[0] = A, p.inner[1] = R, p.n_inner = 2;
        } else {
            p.mode = Mode::Run;
            p.inner[0] = A, p.n_inner = 1;
        }
    } else if (p.ds[A] == 1 && B >= 0 && B != p.pad_group) {
        p.mode = Mode::Transpose;
        p.inner[0] = A, p.inner[1] = B, p.n_inner = 2;
    } else {
        p.mode = Mode::Strided;
        p.inner[0] = A, p.n_inner = 1;
    }
    if (p.mode != Mode::Elementwise) {
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
    // py::enum_, not py::native_enum (a real enum.Enum): pybind11 3.1 reads a native_enum argument in ~0.4 us
    // (internals look-up, isinstance, the member's `value`), an enum_ in ~0.06 us: with three per call, native
    // enums doubled the ~1.1 us of a small convert_strided call. An enum_ can be made from any int
    // (ElementType(99)): convert_strided checks the values it gets.
    py::enum_<ElementType> element_type(
        m, "ElementType", "The element types of convert_strided: npurt.DataType's members, by the same names and "
                          "values.");
    for (const TypeDesc &t : TYPES) element_type.value(t.name, t.type);

    py::enum_<Rounding>(m, "Rounding",
                        "How convert_strided rounds when it quantizes: npurt.RoundingMode's members (but UNKNOWN), "
                        "by the same names and values.")
        .value("ROUND_TO_NEAREST_EVEN", Rounding::ToNearestEven)
        .value("ROUND_TOWARD_ZERO", Rounding::TowardZero);

    py::set convertible;
    for (const TypeDesc &t : TYPES)
        if (t.kind != Kind::None) convertible.add(py::cast(t.type));
    m.attr("CONVERTIBLE_TYPES") = py::frozenset(convertible);

    py::class_<ChannelPadding>(m, "ChannelPadding", R"doc(
Channel grouping with zero padding, for convert_strided: the channel axis C is split into two axes of the
iteration space, group_axis (C / group_size groups, rounded up) and lane_axis (group_size lanes); channel
group * group_size + lane is padding when it is >= channels. dst_padded: the destination is the padded side
and gets zeros there; otherwise the source is, and is not read there. Read-only.)doc")
        .def(py::init(&make_channel_padding), py::kw_only(), py::arg("group_axis"), py::arg("lane_axis"),
             py::arg("channels"), py::arg("group_size"), py::arg("dst_padded"),
             "Raises ValueError unless the axes are two different axes >= 0, channels >= 0, group_size >= 1.")
        .def_readonly("group_axis", &ChannelPadding::group_axis)
        .def_readonly("lane_axis", &ChannelPadding::lane_axis)
        .def_readonly("channels", &ChannelPadding::channels)
        .def_readonly("group_size", &ChannelPadding::group_size)
        .def_readonly("dst_padded", &ChannelPadding::dst_padded)
        .def("__repr__", &padding_repr);

    m.def("convert_strided", &convert_strided, py::arg("src"), py::arg("src_type"), py::arg("dst"),
          py::arg("dst_type"), py::arg("shape"), py::arg("src_strides"), py::arg("dst_strides"),
          py::arg("scale") = 1.0, py::arg("zero_point") = 0.0, py::arg("rounding") = Rounding::ToNearestEven,
          py::arg("pad") = py::none(),
          R"doc(Convert a tensor between layouts and dtypes in one pass, without the GIL.

src, dst: contiguous buffer-protocol objects (raw bytes, or elements of the dtype), never copied.
src_type, dst_type: ElementType members. Same type: an element copy. Otherwise both must be in
CONVERTIBLE_TYPES: FLOAT32, FP16, BF16, INT8, UINT8 or UINT16 (through float32; int8/uint8/uint16 are
(de)quantized with scale and zero_point).
shape, src_strides, dst_strides: the iteration space and each axis' stride in elements, per side.
rounding: the Rounding used when quantizing.
pad: None, or a ChannelPadding.)doc");
    m.def("convert_isa", []() { return std::string(isa_name(g_isa.load(std::memory_order_relaxed))); },
          "The instruction set the conversion kernels use: 'avx512', 'avx2' or 'portable'.");
    m.def(
        "set_convert_isa",
        [](const std::string &name) {
            const Isa best = best_isa();
            std::optional<Isa> want;
            if (name == "auto") want = best;
            for (const IsaName &n : ISA_NAMES)
                if (name == n.name) want = n.isa;
            if (!want) throw ArgError("set_convert_isa: unknown instruction set '" + name + "'");
            if (*want > best)
                throw ArgError("set_convert_isa: this CPU cannot run '" + name + "' (best: " + isa_name(best) +
                               ")");
            g_isa.store(*want, std::memory_order_relaxed);
        },
        py::arg("name"), "Choose the kernels' instruction set ('auto', 'avx512', 'avx2', 'portable'), for tests.");
}
