/* Greedy sampling: the first index of each row's maximum, as torch.max(-1).indices.
 *
 * Rows are bf16 (bf16 = 1) or fp32 logits; bf16 values are compared exactly as
 * fp32 (the conversion is exact), so no fp32 copy of the logits is made. A row
 * holding NaN answers its first NaN, as torch's max does; -0 and +0 compare
 * equal, so the first of them wins.
 */
#include <stdint.h>

typedef int64_t i64;

static inline float value(const void *row, int bf16, i64 i) {
    if (bf16) {
        union {
            uint32_t u;
            float f;
        } b = {.u = (uint32_t)((const uint16_t *)row)[i] << 16};
        return b.f;
    }
    return ((const float *)row)[i];
}

/* logits [rows, cols] with row stride rs (elements); out [rows] int64. */
void hkv_argmax_rows(int bf16, i64 rows, i64 cols, const void *logits, i64 rs, i64 *out) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (i64 r = 0; r < rows; ++r) {
        const void *row = (const char *)logits + r * rs * (bf16 ? 2 : 4);
        float best = value(row, bf16, 0);
        int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
        for (i64 i = 0; i < cols; ++i) {
            float v = value(row, bf16, i);
            nan |= v != v;
            best = v > best ? v : best;
        }
        i64 at = 0;
        for (i64 i = 0; i < cols; ++i) {
            float v = value(row, bf16, i);
            if (nan ? v != v : v == best) {
                at = i;
                break;
            }
        }
        out[r] = at;
    }
}
