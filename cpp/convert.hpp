// Conversion kernels, instantiated once per instruction set.
//
// No include guard on purpose: convert.cpp includes this file several times, each time inside its own
// namespace and `#pragma GCC target(...)` region, so the same source becomes an AVX-512 clone, an
// AVX2+F16C clone and a portable (baseline x86-64 / any arch) clone. Whatever is in here must only use
// names declared before the include (Plan, Kind, Quant, the standard headers, <immintrin.h>) and the
// macros NPURT_AVX512 / NPURT_F16C / NPURT_SSSE3 (g++ does not update __AVX512F__ etc. under
// `#pragma GCC target`, so convert.cpp says what each clone may use).
//
// Every converter goes through float32: load(In) -> float -> store(Out). The scalar load/store functions
// are branch-free so that gcc's vectoriser turns the contiguous runs into SIMD loops; float32 <-> float16
// runs use F16C where the clone has it (rounding to nearest even, like the portable bit code). The AVX-512
// clone runs every kind 16 lanes at a time with intrinsics (VK below), and converts the 3-channel frame
// layouts (NHWC, HCWNC4) in registers, 16 pixels at a time, without a scratch pass.

// ---------------------------------------------------------------- scalar element conversions
static inline uint32_t f_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float bits_f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// IEEE binary16 -> binary32, exact; NaN payload kept.
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    const uint32_t normal = (em << 13) + 0x38000000u;            // rebias exponent 15 -> 127
    const uint32_t infnan = (em << 13) | 0x7f800000u;
    const uint32_t subnormal = f_bits(static_cast<float>(em) * 5.9604644775390625e-08f);  // em * 2^-24, exact
    uint32_t r = em >= 0x7c00u ? infnan : normal;
    r = em < 0x0400u ? subnormal : r;
    return bits_f(r | sign);
}

// IEEE binary32 -> binary16, round to nearest even; overflow -> inf; NaN -> quiet NaN with the top payload
// bits (what F16C's VCVTPS2PH does, so every clone gives the same bits).
static inline uint16_t float_to_half(float f) {
    uint32_t x = f_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    const uint32_t nan = 0x7e00u | ((x >> 13) & 0x3ffu);
    const uint32_t inf_or_nan = x > 0x7f800000u ? nan : 0x7c00u;
    // Subnormal results: adding 0.5 (as float) lines the mantissa up so the FPU rounds (to nearest even).
    const uint32_t sub = f_bits(bits_f(x) + 0.5f) - 0x3f000000u;
    const uint32_t odd = (x >> 13) & 1u;
    const uint32_t norm = (x + 0xc8000fffu + odd) >> 13;         // rebias 127 -> 15 and round, in one add
    uint32_t r = x < 0x38800000u ? sub : norm;                   // below 2^-14: subnormal half
    r = x >= 0x47800000u ? inf_or_nan : r;                       // 65520 and up rounds to inf
    return static_cast<uint16_t>(r | sign);
}

// binary32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
static inline uint16_t float_to_bf16(float f) {
    const uint32_t x = f_bits(f);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
    return static_cast<uint16_t>(nan ? ((x >> 16) | 0x40u) : rounded);
}

static inline float bf16_to_float(uint16_t b) { return bits_f(static_cast<uint32_t>(b) << 16); }

// ---------------------------------------------------------------- element kinds (load to / store from float)
struct LF32 { using T = float;    static float load(T v, const Quant &) { return v; } };
struct LF16 { using T = uint16_t; static float load(T v, const Quant &) { return half_to_float(v); } };
struct LBF16 { using T = uint16_t; static float load(T v, const Quant &) { return bf16_to_float(v); } };
struct LU8 { using T = uint8_t;  static float load(T v, const Quant &q) { return (static_cast<float>(v) - q.zero) * q.scale; } };
struct LI8 { using T = int8_t;   static float load(T v, const Quant &q) { return (static_cast<float>(v) - q.zero) * q.scale; } };

struct SF32 { using T = float;    static T store(float v, const Quant &) { return v; } };
struct SF16 { using T = uint16_t; static T store(float v, const Quant &) { return float_to_half(v); } };
struct SBF16 { using T = uint16_t; static T store(float v, const Quant &) { return float_to_bf16(v); } };

// Quantize: x / scale (a division, as ONNX QuantizeLinear and ONNX Runtime do, so results match them
// bit for bit), rounded, plus the zero point, saturated. NaN saturates to the lowest code (as MLAS does).
template <class IntT, int LO, int HI, bool TOWARD_ZERO>
struct SQ {
    using T = IntT;
    static T store(float v, const Quant &q) {
        float r = v / q.scale;
        r = TOWARD_ZERO ? __builtin_truncf(r) : __builtin_rintf(r);
        r = r + q.zero;
        r = r >= static_cast<float>(LO) ? r : static_cast<float>(LO);
        r = r <= static_cast<float>(HI) ? r : static_cast<float>(HI);
        return static_cast<T>(static_cast<int>(r));
    }
};
using SU8 = SQ<uint8_t, 0, 255, false>;
using SU8Z = SQ<uint8_t, 0, 255, true>;
using SI8 = SQ<int8_t, -128, 127, false>;
using SI8Z = SQ<int8_t, -128, 127, true>;

