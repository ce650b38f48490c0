/* Float32 linear layers for decoding on x86 CPUs: y = x @ W.T + b for a few to a few hundred rows.

   W is packed once as [ceil(N/16)][K][16]: each block of 16 output columns is one contiguous
   stream. A tile of R rows x C blocks keeps R*C 16-lane accumulators in registers and walks k from
   0 to K-1, one fused multiply-add per accumulator and k: the weights stream from memory once per
   tile while every row of the tile uses them, so a handful of rows cost little more than one.

   Every output element is the same chain, acc = fma(x[m][k], W[n][k], acc) for k = 0..K-1 from
   acc = 0, then + b[n]: its bits do not depend on M, on the row's place, on the tiling, on the
   thread count or on which columns are computed with it (so fused projections equal their parts).
   That is what makes a batched forward give each sequence its batch-of-one bits.

   Past a few rows, a tile computes longer than its weights take to arrive, and the rows' later tiles
   read the panel from cache: without help the memory would idle while they compute, and a step would
   cost the stream's time plus most of the arithmetic's. So the tiles of a panel prefetch the next
   panel, a share each, and the two overlap. Up to 6 rows (AVX-512) the stream is the whole cost and
   the hardware prefetcher keeps up: there the extra requests only cost, so they are not made.

   Threads: the calling thread's OpenMP team. Loaded after torch, this library shares torch's
   libgomp (same soname), so its parallel regions run on torch's own worker threads. */

#include <omp.h>
#include <stddef.h>
#include <string.h>

#include "simd.h"

#if LS_ISA == 512
#define RMAX4 6
#define RMAX3 8
#define RMAX2 12
#else
#define RMAX4 1
#define RMAX3 1
#define RMAX2 3
#endif

int matmul_isa(void) { return LS_ISA; }

/* W [N][K] row-major -> out [ceil(N/16)][K][16], zero past column N. */
void matmul_pack(const float *w, float *out, long N, long K) {
    long nb = (N + 15) / 16;
    for (long b = 0; b < nb; b++)
        for (long k = 0; k < K; k++)
            for (long j = 0; j < 16; j++) {
                long n = b * 16 + j;
                out[(b * K + k) * 16 + j] = n < N ? w[n * K + k] : 0.0f;
            }
}

/* The inverse of matmul_pack. */
void matmul_unpack(const float *packed, float *w, long N, long K) {
    for (long n = 0; n < N; n++)
        for (long k = 0; k < K; k++)
            w[n * K + k] = packed[((n / 16) * K + k) * 16 + n % 16];
}

/* Stores one 16-column accumulator (+ bias) into the first `cols` columns of y. */
static inline void put(float *y, vec acc, const float *bias, long cols) {
    float tmp[16];
    if (bias) {
        if (cols >= 16) {
            acc = v_add(acc, v_load(bias));
        } else {
            float b[16] = {0};
            memcpy(b, bias, (size_t)cols * sizeof(float));
            acc = v_add(acc, v_load(b));
        }
    }
    if (cols >= 16) {
        v_store(y, acc);
    } else {
        v_store(tmp, acc);
        memcpy(y, tmp, (size_t)cols * sizeof(float));
    }
}

/* One tile: R rows x C blocks. It also prefetches the cache lines [pf, pf_end), pf_n at each k. */
#define TILE(R, C)                                                                                  \
    static void tile_##R##_##C(const float *x, long ldx, const float *wp, long K, float *y, long ldy,  \
                               const float *bias, long cols, const char *pf, const char *pf_end,    \
                               int pf_n) {                                                           \
        vec acc[R][C];                                                                               \
        for (int r = 0; r < R; r++)                                                                  \
            for (int c = 0; c < C; c++) acc[r][c] = v_zero();                                        \
        for (long k = 0; k < K; k++) {                                                               \
            for (int p = 0; p < pf_n && pf < pf_end; p++, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);    \
            vec w[C];                                                                                \
            for (int c = 0; c < C; c++) w[c] = v_load(wp + ((long)c * K + k) * 16);                  \
            for (int r = 0; r < R; r++) {                                                            \
                float a = x[r * ldx + k];                                                            \
                for (int c = 0; c < C; c++) acc[r][c] = v_fma(v_set(a), w[c], acc[r][c]);                   \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C && c * 16 < cols; c++) {                                               \
            long left = cols - c * 16;                                                               \
            for (int r = 0; r < R; r++)                                                              \
                put(y + r * ldy + c * 16, acc[r][c], bias ? bias + c * 16 : NULL, left);             \
        }                                                                                            \
    }

typedef void (*tile_fn)(const float *, long, const float *, long, float *, long, const float *, long,
                        const char *, const char *, int);

TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1) TILE(5, 1) TILE(6, 1)
static const tile_fn T1[7] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1, tile_5_1, tile_6_1};
#if LS_ISA == 512
TILE(1, 2) TILE(2, 2) TILE(3, 2) TILE(4, 2) TILE(5, 2) TILE(6, 2)
TILE(7, 2) TILE(8, 2) TILE(9, 2) TILE(10, 2) TILE(11, 2) TILE(12, 2)
TILE(1, 3) TILE(2, 3) TILE(3, 3) TILE(4, 3) TILE(5, 3) TILE(6, 3) TILE(7, 3) TILE(8, 3)
TILE(1, 4) TILE(2, 4) TILE(3, 4) TILE(4, 4) TILE(5, 4) TILE(6, 4)
static const tile_fn T2[13] = {0, tile_1_2, tile_2_2, tile_3_2, tile_4_2, tile_5_2, tile_6_2,
                               tile_7_2, tile_8_2, tile_9_2, tile_10_2, tile_11_2, tile_12_2};
