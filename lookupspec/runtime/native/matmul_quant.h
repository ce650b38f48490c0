/* ------------------------------------------------------------------------------------------------
   Quantized weights (GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), multiplied without a
   float copy of the model. Up to QREG_M rows (decode steps, small draft trees) every weight vector is
   dequantized in registers right before the multiply-adds of the tile's rows that use it; past that
   (prompt chunks, big trees) each tile's 16-column blocks are dequantized over the whole K into a
   per-thread panel that stays in L2, and the float kernel's own tiles multiply it, every row tile
   reusing one dequantization. Either way every output is the float kernel's fused multiply-add chain
   on the dequantized weights, bit for bit.

   The weights are regrouped at load (quantized.py) by 16 output rows, each field a plane whose
   innermost dimension is the group's 16 rows, so the k-th weights of 16 rows are one 16-lane
   vector: group g of a plane starts at g times the plane's bytes per group.
     q   kind 8 (Q8_0): int8 [K][16]. Kind 4 (Q4_0, Q4_1, Q4_K): 32-bit words [K/8][16], nibble t
         of word j holding value 8j + t, so that 16 rows' value k is one masked vector (v_nibble).
         Kinds 5 and 6 (their 4 low bits): [K/32][16][16] bytes, byte i of chunk c holding value
         32c + i in its low nibble and 32c + 16 + i in its high one
     hb  the values' high bits: kind 5 one bit [K/8][16] (bit k % 8), kind 6 two [K/4][16]
         (bits 2 (k % 4), +1)
     d   float16 [K/bs][16] per block; dm float16 [K/bs][16] (Q4_1, Q5_1: the block's minimum;
         K-quants: dmin)
     sc  int8 [K/ss][16] per sub-block (K-quants' scales); mn int8 [K/ss][16] (Q4_K, Q5_K: mins)
   A weight is gguf's dequantization with its float32 operations, each rounded on its own (this file
   is built with -ffp-contract=off):
     w = A * (q - off) [+ B | - B],  A = d [* sc],  B = dm [* mn]
   as gguf.quants computes it: Q4_1 d * q + m; Q4_K (d * sc) * q - (dmin * m); Q6_K (d * sc) * q.
   Kind 4 multiplies A * 16^-t by (q - off) * 16^t (the nibble masked in place): the same exact
   product, so the same weight. */

#include <stdint.h>
#include <stdlib.h>

typedef struct {
    const int8_t *q; const uint8_t *hb; const uint16_t *d, *dm; const int8_t *sc, *mn;
} planes;

enum { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K };

/* The scale and offset of sub-block s: A = d [* sc], B = dm or -(dmin * mn) (16 rows each; the sign
   flipped by a multiply by -1, exact for zeros too). */
static inline __attribute__((always_inline)) void
scales(const uint16_t *d, const uint16_t *dm, const int8_t *sc, const int8_t *mn, long s, long blk, int has_sc,
       int minmode, vec *A, vec *B) {
    *A = v_from_f16(d + blk * 16);
    *B = v_zero();
    if (has_sc) *A = v_mul(*A, v_from_i8(_mm_loadu_si128((const __m128i *)(sc + s * 16))));
    if (minmode) *B = v_from_f16(dm + blk * 16);
    if (minmode == 2) *B = v_mul(v_set(-1.0f), v_mul(*B, v_from_i8(_mm_loadu_si128((const __m128i *)(mn + s * 16)))));
}

/* w = A * q [+ B | - B] for 16 values q (int8). With a minimum the product A * q is exact in float32
   (A has at most 17 significant bits, q at most 5: gguf's own multiply does not round it), so the
   one rounding of a fused multiply-add is the rounding of gguf's separate add: one instruction
   instead of two, the same bits. `scales` hands over -B where gguf subtracts. */
static inline __attribute__((always_inline)) vec weights16(vec q, vec A, vec B, int minmode) {
    return minmode ? v_fma(A, q, B) : v_mul(A, q);
}