#if NPURT_AVX512
// ---------------------------------------------------------------- the element kinds, 16 lanes at a time
// V16<T>::V holds 16 elements of T: __m512 (float), __m256i (16-bit), __m128i (8-bit).
template <class T>
struct V16;
template <>
struct V16<float> {
    using V = __m512;
    static V load(const float *p) { return _mm512_loadu_ps(p); }
    static void store(float *p, V v) { _mm512_storeu_ps(p, v); }
    static void stream(float *p, V v) { _mm512_stream_ps(p, v); }  // p 64-byte aligned
};
template <>
struct V16<uint16_t> {
    using V = __m256i;
    static V load(const uint16_t *p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }
    static void store(uint16_t *p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), v); }
    static void stream(uint16_t *p, V v) { _mm256_stream_si256(reinterpret_cast<__m256i *>(p), v); }
};
template <class T8>
struct V16Byte {
    using V = __m128i;
    static V load(const T8 *p) { return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)); }
    static void store(T8 *p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i *>(p), v); }
    static void stream(T8 *p, V v) { _mm_stream_si128(reinterpret_cast<__m128i *>(p), v); }
};
template <>
struct V16<uint8_t> : V16Byte<uint8_t> {};
template <>
struct V16<int8_t> : V16Byte<int8_t> {};

// VK<L>::load: 16 elements -> 16 floats; VK<S>::store: 16 floats -> 16 elements; bit for bit the scalar
// functions above.
template <class K>
struct VK;
template <>
struct VK<LF32> { static __m512 load(__m512 v, const Quant &) { return v; } };
template <>
struct VK<LF16> { static __m512 load(__m256i v, const Quant &) { return _mm512_cvtph_ps(v); } };
template <>
struct VK<LBF16> {
    static __m512 load(__m256i v, const Quant &) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    }
};
template <>
struct VK<LU8> {
    static __m512 load(__m128i v, const Quant &q) {
        const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
        return _mm512_mul_ps(_mm512_sub_ps(x, _mm512_set1_ps(q.zero)), _mm512_set1_ps(q.scale));
    }
};
template <>
struct VK<LI8> {
    static __m512 load(__m128i v, const Quant &q) {
        const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
        return _mm512_mul_ps(_mm512_sub_ps(x, _mm512_set1_ps(q.zero)), _mm512_set1_ps(q.scale));
    }
};
template <>
struct VK<SF32> { static __m512 store(__m512 v, const Quant &) { return v; } };
template <>
struct VK<SF16> {
    static __m256i store(__m512 v, const Quant &) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
};
// bfloat16: the same integer rounding as float_to_bf16.
template <>
struct VK<SBF16> {
    static __m256i store(__m512 v, const Quant &) {
        const __m512i x = _mm512_castps_si512(v);
        const __m512i hi = _mm512_srli_epi32(x, 16);
        const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd), 16);
        r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r,
                                    _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
        return _mm512_cvtepi32_epi16(r);
    }
};
// Quantize: divide, round, add the zero point, saturate (MAXPS gives the second operand for NaN, so
// NaN -> LO like the scalar code), narrow.
template <class IntT, int LO, int HI, bool TOWARD_ZERO>
struct VK<SQ<IntT, LO, HI, TOWARD_ZERO>> {
    static __m128i store(__m512 v, const Quant &q) {
        __m512 r = _mm512_div_ps(v, _mm512_set1_ps(q.scale));
        r = TOWARD_ZERO ? _mm512_roundscale_ps(r, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)
                        : _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_add_ps(r, _mm512_set1_ps(q.zero));
        r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(static_cast<float>(LO))),
                          _mm512_set1_ps(static_cast<float>(HI)));
        return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r));
    }
};
#endif

// A converter: In -> Out, one element (cvt) or a contiguous run (run).
template <class L, class S>
struct Cvt {
    using In = typename L::T;
    using Out = typename S::T;
    static inline Out one(In v, const Quant &q) { return S::store(L::load(v, q), q); }
#if NPURT_AVX512
    static inline typename V16<Out>::V vec(typename V16<In>::V v, const Quant &q) {
        return VK<S>::store(VK<L>::load(v, q), q);
    }
#endif
    static void run(const In *__restrict s, Out *__restrict d, int64_t n, const Quant &q) {
        const Quant qq = q;  // a local copy, so the compiler knows stores cannot alias it
        int64_t i = 0;
#if NPURT_AVX512
        for (; i + 16 <= n; i += 16) V16<Out>::store(d + i, vec(V16<In>::load(s + i), qq));
#endif
        for (; i < n; ++i) d[i] = S::store(L::load(s[i], qq), qq);
    }
};

#if NPURT_F16C && !NPURT_AVX512  // (the AVX-512 clone: VK above)
template <>
void Cvt<LF32, SF16>::run(const float *__restrict s, uint16_t *__restrict d, int64_t n, const Quant &) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(d + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) d[i] = float_to_half(s[i]);
}

template <>
void Cvt<LF16, SF32>::run(const uint16_t *__restrict s, float *__restrict d, int64_t n, const Quant &) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i))));
    for (; i < n; ++i) d[i] = half_to_float(s[i]);
}

