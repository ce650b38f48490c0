/* Float32 attention for a ragged batch on x86 CPUs: every sequence's rows, every head, one call.

   A forward's rows belong to sequences (views). A view's rows see a range of entries [lo, hi) of
   its slot in the KV pool, all of them (kind 0: one decode row), causally (kind 1: row i sees the
   first hi - lo - n + 1 + i entries) or through a byte mask [n][hi - lo] (kind 2: draft trees,
   chunks after a cache, sliding windows). The keys a row sees are always its sequence's positions
   in ascending order, whichever kind of forward carries the row.

   One row and one key/value head is one unit of work; the unit's query heads share each key and
   value as they are loaded. Per query head:
     s[c] = (q . k_c) * scale   the dot product as 16 lanes of d / 16 fused multiply-adds in order,
                                then a fixed halving tree across the lanes (soft-capped models:
                                then cap * tanhf(s[c] / cap), element by element);
     m = max(s);  e[c] = exp(s[c] - m)   (a fixed polynomial);
     sum = the lanes of e summed by c mod 16, then the same tree;
     out = (sum over c of e[c] * v_c, in order of c) * (1 / sum).
   (With AVX-512 the dot products of three query heads run together, each key loaded once for the
   three, and the weighted sums of three heads too, of two rows' six where a prompt chunk's rows see
   the same entries, each value loaded once for all of them: on cores that take one 64-byte load per
   two fused multiply-adds, loads rather than arithmetic would otherwise bound the kernel. With AVX2,
   three heads' weighted sums over 32 columns at a time, for the 12 accumulator chains that keep its
   FMA units busy. Every head's sum is still the same operations in the same order.)
   c counts the visible keys from the row's first visible position, so a row's arithmetic depends
   only on its own position and its sequence's keys: not on the other rows of its forward, on the
   chunk or draft tree it came in, on the batch or on the thread count. That makes a prefill chunk
   of any size, a draft tree and a one-token step give a row the same bits.

   Threads: the calling thread's OpenMP team (torch's, when loaded after torch, as matmul.c). */

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

int attention_isa(void) { return LS_ISA; }

/* The sums of KB vectors at once, out[j] = v_hsum(p[j]): the same tree of additions for every
   lane (each step adds the same pairs of lanes), so the same bits. */
#if LS_ISA == 512
#define KB 16
static inline void hsum_block(const vec *p, float *out) {
    vec x[8], y[4], z[2];
    for (int j = 0; j < 8; j++) /* lanes i + i+8 */
        x[j] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * j], p[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(p[2 * j], p[2 * j + 1], 0xEE));
    for (int j = 0; j < 4; j++) /* i + i+4: 128-bit lane l of y[j] is key 4j + l */
        y[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; j++) /* i + i+2 */
        z[j] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * j], y[2 * j + 1], 0x44),
                             _mm512_shuffle_ps(y[2 * j], y[2 * j + 1], 0xEE));
    /* i + i+1: lane 4l + e holds key 4e + l */
    vec w = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, w));
}
#else
#define KB 8
static inline void hsum_block(const vec *p, float *out) {
    __m256 f[8], g[4], h[2];
    for (int j = 0; j < 8; j++) f[j] = v_fold(p[j]); /* lanes i + i+8 */
    for (int j = 0; j < 4; j++) /* i + i+4: 128-bit lane l of g[j] is key 2j + l */
        g[j] = _mm256_add_ps(_mm256_permute2f128_ps(f[2 * j], f[2 * j + 1], 0x20),
                             _mm256_permute2f128_ps(f[2 * j], f[2 * j + 1], 0x31));
    for (int j = 0; j < 2; j++) /* i + i+2 */
        h[j] = _mm256_add_ps(_mm256_shuffle_ps(g[2 * j], g[2 * j + 1], 0x44),
                             _mm256_shuffle_ps(g[2 * j], g[2 * j + 1], 0xEE));
    /* i + i+1: lanes hold keys 0, 2, 4, 6, 1, 3, 5, 7 */
    __m256 w = _mm256_add_ps(_mm256_shuffle_ps(h[0], h[1], 0x88), _mm256_shuffle_ps(h[0], h[1], 0xDD));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(w, order));
}
#endif

