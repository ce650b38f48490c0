/* The lean forward's element-wise steps around attention, as transformers computes them in float32,
   in one call each instead of a dozen torch ops (lean.py; layer_ops.py loads this).

   layer_rope_store: the rotary embedding of a forward's query and key heads, with the rows' keys
   and values written into their slots of the KV pool:
     out[i] = x[i] * cos[i] + r[i] * sin[i],   r = (-x[d/2 ..], x[.. d/2])   (rotate_half)
   every product and the sum rounded on their own, as torch's three ops do (this file is built with
   -ffp-contract=off, so no fused multiply-add joins them; negating is exact). The values are
   copied as they are. Queries go to q_out [rows][heads][d]; keys and values of rows < real to the
   pool at (slot[r], entry[r]).

   layer_add_rms: the residual sum and the next RMSNorm in one pass, the mean of squares summed in
   the order of torch's reduction (its cascade of vector accumulators, for the vector width torch's
   kernels use here: layer_ops.py finds it by comparing with torch at load, and keeps torch's
   mean where neither width gives its bits).

   layer_rms_scale: RMSNorm after its mean of squares (which stays torch's, its summation order is
   torch's):  out[r][i] = w[i] * (x[r][i] * (1 / sqrt(var[r] + eps))), each operation rounded as
   torch's rsqrt, mul and mul round it.

   Threads: the calling thread's OpenMP team (torch's), for forwards of many rows. */

#include <math.h>
#include <omp.h>
#include <string.h>

#define PARALLEL_ROWS 32 /* fewer rows than this: one thread (a decode step's rows are a few us) */

static inline void rope_row(const float *x, const float *c, const float *s, float *out, long d) {
    long h = d / 2;
    for (long i = 0; i < h; i++) {
        float a = x[i] * c[i];
        float b = (-x[i + h]) * s[i];
        out[i] = a + b;
    }
    for (long i = h; i < d; i++) {
        float a = x[i] * c[i];
        float b = x[i - h] * s[i];
        out[i] = a + b;
    }
}

/* qkv: row r, head j (queries 0..heads-1, keys heads..heads+kv_heads-1, values after) at
   qkv + r * qkv_row + j * qkv_head, d contiguous floats (values: dv). cos/sin: row r at
   + r * cs_row. keys/values: the layer's pool tensors (strides in floats, d / dv contiguous). */
void layer_rope_store(const float *qkv, long qkv_row, long qkv_head, long rows, long heads, long kv_heads,
                    long d, long dv, const float *cos, const float *sin, long cs_row, float *q_out,
                    float *keys, long k_slot, long k_head, long k_entry, float *values, long v_slot,
                    long v_head, long v_entry, const long *slot, const long *entry, long real,
                    int nthreads) {
    if (nthreads < 1 || rows < PARALLEL_ROWS) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *xr = qkv + r * qkv_row, *c = cos + r * cs_row, *s = sin + r * cs_row;
        for (long j = 0; j < heads; j++)
            rope_row(xr + j * qkv_head, c, s, q_out + (r * heads + j) * d, d);
        if (r >= real) continue; /* a pad row: nothing to keep */
        float *kd = keys + slot[r] * k_slot + entry[r] * k_entry;
        float *vd = values + slot[r] * v_slot + entry[r] * v_entry;
        for (long j = 0; j < kv_heads; j++) {
            rope_row(xr + (heads + j) * qkv_head, c, s, kd + j * k_head, d);
            memcpy(vd + j * v_head, xr + (heads + kv_heads + j) * qkv_head, sizeof(float) * dv);
        }
    }
}

/* RMSNorm's scaling of one row once its mean of squares is known: w * (x * (1 / sqrt(var + eps))),
   each operation rounded as torch's rsqrt, mul and mul round it. */
static inline void scale_row(const float *x, float var, const float *w, float eps, float *out, long dim) {
    float inv = 1.0f / sqrtf(var + eps);
    for (long i = 0; i < dim; i++) {
        float t = x[i] * inv;
        out[i] = w[i] * t;
    }
}