template <>
void Cvt<LF32, SBF16>::run(const float *__restrict s, uint16_t *__restrict d, int64_t n, const Quant &) {
    const __m256i c7fff = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i out[2];
        for (int h = 0; h < 2; ++h) {
            const __m256 v = _mm256_loadu_ps(s + i + 8 * h);
            const __m256i x = _mm256_castps_si256(v);
            const __m256i hi = _mm256_srli_epi32(x, 16);
            const __m256i r = _mm256_srli_epi32(
                _mm256_add_epi32(_mm256_add_epi32(x, c7fff), _mm256_and_si256(hi, one)), 16);
            const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            out[h] = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        }
        // values fit in 16 bits, so the saturating pack is exact; it interleaves 128-bit lanes: fix the order
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out[0], out[1]), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), packed);
    }
    for (; i < n; ++i) d[i] = float_to_bf16(s[i]);
}
#endif

// Same dtype: a plain copy of elements of this size.
template <class U>
struct Raw {
    using In = U;
    using Out = U;
    static inline U one(U v, const Quant &) { return v; }
    static void run(const U *__restrict s, U *__restrict d, int64_t n, const Quant &) {
        std::memcpy(d, s, static_cast<size_t>(n) * sizeof(U));
    }
};

// ---------------------------------------------------------------- 3-channel byte (de)interleave
// Generic loops; with SSSE3, RGB bytes go through PSHUFB (gcc does not vectorise groups of 3 bytes well).
template <class T>
static inline void deinterleave3(const T *__restrict s, T *__restrict r, T *__restrict g, T *__restrict b,
                                 int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        r[i] = s[3 * i];
        g[i] = s[3 * i + 1];
        b[i] = s[3 * i + 2];
    }
}
template <class T>
static inline void interleave3(const T *__restrict r, const T *__restrict g, const T *__restrict b,
                               T *__restrict d, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        d[3 * i] = r[i];
        d[3 * i + 1] = g[i];
        d[3 * i + 2] = b[i];
    }
}
#if NPURT_SSSE3
static inline __m128i shuf3(__m128i a, __m128i b, __m128i c, __m128i ma, __m128i mb, __m128i mc) {
    return _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, ma), _mm_shuffle_epi8(b, mb)), _mm_shuffle_epi8(c, mc));
}
// 16 RGB pixels (48 bytes at s) -> 16 bytes of each channel.
static inline void split3x16(const uint8_t *s, __m128i v[3]) {
    const __m128i ra = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i rb = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
    const __m128i rc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
    const __m128i ga = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i gb = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
    const __m128i gc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
    const __m128i ba = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i bb = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
    const __m128i bc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 16));
    const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 32));
    v[0] = shuf3(x0, x1, x2, ra, rb, rc);
    v[1] = shuf3(x0, x1, x2, ga, gb, gc);
    v[2] = shuf3(x0, x1, x2, ba, bb, bc);
}
// 16 bytes of each channel -> 16 RGB pixels (48 bytes at d).
static inline void merge3x16(const __m128i v[3], uint8_t *d) {
    // output byte j of each 16-byte block takes channel j % 3 of pixel j / 3 (+ 16 / 3 offsets per block)
    const __m128i a0 = _mm_setr_epi8(0, -1, -1, 1, -1, -1, 2, -1, -1, 3, -1, -1, 4, -1, -1, 5);
    const __m128i a1 = _mm_setr_epi8(-1, 0, -1, -1, 1, -1, -1, 2, -1, -1, 3, -1, -1, 4, -1, -1);
    const __m128i a2 = _mm_setr_epi8(-1, -1, 0, -1, -1, 1, -1, -1, 2, -1, -1, 3, -1, -1, 4, -1);
    const __m128i b0 = _mm_setr_epi8(-1, -1, 6, -1, -1, 7, -1, -1, 8, -1, -1, 9, -1, -1, 10, -1);
    const __m128i b1 = _mm_setr_epi8(5, -1, -1, 6, -1, -1, 7, -1, -1, 8, -1, -1, 9, -1, -1, 10);
    const __m128i b2 = _mm_setr_epi8(-1, 5, -1, -1, 6, -1, -1, 7, -1, -1, 8, -1, -1, 9, -1, -1);
    const __m128i c0 = _mm_setr_epi8(-1, 11, -1, -1, 12, -1, -1, 13, -1, -1, 14, -1, -1, 15, -1, -1);
    const __m128i c1 = _mm_setr_epi8(-1, -1, 11, -1, -1, 12, -1, -1, 13, -1, -1, 14, -1, -1, 15, -1);
    const __m128i c2 = _mm_setr_epi8(10, -1, -1, 11, -1, -1, 12, -1, -1, 13, -1, -1, 14, -1, -1, 15);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(d), shuf3(v[0], v[1], v[2], a0, a1, a2));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(d + 16), shuf3(v[0], v[1], v[2], b0, b1, b2));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(d + 32), shuf3(v[0], v[1], v[2], c0, c1, c2));
}
static inline void deinterleave3(const uint8_t *__restrict s, uint8_t *__restrict r, uint8_t *__restrict g,
                                 uint8_t *__restrict b, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i v[3];
        split3x16(s + 3 * i, v);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(r + i), v[0]);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(g + i), v[1]);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(b + i), v[2]);
    }
    for (; i < n; ++i) {
        r[i] = s[3 * i];
        g[i] = s[3 * i + 1];
        b[i] = s[3 * i + 2];
    }
}
static inline void interleave3(const uint8_t *__restrict r, const uint8_t *__restrict g,
                               const uint8_t *__restrict b, uint8_t *__restrict d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i v[3] = {_mm_loadu_si128(reinterpret_cast<const __m128i *>(r + i)),
                              _mm_loadu_si128(reinterpret_cast<const __m128i *>(g + i)),
                              _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + i))};
        merge3x16(v, d + 3 * i);
    }
    for (; i < n; ++i) {
        d[3 * i] = r[i];
        d[3 * i + 1] = g[i];
        d[3 * i + 2] = b[i];
    }
}
static inline void deinterleave3(const int8_t *s, int8_t *r, int8_t *g, int8_t *b, int64_t n) {
    deinterleave3(reinterpret_cast<const uint8_t *>(s), reinterpret_cast<uint8_t *>(r),
                  reinterpret_cast<uint8_t *>(g), reinterpret_cast<uint8_t *>(b), n);
}
static inline void interleave3(const int8_t *r, const int8_t *g, const int8_t *b, int8_t *d, int64_t n) {
    interleave3(reinterpret_cast<const uint8_t *>(r), reinterpret_cast<const uint8_t *>(g),
                reinterpret_cast<const uint8_t *>(b), reinterpret_cast<uint8_t *>(d), n);
}
#endif

