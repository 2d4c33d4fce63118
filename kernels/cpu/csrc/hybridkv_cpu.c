/* hybridkv native CPU kernels: the per-layer work of a decode step, fused.
 *
 * Built at first use by kernels/cpu/build.py (cc -O3 -march=native -fopenmp
 * -shared) and called through ctypes by kernels/cpu/ops.py, which checks
 * shapes, dtypes and strides first. Every op takes `bf16` (1: elements are
 * bfloat16 bits, 0: fp32) and element strides; rows are converted to fp32
 * buffers, computed there with plain loops the compiler vectorizes, and
 * stored back.
 *
 * Numerics follow the eager torch code they replace (models/layers/norms.py,
 * rotary.py, Gemma's GeGLU): fp32 math, rounded to the element type at the
 * points where the eager ops round, no fused multiply-adds outside attention
 * (built with -ffp-contract=off). Reductions (the RMS mean, attention dot
 * products) sum in another order than ATen, and exp is a polynomial (~1 ulp),
 * so results agree to fp32 rounding, not bit for bit. Decode attention keeps
 * its softmax probabilities in fp32.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int64_t i64;

#define MAX_ROW 16384 /* longest row the norms take (ops.py checks) */
#define TILE 64       /* keys per online-softmax step in decode attention */
#define LANES 16      /* partial sums per dot product (one AVX-512 register) */
#define PREFETCH 8    /* keys ahead that decode attention prefetches */

typedef union {
    float f;
    uint32_t u;
    int32_t i;
} bits32;

static inline float bf16_to_f32(uint16_t v) {
    bits32 b = {.u = (uint32_t)v << 16};
    return b.f;
}

