/* The causal head's forward and closed-form backward (R1-R3) for one run, fused: QB queries
 * at a time walk their visible keys j <= i, so that every key, value and gradient row loaded
 * from memory serves QB queries and no T x T matrix is ever formed. Compiled on the reader's
 * machine (see __init__.py) with DK (= d_k), KP (d_k rounded up to a power of two) and NC
 * (= the number of classes, a power of two) fixed at compile time, so that every loop over a
 * feature is one vector operation (GCC's vector extensions) and every loop over keys runs in
 * chunks of JB.
 *
 * Inputs, float32, row-major: q and k (T x KP; q already scaled by 1/sqrt(d_k); columns past
 * DK zero), kt (DK x TP: k transposed, zero past T; TP = T rounded up to a multiple of JB),
 * zv (T x NC: the values read out, Zv = V W_O) and zvt (NC x TP, its transpose, zero past
 * T), y (T targets). Outputs, accumulated into zero-initialized arrays: dq (T x KP, dL/dq
 * before the 1/sqrt(d_k)), dk (T x KP, dL/dk), m (T x NC, sum_i alpha_ij dz_i), n (T,
 * sum_i alpha_ij; may be NULL), and sums[4]: the cross-entropy, predictive entropy, accuracy
 * and attention entropy, each summed over the T positions (nats). buf: 2 QB TP floats of
 * work space. With backward = 0 only the forward pass and the sums are computed.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vectors.h"

#if !defined(DK) || !defined(KP) || !defined(NC)
#error "compile with -DDK=<d_k> -DKP=<d_k rounded up to a power of two> -DNC=<classes, a power of two>"
#endif
#define QB 8
#define JB 16

VECTOR(key, KP)   /* one query or key, padded */
VECTOR(cls, NC)   /* one vector over the classes */
VECTOR(chunk, JB) /* one chunk of JB keys */

/* out[r][j] = a_r . xt[:, j] for the QB rows of a block (ND features each, stride AS) and
 * j < n, rounded up to a multiple of JB */
static inline void block_dots(int n, int TP, const float *restrict a, int AS, int ND,
                              const float *restrict xt, float *restrict out) {
    for (int j0 = 0; j0 < n; j0 += JB) {
        chunk_t acc[QB];
        for (int r = 0; r < QB; r++) acc[r] = (chunk_t){0};
        for (int d = 0; d < ND; d++) {
            const chunk_t xv = load_chunk(xt + (size_t)d * TP + j0);
            for (int r = 0; r < QB; r++) acc[r] += a[r * AS + d] * xv;
        }
        for (int r = 0; r < QB; r++) store_chunk(out + (size_t)r * TP + j0, acc[r]);
    }
}

