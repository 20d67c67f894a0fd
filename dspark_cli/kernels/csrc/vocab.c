/* The vocabulary loss's row-wise passes (training/loss.py, kernels/vocab.py). */
#include "prelude.h"

/* Per row i of z [c, V] (logits, overwritten): p = softmax(z), q = table[rows[i]];
   stats[i] = (CE, L1 = sum|p - q|, z[label] is the max, z[top[rows[i]]] is the max);
   with grads, z becomes d/dz of w_ce*CE + w_l1*L1 divided by out_scale[i]:
   a * copysign(p, p - q) + p * (w_ce - w_l1 * sum_v copysign(p, p - q)_v) / out_scale - onehot * w_ce / out_scale,
   a = 1 when by_l1 (out_scale = w_l1) and w_l1 otherwise.
   The CE is against the mixture y = share_q * q + share_top * onehot(top[rows[i]]) + share_label *
   onehot(label) (the shares sum to 1): stats[i][0] = -sum_v y_v log p_v, and its gradient's
   - onehot * w_ce / out_scale becomes - y * w_ce / out_scale. */
void dspark_vocab_rows(int64_t c, int64_t V, float *z, const float *table, const int64_t *rows,
                       const int64_t *labels, const int64_t *top, const float *w_ce, const float *w_l1,
                       const float *out_scale, int by_l1, float share_q, float share_top, float share_label, int grads,
                       float *stats, int threads) {
    const int64_t body = V - V % W;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < c; i++) {
        float *zr = z + i * V;
        const float *qr = table + rows[i] * V;
        int64_t v;
        float m = row_max(zr, V);
        const int64_t t = top[rows[i]];
        float z_label = zr[labels[i]], z_top = zr[t];
        float qz = 0.0f;  /* sum_v q_v z_v, for the CE against q */
        if (share_q != 0.0f) {
            vf qzv = vsplat(0.0f);
            for (v = 0; v < body; v += W) qzv += vload(qr + v) * vload(zr + v);
            qz = hsum(qzv);
            for (; v < V; v++) qz += qr[v] * zr[v];
        }
        vf sv = vsplat(0.0f);
        for (v = 0; v < body; v += W) { vf e = vexp_le0(vload(zr + v) - m); vstore(zr + v, e); sv += e; }
        float s = hsum(sv);
        for (; v < V; v++) { float e = exp_le0(zr[v] - m); zr[v] = e; s += e; }
        float inv = 1.0f / s;
        vf l1v = vsplat(0.0f), cv = vsplat(0.0f);
        for (v = 0; v < body; v += W) {
            vf p = vload(zr + v) * inv, d = p - vload(qr + v), ps = vcopysign_pos(p, d);
            l1v += vabs(d);
            cv += ps;
            vstore(zr + v, ps);
        }
        float l1 = hsum(l1v), centre = hsum(cv);
        for (; v < V; v++) {
            float p = zr[v] * inv, d = p - qr[v], ps = copysignf(p, d);
            l1 += fabsf(d);
            centre += ps;
            zr[v] = ps;
        }
        stats[4 * i + 0] = m + logf(s) - (share_q * qz + share_top * z_top + share_label * z_label);
        stats[4 * i + 1] = l1;
        stats[4 * i + 2] = z_label >= m ? 1.0f : 0.0f;
        stats[4 * i + 3] = z_top >= m ? 1.0f : 0.0f;
        if (grads) {
            float row_scale = (w_ce[i] - w_l1[i] * centre) / out_scale[i];
            float a = by_l1 ? 1.0f : w_l1[i];
            float k = w_ce[i] / out_scale[i];
            if (share_q != 0.0f) {
                float kq = k * share_q;
                for (v = 0; v < body; v += W) {
                    vf ps = vload(zr + v);
                    vstore(zr + v, ps * a + vabs(ps) * row_scale - vload(qr + v) * kq);
                }
                for (; v < V; v++) { float ps = zr[v]; zr[v] = ps * a + fabsf(ps) * row_scale - qr[v] * kq; }
            } else {
                for (v = 0; v < body; v += W) { vf ps = vload(zr + v); vstore(zr + v, ps * a + vabs(ps) * row_scale); }
                for (; v < V; v++) { float ps = zr[v]; zr[v] = ps * a + fabsf(ps) * row_scale; }
            }
            if (share_top != 0.0f) zr[t] -= k * share_top;
            if (share_label != 0.0f) zr[labels[i]] -= k * share_label;
        }
    }
}

/* out[i] = the first index of the largest value of row i of x [n, V] (torch.argmax's tie rule). */
void dspark_row_argmax(int64_t n, int64_t V, const float *x, int64_t *out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + i * V;
        float m = row_max(r, V);
        int64_t k = 0;
        while (k < V - 1 && r[k] != m) k++;
        out[i] = k;
    }
}