static inline __attribute__((always_inline)) void
put_weights(float *out, __m128i q, vec A, vec B, int minmode) {
    v_store(out, weights16(v_from_i8(q), A, B, minmode));
}

/* A * 16^-t for t = 0..7 (t = 7: A; see v_nibble), exact: a power of two, far from underflow. */
static inline __attribute__((always_inline)) void nibble_scales(vec A, vec At[8]) {
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) At[t] = t < 7 ? v_mul(A, v_set(1.0f / (float)(1 << (4 * t)))) : A;
}

/* The weight of nibble t of the 16 words at p (kind 4), At = nibble_scales of A. */
static inline __attribute__((always_inline)) vec
weights_nibble(const int *p, int t, int off, vec At, vec B, int minmode) {
    return weights16(v_nibble(p, t, off), At, B, minmode);
}

/* Values [kb, ke) of group g of the planes (16 rows) dequantized into out [ke - kb][16], 32 values (one chunk of the 4-bit
   plane: byte i gives values i and 16 + i) at a time; ss is 32 or 16, so a chunk holds one or two
   sub-blocks. */
static inline __attribute__((always_inline)) void
dequant_group(const planes *P, long g, long K, long kb, long ke, float *out, int bs, int ss, int kind, int off,
              int has_sc, int minmode) {
    long nb = K / bs, ns = K / ss;
    const int8_t *q = P->q + g * (kind == 8 ? K * 16 : K * 8);
    const uint8_t *hb = kind == 5 ? P->hb + g * K * 2 : kind == 6 ? P->hb + g * K * 4 : NULL;
    const uint16_t *d = P->d + g * nb * 16, *dm = minmode ? P->dm + g * nb * 16 : NULL;
    const int8_t *sc = has_sc ? P->sc + g * ns * 16 : NULL, *mn = minmode == 2 ? P->mn + g * ns * 16 : NULL;
    const __m128i low = _mm_set1_epi8(0x0F), offset = _mm_set1_epi8((char)off);
    for (long c = kb / 32; c < ke / 32; c++) {
        long k0 = 32 * c, s0 = k0 / ss, s1 = (k0 + 16) / ss;
        vec A0, B0, A1, B1;
        scales(d, dm, sc, mn, s0, k0 / bs, has_sc, minmode, &A0, &B0);
        if (s1 != s0) scales(d, dm, sc, mn, s1, k0 / bs, has_sc, minmode, &A1, &B1);
        else A1 = A0, B1 = B0;
        float *o = out + (k0 - kb) * 16;
        if (kind == 4) { /* s1 == s0: a chunk is one block or sub-block */
            const int *qw = (const int *)(P->q + g * K * 8) + (k0 / 8) * 16;
            vec At[8];
            nibble_scales(A0, At);
            for (int j = 0; j < 4; j++)
#pragma GCC unroll 8
                for (int t = 0; t < 8; t++)
                    v_store(o + (8 * j + t) * 16, weights_nibble(qw + j * 16, t, off, At[t], B0, minmode));
            continue;
        }
        if (kind == 8) {
            const int8_t *qc = q + k0 * 16;
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                v_store(o + i * 16, weights16(v_load_i8(qc + i * 16), A0, B0, minmode));
                v_store(o + (16 + i) * 16, weights16(v_load_i8(qc + (16 + i) * 16), A1, B1, minmode));
            }
            continue;
        }
        const int8_t *qc = q + c * 256;
        const uint8_t *hc = kind == 5 ? hb + c * 64 : kind == 6 ? hb + c * 128 : NULL;
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(qc + i * 16));
            __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
            if (kind == 5) { /* bit k % 8 of byte k / 8: k = 32 c + i and 32 c + 16 + i */
                __m128i h0 = _mm_loadu_si128((const __m128i *)(hc + (i >> 3) * 16));
                __m128i h1 = _mm_loadu_si128((const __m128i *)(hc + (2 + (i >> 3)) * 16));
                const __m128i one = _mm_set1_epi8(1);
                lo = _mm_or_si128(lo, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h0, i & 7), one), 4));
                hi = _mm_or_si128(hi, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h1, i & 7), one), 4));
            }
            if (kind == 6) { /* bits 2 (k % 4), +1 of byte k / 4 */
                __m128i h0 = _mm_loadu_si128((const __m128i *)(hc + (i >> 2) * 16));
                __m128i h1 = _mm_loadu_si128((const __m128i *)(hc + (4 + (i >> 2)) * 16));
                int sh = 2 * (i & 3);
                const __m128i three = _mm_set1_epi8(3);
                lo = _mm_or_si128(lo, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h0, sh), three), 4));
                hi = _mm_or_si128(hi, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h1, sh), three), 4));
            }
            if (off) {
                lo = _mm_sub_epi8(lo, offset);
                hi = _mm_sub_epi8(hi, offset);
            }
            put_weights(o + i * 16, lo, A0, B0, minmode);
            put_weights(o + (16 + i) * 16, hi, A1, B1, minmode);
        }
    }
}