// ---------------------------------------------------------------- 4-lane 16-bit groups (HCWNC4 fp16 / bf16)
// A group of four 16-bit lanes is one 64-bit word: pack / unpack with shifts, which gcc vectorises, instead
// of a 4-way scatter / gather.
template <class T>
static inline void interleave4(const T *__restrict t0, const T *__restrict t1, const T *__restrict t2,
                               const T *__restrict t3, T *__restrict d, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        d[4 * i] = t0[i];
        d[4 * i + 1] = t1[i];
        d[4 * i + 2] = t2[i];
        d[4 * i + 3] = t3[i];
    }
}
typedef uint64_t word64 __attribute__((may_alias, aligned(2)));  // four 16-bit lanes, any 2-byte address
static inline void interleave4(const uint16_t *__restrict t0, const uint16_t *__restrict t1,
                               const uint16_t *__restrict t2, const uint16_t *__restrict t3,
                               uint16_t *__restrict d, int64_t n) {
    word64 *__restrict w = reinterpret_cast<word64 *>(d);
    for (int64_t i = 0; i < n; ++i)
        w[i] = static_cast<uint64_t>(t0[i]) | static_cast<uint64_t>(t1[i]) << 16 |
               static_cast<uint64_t>(t2[i]) << 32 | static_cast<uint64_t>(t3[i]) << 48;
}
// Lanes 0..G-1 of 4-lane groups (G = 3: the real channels of a padded group of 4).
template <int G, class T>
static inline void deinterleave_of4(const T *__restrict s, T *__restrict t, int64_t chunk, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        for (int g = 0; g < G; ++g) t[g * chunk + i] = s[4 * i + g];
}
template <int G>
static inline void deinterleave_of4(const uint16_t *__restrict s, uint16_t *__restrict t, int64_t chunk, int64_t n) {
    const word64 *__restrict w = reinterpret_cast<const word64 *>(s);
    int64_t i = 0;
    for (; i + 1 < n; ++i) {  // the last group lane by lane: the buffer may end after its last real lane
        const uint64_t v = w[i];
        t[i] = static_cast<uint16_t>(v);
        if (G > 1) t[chunk + i] = static_cast<uint16_t>(v >> 16);
        if (G > 2) t[2 * chunk + i] = static_cast<uint16_t>(v >> 32);
        if (G > 3) t[3 * chunk + i] = static_cast<uint16_t>(v >> 48);
    }
    for (; i < n; ++i)
        for (int g = 0; g < G; ++g) t[g * chunk + i] = s[4 * i + g];
}

#if NPURT_AVX512
// ---------------------------------------------------------------- 16 pixels of 3 channels, in registers
// The layouts converted on every frame hold 3 channels in groups of STEP elements: 3 (NHWC) or 4 (HCWNC4,
// the fourth lane padding). split16: 16 groups -> one vector per channel; merge16: the reverse, zeroing a
// fourth lane. 16-bit lanes go through VPERMT2W (a word gather from two registers, indices below).
struct WordIx {
    alignas(64) uint16_t v[3][32];
};
static constexpr WordIx split_ix(int step) {  // v[c]: word c + step * i of the 16 groups, i = 0..15
    WordIx w{};
    for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 32; ++i) w.v[c][i] = static_cast<uint16_t>((c + step * i) & 63);
    return w;
}
static constexpr WordIx merge_ix(int step) {  // v[h]: output word j = 32 h + i is channel j % step of
    WordIx w{};                                // pixel j / step, from the words {c0, c1 | c2}: 16 c + pixel
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 32; ++i) {
            const int j = 32 * h + i, c = j % step;
            w.v[h][i] = static_cast<uint16_t>(c < 3 ? (16 * c + j / step) & 63 : 0);
        }
    return w;
}
constexpr WordIx SPLIT3 = split_ix(3), SPLIT4 = split_ix(4), MERGE3 = merge_ix(3), MERGE4 = merge_ix(4);

