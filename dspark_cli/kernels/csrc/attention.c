/* DSpark block attention, forward and backward, fp32 (draft/attention.py "blockwise", kernels/attention.py).

   q [B, Hq, Q, D], k [B, Hk, T + Q, D], v [B, Hk, T + Q, Dv] with any strides over the first three
   dims and unit stride over the last; ctx_limit [B, A] contiguous; Q = A * N, N <= W; D and Dv
   multiples of W. Query i of block j (query index j * N + i) sees the context keys t < ctx_limit[b, j]
   (clamped to [0, T]) and the N keys T + j * N ... of its own block; query head h reads KV head
   h / (Hq / Hk). The R = (Hq / Hk) * N query rows of a block share one key set and are processed
   together.

   One row's scores live in a buffer of Lp + W floats: the context keys at [0, Lp) (L rounded up to
   W) and the block's keys at [Lp, Lp + W). Padding lanes are -inf before the softmax and 0 after it,
   so every loop runs on whole vectors. Scores and dO . v are taken against transposed keys / values
   ([D, keys]: one broadcast query element times W keys per FMA); sums over keys (the output, dq, dk,
   dv) run over key rows, W head dims per FMA. The backward reads the softmax the forward kept, or
   recomputes it from the saved log-sum-exp as flash attention does. */
#include <stdlib.h>
#include <string.h>
#include "prelude.h"

typedef struct { float *p; int64_t sb, sh, ss; } view_t;  /* strides in elements; the last dim is unit */

static inline float *at(view_t x, int64_t b, int64_t h, int64_t s) { return x.p + b * x.sb + h * x.sh + s * x.ss; }

typedef struct {
    int64_t B, Hq, Hk, T, Q, N, D, Dv, A, rep, Tp;
    view_t q, k, v;
    const int64_t *ctx_limit;
    float scale;
} attn_t;

/* one block: its context length, the valid lanes, its own keys / values transposed */
typedef struct {
    int64_t L, Lp, width;
    vi tail, blk;  /* valid lanes of the last context vector (all when L % W == 0), of the block vector */
    float *kbt, *vbt;  /* [D, W], [Dv, W], zero padded */
} blk_t;

static inline vi lanes_below(int64_t n) {
    vi idx;
    for (int k = 0; k < W; k++) idx[k] = k;
    return idx < (vi){0} + (int32_t)n;
}

/* rows s0 .. s0 + rows - 1 of x (b, h) -> xt [D, ld], columns >= rows zero */
static void transpose(view_t x, int64_t b, int64_t h, int64_t s0, int64_t rows, int64_t D, int64_t ld, float *xt) {
    for (int64_t d = 0; d < ld * D; d++) xt[d] = 0.0f;
    for (int64_t t = 0; t < rows; t++) {
        const float *r = at(x, b, h, s0 + t);
        for (int64_t d = 0; d < D; d++) xt[d * ld + t] = r[d];
    }
}

static void block_setup(const attn_t *a, int64_t b, int64_t hk, int64_t j, blk_t *g, int with_v) {
    int64_t L = a->ctx_limit[b * a->A + j];
    g->L = L < 0 ? 0 : (L > a->T ? a->T : L);
    g->Lp = (g->L + W - 1) / W * W;
    g->width = g->Lp + W;
    g->tail = lanes_below(g->L % W ? g->L % W : W);
    g->blk = lanes_below(a->N);
    transpose(a->k, b, hk, a->T + j * a->N, a->N, a->D, W, g->kbt);
    if (with_v) transpose(a->v, b, hk, a->T + j * a->N, a->N, a->Dv, W, g->vbt);
}

/* s[t] = mul * sum_d x[d] * yt[d, t] for t < Lp (a multiple of W), four vectors at a time */
static void row_times_t(const float *x, const float *yt, int64_t ld, int64_t D, int64_t Lp, float mul, float *s) {
    int64_t t = 0;
    for (; t + 4 * W <= Lp; t += 4 * W) {
        vf a0 = vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t d = 0; d < D; d++) {
            const float *y = yt + d * ld + t;
            vf xd = vsplat(x[d]);
            a0 += xd * vload(y);
            a1 += xd * vload(y + W);
            a2 += xd * vload(y + 2 * W);
            a3 += xd * vload(y + 3 * W);
        }
        vstore(s + t, a0 * mul);
        vstore(s + t + W, a1 * mul);
        vstore(s + t + 2 * W, a2 * mul);
        vstore(s + t + 3 * W, a3 * mul);
    }
    for (; t < Lp; t += W) {
        vf a0 = vsplat(0.0f);
        for (int64_t d = 0; d < D; d++) a0 += vsplat(x[d]) * vload(yt + d * ld + t);
        vstore(s + t, a0 * mul);
    }
}