static void dequant(const planes *P, int type, long g, long K, long kb, long ke, float *out) {
    switch (type) {
    case Q8_0: dequant_group(P, g, K, kb, ke, out, 32, 32, 8, 0, 0, 0); break;
    case Q4_0: dequant_group(P, g, K, kb, ke, out, 32, 32, 4, 8, 0, 0); break;
    case Q4_1: dequant_group(P, g, K, kb, ke, out, 32, 32, 4, 0, 0, 1); break;
    case Q5_0: dequant_group(P, g, K, kb, ke, out, 32, 32, 5, 16, 0, 0); break;
    case Q5_1: dequant_group(P, g, K, kb, ke, out, 32, 32, 5, 0, 0, 1); break;
    case Q4_K: dequant_group(P, g, K, kb, ke, out, 256, 32, 4, 0, 1, 2); break;
    case Q5_K: dequant_group(P, g, K, kb, ke, out, 256, 32, 5, 0, 1, 2); break;
    case Q6_K: dequant_group(P, g, K, kb, ke, out, 256, 16, 6, 32, 1, 0); break;
    default: break;
    }
}

/* 16 values of one half of a 4-bit chunk as int8: byte i of the chunk's vector i holds value i in its
   low nibble (h = 0) and value 16 + i in its high one (h = 1), with the high bits of kinds 5 and 6
   (hc: the chunk's high-bit rows) and the offset applied. */
static inline __attribute__((always_inline)) __m128i
nibbles(const int8_t *qc, const uint8_t *hc, int i, int h, int kind, int off) {
    const __m128i low = _mm_set1_epi8(0x0F);
    __m128i b = _mm_loadu_si128((const __m128i *)(qc + i * 16));
    __m128i v = h ? _mm_and_si128(_mm_srli_epi16(b, 4), low) : _mm_and_si128(b, low);
    if (kind == 5) {
        __m128i hbits = _mm_loadu_si128((const __m128i *)(hc + (2 * h + (i >> 3)) * 16));
        v = _mm_or_si128(v, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hbits, i & 7), _mm_set1_epi8(1)), 4));
    }
    if (kind == 6) {
        __m128i hbits = _mm_loadu_si128((const __m128i *)(hc + (4 * h + (i >> 2)) * 16));
        v = _mm_or_si128(v, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hbits, 2 * (i & 3)), _mm_set1_epi8(3)), 4));
    }
    if (off) v = _mm_sub_epi8(v, _mm_set1_epi8((char)off));
    return v;
}

/* The most rows an in-register tile takes: 10 on AVX-512 (one tile dequantizes each weight once for
   all its rows; SmolLM2's products, 2 threads, Zen 5: 9 rows 8.1 -> 6.9 ms and 10 rows 8.8 -> 7.9
   against two tiles, 18 rows 14.0 -> 13.0 in two tiles against three; tiles of 12-16 rows gained
   nothing and of 24 lost 6%), 6 on AVX2, whose 16 registers hold no more. */
