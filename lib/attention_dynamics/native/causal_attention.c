/* Causal softmax attention of one head, forward and backward, for a run of independent
 * (batch, head) slices: what torch's scaled_dot_product_attention(is_causal=True) computes.
 * PyTorch's blocked CPU kernel spends most of its time in tiny matrix products when the head
 * dimension is small (16 in the book's transformers); here QB queries at a time walk their
 * visible keys, so that every key and value loaded from memory serves QB queries, and every
 * loop over the head dimension is one vector operation. Compiled on the reader's machine
 * (see __init__.py) with DH (= the head dimension) fixed at compile time.
 *
 * Layouts, float32, row-major, per slice: q, k, v, o and the gradients dq, dk, dv (T x DH);
 * kt and vt (DH x TP): keys and values transposed, zero-padded to TP = T rounded up to a
 * multiple of JB columns; lse (T): each query's log-sum-exp of scaled scores, kept by the
 * forward pass for the backward one. buf: 2 QB TP floats of work space. The backward pass
 * recomputes the scores and accumulates into dk and dv, which must start at zero.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "vectors.h"

#ifndef DH
#error "compile with -DDH=<head dimension, a power of two from 4 to 64>"
#endif
#define QB 8
#define JB 16

VECTOR(row, DH)   /* one row of the head dimension */
VECTOR(chunk, JB) /* one chunk of JB keys */

static inline float row_dot(row_t a, row_t b) {
    float s = 0.0f;
    for (int d = 0; d < DH; d++) s += a[d] * b[d];
    return s;
}

/* out[r][j] = scale * a_r . kt[:, j] for the rows of a block and j < n (rounded up to JB) */
static void block_dots(int nb, int n, int TP, const row_t *restrict a, const float *restrict kt, float scale,
                       float *restrict out) {
    for (int j0 = 0; j0 < n; j0 += JB) {
        chunk_t acc[QB];
        for (int r = 0; r < QB; r++) acc[r] = (chunk_t){0};
        for (int d = 0; d < DH; d++) {
            const chunk_t kv = load_chunk(kt + (size_t)d * TP + j0);
            for (int r = 0; r < QB; r++) acc[r] += a[r][d] * kv;
        }
        for (int r = 0; r < nb; r++) store_chunk(out + (size_t)r * TP + j0, acc[r] * scale);
    }
}

/* the rows of a block (rows past the end of the sequence are zeros) */
static void load_rows(int i0, int nb, const float *restrict src, row_t *restrict dst) {
    for (int r = 0; r < QB; r++) dst[r] = r < nb ? load_row(src + (size_t)(i0 + r) * DH) : (row_t){0};
}

void attention_forward(int S, int T, int TP, const float *restrict q, const float *restrict kt,
                       const float *restrict v, float *restrict o, float *restrict lse, float scale,
                       float *restrict buf) {
    for (int sl = 0; sl < S; sl++) {
        const float *restrict Q = q + (size_t)sl * T * DH, *restrict V = v + (size_t)sl * T * DH;
        const float *restrict Kt = kt + (size_t)sl * TP * DH;
        float *restrict O = o + (size_t)sl * T * DH, *restrict L = lse + (size_t)sl * T;
        for (int i0 = 0; i0 < T; i0 += QB) {
            const int nb = T - i0 < QB ? T - i0 : QB, n = i0 + nb;
            row_t qb[QB];
            load_rows(i0, nb, Q, qb);
            block_dots(nb, n, TP, qb, Kt, scale, buf);
            float inv[QB];
            for (int r = 0; r < QB; r++) inv[r] = 0.0f;
            for (int r = 0; r < nb; r++) {
                float *restrict p = buf + (size_t)r * TP;
                const int visible = i0 + r + 1;
                const float mx = max_of(p, visible);
                float sum = 0.0f;
                for (int j = 0; j < visible; j++) {
                    p[j] = expf(p[j] - mx);
                    sum += p[j];
                }
                for (int j = visible; j < n; j++) p[j] = 0.0f;
                inv[r] = 1.0f / sum;
                L[i0 + r] = mx + logf(sum);
            }
            row_t acc[QB];
            for (int r = 0; r < QB; r++) acc[r] = (row_t){0};
            for (int j = 0; j < n; j++) {
                const row_t vj = load_row(V + (size_t)j * DH);
                for (int r = 0; r < QB; r++) acc[r] += (r < nb ? buf[(size_t)r * TP + j] : 0.0f) * vj;
            }
            for (int r = 0; r < nb; r++) store_row(O + (size_t)(i0 + r) * DH, acc[r] * inv[r]);
        }
    }
}

void attention_backward(int S, int T, int TP, const float *restrict q, const float *restrict k,
                        const float *restrict kt, const float *restrict vt, const float *restrict o,
                        const float *restrict dout, const float *restrict lse, float *restrict dq,
                        float *restrict dk, float *restrict dv, float scale, float *restrict buf) {
    float *restrict P = buf, *restrict G = buf + (size_t)QB * TP;
    for (int sl = 0; sl < S; sl++) {
        const size_t off = (size_t)sl * T * DH, offt = (size_t)sl * TP * DH;
        const float *restrict Q = q + off, *restrict K = k + off, *restrict O = o + off, *restrict dO = dout + off;
        const float *restrict Kt = kt + offt, *restrict Vt = vt + offt, *restrict L = lse + (size_t)sl * T;
        float *restrict dQ = dq + off, *restrict dK = dk + off, *restrict dV = dv + off;
        for (int i0 = 0; i0 < T; i0 += QB) {
            const int nb = T - i0 < QB ? T - i0 : QB, n = i0 + nb;
            row_t qb[QB], gb[QB];
            load_rows(i0, nb, Q, qb);
            load_rows(i0, nb, dO, gb);
            block_dots(nb, n, TP, qb, Kt, scale, P);  /* the scores again */
            block_dots(nb, n, TP, gb, Vt, 1.0f, G);   /* dO_i . v_j */
            for (int r = 0; r < QB; r++) {
                float *restrict p = P + (size_t)r * TP, *restrict g = G + (size_t)r * TP;
                if (r >= nb) {  /* rows past the end: no weight, no gradient */
                    memset(p, 0, sizeof(float) * n);
                    memset(g, 0, sizeof(float) * n);
                    continue;
                }
                const int visible = i0 + r + 1;
                const float delta = row_dot(gb[r], load_row(O + (size_t)(i0 + r) * DH));  /* dO_i . O_i */
                const float li = L[i0 + r];
                for (int j = 0; j < visible; j++) {
                    p[j] = expf(p[j] - li);
                    g[j] = p[j] * (g[j] - delta) * scale;  /* dL/d(q_i . k_j) */
                }
                for (int j = visible; j < n; j++) p[j] = g[j] = 0.0f;
            }
            row_t accq[QB];
            for (int r = 0; r < QB; r++) accq[r] = (row_t){0};
            for (int j = 0; j < n; j++) {
                const row_t kj = load_row(K + (size_t)j * DH);
                row_t dkj = {0}, dvj = {0};
                for (int r = 0; r < QB; r++) {
                    const float ds = G[(size_t)r * TP + j], pr = P[(size_t)r * TP + j];
                    accq[r] += ds * kj;
                    dkj += ds * qb[r];
                    dvj += pr * gb[r];
                }
                store_row(dK + (size_t)j * DH, load_row(dK + (size_t)j * DH) + dkj);
                store_row(dV + (size_t)j * DH, load_row(dV + (size_t)j * DH) + dvj);
            }
            for (int r = 0; r < nb; r++) store_row(dQ + (size_t)(i0 + r) * DH, accq[r]);
        }
    }
}