void causal_head_run(int T, int TP, const float *restrict q, const float *restrict k,
                     const float *restrict kt, const float *restrict zv, const float *restrict zvt,
                     const int64_t *restrict y, float *restrict dq, float *restrict dk, float *restrict m_out,
                     float *restrict n_out, double *restrict sums, float *restrict buf, int backward) {
    float *restrict A = buf, *restrict G = buf + (size_t)QB * TP;
    double loss = 0.0, entropy = 0.0, accuracy = 0.0, att_entropy = 0.0;
    for (int i0 = 0; i0 < T; i0 += QB) {
        const int nb = T - i0 < QB ? T - i0 : QB, n = i0 + nb;
        float qb[QB * KP], dzb[QB * NC];
        memset(qb, 0, sizeof qb);
        memcpy(qb, q + (size_t)i0 * KP, sizeof(float) * KP * nb);
        block_dots(n, TP, qb, KP, DK, kt, A);  /* the scores s_ij */
        /* attention weights alpha_ij (zero for j > i and for rows past the end) */
        for (int r = 0; r < QB; r++) {
            float *restrict a = A + (size_t)r * TP;
            if (r >= nb) {
                memset(a, 0, sizeof(float) * n);
                continue;
            }
            const int visible = i0 + r + 1;
            const float mx = max_of(a, visible);
            float sum = 0.0f, shifted = 0.0f;
            for (int j = 0; j < visible; j++) {
                const float d = a[j] - mx, e = expf(d);
                a[j] = e;
                sum += e;
                shifted += e * d;
            }
            const float inv = 1.0f / sum;
            for (int j = 0; j < visible; j++) a[j] *= inv;
            for (int j = visible; j < n; j++) a[j] = 0.0f;
            att_entropy += log((double)sum) - (double)(shifted * inv);
        }
        /* the read-out z_i = sum_j alpha_ij Zv_j */
        cls_t z[QB];
        for (int r = 0; r < QB; r++) z[r] = (cls_t){0};
        for (int j = 0; j < n; j++) {
            const cls_t zj = load_cls(zv + (size_t)j * NC);
            for (int r = 0; r < QB; r++) z[r] += A[(size_t)r * TP + j] * zj;
        }
        /* cross-entropy: log-probabilities, loss, dL/dz = (p - e_y) / T and E_alpha[b]_i = dz_i . z_i */
        float mean_b[QB];
        memset(dzb, 0, sizeof dzb);
        for (int r = 0; r < nb; r++) {
            float zmax = z[r][0];
            for (int c = 1; c < NC; c++) zmax = fmaxf(zmax, z[r][c]);
            float zsum = 0.0f;
            for (int c = 0; c < NC; c++) zsum += expf(z[r][c] - zmax);
            const float lse = zmax + logf(zsum);
            const int yi = (int)y[i0 + r];
            float mb = 0.0f;
            int best = 0;
            for (int c = 0; c < NC; c++) {
                const float lp = z[r][c] - lse, p = expf(lp);
                entropy -= (double)(p * lp);
                dzb[r * NC + c] = (p - (c == yi ? 1.0f : 0.0f)) / (float)T;
                mb += dzb[r * NC + c] * z[r][c];
                if (z[r][c] > z[r][best]) best = c;
            }
            mean_b[r] = mb;
            loss -= (double)(z[r][yi] - lse);
            accuracy += best == yi ? 1.0 : 0.0;
        }
        if (!backward) continue;
        /* b_ij = dz_i . Zv_j; dL/ds_ij = alpha_ij (b_ij - E_alpha[b]_i)  (R1) */
        block_dots(n, TP, dzb, NC, NC, zvt, G);
        for (int r = 0; r < nb; r++) {
            float *restrict g = G + (size_t)r * TP;
            const float *restrict a = A + (size_t)r * TP;
            for (int j = 0; j < n; j++) g[j] = a[j] * (g[j] - mean_b[r]);
        }
        for (int r = nb; r < QB; r++) memset(G + (size_t)r * TP, 0, sizeof(float) * n);
        /* dq_i += ds_ij k_j, dk_j += ds_ij q_i  (R3); m_j += alpha_ij dz_i  (R2); n_j += alpha_ij */
        key_t accq[QB], qv[QB];
        cls_t dz[QB];
        for (int r = 0; r < QB; r++) {
            accq[r] = (key_t){0};
            qv[r] = load_key(qb + r * KP);
            dz[r] = load_cls(dzb + r * NC);
        }
        for (int j = 0; j < n; j++) {
            const key_t kj = load_key(k + (size_t)j * KP);
            key_t dkj = {0};
            cls_t mj = {0};
            float nj = 0.0f;
            for (int r = 0; r < QB; r++) {
                const float ds = G[(size_t)r * TP + j], a = A[(size_t)r * TP + j];
                accq[r] += ds * kj;
                dkj += ds * qv[r];
                mj += a * dz[r];
                nj += a;
            }
            store_key(dk + (size_t)j * KP, load_key(dk + (size_t)j * KP) + dkj);
            store_cls(m_out + (size_t)j * NC, load_cls(m_out + (size_t)j * NC) + mj);
            if (n_out != NULL) n_out[j] += nj;
        }
        for (int r = 0; r < nb; r++) store_key(dq + (size_t)(i0 + r) * KP, accq[r]);
    }
    sums[0] = loss;
    sums[1] = entropy;
    sums[2] = accuracy;
    sums[3] = att_entropy;
}