#if LS_ISA == 512
#define QREG_R 10
#else
#define QREG_R 6
#endif
#define QREG_C 4 /* the most groups of 16 output rows a tile takes */

#ifndef QPF_AHEAD
#define QPF_AHEAD 8
#endif

/* Asks for the lines of chunk `ahead` of each of the tile's C groups (their values and block scales):
   the planes stream from memory in C interleaved runs, which the hardware prefetcher alone follows
   at well under the bandwidth the float kernel gets. Past a group's last chunk, the lines asked for
   are the next tile's group in the same place (groups lie one after another in every plane). */
static inline __attribute__((always_inline)) void
qprefetch_chunk(const planes *P, long g0, int C, long K, long ahead, long nb, int kind, int minmode) {
    long chunks = K / 32, qbytes = kind == 8 ? 512 : 256; /* a chunk's q bytes per group */
    if (ahead >= chunks) ahead += (C - 1) * chunks;
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        long g = g0 + c;
        const char *q = (const char *)P->q + g * K * (kind == 8 ? 16 : 8) + ahead * qbytes;
        for (long b = 0; b < qbytes; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
        if (nb == chunks && (ahead & 1) == 0) { /* 32-value blocks: a line holds 2 chunks' scales */
            _mm_prefetch((const char *)(P->d + g * nb * 16) + ahead * 32, _MM_HINT_T0);
            if (minmode) _mm_prefetch((const char *)(P->dm + g * nb * 16) + ahead * 32, _MM_HINT_T0);
        }
    }
}

/* At chunk cc, the chunk QPF_AHEAD on; at the first, the ones before it too (a tile's start). */
static inline __attribute__((always_inline)) void
qprefetch(const planes *P, long g0, int C, long K, long cc, long nb, int kind, int minmode) {
    if (cc == 0)
        for (long a = 0; a < QPF_AHEAD; a++) qprefetch_chunk(P, g0, C, K, a, nb, kind, minmode);
    qprefetch_chunk(P, g0, C, K, cc + QPF_AHEAD, nb, kind, minmode);
}

/* A few rows straight from the quantized planes: R rows x C groups (16 output rows each, groups
   g0 .. g0 + C - 1), every weight dequantized in registers right before the fused multiply-adds
   that use it, k from 0 to K - 1 in order: the float kernel's chains on the same weights, with no
   buffer in between. For a decode step's rows, where the buffered path spends more on storing and
   reloading the weights than on the products. */
