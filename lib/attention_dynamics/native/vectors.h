/* Vectors of a fixed number of floats (GCC's vector extensions: one machine vector or a
 * few, whatever the machine's width), with unaligned loads and stores. VECTOR(name, n)
 * defines the type name_t of n floats and load_name / store_name.
 *
 * The kernels are built without -ffast-math (see __init__.py): linking with it turns on
 * flush-to-zero for the whole process, and -ffinite-math-only lets the compiler drop NaN
 * handling. What -ffast-math bought in speed is kept by the two pieces below. */
#ifndef ATTENTION_DYNAMICS_VECTORS_H
#define ATTENTION_DYNAMICS_VECTORS_H
#include <float.h>
#include <math.h>
#include <string.h>

/* glibc's vector expf and logf (libmvec, which -lm brings in on x86-64). math.h declares
 * them only under -ffast-math; declaring them here lets the vectorizer call them. They keep
 * IEEE semantics (NaN, infinities, subnormals), within 4 ulp of the scalar functions. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) && !defined(__FAST_MATH__)
__attribute__((__simd__("notinbranch"))) float expf(float);
__attribute__((__simd__("notinbranch"))) float logf(float);
#endif

/* The largest of p[0..n) (-FLT_MAX for none), written so that GCC vectorizes it without
 * -ffinite-math-only, which fmaxf needs. Like fmaxf it passes over NaN entries; a caller
 * that exponentiates p - max still carries the NaN into its sums. */
static inline float max_of(const float *p, int n) {
    float m = -FLT_MAX;
    for (int j = 0; j < n; j++) m = p[j] > m ? p[j] : m;
    return m;
}

#define VECTOR(name, n)                                                                  \
    typedef float name##_t __attribute__((vector_size((n) * sizeof(float))));             \
    static inline name##_t load_##name(const float *p) {                                 \
        name##_t v;                                                                       \
        memcpy(&v, p, sizeof v);                                                          \
        return v;                                                                         \
    }                                                                                     \
    static inline void store_##name(float *p, name##_t v) { memcpy(p, &v, sizeof v); }

#endif