template <int STEP>
static inline void split16(const uint16_t *s, __m256i v[3]) {
    const __m512i a = _mm512_loadu_si512(s);
    const __m512i b = STEP == 3 ? _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 32)))
                                : _mm512_loadu_si512(s + 32);  // (16 groups of 3: 48 words, read no further)
    const WordIx &ix = STEP == 3 ? SPLIT3 : SPLIT4;
    for (int c = 0; c < 3; ++c)
        v[c] = _mm512_castsi512_si256(_mm512_permutex2var_epi16(a, _mm512_load_si512(ix.v[c]), b));
}
template <int STEP>
static inline void merge16(const __m256i v[3], uint16_t *d) {
    const __m512i a = _mm512_inserti64x4(_mm512_castsi256_si512(v[0]), v[1], 1);
    const __m512i b = _mm512_castsi256_si512(v[2]);
    if (STEP == 3) {
        _mm512_storeu_si512(d, _mm512_permutex2var_epi16(a, _mm512_load_si512(MERGE3.v[0]), b));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + 32),
                            _mm512_castsi512_si256(_mm512_permutex2var_epi16(a, _mm512_load_si512(MERGE3.v[1]), b)));
    } else {
        const __mmask32 real = 0x77777777;  // lane 3 of each group of 4 is padding: zero
        _mm512_storeu_si512(d, _mm512_maskz_permutex2var_epi16(real, a, _mm512_load_si512(MERGE4.v[0]), b));
        _mm512_storeu_si512(d + 32, _mm512_maskz_permutex2var_epi16(real, a, _mm512_load_si512(MERGE4.v[1]), b));
    }
}
template <int STEP>
static inline void split16(const uint8_t *s, __m128i v[3]) {
    static_assert(STEP == 3, "bytes: groups of 3 only");
    split3x16(s, v);
}
template <int STEP>
static inline void split16(const int8_t *s, __m128i v[3]) {
    split16<STEP>(reinterpret_cast<const uint8_t *>(s), v);
}
template <int STEP>
static inline void merge16(const __m128i v[3], uint8_t *d) {
    static_assert(STEP == 3, "bytes: groups of 3 only");
    merge3x16(v, d);
}
template <int STEP>
static inline void merge16(const __m128i v[3], int8_t *d) {
    merge16<STEP>(v, reinterpret_cast<uint8_t *>(d));
}

template <class C>
struct IsCvt : std::false_type {};
template <class L, class S>
struct IsCvt<Cvt<L, S>> : std::true_type {};
#endif

// ---------------------------------------------------------------- the engine
template <class C>
struct Engine {
    using In = typename C::In;
    using Out = typename C::Out;
    static constexpr int64_t CHUNK = 512;  // elements per row of the interleave scratch (fits L1 with 16 rows)
    static constexpr int64_t TILE = 32;    // square tiles for large transposes

    // ---- interleave: G contiguous rows (already converted) -> G-element groups every `step` elements
    template <int G>
    static void interleave_fixed(const Out *__restrict t, Out *__restrict d, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
            for (int g = 0; g < G; ++g) d[i * G + g] = t[g * CHUNK + i];
    }
    static void interleave_any(const Out *__restrict t, int64_t rows, Out *__restrict d, int64_t n, int64_t step) {
        for (int64_t i = 0; i < n; ++i)
            for (int64_t g = 0; g < rows; ++g) d[i * step + g] = t[g * CHUNK + i];
    }
    // ---- deinterleave: G-element groups every STEP elements -> G contiguous rows (not yet converted)
    template <int G, int STEP>
    static void deinterleave_fixed(const In *__restrict s, In *__restrict t, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
            for (int g = 0; g < G; ++g) t[g * CHUNK + i] = s[i * STEP + g];
    }
    static void deinterleave_any(const In *__restrict s, int64_t rows, int64_t step, In *__restrict t, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
            for (int64_t g = 0; g < rows; ++g) t[g * CHUNK + i] = s[i * step + g];
    }

