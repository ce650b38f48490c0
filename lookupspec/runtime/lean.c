/* The lean forward's element-wise steps around attention, as transformers computes them in float32,
   in one call each instead of a dozen torch ops (lean.py; lean_native.py loads this).

   lsl_rope_store: the rotary embedding of a forward's query and key heads, with the rows' keys
   and values written into their slots of the KV pool:
     out[i] = x[i] * cos[i] + r[i] * sin[i],   r = (-x[d/2 ..], x[.. d/2])   (rotate_half)
   every product and the sum rounded on their own, as torch's three ops do (this file is built with
   -ffp-contract=off, so no fused multiply-add joins them; negating is exact). The values are
   copied as they are. Queries go to q_out [rows][heads][d]; keys and values of rows < real to the
   pool at (slot[r], entry[r]).

   lsl_rms_scale: RMSNorm after its mean of squares (which stays torch's, its summation order is
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
void lsl_rope_store(const float *qkv, long qkv_row, long qkv_head, long rows, long heads, long kv_heads,
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

/* x: row r at x + r * x_row (dim contiguous floats); var: one float per row; out [rows][dim]. */
void lsl_rms_scale(const float *x, long x_row, const float *var, const float *w, float eps, float *out,
                   long rows, long dim, int nthreads) {
    if (nthreads < 1 || rows < PARALLEL_ROWS) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long r = 0; r < rows; r++) {
        float inv = 1.0f / sqrtf(var[r] + eps);
        const float *xr = x + r * x_row;
        float *o = out + r * dim;
        for (long i = 0; i < dim; i++) {
            float t = xr[i] * inv;
            o[i] = w[i] * t;
        }
    }
}