/* scaled x . [context keys, block keys] into s (padding -inf); returns their max */
static float scores(const attn_t *a, const blk_t *g, const float *x, const float *kt, float *s) {
    row_times_t(x, kt, a->Tp, a->D, g->Lp, a->scale, s);
    row_times_t(x, g->kbt, W, a->D, W, a->scale, s + g->Lp);
    vf ninf = vsplat(-INFINITY), mv = ninf;
    if (g->Lp) {
        vstore(s + g->Lp - W, vsel(g->tail, vload(s + g->Lp - W), ninf));
        for (int64_t t = 0; t < g->Lp; t += W) mv = vmax(mv, vload(s + t));
    }
    vf sb = vsel(g->blk, vload(s + g->Lp), ninf);
    vstore(s + g->Lp, sb);
    return hmax(vmax(mv, sb));
}

/* s <- exp(s - m), 0 on the padding; returns the sum */
static float exp_shift(const blk_t *g, float *s, float m) {
    vf acc = vsplat(0.0f), zero = vsplat(0.0f);
    for (int64_t t = 0; t < g->Lp; t += W) {
        vf e = vexp_le0(vload(s + t) - m);
        if (t + W == g->Lp) e = vsel(g->tail, e, zero);
        vstore(s + t, e);
        acc += e;
    }
    vf e = vsel(g->blk, vexp_le0(vload(s + g->Lp) - m), zero);
    vstore(s + g->Lp, e);
    return hsum(acc + e);
}

/* y = mul * sum over the valid keys t of w[t] * row t (context rows of x (b, h), then the block's) */
static void weighted_rows(const attn_t *a, const blk_t *g, const float *w, view_t x, int64_t b, int64_t h,
                          int64_t j, int64_t D, float mul, float *y) {
    const float *xc = at(x, b, h, 0), *xb = at(x, b, h, a->T + j * a->N);
    for (int64_t d = 0; d < D; d += W) {
        vf acc = vsplat(0.0f);
        for (int64_t t = 0; t < g->L; t++) acc += w[t] * vload(xc + t * x.ss + d);
        for (int64_t i = 0; i < a->N; i++) acc += w[g->Lp + i] * vload(xb + i * x.ss + d);
        vstore(y + d, acc * mul);
    }
}

static inline float dot(const float *x, const float *y, int64_t D) {
    vf acc = vsplat(0.0f);
    for (int64_t d = 0; d < D; d += W) acc += vload(x + d) * vload(y + d);
    return hsum(acc);
}

/* query head and index of row r of block j */
static inline int64_t row_head(const attn_t *a, int64_t hk, int64_t r) { return hk * a->rep + r / a->N; }
static inline int64_t row_query(const attn_t *a, int64_t j, int64_t r) { return j * a->N + r % a->N; }

/* out [B, Hq, Q, Dv] (strided), lse [B, Hq, Q] contiguous: the log-sum-exp of each row's scores;
   probs (NULL: not kept) [B, Hq, Q, Tp + W]: each row's softmax in the score layout above, for the backward */