    // dst(a, b) = cvt(src(a, b)); dst contiguous along a (extent na, of which the first va are real and the
    // rest zero padding), src contiguous along b (extent nb); src a-stride sa, dst b-stride db.
    static void interleave(const In *s, Out *d, int64_t na, int64_t va, int64_t nb, int64_t sa, int64_t db,
                           const Quant &q) {
#if NPURT_AVX512
        if constexpr (IsCvt<C>::value && sizeof(Out) <= 2) {
            if (va == 3 && db == na && na == 3) return merge3_fused<3>(s, d, nb, sa, q);
            if constexpr (sizeof(Out) == 2)
                if (va == 3 && db == na && na == 4) return merge3_fused<4>(s, d, nb, sa, q);
        }
#endif
        alignas(64) Out t[16 * CHUNK];
        for (int64_t a = va; a < na; ++a) std::memset(t + a * CHUNK, 0, sizeof(Out) * CHUNK);
        for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
            const int64_t n = std::min(CHUNK, nb - b0);
            for (int64_t a = 0; a < va; ++a) C::run(s + a * sa + b0, t + a * CHUNK, n, q);
            Out *dd = d + b0 * db;
            if (db == na) {
                switch (na) {
                    case 2: interleave_fixed<2>(t, dd, n); continue;
                    case 3: interleave3(t, t + CHUNK, t + 2 * CHUNK, dd, n); continue;
                    case 4: interleave4(t, t + CHUNK, t + 2 * CHUNK, t + 3 * CHUNK, dd, n); continue;
                    case 8: interleave_fixed<8>(t, dd, n); continue;
                    case 16: interleave_fixed<16>(t, dd, n); continue;
                    default: break;
                }
            }
            interleave_any(t, na, dd, n, db);
        }
    }

    // dst(a, b) = cvt(src(a, b)); dst contiguous along a (extent na), src contiguous along b (nb real
    // elements; any padding after them is skipped); src a-stride sa, dst b-stride db.
    static void deinterleave(const In *s, Out *d, int64_t na, int64_t nb, int64_t sa, int64_t db, const Quant &q,
                             bool stream) {
#if NPURT_AVX512
        if constexpr (IsCvt<C>::value && sizeof(In) <= 2) {
            if (nb == 3 && sa == 3) return split3_fused<3>(s, d, na, db, q, stream);
            if constexpr (sizeof(In) == 2)
                if (nb == 3 && sa == 4) return split3_fused<4>(s, d, na, db, q, stream);
        }
#else
        (void)stream;
#endif
        alignas(64) In t[16 * CHUNK];
        for (int64_t a0 = 0; a0 < na; a0 += CHUNK) {
            const int64_t n = std::min(CHUNK, na - a0);
            const In *ss = s + a0 * sa;
            bool done = true;
            switch (nb * 100 + sa) {
                case 202: deinterleave_fixed<2, 2>(ss, t, n); break;
                case 303: deinterleave3(ss, t, t + CHUNK, t + 2 * CHUNK, n); break;
                case 304: deinterleave_of4<3>(ss, t, CHUNK, n); break;
                case 404: deinterleave_of4<4>(ss, t, CHUNK, n); break;
                case 204: deinterleave_fixed<2, 4>(ss, t, n); break;
                case 808: deinterleave_fixed<8, 8>(ss, t, n); break;
                case 1616: deinterleave_fixed<16, 16>(ss, t, n); break;
                default: done = false;
            }
            if (!done) deinterleave_any(ss, nb, sa, t, n);
            for (int64_t b = 0; b < nb; ++b) C::run(t + b * CHUNK, d + b * db + a0, n, q);
        }
    }

#if NPURT_AVX512
    // 3 channels in groups of STEP <-> 3 rows, 16 pixels at a time in registers, converted on the way: one
    // pass over memory and no scratch (the layouts a runner converts on every frame).
    template <int STEP>
    static void merge3_fused(const In *s, Out *d, int64_t nb, int64_t sa, const Quant &q) {
        const Quant qq = q;
        auto one_by_one = [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) {
                for (int c = 0; c < 3; ++c) d[b * STEP + c] = C::one(s[c * sa + b], qq);
                if (STEP == 4) d[b * STEP + 3] = Out(0);
            }
        };
        // Source vectors that straddle cache lines halve the speed (f32 -> HCWNC4 bf16: 0.9 -> 1.8 ms a
        // frame): the first pixels go one by one up to an aligned source, when that aligns all three rows.
        constexpr uintptr_t VB = 16 * sizeof(In);
        const uintptr_t addr = reinterpret_cast<uintptr_t>(s);
        const int64_t head = addr % sizeof(In) == 0 && (sa * sizeof(In)) % VB == 0
                                 ? std::min<int64_t>(nb, static_cast<int64_t>((VB - addr % VB) % VB / sizeof(In)))
                                 : 0;
        one_by_one(0, head);
        int64_t b = head;
        for (; b + 16 <= nb; b += 16) {
            typename V16<Out>::V v[3];
            for (int c = 0; c < 3; ++c) v[c] = C::vec(V16<In>::load(s + c * sa + b), qq);
            merge16<STEP>(v, d + b * STEP);
        }
        one_by_one(b, nb);
    }
    template <int STEP, bool NT>
    static int64_t split3_rows(const In *s, Out *d, int64_t a, int64_t na, int64_t db, const Quant &q) {
        // Groups of 4 are read whole, padding lane included: the last group is left to the scalar tail, the
        // source buffer may end after its last real lane.
        const int64_t end = STEP == 4 ? na - 1 : na;
        for (; a + 16 <= end; a += 16) {
            typename V16<In>::V v[3];
            split16<STEP>(s + a * STEP, v);
            for (int c = 0; c < 3; ++c) {
                if (NT) V16<Out>::stream(d + c * db + a, C::vec(v[c], q));
                else V16<Out>::store(d + c * db + a, C::vec(v[c], q));
            }
        }
        return a;
    }
    template <int STEP>
    static void split3_fused(const In *s, Out *d, int64_t na, int64_t db, const Quant &q, bool stream) {
        // Streaming stores write aligned vectors: the first pixels go one by one up to an aligned address,
        // when that aligns all three rows (otherwise ordinary stores).
        constexpr uintptr_t VB = 16 * sizeof(Out);
        const uintptr_t addr = reinterpret_cast<uintptr_t>(d);
        const bool nt = stream && addr % sizeof(Out) == 0 && (db * sizeof(Out)) % VB == 0;
        const int64_t head = nt ? std::min<int64_t>(na, static_cast<int64_t>((VB - addr % VB) % VB / sizeof(Out))) : 0;
        const Quant qq = q;
        auto one_by_one = [&](int64_t a0, int64_t a1) {
            for (int64_t a = a0; a < a1; ++a)
                for (int c = 0; c < 3; ++c) d[c * db + a] = C::one(s[a * STEP + c], qq);
        };
        one_by_one(0, head);
        const int64_t a = nt ? split3_rows<STEP, true>(s, d, head, na, db, qq) : split3_rows<STEP, false>(s, d, 0, na, db, qq);
        if (nt) _mm_sfence();  // streaming stores are weakly ordered: make them visible before returning
        one_by_one(a, na);
    }
