/* Vectors of a fixed number of floats (GCC's vector extensions: one machine vector or a
 * few, whatever the machine's width), with unaligned loads and stores. VECTOR(name, n)
 * defines the type name_t of n floats and load_name / store_name. */
#ifndef ATTENTION_DYNAMICS_VECTORS_H
#define ATTENTION_DYNAMICS_VECTORS_H
#include <string.h>

#define VECTOR(name, n)                                                                  \
    typedef float name##_t __attribute__((vector_size((n) * sizeof(float))));             \
    static inline name##_t load_##name(const float *p) {                                 \
        name##_t v;                                                                       \
        memcpy(&v, p, sizeof v);                                                          \
        return v;                                                                         \
    }                                                                                     \
    static inline void store_##name(float *p, name##_t v) { memcpy(p, &v, sizeof v); }

#endif