void dspark_block_attn_fwd(int64_t B, int64_t Hq, int64_t Hk, int64_t T, int64_t Q, int64_t N, int64_t D, int64_t Dv,
                           const int64_t *strides, float *q, float *k, float *v, const int64_t *ctx_limit, float scale,
                           float *out, float *lse, float *probs, int threads) {
    const int64_t *st = strides;  /* (sb, sh, ss) of q, k, v, out */
    attn_t a = {B, Hq, Hk, T, Q, N, D, Dv, Q / N, Hq / Hk, (T + W - 1) / W * W,
                {q, st[0], st[1], st[2]}, {k, st[3], st[4], st[5]}, {v, st[6], st[7], st[8]}, ctx_limit, scale};
    view_t o = {out, st[9], st[10], st[11]};
    float *kt = malloc(sizeof(float) * B * Hk * D * a.Tp);
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < B * Hk; u++) transpose(a.k, u / Hk, u % Hk, 0, T, D, a.Tp, kt + u * D * a.Tp);
        float *s = malloc(sizeof(float) * (a.Tp + W));
        blk_t g = {.kbt = malloc(sizeof(float) * D * W), .vbt = NULL};
        #pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < B * Hk * a.A; u++) {
            int64_t b = u / (Hk * a.A), hk = (u / a.A) % Hk, j = u % a.A;
            block_setup(&a, b, hk, j, &g, 0);
            for (int64_t r = 0; r < a.rep * N; r++) {
                int64_t h = row_head(&a, hk, r), i = row_query(&a, j, r);
                float m = scores(&a, &g, at(a.q, b, h, i), kt + (b * Hk + hk) * D * a.Tp, s);
                float sum = exp_shift(&g, s, m), inv = 1.0f / sum;
                int64_t row = (b * Hq + h) * Q + i;
                lse[row] = m + logf(sum);
                weighted_rows(&a, &g, s, a.v, b, hk, j, Dv, inv, at(o, b, h, i));
                if (probs) {
                    float *pr = probs + row * (a.Tp + W);
                    for (int64_t t = 0; t < g.width; t += W) vstore(pr + t, vload(s + t) * inv);
                    for (int64_t t = g.width; t < a.Tp + W; t += W) vstore(pr + t, vsplat(0.0f));  /* defined */
                }
            }
        }
        free(s);
        free(g.kbt);
    }
    free(kt);
}

/* dq, dk, dv (strided like q, k, v) from dout, out (strided like out) and lse, or from the forward's
   probs when it kept them (NULL: the softmax is recomputed from q, k and lse). Work unit: (b, hk,
   segment of blocks); with several segments per (b, hk) (when B * Hk is small next to the threads),
   each segment's context-key gradients go to its own zeroed slice of a scratch buffer and are summed
   at the end, so no two threads add to the same row. */
