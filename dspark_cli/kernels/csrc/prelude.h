/* Shared by the kernels (vocab.c, attention.c): GCC / clang vector extensions and a vector exp. */
#ifndef DSPARK_PRELUDE_H
#define DSPARK_PRELUDE_H
#include <math.h>
#include <stdint.h>

/* 16 floats (one AVX-512 register, two AVX2 ones), lane-wise ops. */
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
#define W 16
#define SIGN ((vi){0} + (int32_t)0x80000000)

static inline vf vload(const float *p) { vf v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
static inline vf vsplat(float x) { return (vf){0} + x; }
static inline vf vmax(vf a, vf b) { vi m = a > b; return (vf)((m & (vi)a) | (~m & (vi)b)); }
static inline vf vabs(vf a) { return (vf)((vi)a & ~SIGN); }
static inline vf vcopysign_pos(vf p, vf d) { return (vf)((vi)p | ((vi)d & SIGN)); }  /* p >= 0 */
static inline float hsum(vf v) { float s = 0.0f; for (int k = 0; k < W; k++) s += v[k]; return s; }
static inline float hmax(vf v) { float m = v[0]; for (int k = 1; k < W; k++) m = v[k] > m ? v[k] : m; return m; }

/* exp(x) for x <= 0 (logits minus their row max): Cephes expf, ~1 ulp; below -87 it returns
   ~1e-38 instead of underflowing, which is 0 for every use here. */
static inline vf vexp_le0(vf x) {
    vi low = x < -87.0f;  /* false for NaN: a NaN logit stays NaN and so does the loss */
    x = (vf)((low & (vi)vsplat(-87.0f)) | (~low & (vi)x));
    vi ni = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);  /* round half away (x <= 0) */
    vf n = __builtin_convertvector(ni, vf);
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf e = p * r * r + r + 1.0f;
    return e * (vf)((ni + 127) << 23);
}
static inline float row_max(const float *x, int64_t V) {
    const int64_t body = V - V % W;
    int64_t v;
    vf mv = vsplat(x[0]);
    for (v = 0; v < body; v += W) mv = vmax(mv, vload(x + v));
    float m = hmax(mv);
    for (; v < V; v++) m = x[v] > m ? x[v] : m;
    return m;
}
static inline float exp_le0(float x) {
    vf v = vexp_le0(vsplat(x));
    return v[0];
}
static inline vf vsel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }
#endif