#endif

    // Both extents large: square tiles through a scratch block, so reads and writes stay in cache lines.
    static void tiles(const In *s, Out *d, int64_t na, int64_t nb, int64_t sa, int64_t db, const Quant &q) {
        alignas(64) Out t[TILE * TILE];
        for (int64_t b0 = 0; b0 < nb; b0 += TILE) {
            const int64_t tb = std::min(TILE, nb - b0);
            for (int64_t a0 = 0; a0 < na; a0 += TILE) {
                const int64_t ta = std::min(TILE, na - a0);
                for (int64_t a = 0; a < ta; ++a) C::run(s + (a0 + a) * sa + b0, t + a * TILE, tb, q);
                for (int64_t b = 0; b < tb; ++b) {
                    Out *dd = d + (b0 + b) * db + a0;
                    for (int64_t a = 0; a < ta; ++a) dd[a] = t[a * TILE + b];
                }
            }
        }
    }

    // Short contiguous groups (an NHWC pixel, an HCWNC lane group) repeated along another axis r.
    template <int G>
    static void groups_fixed(const In *__restrict s, Out *__restrict d, int64_t nr, int64_t sr, int64_t dr,
                             int64_t zeros, const Quant &q) {
        const Quant qq = q;
        for (int64_t r = 0; r < nr; ++r) {
            for (int g = 0; g < G; ++g) d[r * dr + g] = C::one(s[r * sr + g], qq);
            for (int64_t z = 0; z < zeros; ++z) d[r * dr + G + z] = Out(0);
        }
    }
    static void groups(const In *s, Out *d, int64_t g, int64_t zeros, int64_t nr, int64_t sr, int64_t dr,
                       const Quant &q) {
        switch (g) {
            case 1: groups_fixed<1>(s, d, nr, sr, dr, zeros, q); return;
            case 2: groups_fixed<2>(s, d, nr, sr, dr, zeros, q); return;
            case 3: groups_fixed<3>(s, d, nr, sr, dr, zeros, q); return;
            case 4: groups_fixed<4>(s, d, nr, sr, dr, zeros, q); return;
            default:
                for (int64_t r = 0; r < nr; ++r) {
                    C::run(s + r * sr, d + r * dr, g, q);
                    for (int64_t z = 0; z < zeros; ++z) d[r * dr + g + z] = Out(0);
                }
        }
    }

    static void zero_inner(const Plan &p, Out *d) {
        // Zero the inner block of a padding lane (all inner axes, dst strides).
        int64_t idx[MAX_AXES] = {0};
        const int ni = p.n_inner;
        if (ni == 0) { *d = Out(0); return; }
        for (;;) {
            int64_t off = 0;
            for (int k = 0; k < ni; ++k) off += idx[k] * p.ds[p.inner[k]];
            d[off] = Out(0);
            int k = ni - 1;
            for (; k >= 0; --k) {
                if (++idx[k] < p.n[p.inner[k]]) break;
                idx[k] = 0;
            }
            if (k < 0) return;
        }
    }

    // Element by element over every axis, padding checked per element: the path for whatever no faster
    // kernel fits (a channel-group axis inside the block, odd strides on both sides).
    static void elementwise(const Plan &p, const In *s, Out *d) {
        int64_t idx[MAX_AXES] = {0};
        const Quant q = p.q;
        const int nd = p.nd;
        for (;;) {
            int64_t so = 0, dof = 0;
            for (int k = 0; k < nd; ++k) { so += idx[k] * p.ss[k]; dof += idx[k] * p.ds[k]; }
            const bool real = p.pad_lane < 0 || idx[p.pad_group] * p.pad_k + idx[p.pad_lane] < p.pad_limit;
            if (real) d[dof] = C::one(s[so], q);
            else if (p.dst_padded) d[dof] = Out(0);
            int k = nd - 1;
            for (; k >= 0; --k) {
                if (++idx[k] < p.n[k]) break;
                idx[k] = 0;
            }
            if (k < 0) return;
        }
    }

    static void execute(const Plan &p) {
        const In *S = reinterpret_cast<const In *>(p.src);
        Out *D = reinterpret_cast<Out *>(p.dst);
        if (p.mode == MODE_ELEMENTWISE) { elementwise(p, S, D); return; }
        int64_t idx[MAX_AXES] = {0};
        const int no = p.n_outer;
        for (;;) {
            int64_t so = 0, dof = 0;
            for (int k = 0; k < no; ++k) { so += idx[k] * p.ss[p.outer[k]]; dof += idx[k] * p.ds[p.outer[k]]; }
            // How many lanes of a padded channel group are real here (-1: no padding in the inner block).
            int64_t valid = -1;
            bool skip = false;
            if (p.pad_lane >= 0) {
                int64_t group = 0, lane = -1;
                for (int k = 0; k < no; ++k) {
                    if (p.outer[k] == p.pad_group) group = idx[k];
                    if (p.outer[k] == p.pad_lane) lane = idx[k];
                }
                const int64_t base = group * p.pad_k;
                if (lane >= 0) skip = base + lane >= p.pad_limit;
                else valid = std::max<int64_t>(0, std::min<int64_t>(p.pad_k, p.pad_limit - base));
            }
            if (skip) {
                if (p.dst_padded) zero_inner(p, D + dof);
            } else {
                run_inner(p, S + so, D + dof, valid);
            }
            int k = no - 1;
            for (; k >= 0; --k) {
                if (++idx[k] < p.n[p.outer[k]]) break;
                idx[k] = 0;
            }
            if (k < 0) return;
        }
    }

    static void run_inner(const Plan &p, const In *s, Out *d, int64_t valid) {
        const int A = p.inner[0];
        const int64_t na = p.n[A];
        switch (p.mode) {
            case MODE_RUN: {  // contiguous on both sides along A
                const int64_t v = (valid >= 0 && p.pad_lane == A) ? valid : na;
                C::run(s, d, v, p.q);
                if (p.dst_padded && v < na) std::memset(d + v, 0, sizeof(Out) * (na - v));
                return;
            }
            case MODE_GROUPS: {  // short contiguous groups along A, repeated along R
                const int R = p.inner[1];
                const int64_t v = (valid >= 0 && p.pad_lane == A) ? valid : na;
                groups(s, d, v, p.dst_padded ? na - v : 0, p.n[R], p.ss[R], p.ds[R], p.q);
                return;
            }
            case MODE_TRANSPOSE: {  // dst contiguous along A, src contiguous along B
                const int B = p.inner[1];
                const int64_t nb = p.n[B];
                const int64_t va = (valid >= 0 && p.pad_lane == A) ? valid : na;
                const int64_t vb = (valid >= 0 && p.pad_lane == B) ? valid : nb;
                if (na <= 16) interleave(s, d, p.dst_padded ? na : va, va, vb, p.ss[A], p.ds[B], p.q);
                else if (vb <= 16) deinterleave(s, d, va, vb, p.ss[A], p.ds[B], p.q, p.stream);
                else tiles(s, d, va, vb, p.ss[A], p.ds[B], p.q);
                return;
            }
            default: {  // MODE_STRIDED: one strided axis
                const int64_t v = (valid >= 0 && p.pad_lane == A) ? valid : na;
                const int64_t sa = p.ss[A], da = p.ds[A];
                for (int64_t i = 0; i < v; ++i) d[i * da] = C::one(s[i * sa], p.q);
                if (p.dst_padded)
                    for (int64_t i = v; i < na; ++i) d[i * da] = Out(0);
                return;
            }
        }
    }
};