/* Round to nearest even, as torch's float -> bfloat16 conversion (NaN stays NaN). */
static inline uint16_t f32_to_bf16(float f) {
    bits32 b = {.f = f};
    uint32_t u = b.u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

static inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

static void load_row(const void *src, int bf16, i64 n, float *dst) {
    if (bf16) {
        const uint16_t *s = src;
        for (i64 i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
    } else {
        memcpy(dst, src, (size_t)n * 4);
    }
}

static void store_row(const float *src, int bf16, i64 n, void *dst) {
    if (bf16) {
        uint16_t *d = dst;
        for (i64 i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
    } else {
        memcpy(dst, src, (size_t)n * 4);
    }
}

/* What an eager op's output holds: the value rounded to the element type. */
static void round_row(float *x, int bf16, i64 n) {
    if (bf16)
        for (i64 i = 0; i < n; ++i) x[i] = bf16_round(x[i]);
}

static inline const char *at(const void *base, i64 elem_offset, int bf16) {
    return (const char *)base + elem_offset * (bf16 ? 2 : 4);
}

/* exp(x) for x <= 0 (softmax terms, GeLU's tanh), Cephes' polynomial (~1 ulp).
 * Below -87 (or -inf) it returns exp(-87) ~ 1.6e-38. Branch-free, clamped on
 * the bits (a float compare here stops gcc from vectorizing the loops). */
static inline float exp_nonpos(float x) {
    bits32 b = {.f = x};
    b.u = b.u > 0xC2AE0000u ? 0xC2AE0000u : b.u; /* 0xC2AE0000 = -87.0f */
    float xc = b.f;
    int32_t ni = (int32_t)(xc * 1.44269504088896341f - 0.5f); /* round(x / ln 2) */
    float n = (float)ni;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    bits32 scale = {.i = (ni + 127) << 23};
    return p * scale.f;
}

/* Gemma RMS norm of an fp32 row, in place: x / sqrt(mean(x^2) + eps) * w1p,
 * w1p = 1 + weight (fp32), as GemmaRMSNorm computes before its cast. */
static void gemma_norm(float *x, i64 n, const float *w1p, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (i64 i = 0; i < n; ++i) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (i64 i = 0; i < n; ++i) x[i] = x[i] * r * w1p[i];
}

/* Residual + Gemma norms, one pass per row (rows split over threads):
 *   if h:  x = round(x + round(norm(h) * wh))    (post-branch norm, residual add)
 *   if wo: out = round(norm(x) * wo)              (the next pre-norm)
 * x is updated in place. */
void hkv_add_norm(int bf16, i64 rows, i64 dim, const void *h, i64 hs, const float *wh, void *x,
                  i64 xs, const float *wo, void *out, i64 os, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim > 65536)
    for (i64 r = 0; r < rows; ++r) {
        float xf[MAX_ROW], hf[MAX_ROW];
        void *xr = (void *)at(x, r * xs, bf16);
        load_row(xr, bf16, dim, xf);
        if (h) {
            load_row(at(h, r * hs, bf16), bf16, dim, hf);
            gemma_norm(hf, dim, wh, eps);
            round_row(hf, bf16, dim);
            for (i64 i = 0; i < dim; ++i) xf[i] += hf[i];
            round_row(xf, bf16, dim);
            store_row(xf, bf16, dim, xr);
        }
        if (wo) {
            gemma_norm(xf, dim, wo, eps);
            store_row(xf, bf16, dim, (void *)at(out, r * os, bf16));
        }
    }
}

/* Per-head Gemma norm (w1p may be NULL: none) then rotate_half RoPE, in place on
 * x [T, H, D] (row (t, h) at x + t*xst + h*xsh), cos/sin [T, D] in the element
 * type: out = round(round(n*cos) + round(rotate_half(n)*sin)), n the rounded
 * norm, as the eager ops round. D even, <= MAX_ROW / 4. */
void hkv_norm_rope(int bf16, i64 tokens, i64 heads, i64 dim, void *x, i64 xst, i64 xsh,
                   const float *w1p, const void *cos, const void *sin, i64 cst, float eps) {
    i64 half = dim / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * dim > 65536)
    for (i64 t = 0; t < tokens; ++t) {
        float c[MAX_ROW / 4], s[MAX_ROW / 4], n[MAX_ROW / 4], rot[MAX_ROW / 4];
        load_row(at(cos, t * cst, bf16), bf16, dim, c);
        load_row(at(sin, t * cst, bf16), bf16, dim, s);
        for (i64 hh = 0; hh < heads; ++hh) {
            void *xr = (void *)at(x, t * xst + hh * xsh, bf16);
            load_row(xr, bf16, dim, n);
            if (w1p) {
                gemma_norm(n, dim, w1p, eps);
                round_row(n, bf16, dim);
            }
            for (i64 i = 0; i < half; ++i) {
                rot[i] = -n[i + half];
                rot[i + half] = n[i];
            }
            for (i64 i = 0; i < dim; ++i) {
                float a = n[i] * c[i], b = rot[i] * s[i];
                if (bf16) {
                    a = bf16_round(a);
                    b = bf16_round(b);
                }
                n[i] = a + b;
            }
            store_row(n, bf16, dim, xr);
        }
    }
}

/* GeGLU: out = round(round(gelu_tanh(gate)) * up), gelu_tanh(x) = 0.5 x (1 + tanh(u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3), in ATen's order of operations, with
 * tanh(|u|) = (1 - e) / (1 + e), e = exp(-2|u|): accurate to ~1 ulp of 1,
 * which is all 1 + tanh(u) keeps. */
void hkv_geglu(int bf16, i64 rows, i64 cols, const void *gate, i64 gs, const void *up, i64 us,
               void *out, i64 os) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
    for (i64 r = 0; r < rows; ++r) {
        float g[256], u[256];
        for (i64 c0 = 0; c0 < cols; c0 += 256) {
            i64 n = cols - c0 < 256 ? cols - c0 : 256;
            load_row(at(gate, r * gs + c0, bf16), bf16, n, g);
            load_row(at(up, r * us + c0, bf16), bf16, n, u);
            for (i64 i = 0; i < n; ++i) {
                float x = g[i];
                float inner = 0.7978845608028654f * (x + 0.044715f * (x * x * x));
                float e = exp_nonpos(-2.0f * fabsf(inner));
                float t = (1.0f - e) / (1.0f + e);
                g[i] = 0.5f * x * (1.0f + copysignf(t, inner));
            }
            round_row(g, bf16, n);
            for (i64 i = 0; i < n; ++i) g[i] = g[i] * u[i];
            store_row(g, bf16, n, (void *)at(out, r * os + c0, bf16));
        }
    }
}

/* KV cache write: token t's K row (row_bytes: all its KV heads, contiguous)
 * goes to key_cache + (slot / bs) * sb + (slot % bs) * so (byte strides);
 * slot < 0 skips the token. */
void hkv_cache_write(i64 tokens, i64 row_bytes, const char *k, i64 kst, const char *v, i64 vst,
                     const i64 *slots, char *kc, char *vc, i64 ksb, i64 kso, i64 vsb, i64 vso,
                     i64 bs) {
    for (i64 t = 0; t < tokens; ++t) {
        i64 s = slots[t];
        if (s < 0) continue;
        i64 b = s / bs, o = s % bs;
        memcpy(kc + b * ksb + o * kso, k + t * kst, (size_t)row_bytes);
        memcpy(vc + b * vsb + o * vso, v + t * vst, (size_t)row_bytes);
    }
}

/* Ask for a K/V row ahead of its use: the blocks of a sequence are scattered,
 * so the hardware prefetcher loses the stream at every block boundary. */
