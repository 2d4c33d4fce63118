/* bf16 linear layers on Intel AMX: y = round(x @ W^T + bias), for decode-sized batches.
 *
 * A decode step multiplies a few rows by every weight of the model once, so it
 * streams the weights from memory; oneDNN's AMX path spends ~20 us of setup per
 * call on top of that (~2.5 ms of a Gemma 3 270M decode step). This kernel
 * streams a weight pre-packed in AMX's tile layout with software prefetch and
 * no per-call setup beyond loading the tile configuration.
 *
 * Packed layout (hkv_amx_pack): W [n, k] bf16, k a multiple of 32, becomes
 * [ceil(n / 64)][k / 32][4][16][32] bf16: for each group of 64 output columns and
 * each 32-wide slice of k, four 16 x 16 column tiles in AMX's pair-interleaved
 * ("VNNI") order, tile row r holding k pairs (2r, 2r + 1) of 16 columns.
 * Columns past n are zero.
 *
 * Numerics: every output element is one fp32 accumulation chain over k in
 * order, 32 products per TDPBF16PS, then + bias (fp32) and rounded to bf16
 * (nearest even). It does not depend on n, m or the thread count, so a
 * product over concatenated weights equals the separate products bit for bit.
 *
 * Callers check the CPU first: hkv_amx_init() returns 1 when AMX-BF16 runs here
 * (after asking Linux for the tile state: arch_prctl ARCH_REQ_XCOMP_PERM), 0 when
 * the CPU lacks it, 2 when this build has no AMX code (not x86-64, or a compiler
 * without AMX intrinsics: gcc < 11, clang < 12), -errno when Linux refuses it.
 * The rest of the library builds either way.
 */
#if defined(__x86_64__) && defined(__linux__) && \
    (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define HKV_HAVE_AMX 1
#endif

#include <stdint.h>
typedef int64_t i64;

#ifndef HKV_HAVE_AMX
int hkv_amx_init(void) { return 2; }
void hkv_amx_pack(i64 n, i64 k, const uint16_t *w, uint16_t *out) {
    (void)n, (void)k, (void)w, (void)out;
}
void hkv_amx_linear(i64 m, i64 n, i64 k, const uint16_t *x, i64 xs, const uint16_t *wp,
                    const float *bias, uint16_t *y, i64 ys) {
    (void)m, (void)n, (void)k, (void)x, (void)xs, (void)wp, (void)bias, (void)y, (void)ys;
}
#else
#include <errno.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define GROUP 64 /* output columns per group: four 16-column tiles */
#define KSTEP 32 /* k per tile (16 pairs of bf16) */
#define TILE_ELEMS 512

int hkv_amx_init(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    if (!tile || !bf16) return 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return -errno;
    return 1;
}

void hkv_amx_pack(i64 n, i64 k, const uint16_t *w, uint16_t *out) {
    i64 groups = (n + GROUP - 1) / GROUP, ks = k / KSTEP;
#pragma omp parallel for schedule(static)
    for (i64 g = 0; g < groups; ++g)
        for (i64 kb = 0; kb < ks; ++kb)
            for (int j = 0; j < 4; ++j) {
                uint16_t *t = out + ((g * ks + kb) * 4 + j) * TILE_ELEMS;
                for (int col = 0; col < 16; ++col) {
                    i64 row = g * GROUP + j * 16 + col;
                    for (int r = 0; r < 16; ++r)
                        for (int e = 0; e < 2; ++e)
                            t[r * 32 + col * 2 + e] = row < n ? w[row * k + kb * KSTEP + 2 * r + e] : 0;
                }
            }
}

static inline uint16_t round_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } b = {.f = f};
    uint32_t u = b.u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0-3: accumulators (rows: this row block), 4: x slice, 5-7: weight tiles. */
__attribute__((target("amx-tile,amx-bf16"))) static void configure(tile_config *cfg, int rows) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg->colsb[t] = 64;
        cfg->rows[t] = t < 5 ? (uint8_t)rows : 16;
    }
    _tile_loadconfig(cfg);
}

/* x [m, k] (row stride xs elements), wp packed (see top), bias fp32 [n] or NULL,
 * y [m, n] (row stride ys). k a multiple of 32; any m >= 1. */
__attribute__((target("amx-tile,amx-bf16"))) void hkv_amx_linear(i64 m, i64 n, i64 k,
                                                                 const uint16_t *x, i64 xs,
                                                                 const uint16_t *wp,
                                                                 const float *bias, uint16_t *y,
                                                                 i64 ys) {
    i64 groups = (n + GROUP - 1) / GROUP, ks = k / KSTEP, blocks = (m + 15) / 16;
#pragma omp parallel if (groups > 1)
    {
        tile_config cfg;
        int rows = m < 16 ? (int)m : 16;
        configure(&cfg, rows);
        float acc[16 * GROUP];
#pragma omp for schedule(static)
        for (i64 g = 0; g < groups; ++g) {
            const uint16_t *wg = wp + g * ks * 4 * TILE_ELEMS;
            i64 cols = n - g * GROUP < GROUP ? n - g * GROUP : GROUP;
            for (i64 mb = 0; mb < blocks; ++mb) {
                int r_here = m - mb * 16 < 16 ? (int)(m - mb * 16) : 16;
                if (r_here != rows) configure(&cfg, rows = r_here);
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                const uint16_t *a = x + mb * 16 * xs;
                const uint16_t *b = wg;
                for (i64 kb = 0; kb < ks; ++kb, b += 4 * TILE_ELEMS) {
                    if (mb == 0) /* the next k step's four tiles (4 KB) */
                        for (int p = 0; p < 4 * TILE_ELEMS * 2; p += 64)
                            _mm_prefetch((const char *)(b + 4 * TILE_ELEMS) + p, _MM_HINT_T0);
                    _tile_loadd(4, a + kb * KSTEP, xs * 2);
                    _tile_loadd(5, b, 64);
                    _tile_loadd(6, b + TILE_ELEMS, 64);
                    _tile_dpbf16ps(0, 4, 5);
                    _tile_loadd(7, b + 2 * TILE_ELEMS, 64);
                    _tile_dpbf16ps(1, 4, 6);
                    _tile_loadd(5, b + 3 * TILE_ELEMS, 64);
                    _tile_dpbf16ps(2, 4, 7);
                    _tile_dpbf16ps(3, 4, 5);
                }
                _tile_stored(0, acc, GROUP * 4);
                _tile_stored(1, acc + 16, GROUP * 4);
                _tile_stored(2, acc + 32, GROUP * 4);
                _tile_stored(3, acc + 48, GROUP * 4);
                uint16_t *out = y + mb * 16 * ys + g * GROUP;
                if (bias) /* (an fp32 add only where there is a bias: -0 stays -0) */
                    for (int r = 0; r < r_here; ++r)
                        for (i64 j = 0; j < cols; ++j)
                            acc[r * GROUP + j] += bias[g * GROUP + j];
                for (int r = 0; r < r_here; ++r)
                    for (i64 j = 0; j < cols; ++j) out[r * ys + j] = round_bf16(acc[r * GROUP + j]);
            }
        }
        _tile_release();
    }
}
#endif /* HKV_HAVE_AMX */