/* exp(x) for x <= 0 (Cephes' expf polynomial; x below -87 counts as -87, about 1.6e-38). */
static inline vec v_exp(vec x) {
    x = v_max(x, v_set(-87.0f));
    vec n = v_round(v_mul(x, v_set(1.44269504088896341f)));
    vec r = v_fma(n, v_set(-0.693359375f), x);
    r = v_fma(n, v_set(2.12194440e-4f), r);
    vec p = v_set(1.9875691500e-4f);
    p = v_fma(p, r, v_set(1.3981999507e-3f));
    p = v_fma(p, r, v_set(8.3334519073e-3f));
    p = v_fma(p, r, v_set(4.1665795894e-2f));
    p = v_fma(p, r, v_set(1.6666665459e-1f));
    p = v_fma(p, r, v_set(5.0000001201e-1f));
    vec y = v_add(v_fma(v_mul(p, r), r, r), v_set(1.0f));
    return v_pow2(y, n);
}

#define PLAN 7   /* per view: slot, r0, r1, lo, hi, kind, mask offset */
#define RB 8     /* rows of one view per unit of work: they share the keys and values they load */
#define EB 64    /* entries per block: a block's keys or values (16 KB at d = 64) stay in L1 */

typedef struct {
    const float *q; long q_row, q_head;
    const float *k; long k_slot, k_head, k_entry;
    const float *v; long v_slot, v_head, v_entry;
    long heads, kv_heads, d, dv;
    const long *plan; const unsigned char *masks;
    float scale, softcap; float *out;
} job;

typedef struct { /* one thread's scratch, sized for the batch's longest key range */
    int *idx;    /* [RB][cap]: a row's visible entries, ascending */
    float *sc;   /* [RB * g][cap + 16]: scores, then softmax weights; 1 / sum in the last float */
    float *acc;  /* [RB * g][dv]: weighted values between entry blocks */
    long cap;
} scratch;

/* q . k as 16 lanes: lane l sums dimensions l, 16 + l, ... in order (v_hsum finishes it). */
static inline vec dot_lanes(const float *q, const float *k, long d) {
    vec acc = v_mul(v_load(q), v_load(k));
    for (long x = 16; x < d; x += 16) acc = v_fma(v_load(q + x), v_load(k + x), acc);
    return acc;
}

/* The end of a row's visible keys that lie before entry `limit`, from c0 (idx ascending). Where the
   row's visible entries are consecutive (first, first + 1, ...: every row without a mask, and the
   masked rows of a prompt chunk after a cache or a sliding window), `first` >= 0 and the end is
   counted rather than searched; elsewhere `first` is -1. (The blocks only keep keys and values in
   L1 across a unit's rows: any split of a row's keys into ascending ranges gives the same bits.) */
static inline long block_end(const int *idx, long cnt, long c0, long limit, long first) {
    if (first >= 0) {
        long end = limit - first < cnt ? limit - first : cnt;
        return end > c0 ? end : c0;
    }
    while (c0 < cnt && idx[c0] < limit) c0++;
    return c0;
}

#if LS_ISA == 512
/* Where a decode step's keys and values come from memory (a batch of sequences, each its own KV slot:
   8 one-row sequences at 800 cached positions read ~10 MB a layer, a third of such a step's bytes),
   the loops that load each key or value once for three heads compute long enough per key that the
   hardware prefetcher no longer keeps the memory busy. They prefetch the entry AHEAD keys on (16:
   4 KB at d = 64; of 8 to 32 measured, 16 was the fastest). No arithmetic changes. */
#define AHEAD 16
static inline void fetch_entry(const float *p, long d) {
    for (long x = 0; x < d; x += 16) _mm_prefetch((const char *)(p + x), _MM_HINT_T0);
}

/* The scores of query heads t, t + 1, t + 2 (t = 0, 3, ...: the heads of `qr`, head dimension 64)
   over a row's visible keys [c0, c1), three heads at a time: each key is loaded once for the three
   (an L1 load for every 3 fused multiply-adds instead of every one, for cores that take one
   64-byte load per two FMAs), and hsum_block's tree is built as the
   keys come (lanes i + i+8 of two keys as soon as both are in, and so on), so the 16 keys' sums
   stay in registers. Every sum is the same operations in the same order as dot_lanes and
   hsum_block's. Returns the first head it left (g rounded down to a multiple of 3). Not inlined, as
   values6: inside unit the compiler spilled their loops' pointers. */