static inline __attribute__((always_inline)) void
qreg_tile(const float *x, long ldx, const planes *P, long g0, long K, float *y, long ldy, const float *bias,
          long cols, const int R, const int C, int bs, int ss, int kind, int off, int has_sc, int minmode) {
    long nb = K / bs, ns = K / ss;
    vec acc[QREG_R][QREG_C]; /* fixed sizes, constant indices once inlined: all in registers */
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = v_zero();
    for (long cc = 0; cc < K / 32 && kind == 4; cc++) {
        long k0 = 32 * cc;
        qprefetch(P, g0, C, K, cc, nb, kind, minmode);
        /* a chunk is one block or sub-block: one scale per group; the 8 nibble scales kept in
           memory, each read by its multiply-add (registers are for the accumulators) */
        float At[QREG_C][8][16] __attribute__((aligned(64)));
        vec B[QREG_C];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            long g = g0 + c;
            vec A, T[8];
            scales(P->d + g * nb * 16, minmode ? P->dm + g * nb * 16 : NULL,
                   has_sc ? P->sc + g * ns * 16 : NULL, minmode == 2 ? P->mn + g * ns * 16 : NULL,
                   k0 / ss, k0 / bs, has_sc, minmode, &A, &B[c]);
            nibble_scales(A, T);
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) v_store(At[c][t], T[t]);
        }
        for (int j = 0; j < 4; j++) {
#if LS_ISA == 512
            /* the group's 16 words, loaded once for their 8 nibbles (AVX-512's registers hold them) */
            __m512i words[QREG_C];
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                words[c] = _mm512_loadu_si512((const int *)(P->q + (g0 + c) * K * 8) + (k0 / 8 + j) * 16);
#endif
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                long k = k0 + 8 * j + t;
                vec w[QREG_C];
#pragma GCC unroll 8
                for (int c = 0; c < C; c++)
#if LS_ISA == 512
                    w[c] = weights16(v_nibble_word(words[c], t, off), v_load(At[c][t]), B[c], minmode);
#else
                    w[c] = weights_nibble((const int *)(P->q + (g0 + c) * K * 8) + (k / 8) * 16, t, off,
                                          v_load(At[c][t]), B[c], minmode);
#endif
#pragma GCC unroll 16
                for (int r = 0; r < R; r++) {
                    vec a = v_set(x[r * ldx + k]);
#pragma GCC unroll 8
                    for (int c = 0; c < C; c++) acc[r][c] = v_fma(a, w[c], acc[r][c]);
                }
                __asm__ volatile("" ::: "memory"); /* (as below) */
            }
        }
    }
    for (long cc = 0; cc < K / 32 && kind != 4; cc++) {
        long k0 = 32 * cc;
        qprefetch(P, g0, C, K, cc, nb, kind, minmode);
#pragma GCC unroll 1 /* (unrolled, the compiler keeps the chunk's 16 byte vectors for the second half, and spills them) */
        for (int h = 0; h < 2; h++) {
            vec A[QREG_C], B[QREG_C];
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                long g = g0 + c;
                scales(P->d + g * nb * 16, minmode ? P->dm + g * nb * 16 : NULL,
                       has_sc ? P->sc + g * ns * 16 : NULL, minmode == 2 ? P->mn + g * ns * 16 : NULL,
                       (k0 + 16 * h) / ss, k0 / bs, has_sc, minmode, &A[c], &B[c]);
            }
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                long k = k0 + 16 * h + i;
                vec w[QREG_C];
#pragma GCC unroll 8
                for (int c = 0; c < C; c++) {
                    long g = g0 + c;
                    vec q;
                    if (kind == 8) q = v_load_i8(P->q + g * K * 16 + k * 16);
                    else
                        q = v_from_i8(nibbles(P->q + g * K * 8 + cc * 256,
                                              kind == 5 ? P->hb + g * K * 2 + cc * 64
                                              : kind == 6 ? P->hb + g * K * 4 + cc * 128 : NULL,
                                              i, h, kind, off));
                    w[c] = weights16(q, A[c], B[c], minmode);
                }
#pragma GCC unroll 16
                for (int r = 0; r < R; r++) {
                    vec a = v_set(x[r * ldx + k]);
#pragma GCC unroll 8
                    for (int c = 0; c < C; c++) acc[r][c] = v_fma(a, w[c], acc[r][c]);
                }
                /* Keeps each value's loads in its own iteration: without it the compiler hoists
                   the chunk's loads ahead and spills them to the stack. */
                __asm__ volatile("" ::: "memory");
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        long left = cols - c * 16;
#pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            if (left > 0) put(y + r * ldy + c * 16, acc[r][c], bias ? bias + c * 16 : NULL, left);
    }
}

typedef void (*qreg_fn)(const float *, long, const planes *, long, long, float *, long, const float *, long);

#define QREG(T, R, C, bs, ss, kind, off, has_sc, minmode)                                             \
    static void qreg_##T##_##R##_##C(const float *x, long ldx, const planes *P, long g0, long K, float *y,   \
                                     long ldy, const float *bias, long cols) {                          \
        qreg_tile(x, ldx, P, g0, K, y, ldy, bias, cols, R, C, bs, ss, kind, off, has_sc, minmode);       \
    }
/* Per type, tiles of 1 .. QREG_R rows and 1, 2 or 4 groups. */
#define QREG_ROWS(T, C, ...)                                                                         \
    QREG(T, 1, C, __VA_ARGS__) QREG(T, 2, C, __VA_ARGS__) QREG(T, 3, C, __VA_ARGS__)                    \
    QREG(T, 4, C, __VA_ARGS__) QREG(T, 5, C, __VA_ARGS__) QREG(T, 6, C, __VA_ARGS__)