/* ceil(log2(x)) as ATen's utils::CeilLog2 (1 for x <= 2). */
static long ceil_log2(long x) {
    if (x <= 2) return 1;
    long k = 0;
    while ((1L << k) < x) k++;
    return k;
}

#define LEVELS 4 /* ATen's multi_row_sum: a cascade of 4 accumulator levels */
#define ILP 4    /* ATen's row_sum: 4 interleaved vector accumulators */

/* sum(x[i] * x[i]) over a row of n floats, added in the order of ATen's cascade_sum for a contiguous
   inner reduction with `w`-lane vectors (vectorized_inner_sum -> row_sum -> multi_row_sum): the
   squares are rounded first (torch's pow(2) is x * x, a tensor of its own), then summed lane by
   lane in the same tree, then the tail and the lanes in order, onto the zero-filled output. */
static float sum_squares(const float *x, long n, int w) {
    float acc[LEVELS][ILP][16];
    memset(acc, 0, sizeof(acc));
    long vecs = n / w, size = vecs / ILP;
    long power = ceil_log2(size) / LEVELS;
    if (power < 4) power = 4;
    long step = 1L << power, mask = step - 1, i = 0;
    for (; i + step <= size;) {
        for (long j = 0; j < step; ++j, ++i)
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < w; l++) {
                    float v = x[(i * ILP + k) * w + l];
                    float sq = v * v;
                    acc[0][k][l] = acc[0][k][l] + sq;
                }
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < w; l++) {
                    acc[j][k][l] = acc[j][k][l] + acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * power))) != 0) break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < w; l++) {
                float v = x[(i * ILP + k) * w + l];
                float sq = v * v;
                acc[0][k][l] = acc[0][k][l] + sq;
            }
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] = acc[0][k][l] + acc[j][k][l];
    for (long v = size * ILP; v < vecs; v++) /* row_sum's leftover vectors into the first chain */
        for (int l = 0; l < w; l++) {
            float e = x[v * w + l];
            float sq = e * e;
            acc[0][0][l] = acc[0][0][l] + sq;
        }
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < w; l++) acc[0][0][l] = acc[0][0][l] + acc[0][k][l];
    float total = 0.0f;
    for (long k = vecs * w; k < n; k++) {
        float sq = x[k] * x[k];
        total = total + sq;
    }
    for (int l = 0; l < w; l++) total = total + acc[0][0][l];
    return 0.0f + total;
}

/* The residual sum and the next RMSNorm: h[r] += y[r] (y may be NULL), then
   out[r] = w * (h[r] * (1 / sqrt(sum(h[r]^2) / dim + eps))), the sum as sum_squares with `lanes`-wide
   vectors: torch's h + y, h.pow(2).mean(-1), + eps, rsqrt, * and * in one pass. h, y and out are
   [rows][dim], contiguous. */
void layer_add_rms(float *h, const float *y, const float *w, float eps, float *out, long rows, long dim,
                 int lanes, int nthreads) {
    if (nthreads < 1 || rows < PARALLEL_ROWS) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long r = 0; r < rows; r++) {
        float *hr = h + r * dim;
        if (y)
            for (long i = 0; i < dim; i++) hr[i] = hr[i] + y[r * dim + i];
        scale_row(hr, sum_squares(hr, dim, lanes) / (float)dim, w, eps, out + r * dim, dim);
    }
}

/* x: row r at x + r * x_row (dim contiguous floats); var: one float per row; out [rows][dim]. */
void layer_rms_scale(const float *x, long x_row, const float *var, const float *w, float eps, float *out,
                   long rows, long dim, int nthreads) {
    if (nthreads < 1 || rows < PARALLEL_ROWS) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long r = 0; r < rows; r++) scale_row(x + r * x_row, var[r], w, eps, out + r * dim, dim);
}