#define LSA_S1(p, q) _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x44), _mm512_shuffle_f32x4(p, q, 0xEE))
#define LSA_S2(p, q) _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x88), _mm512_shuffle_f32x4(p, q, 0xDD))
#define LSA_S3(p, q) _mm512_add_ps(_mm512_shuffle_ps(p, q, 0x44), _mm512_shuffle_ps(p, q, 0xEE))
#define LSA_S4(p, q) _mm512_add_ps(_mm512_shuffle_ps(p, q, 0x88), _mm512_shuffle_ps(p, q, 0xDD))
static __attribute__((noinline)) long scores3(const job *J, const scratch *S, const float *qr, const int *idx,
                                              long c0, long c1, long h0, long g, long stride, const float *kb) {
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    long t = 0;
    for (; t + 3 <= g; t += 3) {
        const float *qa = qr + t * J->q_head, *qb = qa + J->q_head, *qc = qb + J->q_head;
        float *sa = S->sc + (h0 + t) * stride, *sb = sa + stride, *sc = sb + stride;
        vec a0 = v_load(qa), a1 = v_load(qa + 16), a2 = v_load(qa + 32), a3 = v_load(qa + 48);
        vec b0 = v_load(qb), b1 = v_load(qb + 16), b2 = v_load(qb + 32), b3 = v_load(qb + 48);
        vec d0 = v_load(qc), d1 = v_load(qc + 16), d2 = v_load(qc + 32), d3 = v_load(qc + 48);
        long c = c0;
#define LSA_DOT3(j, PA, PB, PC) { \
            const float *kp = kb + idx[c + (j)] * J->k_entry; \
            vec k0 = v_load(kp), k1 = v_load(kp + 16), k2 = v_load(kp + 32), k3 = v_load(kp + 48); \
            vec x = v_mul(a0, k0), y = v_mul(b0, k0), z = v_mul(d0, k0); \
            x = v_fma(a1, k1, x); y = v_fma(b1, k1, y); z = v_fma(d1, k1, z); \
            x = v_fma(a2, k2, x); y = v_fma(b2, k2, y); z = v_fma(d2, k2, z); \
            PA = v_fma(a3, k3, x); PB = v_fma(b3, k3, y); PC = v_fma(d3, k3, z); }
        for (; c + 16 <= c1; c += 16) {
            vec X[3][2], Y[3][2], Z[3][2];
            long ahead = c1 - c - AHEAD; /* keys c + AHEAD + j, j < ahead, are visible */
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) {
                vec p0, p1, p2, r0, r1, r2;
                if (2 * m < ahead) fetch_entry(kb + idx[c + AHEAD + 2 * m] * J->k_entry, 64);
                if (2 * m + 1 < ahead) fetch_entry(kb + idx[c + AHEAD + 2 * m + 1] * J->k_entry, 64);
                LSA_DOT3(2 * m, p0, p1, p2)
                LSA_DOT3(2 * m + 1, r0, r1, r2)
                X[0][m & 1] = LSA_S1(p0, r0); X[1][m & 1] = LSA_S1(p1, r1); X[2][m & 1] = LSA_S1(p2, r2);
                if (m & 1)
                    for (int h = 0; h < 3; h++) Y[h][(m >> 1) & 1] = LSA_S2(X[h][0], X[h][1]);
                if ((m & 3) == 3)
                    for (int h = 0; h < 3; h++) Z[h][m >> 2] = LSA_S3(Y[h][0], Y[h][1]);
            }
            v_store(sa + c, _mm512_permutexvar_ps(order, LSA_S4(Z[0][0], Z[0][1])));
            v_store(sb + c, _mm512_permutexvar_ps(order, LSA_S4(Z[1][0], Z[1][1])));
            v_store(sc + c, _mm512_permutexvar_ps(order, LSA_S4(Z[2][0], Z[2][1])));
        }
        for (; c < c1; c++) {
            vec pa, pb, pc;
            LSA_DOT3(0, pa, pb, pc)
            sa[c] = v_hsum(pa); sb[c] = v_hsum(pb); sc[c] = v_hsum(pc);
        }
#undef LSA_DOT3
    }
    return t;
}
#endif