#define QREG_LIST(T, C) {0, qreg_##T##_1_##C, qreg_##T##_2_##C, qreg_##T##_3_##C, qreg_##T##_4_##C,   \
                         qreg_##T##_5_##C, qreg_##T##_6_##C}
#if LS_ISA == 512
/* 7 to 10 rows take one group (QREG_WIDTH): only those are generated */
#define QREG_LIST10(T) {0, qreg_##T##_1_1, qreg_##T##_2_1, qreg_##T##_3_1, qreg_##T##_4_1, qreg_##T##_5_1,     \
                        qreg_##T##_6_1, qreg_##T##_7_1, qreg_##T##_8_1, qreg_##T##_9_1, qreg_##T##_10_1}
#define QREG_TYPE(T, ...)                                                                            \
    QREG_ROWS(T, 1, __VA_ARGS__) QREG_ROWS(T, 2, __VA_ARGS__) QREG_ROWS(T, 4, __VA_ARGS__)             \
    QREG(T, 7, 1, __VA_ARGS__) QREG(T, 8, 1, __VA_ARGS__) QREG(T, 9, 1, __VA_ARGS__)                   \
    QREG(T, 10, 1, __VA_ARGS__)                                                                       \
    static const qreg_fn QREG_##T[5][QREG_R + 1] = {{0}, QREG_LIST10(T), QREG_LIST(T, 2), {0}, QREG_LIST(T, 4)};
#else /* AVX2 never takes 4 groups (QREG_WIDTH): not generated, a third less to compile */
#define QREG_TYPE(T, ...)                                                                            \
    QREG_ROWS(T, 1, __VA_ARGS__) QREG_ROWS(T, 2, __VA_ARGS__)                                         \
    static const qreg_fn QREG_##T[5][QREG_R + 1] = {{0}, QREG_LIST(T, 1), QREG_LIST(T, 2)};
#endif

QREG_TYPE(Q8_0, 32, 32, 8, 0, 0, 0)
QREG_TYPE(Q4_0, 32, 32, 4, 8, 0, 0)
QREG_TYPE(Q4_1, 32, 32, 4, 0, 0, 1)
QREG_TYPE(Q5_0, 32, 32, 5, 16, 0, 0)
QREG_TYPE(Q5_1, 32, 32, 5, 0, 0, 1)
QREG_TYPE(Q4_K, 256, 32, 4, 0, 1, 2)
QREG_TYPE(Q5_K, 256, 32, 5, 0, 1, 2)
QREG_TYPE(Q6_K, 256, 16, 6, 32, 1, 0)

static const qreg_fn (*const QREG_TABLES[8])[QREG_R + 1] = {QREG_Q8_0, QREG_Q4_0, QREG_Q4_1, QREG_Q5_0,
                                                    QREG_Q5_1, QREG_Q4_K, QREG_Q5_K, QREG_Q6_K};

/* Groups per in-register tile by row count. A row's chains are as many as its tile's vectors, and
   the fused multiply-adds' latency needs about eight in flight: AVX2 (two registers per group) takes
   2 groups for one row, 1 from two rows on (more spill: measured on SmolLM2's shapes, 2 cores);
   AVX-512's 32 registers take 4 groups up to 4 rows (2-4 rows 5-7% faster than with 2 groups), 2 for
   5-6 rows (with the planes prefetched, 5 rows 12% faster than with 1) and 1 from 7 on (7-8 rows
   2% faster than with 2; Zen 4, 2 threads). */
#if LS_ISA == 512
static const int QREG_WIDTH[QREG_R + 1] = {0, 4, 4, 4, 4, 2, 2, 1, 1, 1, 1};
#else
static const int QREG_WIDTH[QREG_R + 1] = {0, 2, 1, 1, 1, 1, 1};
#endif