static const tile_fn T3[9] = {0, tile_1_3, tile_2_3, tile_3_3, tile_4_3, tile_5_3, tile_6_3, tile_7_3, tile_8_3};
static const tile_fn T4[7] = {0, tile_1_4, tile_2_4, tile_3_4, tile_4_4, tile_5_4, tile_6_4};
#else
TILE(1, 2) TILE(2, 2) TILE(3, 2)
static const tile_fn T2[4] = {0, tile_1_2, tile_2_2, tile_3_2};
static const tile_fn T3[2] = {0, 0};
static const tile_fn T4[2] = {0, 0};
#endif

/* Rows [0, M) x blocks [b0, b1): tiles of `width` blocks (fewer where fewer are left) and up to
   `rows` rows each; with `prefetch`, each panel's tiles fetch the next panel's lines, a share each
   (a block at one k is one 64-byte line). */
static void run_blocks(const float *x, long M, long K, const float *wp, long N, const float *bias, float *y,
                       long b0, long b1, int width, int rows, int prefetch) {
    long b = b0;
    while (b < b1) {
        int c = width;
        while (c > 1 && b + c > b1) c = c == 3 ? 2 : c / 2;
        int rmax = c == 4 ? RMAX4 : c == 3 ? RMAX3 : c == 2 ? RMAX2 : 6;
        int step = rows < rmax ? rows : rmax;
        const tile_fn *table = c == 4 ? T4 : c == 3 ? T3 : c == 2 ? T2 : T1;
        long cols = N - b * 16;
        if (cols > 16L * c) cols = 16L * c;
        long tiles = (M + step - 1) / step, after = b1 - b - c;
        long lines = prefetch ? (after < width ? after : width) * K : 0;
        long share = (lines + tiles - 1) / tiles;
        int pf_n = (int)((share + K - 1) / K);
        /* (no next panel: an empty range inside this one, so no pointer leaves the weights) */
        const char *next = (const char *)(wp + (lines ? b + c : b) * K * 16);
        for (long m0 = 0, t = 0; m0 < M; m0 += step, t++) {
            long r = M - m0 < step ? M - m0 : step;
            long from = t * share < lines ? t * share : lines, to = from + share < lines ? from + share : lines;
            const char *pf = next + from * 64, *pf_end = next + to * 64;
            table[r](x + m0 * K, K, wp + b * K * 16, K, y + m0 * N + b * 16, N, bias ? bias + b * 16 : NULL,
                     cols, pf, pf_end, pf_n);
        }
        b += c;
    }
}

/* The tiles for M rows: `width` blocks of up to `rows` rows, prefetching the next panel or not. */
typedef struct { int width, rows, prefetch; } shape;

static inline shape tile_shape(long M) {
    /* Tile shapes, measured on SmolLM2-135M's products (2 cores; any tiling gives the same bits).
       AVX-512, up to 6 rows: one 4-block tile of all the rows, each weight read once. 9-12 rows: one
       2-block tile of all the rows (24 accumulators; each weight still read once, 12% faster than
       3-block tiles of 8 rows and a second tile). Otherwise 3-block tiles of up to 8 rows (24
       accumulators: the most that leave registers for the weights). */
    int one_tile = M > 8 && M <= 12;
    int width = M <= 6 ? 4 : one_tile ? 2 : 3;
    int rows = M <= 6 ? 6 : one_tile ? 12 : 8;
    int prefetch = M > 6;
#if LS_ISA != 512
    /* AVX2 has 16 registers. Past 8 rows (prompt chunks, verified draft trees), 1-block tiles of up
       to 6 rows: 12 accumulators, 2 weight registers and the broadcast fit without spilling, where a
       2-block tile of 3 rows needs 17 registers (1.3-1.8x faster from 12 rows on). Up to 8 rows, the
       decode steps of a batch, which stream the weights from memory: 2-block tiles of 3 rows, which
       read two streams at once. */
    width = M <= 8 ? 2 : 1;
    rows = M <= 8 ? 3 : 6;
    /* Its tiles hold 3 rows, so from 3 rows on a tile computes as long as its panel takes to arrive,
       and the prefetch pays (1-2 rows: it makes no difference). */
    prefetch = M > 2;
#endif
    shape sh = {width, rows, prefetch};
    return sh;
}

/* y [M][N] = x [M][K] @ W.T (+ bias), W packed by matmul_pack; x and y row-major and contiguous. */
void matmul_f32(const float *x, long M, long K, const float *wp, long N, const float *bias, float *y,
                int nthreads) {
    long nb = (N + 15) / 16;
    shape sh = tile_shape(M);
    int width = sh.width, rows = sh.rows, prefetch = sh.prefetch;
    if (nthreads < 1) nthreads = 1;
    if (nb < nthreads) nthreads = (int)nb;
    if (nthreads == 1) {
        run_blocks(x, M, K, wp, N, bias, y, 0, nb, width, rows, prefetch);
        return;
    }
#pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        long b0 = nb * t / nt, b1 = nb * (t + 1) / nt;
        run_blocks(x, M, K, wp, N, bias, y, b0, b1, width, rows, prefetch);
    }
}

#include "matmul_quant.h"
