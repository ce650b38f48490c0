/* 16-float vectors for the runtime's C kernels, on AVX-512 or on AVX2 with FMA.

   `vec` is one __m512 with AVX-512F and a pair of __m256 with AVX2, so a kernel is written once over
   16 lanes and both builds do the same operations on the same lanes in the same order: their
   results are bit-identical (the tests build both and compare). LS_ISA is 512 or 256, for the few
   places where a kernel picks tile shapes or a hand-written loop per instruction set. */

#ifndef LOOKUPSPEC_SIMD_H
#define LOOKUPSPEC_SIMD_H

#include <immintrin.h>

#if defined(__AVX512F__)
#define LS_ISA 512
typedef __m512 vec;
static inline vec v_zero(void) { return _mm512_setzero_ps(); }
static inline vec v_set(float a) { return _mm512_set1_ps(a); }
static inline vec v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vec v) { _mm512_storeu_ps(p, v); }
static inline vec v_add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec v_mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec v_max(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec v_fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec v_round(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* a * 2^n for integral n in [-127, 127] (exact) */
static inline vec v_pow2(vec a, vec n) {
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(a, _mm512_castsi512_ps(e));
}
/* lanes i + i+8 (as two 256-bit halves) */
static inline __m256 v_fold(vec v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
/* 16 signed bytes -> 16 floats (exact) */
static inline vec v_from_i8(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }
static inline vec v_load_i8(const void *p) { return v_from_i8(_mm_loadu_si128((const __m128i *)p)); }
/* 16 float16 -> 16 floats (exact) */
static inline vec v_from_f16(const void *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* Nibble t (0..7) of 16 words at p, minus off, as floats (exact): times 16^t for t < 7 (masked in
   place, no shift), times 1 for t = 7 (shifted down: in place it would reach the sign bit). */
static inline vec v_nibble_word(__m512i w, int t, int off) {
    __m512i m = t < 7 ? _mm512_and_si512(w, _mm512_set1_epi32(0xF << (4 * t))) : _mm512_srli_epi32(w, 28);
    if (off) m = _mm512_sub_epi32(m, _mm512_set1_epi32(t < 7 ? off << (4 * t) : off));
    return _mm512_cvtepi32_ps(m);
}
static inline vec v_nibble(const int *p, int t, int off) { return v_nibble_word(_mm512_loadu_si512(p), t, off); }
#elif defined(__AVX2__) && defined(__FMA__)
#define LS_ISA 256
typedef struct { __m256 lo, hi; } vec;
#define LS_V2(expr_lo, expr_hi) do { vec r_ = {expr_lo, expr_hi}; return r_; } while (0)
static inline vec v_zero(void) { LS_V2(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline vec v_set(float a) { LS_V2(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
static inline vec v_load(const float *p) { LS_V2(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline void v_store(float *p, vec v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
static inline vec v_add(vec a, vec b) { LS_V2(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
static inline vec v_sub(vec a, vec b) { LS_V2(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
static inline vec v_mul(vec a, vec b) { LS_V2(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
static inline vec v_max(vec a, vec b) { LS_V2(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
static inline vec v_fma(vec a, vec b, vec c) { LS_V2(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)); }
static inline vec v_round(vec a) {
    LS_V2(_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline __m256 ls_pow2_half(__m256 a, __m256 n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(a, _mm256_castsi256_ps(e));
}
static inline vec v_pow2(vec a, vec n) { LS_V2(ls_pow2_half(a.lo, n.lo), ls_pow2_half(a.hi, n.hi)); }
static inline __m256 v_fold(vec v) { return _mm256_add_ps(v.lo, v.hi); }
static inline vec v_from_i8(__m128i q) {
    LS_V2(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))));
}
/* 16 signed bytes at p -> 16 floats: each half widened straight from memory (no shift) */
static inline vec v_load_i8(const void *p) {
    LS_V2(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const char *)p + 8)))));
}
static inline vec v_from_f16(const void *p) {
    LS_V2(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1)));
}
static inline __m256 ls_nibble_half(__m256i w, int t, int off) {
    __m256i m = t < 7 ? _mm256_and_si256(w, _mm256_set1_epi32(0xF << (4 * t))) : _mm256_srli_epi32(w, 28);
    if (off) m = _mm256_sub_epi32(m, _mm256_set1_epi32(t < 7 ? off << (4 * t) : off));
    return _mm256_cvtepi32_ps(m);
}
static inline vec v_nibble(const int *p, int t, int off) {
    LS_V2(ls_nibble_half(_mm256_loadu_si256((const __m256i *)p), t, off),
          ls_nibble_half(_mm256_loadu_si256((const __m256i *)p + 1), t, off));
}
#else
#error "lookupspec's CPU kernels need AVX-512F or AVX2 with FMA"
#endif

/* The 16 lanes' sum: (i + i+8), then (i + i+4), (i + i+2), (i + i+1): the same tree in both ISAs. */
static inline float v_hsum(vec v) {
    __m256 a = v_fold(v);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(b);
}

#endif