/* Up to QREG_M rows go through the in-register tiles (in row tiles of up to QREG_R, each of which
   dequantizes the weights again); past it the panel, whose one dequantization serves all the rows,
   is cheaper. SmolLM2's products, 2 threads, Zen 5, with the planes prefetched: AVX-512 in registers
   9 rows 7.4 against 9.1 ms in the panel, 16 rows 11.6 against 13.0, 24 rows 16.8 against 17.4, 32
   rows 22.6 against 22.0; AVX2 (the same machine, -march=haswell) 9 rows 13.3 against 14.5, 10 rows
   14.6 against 14.1, 12 rows 18.8 against 16.1. */
#ifndef QREG_M
#if LS_ISA == 512
#define QREG_M 24
#else
#define QREG_M 8
#endif
#endif

/* Rows [0, M) x groups [b0, b1) in registers, in row tiles of at most QREG_R rows, as even as can be
   (AVX2, 8 rows: two tiles of 4). */
static void run_blocks_reg(const float *x, long M, long K, const planes *P, int type, long N, const float *bias,
                           float *y, long b0, long b1) {
    const qreg_fn (*table)[QREG_R + 1] = QREG_TABLES[type];
    long tiles = (M + QREG_R - 1) / QREG_R, rows = (M + tiles - 1) / tiles;
    for (long b = b0; b < b1;) {
        int c = QREG_WIDTH[rows];
        while (b + c > b1) c /= 2;
        long cols = N - b * 16;
        if (cols > 16L * c) cols = 16L * c;
        for (long m0 = 0; m0 < M; m0 += rows) {
            long r = M - m0 < rows ? M - m0 : rows;
            table[c][r](x + m0 * K, K, P, b, K, y + m0 * N + b * 16, N, bias ? bias + b * 16 : NULL, cols);
        }
        b += c;
    }
}

#ifndef QBUF_ROWS
#define QBUF_ROWS 6
#endif

/* Values of k an embedding lookup dequantizes at a time (matmul_quant_rows). */
#define KCHUNK 128

/* A thread's panel buffer, grown as needed and kept (a decode step calls this ~120 times). */
static __thread float *panel_buf;
static __thread size_t panel_cap;

static float *panel(size_t floats) {
    if (floats > panel_cap) {
        free(panel_buf);
        panel_buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        panel_cap = panel_buf ? floats : 0;
    }
    return panel_buf;
}

/* Rows [0, M) x blocks [b0, b1) past QREG_M rows (prompt chunks, big draft trees): each tile's
   blocks are dequantized over the whole K into a per-thread panel (width x K x 16 floats: 288 KB
   for 3 blocks at K = 1536, so it stays in L2), which the float kernel's own tiles then multiply,
   every row tile reading it from cache, as they read a float panel after its first tile. */
static void run_blocks_q(const float *x, long M, long K, const planes *P, int type, long N, const float *bias,
                         float *y, long b0, long b1, int width, int rows) {
    float *buf = panel((size_t)width * K * 16);
    if (!buf) return;
    long b = b0;
    while (b < b1) {
        int c = width;
        while (c > 1 && b + c > b1) c = c == 3 ? 2 : c / 2;
        int rmax = c == 4 ? RMAX4 : c == 3 ? RMAX3 : c == 2 ? RMAX2 : 6;
        int step = rows < rmax ? rows : rmax;
        const tile_fn *table = c == 4 ? T4 : c == 3 ? T3 : c == 2 ? T2 : T1;
        long cols = N - b * 16;
        if (cols > 16L * c) cols = 16L * c;
        for (int j = 0; j < c; j++) dequant(P, type, b + j, K, 0, K, buf + j * K * 16);
        /* while the tiles multiply the panel, they fetch the next panel's values (a share each) */
        long qbytes = K * (type == Q8_0 ? 16 : 8), after = b1 - b - c;
        long lines = (after < width ? after : width) * qbytes / 64;
        long tiles = (M + step - 1) / step, share = (lines + tiles - 1) / tiles;
        int pf_n = (int)((share + K - 1) / K);
        const char *next = (const char *)P->q + (lines ? b + c : b) * qbytes;
        for (long m0 = 0, t = 0; m0 < M; m0 += step, t++) {
            long r = M - m0 < step ? M - m0 : step;
            long from = t * share < lines ? t * share : lines, to = from + share < lines ? from + share : lines;
            table[r](x + m0 * K, K, buf, K, y + m0 * N + b * 16, N, bias ? bias + b * 16 : NULL, cols,
                     next + from * 64, next + to * 64, pf_n);
        }
        b += c;
    }
}