void dspark_block_attn_bwd(int64_t B, int64_t Hq, int64_t Hk, int64_t T, int64_t Q, int64_t N, int64_t D, int64_t Dv,
                           const int64_t *strides, float *q, float *k, float *v, const int64_t *ctx_limit, float scale,
                           float *out, const float *lse, const float *probs, float *dout, float *dq, float *dk,
                           float *dv, int64_t segs, int threads) {
    const int64_t *st = strides;  /* (sb, sh, ss) of q, k, v, out, dout, dq, dk, dv */
    attn_t a = {B, Hq, Hk, T, Q, N, D, Dv, Q / N, Hq / Hk, (T + W - 1) / W * W,
                {q, st[0], st[1], st[2]}, {k, st[3], st[4], st[5]}, {v, st[6], st[7], st[8]}, ctx_limit, scale};
    view_t o = {out, st[9], st[10], st[11]}, go = {dout, st[12], st[13], st[14]};
    view_t gq = {dq, st[15], st[16], st[17]}, gk = {dk, st[18], st[19], st[20]}, gv = {dv, st[21], st[22], st[23]};
    const int64_t K = T + Q, R = a.rep * N, width = a.Tp + W, per_seg = (a.A + segs - 1) / segs;
    /* transposed context keys only to recompute the softmax; values always (dO . v) */
    float *kt = probs ? NULL : malloc(sizeof(float) * B * Hk * D * a.Tp);
    float *vt = malloc(sizeof(float) * B * Hk * Dv * a.Tp);
    float *part = segs > 1 ? calloc((size_t)(B * Hk * segs * T * (D + Dv)), sizeof(float)) : NULL;
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < B * Hk; u++) {
            int64_t b = u / Hk, hk = u % Hk;
            if (kt) transpose(a.k, b, hk, 0, T, D, a.Tp, kt + u * D * a.Tp);
            transpose(a.v, b, hk, 0, T, Dv, a.Tp, vt + u * Dv * a.Tp);
            for (int64_t t = 0; t < K; t++) {
                memset(at(gk, b, hk, t), 0, sizeof(float) * D);
                memset(at(gv, b, hk, t), 0, sizeof(float) * Dv);
            }
        }
        float *P = probs ? NULL : malloc(sizeof(float) * R * width), *DS = malloc(sizeof(float) * R * width);
        const float **qr = malloc(sizeof(float *) * R), **gr = malloc(sizeof(float *) * R);
        const float **pr = malloc(sizeof(float *) * R);
        blk_t g = {.kbt = malloc(sizeof(float) * D * W), .vbt = malloc(sizeof(float) * Dv * W)};
        #pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < B * Hk * segs; u++) {
            int64_t b = u / (Hk * segs), hk = (u / segs) % Hk, seg = u % segs;
            const float *ktu = kt ? kt + (b * Hk + hk) * D * a.Tp : NULL, *vtu = vt + (b * Hk + hk) * Dv * a.Tp;
            /* where this unit adds its context-key gradients: rows of dk / dv, or its scratch slice */
            float *ck = at(gk, b, hk, 0), *cv = at(gv, b, hk, 0);
            int64_t ldk = gk.ss, ldv = gv.ss;
            if (part) {
                ck = part + u * T * (D + Dv);
                cv = ck + D;
                ldk = ldv = D + Dv;
            }
            int64_t j_end = (seg + 1) * per_seg < a.A ? (seg + 1) * per_seg : a.A;
            for (int64_t j = seg * per_seg; j < j_end; j++) {
                block_setup(&a, b, hk, j, &g, 1);
                for (int64_t r = 0; r < R; r++) {
                    int64_t h = row_head(&a, hk, r), i = row_query(&a, j, r), row = (b * Hq + h) * Q + i;
                    float *ds = DS + r * width;
                    qr[r] = at(a.q, b, h, i);
                    gr[r] = at(go, b, h, i);
                    if (probs) {
                        pr[r] = probs + row * width;
                    } else {
                        float *p = P + r * width;
                        scores(&a, &g, qr[r], ktu, p);
                        exp_shift(&g, p, lse[row]);  /* p = exp(s - lse): the softmax */
                        pr[r] = p;
                    }
                    const float *p = pr[r];
                    row_times_t(gr[r], vtu, a.Tp, Dv, g.Lp, 1.0f, ds);  /* dp = dO . v */
                    row_times_t(gr[r], g.vbt, W, Dv, W, 1.0f, ds + g.Lp);
                    vf delta = vsplat(dot(gr[r], at(o, b, h, i), Dv));
                    for (int64_t t = 0; t < g.width; t += W) vstore(ds + t, vload(p + t) * (vload(ds + t) - delta));
                    weighted_rows(&a, &g, ds, a.k, b, hk, j, D, scale, at(gq, b, h, i));  /* dq = scale sum_t ds_t k_t */
                }
                /* key by key: dk_t += scale sum_r ds[r, t] q_r, dv_t += sum_r p[r, t] dO_r */
                for (int64_t t = 0; t < g.Lp + N; t++) {
                    if (t == g.L && t < g.Lp) t = g.Lp;
                    float *rk, *rv;
                    if (t < g.Lp) {
                        rk = ck + t * ldk;
                        rv = cv + t * ldv;
                    } else {
                        rk = at(gk, b, hk, T + j * N + t - g.Lp);
                        rv = at(gv, b, hk, T + j * N + t - g.Lp);
                    }
                    for (int64_t d = 0; d < D; d += W) {
                        vf acc = vsplat(0.0f);
                        for (int64_t r = 0; r < R; r++) acc += DS[r * width + t] * vload(qr[r] + d);
                        vstore(rk + d, vload(rk + d) + acc * scale);
                    }
                    for (int64_t d = 0; d < Dv; d += W) {
                        vf acc = vsplat(0.0f);
                        for (int64_t r = 0; r < R; r++) acc += pr[r][t] * vload(gr[r] + d);
                        vstore(rv + d, vload(rv + d) + acc);
                    }
                }
            }
        }
        free(P);
        free(DS);
        free(qr);
        free(gr);
        free(pr);
        free(g.kbt);
        free(g.vbt);
        if (part) {
            #pragma omp for schedule(static)
            for (int64_t u = 0; u < B * Hk * T; u++) {
                int64_t bh = u / T, t = u % T;
                float *rk = at(gk, bh / Hk, bh % Hk, t), *rv = at(gv, bh / Hk, bh % Hk, t);
                for (int64_t sg = 0; sg < segs; sg++) {
                    const float *src = part + ((bh * segs + sg) * T + t) * (D + Dv);
                    for (int64_t d = 0; d < D; d += W) vstore(rk + d, vload(rk + d) + vload(src + d));
                    for (int64_t d = 0; d < Dv; d += W) vstore(rv + d, vload(rv + d) + vload(src + D + d));
                }
            }
        }
    }
    free(kt);
    free(vt);
    free(part);
}