#if LS_ISA == 512
/* One row's three heads (weights e, e + stride, e + 2 stride; accumulators p, p + dv, p + 2 dv) over
   visible keys [c0, c1): each value loaded once for the three, every head's sum in order of c. */
static inline void values3(const float *vb, long ve, const int *idx, long c0, long c1, const float *e,
                           long stride, float *p, long dv) {
    if (c0 >= c1) return;
    const float *e1 = e + stride, *e2 = e1 + stride;
    float *p1 = p + dv, *p2 = p1 + dv;
    vec a00 = v_load(p), a01 = v_load(p + 16), a02 = v_load(p + 32), a03 = v_load(p + 48);
    vec a10 = v_load(p1), a11 = v_load(p1 + 16), a12 = v_load(p1 + 32), a13 = v_load(p1 + 48);
    vec a20 = v_load(p2), a21 = v_load(p2 + 16), a22 = v_load(p2 + 32), a23 = v_load(p2 + 48);
    for (long c = c0; c < c1; c++) {
        const float *vp = vb + idx[c] * ve;
        if (c + AHEAD < c1) fetch_entry(vb + idx[c + AHEAD] * ve, 64);
        vec v0 = v_load(vp), v1 = v_load(vp + 16), v2 = v_load(vp + 32), v3 = v_load(vp + 48);
        vec f0 = v_set(e[c]), f1 = v_set(e1[c]), f2 = v_set(e2[c]);
        a00 = v_fma(f0, v0, a00); a01 = v_fma(f0, v1, a01); a02 = v_fma(f0, v2, a02); a03 = v_fma(f0, v3, a03);
        a10 = v_fma(f1, v0, a10); a11 = v_fma(f1, v1, a11); a12 = v_fma(f1, v2, a12); a13 = v_fma(f1, v3, a13);
        a20 = v_fma(f2, v0, a20); a21 = v_fma(f2, v1, a21); a22 = v_fma(f2, v2, a22); a23 = v_fma(f2, v3, a23);
    }
    v_store(p, a00); v_store(p + 16, a01); v_store(p + 32, a02); v_store(p + 48, a03);
    v_store(p1, a10); v_store(p1 + 16, a11); v_store(p1 + 32, a12); v_store(p1 + 48, a13);
    v_store(p2, a20); v_store(p2 + 16, a21); v_store(p2 + 32, a22); v_store(p2 + 48, a23);
}

/* Two rows' three heads each over the entries [n0, n1) both see; row a's weight for entry n0 + k is
   ea[k], row b's eb[k] (each head's weights `stride` floats after the last's). Each value is loaded
   once for the six sums (24 accumulators in registers): every sum is still the same operations in
   order of the entries as values3's. */