/* y [M][N] = x [M][K] @ W.T (+ bias) for W quantized as `type` in the planes above (N rounded up to
   16 rows there, the extra rows zero); the same tile shapes as matmul_f32. */
void matmul_quant(const float *x, long M, long K, const int8_t *q, const uint8_t *hb, const uint16_t *d,
                  const uint16_t *dm, const int8_t *sc, const int8_t *mn, int type, long N, const float *bias,
                  float *y, int nthreads) {
    planes P = {q, hb, d, dm, sc, mn};
    long nb = (N + 15) / 16;
    shape sh = tile_shape(M);
    int width = sh.width, rows = sh.rows; /* no prefetch: the buffer is in cache */
#if LS_ISA != 512
    /* From the buffer nothing streams from memory, so AVX2 takes its compute-bound shape at any row
       count: 1-block tiles of up to 6 rows (12 accumulators, no spills). */
    width = 1, rows = QBUF_ROWS;
#endif
    if (nthreads < 1) nthreads = 1;
    if (nb < nthreads) nthreads = (int)nb;
    if (nthreads == 1) {
        if (M <= QREG_M) run_blocks_reg(x, M, K, &P, type, N, bias, y, 0, nb);
        else run_blocks_q(x, M, K, &P, type, N, bias, y, 0, nb, width, rows);
        return;
    }
#pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        long b0 = nb * t / nt, b1 = nb * (t + 1) / nt;
        if (M <= QREG_M) run_blocks_reg(x, M, K, &P, type, N, bias, y, b0, b1);
        else run_blocks_q(x, M, K, &P, type, N, bias, y, b0, b1, width, rows);
    }
}

/* The weights as floats, out [N][K]: what matmul_quant multiplies. */
void matmul_quant_dequant(const int8_t *q, const uint8_t *hb, const uint16_t *d, const uint16_t *dm,
                          const int8_t *sc, const int8_t *mn, int type, long N, long K, float *out) {
    planes P = {q, hb, d, dm, sc, mn};
    float *buf = aligned_alloc(64, (size_t)K * 16 * sizeof(float));
    if (!buf) return;
    for (long g = 0; g < (N + 15) / 16; g++) {
        dequant(&P, type, g, K, 0, K, buf);
        for (long l = 0; l < 16 && g * 16 + l < N; l++)
            for (long k = 0; k < K; k++) out[(g * 16 + l) * K + k] = buf[k * 16 + l];
    }
    free(buf);
}

/* Rows ids[0..n) of the weights as floats, out [n][K] (an embedding lookup): each row's group
   dequantized, the row's lane kept; the values are matmul_quant_dequant's. */
void matmul_quant_rows(const int8_t *q, const uint8_t *hb, const uint16_t *d, const uint16_t *dm,
                       const int8_t *sc, const int8_t *mn, int type, long K, const long *ids, long n, float *out) {
    planes P = {q, hb, d, dm, sc, mn};
    float *buf = panel((size_t)KCHUNK * 16);
    if (!buf) return;
    for (long i = 0; i < n; i++) {
        long g = ids[i] / 16, l = ids[i] % 16;
        for (long k0 = 0; k0 < K; k0 += KCHUNK) {
            long kn = K - k0 < KCHUNK ? K - k0 : KCHUNK;
            dequant(&P, type, g, K, k0, k0 + kn, buf);
            for (long k = 0; k < kn; k++) out[i * K + k0 + k] = buf[k * 16 + l];
        }
    }
}