static inline void prefetch_row(const char *row, i64 bytes) {
    for (i64 o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
}

/* Scores of one key row against the g query rows (fp32, qf [g, dim]) into
 * sc[a * TILE + j]: LANES-wide partial sums, so the g dot products are g * LANES
 * independent FMA chains; the key is converted LANES elements at a time. */
static inline __attribute__((always_inline)) void key_scores(int bf16, const i64 g, i64 dim,
                                                             const float *qf, const char *kr,
                                                             float *sc, i64 j) {
    float part[g][LANES];
    for (i64 a = 0; a < g; ++a)
        for (i64 l = 0; l < LANES; ++l) part[a][l] = 0.0f;
    i64 body = dim / LANES * LANES;
    for (i64 c = 0; c < body; c += LANES) {
        float kv[LANES];
        load_row(kr + c * (bf16 ? 2 : 4), bf16, LANES, kv);
        for (i64 a = 0; a < g; ++a)
            for (i64 l = 0; l < LANES; ++l)
                part[a][l] = fmaf(qf[a * dim + c + l], kv[l], part[a][l]);
    }
    for (i64 a = 0; a < g; ++a) {
        float s = 0.0f;
        for (i64 l = 0; l < LANES; ++l) s += part[a][l];
        for (i64 d = body; d < dim; ++d) {
            float kd = bf16 ? bf16_to_f32(((const uint16_t *)kr)[d]) : ((const float *)kr)[d];
            s = fmaf(qf[a * dim + d], kd, s);
        }
        sc[a * TILE + j] = s;
    }
}

/* acc [g, dim] += p [g, TILE] @ V rows of the tile: per LANES-wide column
 * block, the g accumulators stay in registers across the tile's keys and
 * each value block is converted once. */
static inline __attribute__((always_inline)) void add_values(int bf16, const i64 g, i64 dim,
                                                             const char *const *rows, i64 cnt,
                                                             const float *p, float *acc) {
    i64 body = dim / LANES * LANES, size = bf16 ? 2 : 4;
    for (i64 c = 0; c < body; c += LANES) {
        float t[g][LANES];
        for (i64 a = 0; a < g; ++a)
            for (i64 l = 0; l < LANES; ++l) t[a][l] = acc[a * dim + c + l];
        for (i64 j = 0; j < cnt; ++j) {
            float vv[LANES];
            load_row(rows[j] + c * size, bf16, LANES, vv);
            for (i64 a = 0; a < g; ++a)
                for (i64 l = 0; l < LANES; ++l) t[a][l] = fmaf(p[a * TILE + j], vv[l], t[a][l]);
        }
        for (i64 a = 0; a < g; ++a)
            for (i64 l = 0; l < LANES; ++l) acc[a * dim + c + l] = t[a][l];
    }
    for (i64 d = body; d < dim; ++d)
        for (i64 j = 0; j < cnt; ++j) {
            const char *vr = rows[j];
            float vd = bf16 ? bf16_to_f32(((const uint16_t *)vr)[d]) : ((const float *)vr)[d];
            for (i64 a = 0; a < g; ++a) acc[a * dim + d] = fmaf(p[a * TILE + j], vd, acc[a * dim + d]);
        }
}

/* One (decode, KV head) of decode attention: the g = hq / hkv query heads that
 * share KV head h, over keys [lo, len) read in place through `table`; `acc`
 * [g, dim] receives the normalized output. Byte strides for the caches. */
static inline __attribute__((always_inline)) void decode_one(
    int bf16, const i64 g, i64 dim, const float *qf, const char *kc, i64 ksb, i64 kso,
    const char *vc, i64 vsb, i64 vso, const int32_t *table, i64 bs, i64 lo, i64 len, float scale,
    float softcap, const float *sinks, float *acc) {
    float m[g], l[g], sc[g * TILE];
    const char *rows[TILE];
    i64 row_bytes = dim * (bf16 ? 2 : 4);
    for (i64 a = 0; a < g; ++a) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
        for (i64 d = 0; d < dim; ++d) acc[a * dim + d] = 0.0f;
    }
    for (i64 j0 = lo; j0 < len; j0 += TILE) {
        i64 cnt = len - j0 < TILE ? len - j0 : TILE;
        for (i64 j = 0; j < cnt; ++j) {
            i64 p = j0 + j;
            if (p + PREFETCH < len) {
                i64 f = p + PREFETCH;
                prefetch_row(kc + (i64)table[f / bs] * ksb + (f % bs) * kso, row_bytes);
            }
            prefetch_row(vc + (i64)table[p / bs] * vsb + (p % bs) * vso, row_bytes);
            key_scores(bf16, g, dim, qf, kc + (i64)table[p / bs] * ksb + (p % bs) * kso, sc, j);
        }
        for (i64 a = 0; a < g; ++a) {
            float *sa = sc + a * TILE, mt = m[a];
            for (i64 j = 0; j < cnt; ++j) {
                float v = sa[j] * scale;
                sa[j] = softcap > 0.0f ? softcap * tanhf(v / softcap) : v;
                mt = sa[j] > mt ? sa[j] : mt;
            }
            float alpha = m[a] == -INFINITY ? 0.0f : exp_nonpos(m[a] - mt);
            float sum = 0.0f;
            for (i64 j = 0; j < cnt; ++j) {
                sa[j] = exp_nonpos(sa[j] - mt);
                sum += sa[j];
            }
            l[a] = l[a] * alpha + sum;
            m[a] = mt;
            if (alpha != 1.0f)
                for (i64 d = 0; d < dim; ++d) acc[a * dim + d] *= alpha;
        }
        for (i64 j = 0; j < cnt; ++j) {
            i64 p = j0 + j;
            rows[j] = vc + (i64)table[p / bs] * vsb + (p % bs) * vso;
        }
        add_values(bf16, g, dim, rows, cnt, sc, acc);
    }
    for (i64 a = 0; a < g; ++a) {
        float denom = l[a], alpha = 1.0f;
        if (sinks) {
            float mt = sinks[a] > m[a] ? sinks[a] : m[a];
            alpha = exp_nonpos(m[a] - mt);
            denom = l[a] * alpha + exp_nonpos(sinks[a] - mt);
        }
        float f = alpha / denom;
        for (i64 d = 0; d < dim; ++d) acc[a * dim + d] *= f;
    }
}