static __attribute__((noinline)) void values6(const float *vb, long ve, long n0, long n1, const float *ea,
                                              const float *eb, long stride, float *pa, float *pb, long dv) {
    const float *ea1 = ea + stride, *ea2 = ea1 + stride, *eb1 = eb + stride, *eb2 = eb1 + stride;
    float *pa1 = pa + dv, *pa2 = pa1 + dv, *pb1 = pb + dv, *pb2 = pb1 + dv;
#define LSA_LD4(P, i) vec P##i##0 = v_load(P##i), P##i##1 = v_load(P##i + 16), P##i##2 = v_load(P##i + 32), \
                          P##i##3 = v_load(P##i + 48);
#define LSA_ST4(P, i) v_store(P##i, P##i##0); v_store(P##i + 16, P##i##1); v_store(P##i + 32, P##i##2); \
                      v_store(P##i + 48, P##i##3);
#define LSA_FMA4(P, i, E) { vec f = v_set(E[n]); P##i##0 = v_fma(f, v0, P##i##0); P##i##1 = v_fma(f, v1, P##i##1); \
                            P##i##2 = v_fma(f, v2, P##i##2); P##i##3 = v_fma(f, v3, P##i##3); }
    float *pa0 = pa, *pb0 = pb;
    LSA_LD4(pa, 0) LSA_LD4(pa, 1) LSA_LD4(pa, 2) LSA_LD4(pb, 0) LSA_LD4(pb, 1) LSA_LD4(pb, 2)
    for (long n = 0; n < n1 - n0; n++) {
        const float *vp = vb + (n0 + n) * ve;
        vec v0 = v_load(vp), v1 = v_load(vp + 16), v2 = v_load(vp + 32), v3 = v_load(vp + 48);
        LSA_FMA4(pa, 0, ea) LSA_FMA4(pa, 1, ea1) LSA_FMA4(pa, 2, ea2)
        LSA_FMA4(pb, 0, eb) LSA_FMA4(pb, 1, eb1) LSA_FMA4(pb, 2, eb2)
    }
    LSA_ST4(pa, 0) LSA_ST4(pa, 1) LSA_ST4(pa, 2) LSA_ST4(pb, 0) LSA_ST4(pb, 1) LSA_ST4(pb, 2)
#undef LSA_LD4
#undef LSA_ST4
#undef LSA_FMA4
}
#endif

/* Row r's weighted values over its visible keys [c0, c1) (entries idx[c]), columns [x, x + 16 w),
   query heads t0 .. g - 1, added to the row's accumulators. */
static void values_row(const job *J, const scratch *S, const float *vb, const int *idx, long c0, long c1,
                       long r, long g, long stride, long dv, long x, long w, long t0) {
    long t = t0;
#if LS_ISA == 512
    for (; w == 4 && t + 3 <= g; t += 3) /* three query heads at a time */
        values3(vb + x, J->v_entry, idx, c0, c1, S->sc + (r * g + t) * stride, stride,
                S->acc + (r * g + t) * dv + x, dv);
#else
    /* three query heads at a time over 32 columns, then the next 32: 12 accumulator chains,
       which AVX2 machines need to keep both FMA units busy (8 chains leave them half idle), each value vector loaded once for the three heads (held in a
       register: memory operands would load it three times) */
    for (const long ve = J->v_entry; w == 4 && t + 3 <= g; t += 3) {
        const float *e0 = S->sc + (r * g + t) * stride, *e1 = e0 + stride, *e2 = e1 + stride;
        for (long y = 0; y < 64; y += 32) {
            float *p0 = S->acc + (r * g + t) * dv + x + y, *p1 = p0 + dv, *p2 = p1 + dv;
            __m256 a00 = _mm256_loadu_ps(p0), a01 = _mm256_loadu_ps(p0 + 8);
            __m256 a02 = _mm256_loadu_ps(p0 + 16), a03 = _mm256_loadu_ps(p0 + 24);
            __m256 a10 = _mm256_loadu_ps(p1), a11 = _mm256_loadu_ps(p1 + 8);
            __m256 a12 = _mm256_loadu_ps(p1 + 16), a13 = _mm256_loadu_ps(p1 + 24);
            __m256 a20 = _mm256_loadu_ps(p2), a21 = _mm256_loadu_ps(p2 + 8);
            __m256 a22 = _mm256_loadu_ps(p2 + 16), a23 = _mm256_loadu_ps(p2 + 24);
            for (long c = c0; c < c1; c++) {
                const float *vp = vb + idx[c] * ve + x + y;
                __m256 f0 = _mm256_broadcast_ss(e0 + c), f1 = _mm256_broadcast_ss(e1 + c);
                __m256 f2 = _mm256_broadcast_ss(e2 + c), u;
#define LSA_V3(o, i) u = _mm256_loadu_ps(vp + (o)); __asm__("" : "+x"(u)); \
                     a0##i = _mm256_fmadd_ps(f0, u, a0##i); a1##i = _mm256_fmadd_ps(f1, u, a1##i); \
                     a2##i = _mm256_fmadd_ps(f2, u, a2##i);
                LSA_V3(0, 0) LSA_V3(8, 1) LSA_V3(16, 2) LSA_V3(24, 3)
#undef LSA_V3
            }
            _mm256_storeu_ps(p0, a00); _mm256_storeu_ps(p0 + 8, a01);
            _mm256_storeu_ps(p0 + 16, a02); _mm256_storeu_ps(p0 + 24, a03);
            _mm256_storeu_ps(p1, a10); _mm256_storeu_ps(p1 + 8, a11);
            _mm256_storeu_ps(p1 + 16, a12); _mm256_storeu_ps(p1 + 24, a13);
            _mm256_storeu_ps(p2, a20); _mm256_storeu_ps(p2 + 8, a21);
            _mm256_storeu_ps(p2 + 16, a22); _mm256_storeu_ps(p2 + 24, a23);
        }
    }
#endif
    for (; t < g; t++) {
        const float *e = S->sc + (r * g + t) * stride;
        float *ap = S->acc + (r * g + t) * dv + x;
        if (w == 4) {
            vec a0 = v_load(ap), a1 = v_load(ap + 16), a2 = v_load(ap + 32), a3 = v_load(ap + 48);
            for (long c = c0; c < c1; c++) {
                const float *vp = vb + idx[c] * J->v_entry + x;
                vec p = v_set(e[c]);
                a0 = v_fma(p, v_load(vp), a0);
                a1 = v_fma(p, v_load(vp + 16), a1);
                a2 = v_fma(p, v_load(vp + 32), a2);
                a3 = v_fma(p, v_load(vp + 48), a3);
            }
            v_store(ap, a0); v_store(ap + 16, a1); v_store(ap + 32, a2); v_store(ap + 48, a3);
        } else
            for (long y = 0; y < w; y++) {
                vec a = v_load(ap + 16 * y);
                for (long c = c0; c < c1; c++)
                    a = v_fma(v_set(e[c]), v_load(vb + idx[c] * J->v_entry + x + 16 * y), a);
                v_store(ap + 16 * y, a);
            }
    }
}

/* Rows [i0, i0 + nr) of a view x one key/value head (its g query heads). */
static void unit(const job *J, const scratch *S, long view, long i0, long nr, long kh) {
    const long *P = J->plan + view * PLAN;
    long slot = P[0], n = P[2] - P[1], lo = P[3], keys = P[4] - P[3], kind = P[5];
    long g = J->heads / J->kv_heads, d = J->d, dv = J->dv, cap = S->cap, stride = cap + 16;
    const float *kb = J->k + slot * J->k_slot + kh * J->k_head;
    const float *vb = J->v + slot * J->v_slot + kh * J->v_head;
    long cnt[RB], cur[RB], first[RB];
    for (long r = 0; r < nr; r++) { /* visible entries */
        long i = i0 + r, c = 0;
        int *idx = S->idx + r * cap;
        if (kind == 2) {
            const unsigned char *m = J->masks + P[6] + i * keys;
            long j = 0;
            for (; j + 32 <= keys; j += 32) { /* 32 mask bytes at a time; a run of ones is common */
                __m256i z = _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(m + j)), _mm256_setzero_si256());
                unsigned int bits = ~(unsigned int)_mm256_movemask_epi8(z);
                if (bits == 0xFFFFFFFFu)
                    for (int b = 0; b < 32; b++) idx[c++] = (int)(lo + j + b);
                else
                    for (; bits; bits &= bits - 1) idx[c++] = (int)(lo + j + __builtin_ctz(bits));
            }
            for (; j < keys; j++)
                if (m[j]) idx[c++] = (int)(lo + j);
        } else {
            long see = kind == 1 ? keys - n + 1 + i : keys;
            for (long j = 0; j < see; j++) idx[c++] = (int)(lo + j);
        }
        cnt[r] = c;
        first[r] = c == 0 ? lo : idx[c - 1] - idx[0] == c - 1 ? idx[0] : -1;
    }
    /* scores, block by block of entries; a row's keys in groups of KB summed by one transpose */
    for (long r = 0; r < nr; r++) cur[r] = 0;
    for (long e0 = lo; e0 < lo + keys; e0 += EB) {
        for (long r = 0; r < nr; r++) {
            const int *idx = S->idx + r * cap;
            long c0 = cur[r], c1 = block_end(idx, cnt[r], c0, e0 + EB, first[r]);
            const float *qr = J->q + (P[1] + i0 + r) * J->q_row + kh * g * J->q_head;
            long t = 0;
#if LS_ISA == 512
            if (d == 64) t = scores3(J, S, qr, idx, c0, c1, r * g, g, stride, kb);
#endif
            for (; t < g; t++) {
                const float *qp = qr + t * J->q_head;
                float *s = S->sc + (r * g + t) * stride;
                long c = c0;
                if (d == 64) { /* the query in registers */
                    vec q0 = v_load(qp), q1 = v_load(qp + 16), q2 = v_load(qp + 32), q3 = v_load(qp + 48);
                    for (; c + KB <= c1; c += KB) {
                        vec part[KB];
                        for (int j = 0; j < KB; j++) {
                            const float *kp = kb + idx[c + j] * J->k_entry;
                            vec a = v_mul(q0, v_load(kp));
                            a = v_fma(q1, v_load(kp + 16), a);
                            a = v_fma(q2, v_load(kp + 32), a);
                            part[j] = v_fma(q3, v_load(kp + 48), a);
                        }
                        hsum_block(part, s + c);
                    }
                }
                for (; c + KB <= c1; c += KB) {
                    vec part[KB];
                    for (int j = 0; j < KB; j++) part[j] = dot_lanes(qp, kb + idx[c + j] * J->k_entry, d);
                    hsum_block(part, s + c);
                }
                for (; c < c1; c++) s[c] = v_hsum(dot_lanes(qp, kb + idx[c] * J->k_entry, d));
            }
            cur[r] = c1;
        }
    }
    /* softmax weights: max, exp, the sum by lanes c mod 16 */
    for (long r = 0; r < nr; r++)
        for (long t = 0; t < g; t++) {
            float *s = S->sc + (r * g + t) * stride, tmp[16], m = -INFINITY;
            long n_ = cnt[r];
            vec sv = v_set(J->scale);
            for (long c = 0; c < n_; c += 16) { /* scale; pad the tail with -inf */
                if (c + 16 > n_)
                    for (long l = n_; l < c + 16; l++) s[l] = -INFINITY;
                v_store(s + c, v_mul(v_load(s + c), sv));
            }
            if (J->softcap > 0) /* soft-capped scores (Gemma 2): cap * tanh(score / cap), each on its own */
                for (long c = 0; c < n_; c++) s[c] = tanhf(s[c] / J->softcap) * J->softcap;
            vec mx = v_load(s);
            for (long c = 16; c < n_; c += 16) mx = v_max(mx, v_load(s + c));
            v_store(tmp, mx);
            for (int l = 0; l < 16; l++) m = tmp[l] > m ? tmp[l] : m;
            vec vm = v_set(m), sum = v_zero();
            for (long c = 0; c < n_; c += 16) {
                vec e = v_exp(v_sub(v_load(s + c), vm));
                if (c + 16 > n_) { /* lanes past the end add nothing */
                    v_store(tmp, e);
                    for (long l = n_ - c; l < 16; l++) tmp[l] = 0.0f;
                    e = v_load(tmp);
                }
                v_store(s + c, e);
                sum = v_add(sum, e);
            }
            s[stride - 1] = 1.0f / v_hsum(sum);
        }
    /* weighted values in order of the entries, block by block, 64 columns at a time */
    for (long x = 0; x < dv; x += 64) {
        long w = dv - x >= 64 ? 4 : (dv - x) / 16;
        for (long r = 0; r < nr; r++) cur[r] = 0;
        for (long h = 0; h < nr * g; h++)
            for (long y = 0; y < w; y++) v_store(S->acc + h * dv + x + 16 * y, v_zero());
        for (long e0 = lo; e0 < lo + keys; e0 += EB)
            for (long r = 0; r < nr; r++) {
                const int *idx = S->idx + r * cap;
                long c0 = cur[r], c1 = block_end(idx, cnt[r], c0, e0 + EB, first[r]);
#if LS_ISA == 512
                if (w == 4 && g >= 3 && r + 1 < nr && first[r] >= 0 && first[r + 1] >= 0) {
                    /* two rows whose visible entries are consecutive (a prompt chunk's): the entries
                       both see in this block run for the two rows' three heads at once */
                    const int *idb = S->idx + (r + 1) * cap;
                    long c0b = cur[r + 1], c1b = block_end(idb, cnt[r + 1], c0b, e0 + EB, first[r + 1]);
                    long fa = first[r], fb = first[r + 1], g3 = g - g % 3;
                    long jl = fa + c0 > fb + c0b ? fa + c0 : fb + c0b;
                    long jh = fa + c1 < fb + c1b ? fa + c1 : fb + c1b;
                    if (jl < jh) {
                        for (long t = 0; t < g3; t += 3) {
                            const float *ea = S->sc + (r * g + t) * stride, *eb = ea + g * stride;
                            float *pa = S->acc + (r * g + t) * dv + x, *pb = pa + g * dv;
                            values3(vb + x, J->v_entry, idx, c0, jl - fa, ea, stride, pa, dv);
                            values3(vb + x, J->v_entry, idb, c0b, jl - fb, eb, stride, pb, dv);
                            values6(vb + x, J->v_entry, jl, jh, ea + (jl - fa), eb + (jl - fb), stride, pa, pb, dv);
                            values3(vb + x, J->v_entry, idx, jh - fa, c1, ea, stride, pa, dv);
                            values3(vb + x, J->v_entry, idb, jh - fb, c1b, eb, stride, pb, dv);
                        }
                        if (g3 < g) {
                            values_row(J, S, vb, idx, c0, c1, r, g, stride, dv, x, w, g3);
                            values_row(J, S, vb, idb, c0b, c1b, r + 1, g, stride, dv, x, w, g3);
                        }
                        cur[r] = c1;
                        cur[r + 1] = c1b;
                        r++;
                        continue;
                    }
                }
#endif
                values_row(J, S, vb, idx, c0, c1, r, g, stride, dv, x, w, 0);
                cur[r] = c1;
            }
        for (long r = 0; r < nr; r++)
            for (long t = 0; t < g; t++) {
                const float *ap = S->acc + (r * g + t) * dv + x;
                vec inv = v_set(S->sc[(r * g + t) * stride + stride - 1]);
                float *o = J->out + ((P[1] + i0 + r) * J->heads + kh * g + t) * dv + x;
                for (long y = 0; y < w; y++) v_store(o + 16 * y, v_mul(v_load(ap + 16 * y), inv));
            }
    }
}