// ---------------------------------------------------------------- dispatch on the element kinds
// The SIMD clones carry the conversions between a CPU view and a HW view (and raw copies); the portable
// clone carries every pair. Keeping the clones small keeps the build time reasonable.
template <class L>
static bool run_from(const Plan &p) {
#if NPURT_SUBSET
    const bool wanted = p.in_kind == K_F32 || p.out_kind == K_F32 ||
                        ((p.in_kind == K_U8 || p.in_kind == K_F16 || p.in_kind == K_BF16) &&
                         (p.out_kind == K_F16 || p.out_kind == K_BF16));
    if (!wanted) return false;
#endif
    switch (p.out_kind) {
        case K_F32: Engine<Cvt<L, SF32>>::execute(p); return true;
        case K_F16: Engine<Cvt<L, SF16>>::execute(p); return true;
        case K_BF16: Engine<Cvt<L, SBF16>>::execute(p); return true;
        case K_U8: if (p.toward_zero) Engine<Cvt<L, SU8Z>>::execute(p); else Engine<Cvt<L, SU8>>::execute(p); return true;
        case K_I8: if (p.toward_zero) Engine<Cvt<L, SI8Z>>::execute(p); else Engine<Cvt<L, SI8>>::execute(p); return true;
        default: return false;
    }
}

static bool run_plan(const Plan &p) {
    if (p.raw_size) {
        switch (p.raw_size) {
            case 1: Engine<Raw<uint8_t>>::execute(p); return true;
            case 2: Engine<Raw<uint16_t>>::execute(p); return true;
            case 4: Engine<Raw<uint32_t>>::execute(p); return true;
            case 8: Engine<Raw<uint64_t>>::execute(p); return true;
            default: return false;
        }
    }
    switch (p.in_kind) {
        case K_F32: return run_from<LF32>(p);
        case K_F16: return run_from<LF16>(p);
        case K_BF16: return run_from<LBF16>(p);
        case K_U8: return run_from<LU8>(p);
        case K_I8: return run_from<LI8>(p);
        default: return false;
    }
}
