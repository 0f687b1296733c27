/* The selective scan of a diagonal SSM (Mamba's S6) and its backward pass, without the
 * (batch, T, channels, N) tensors that the same recurrence written with PyTorch operations
 * materializes several times per layer. Compiled on the reader's machine (see __init__.py)
 * with NS (= the number of states N per channel) fixed at compile time, so that every loop
 * over the states is one vector operation.
 *
 *   h_t[c, n] = exp(delta_t[c] A[c, n]) h_{t-1}[c, n] + delta_t[c] x_t[c] B_t[n]
 *   y_t[c]    = sum_n C_t[n] h_t[c, n]                                  (h_{-1} = 0)
 *
 * float32, row-major: x, delta, y, gy, dx, ddelta (batch, T, channels); A, dA (channels,
 * NS); B, C, dB, dC (batch, T, NS). The backward pass recomputes one sequence's states at a
 * time into work ((T + 1) * channels * NS floats) and accumulates dA, which must start at zero;
 * carry: channels * NS floats.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "vectors.h"  /* the vector expf */

#if !defined(NS)
#error "compile with -DNS=<states per channel>"
#endif

void scan_forward(int nb, int T, int nc, const float *restrict x, const float *restrict delta,
                  const float *restrict A, const float *restrict B, const float *restrict C,
                  float *restrict y, float *restrict h) {
    for (int b = 0; b < nb; b++) {
        memset(h, 0, sizeof(float) * (size_t)nc * NS);
        for (int t = 0; t < T; t++) {
            const size_t row = ((size_t)b * T + t);
            const float *restrict Bt = B + row * NS, *restrict Ct = C + row * NS;
            for (int c = 0; c < nc; c++) {
                const float dl = delta[row * nc + c], u = dl * x[row * nc + c];
                float *restrict hc = h + (size_t)c * NS;
                const float *restrict Ac = A + (size_t)c * NS;
                float acc = 0.0f;
                for (int n = 0; n < NS; n++) {
                    hc[n] = expf(dl * Ac[n]) * hc[n] + u * Bt[n];
                    acc += Ct[n] * hc[n];
                }
                y[row * nc + c] = acc;
            }
        }
    }
}

void scan_backward(int nb, int T, int nc, const float *restrict x, const float *restrict delta,
                   const float *restrict A, const float *restrict B, const float *restrict C,
                   const float *restrict gy, float *restrict dx, float *restrict ddelta,
                   float *restrict dA, float *restrict dB, float *restrict dC, float *restrict work,
                   float *restrict carry) {
    const size_t step = (size_t)nc * NS;
    for (int b = 0; b < nb; b++) {
        /* the states of this sequence: h_{t-1} in slot t (slot 0: zeros) */
        memset(work, 0, sizeof(float) * step);
        for (int t = 0; t < T; t++) {
            const size_t row = ((size_t)b * T + t);
            const float *restrict Bt = B + row * NS;
            const float *restrict prev = work + t * step;
            float *restrict cur = work + (t + 1) * step;
            for (int c = 0; c < nc; c++) {
                const float dl = delta[row * nc + c], u = dl * x[row * nc + c];
                const float *restrict Ac = A + (size_t)c * NS;
                for (int n = 0; n < NS; n++) {
                    cur[c * NS + n] = expf(dl * Ac[n]) * prev[c * NS + n] + u * Bt[n];
                }
            }
        }
        /* back through time; carry[c, n] = dL/dh_t through h_{t+1} */
        memset(carry, 0, sizeof(float) * step);
        for (int t = T - 1; t >= 0; t--) {
            const size_t row = ((size_t)b * T + t);
            const float *restrict Bt = B + row * NS, *restrict Ct = C + row * NS;
            const float *restrict prev = work + t * step, *restrict cur = work + (t + 1) * step;
            float dBt[NS], dCt[NS];
            memset(dBt, 0, sizeof dBt);
            memset(dCt, 0, sizeof dCt);
            for (int c = 0; c < nc; c++) {
                const float g = gy[row * nc + c], dl = delta[row * nc + c], xv = x[row * nc + c];
                const float *restrict Ac = A + (size_t)c * NS;
                float *restrict dAc = dA + (size_t)c * NS, *restrict cc = carry + (size_t)c * NS;
                float d_delta = 0.0f, d_x = 0.0f;
                for (int n = 0; n < NS; n++) {
                    const float dh = cc[n] + g * Ct[n];
                    const float a = expf(dl * Ac[n]);
                    const float da = dh * prev[c * NS + n] * a; /* dL/d(delta A) through the decay */
                    dCt[n] += g * cur[c * NS + n];
                    d_delta += da * Ac[n] + dh * xv * Bt[n];
                    dAc[n] += da * dl;
                    d_x += dh * Bt[n];
                    dBt[n] += dh * dl * xv;
                    cc[n] = dh * a;
                }
                ddelta[row * nc + c] = d_delta;
                dx[row * nc + c] = d_x * dl;
            }
            memcpy(dB + row * NS, dBt, sizeof dBt);
            memcpy(dC + row * NS, dCt, sizeof dCt);
        }
    }
}