/* out [rows][heads][dv] = attention of the rows of `nviews` views (plan: PLAN longs each) over the
   pool's keys k [slots][kv_heads][entries][d] and values v [..][dv] (strides in floats; the last
   dimension contiguous). q: row r, head h at q + r * q_row + h * q_head, d contiguous floats.
   d and dv are multiples of 16. softcap > 0 caps the scaled scores at +-softcap (cap * tanh(score /
   cap), before the softmax); 0 leaves them. Rows outside every view are not written. */
void attention_ragged(const float *q, long q_row, long q_head, const float *k, long k_slot, long k_head,
                long k_entry, const float *v, long v_slot, long v_head, long v_entry, long heads,
                long kv_heads, long d, long dv, const long *plan, long nviews, const unsigned char *masks,
                float scale, float softcap, float *out, int nthreads) {
    job J = {q, q_row, q_head, k, k_slot, k_head, k_entry, v, v_slot, v_head, v_entry, heads, kv_heads,
             d, dv, plan, masks, scale, softcap, out};
    long blocks = 0, cap = 16;
    for (long w = 0; w < nviews; w++) {
        blocks += (plan[w * PLAN + 2] - plan[w * PLAN + 1] + RB - 1) / RB;
        long keys = plan[w * PLAN + 4] - plan[w * PLAN + 3];
        if (keys > cap) cap = keys;
    }
    long units = blocks * kv_heads;
    long *where = malloc(sizeof(long) * 2 * (blocks ? blocks : 1)); /* (view, first row) per block */
    for (long w = 0, b = 0; w < nviews; w++)
        for (long i = 0; i < plan[w * PLAN + 2] - plan[w * PLAN + 1]; i += RB, b++) {
            where[2 * b] = w;
            where[2 * b + 1] = i;
        }
    long g = heads / kv_heads;
    if (nthreads < 1) nthreads = 1;
    if (units < nthreads) nthreads = (int)(units ? units : 1);
#pragma omp parallel num_threads(nthreads)
    {
        scratch S = {malloc(sizeof(int) * RB * cap), malloc(sizeof(float) * RB * g * (cap + 16)),
                     malloc(sizeof(float) * RB * g * dv), cap};
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < units; u++) {
            long b = u % blocks, kh = u / blocks; /* a thread's next units share its keys and values */
            long w = where[2 * b], i = where[2 * b + 1], n = plan[w * PLAN + 2] - plan[w * PLAN + 1];
            unit(&J, &S, w, i, n - i < RB ? n - i : RB, kh);
        }
        free(S.idx);
        free(S.sc);
        free(S.acc);
    }
    free(where);
}