/* decode_one with the group size a compile-time constant for the common
 * sizes (the per-head partial sums then live in registers). */
static void decode_dispatch(int bf16, i64 g, i64 dim, const float *qf, const char *kc, i64 ksb,
                            i64 kso, const char *vc, i64 vsb, i64 vso, const int32_t *table,
                            i64 bs, i64 lo, i64 len, float scale, float softcap,
                            const float *sinks, float *acc) {
#define DECODE_G(G) decode_one(bf16, G, dim, qf, kc, ksb, kso, vc, vsb, vso, table, bs, lo, len, \
                               scale, softcap, sinks, acc)
    switch (g) {
    case 1: DECODE_G(1); break;
    case 2: DECODE_G(2); break;
    case 4: DECODE_G(4); break;
    case 8: DECODE_G(8); break;
    default: DECODE_G(g); break;
    }
#undef DECODE_G
}

/* Decode attention over the paged cache, read in place (no gather).
 * Decode i is query row q_rows[i] of q [T, Hq, D], of a sequence of seq_lens[i]
 * tokens (the new one last) whose blocks are tables[i * table_stride + j].
 * Visible keys [lo, len): lo from the window (q - W < k) or the chunk
 * (k // C == q // C). Scores scaled, optionally softcapped (c tanh(s / c)),
 * online softmax in fp32, optional per-head sink logits (fp32 [Hq]).
 * Element strides: q (qst, qsh), out (ost, osh), caches (sb, so, sh), unit D. */
void hkv_decode_attention(int bf16, i64 n, i64 hq, i64 hkv, i64 dim, const void *q, i64 qst,
                          i64 qsh, const void *kc, i64 ksb, i64 kso, i64 ksh, const void *vc,
                          i64 vsb, i64 vso, i64 vsh, const int32_t *tables, i64 table_stride,
                          i64 bs, const i64 *q_rows, const i64 *seq_lens, float scale,
                          float softcap, i64 window, i64 chunk, const float *sinks, void *out,
                          i64 ost, i64 osh) {
    i64 g = hq / hkv;
#pragma omp parallel for schedule(dynamic, 1)
    for (i64 item = 0; item < n * hkv; ++item) {
        i64 i = item / hkv, h = item % hkv;
        i64 len = seq_lens[i], pos = len - 1, lo = 0;
        if (window > 0) lo = pos - window + 1 > 0 ? pos - window + 1 : 0;
        if (chunk > 0) lo = pos / chunk * chunk;
        float qf[g * dim], acc[g * dim];
        for (i64 a = 0; a < g; ++a)
            load_row(at(q, q_rows[i] * qst + (h * g + a) * qsh, bf16), bf16, dim, qf + a * dim);
        i64 size = bf16 ? 2 : 4;
        decode_dispatch(bf16, g, dim, qf, at(kc, h * ksh, bf16), ksb * size, kso * size,
                        at(vc, h * vsh, bf16), vsb * size, vso * size, tables + i * table_stride,
                        bs, lo, len, scale, softcap, sinks ? sinks + h * g : NULL, acc);
        for (i64 a = 0; a < g; ++a)
            store_row(acc + a * dim, bf16, dim, (void *)at(out, q_rows[i] * ost + (h * g + a) * osh, bf16));
    }
}
