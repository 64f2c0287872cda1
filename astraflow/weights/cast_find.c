/* One pass over a float32 tensor for a bf16 delta (weights/kernel.py builds and loads this file).
 *
 * numpy and torch need three passes for what a bf16 delta of float32 weights asks: the cast
 * (read 4 bytes, write 2), the compare with the previous version's bits (read 2 + 2, write a
 * 1-byte mask) and the search for the mask's set bytes (read 1): ~12 bytes moved per element.
 * Here, per block of BLOCK elements, the cast is written and compared while the block is still in
 * the cache, four elements at a time: ~8 bytes per element leave memory.
 */
#include <stdint.h>
#include <string.h>

#define BLOCK 4096

const int64_t CAST_FIND_SLACK = BLOCK;

/* torch's float32 -> bfloat16: round to nearest, ties to even; every NaN becomes 0xFFFF (as its
 * vectorised CPU cast does). */
static inline uint16_t bf16_bits(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFu;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* out[i] = bf16(src[i]) for every i < n; idx[0..k) = the i where out[i] != old[i], increasing, and
 * fresh[j] = out[idx[j]], stale[j] = old[idx[j]] (gathered while in the cache). Returns k, or -1 once
 * more than cap differ (out is still filled in whole; idx, fresh and stale must hold
 * cap + CAST_FIND_SLACK entries: the count is checked a block at a time). */
int64_t cast_and_find(const uint32_t *src, const uint16_t *old, uint16_t *out, int64_t n, int64_t *idx,
                      uint16_t *fresh, uint16_t *stale, int64_t cap) {
    int64_t k = 0;
    for (int64_t start = 0; start < n; start += BLOCK) {
        int64_t end = start + BLOCK < n ? start + BLOCK : n;
        for (int64_t i = start; i < end; i++) out[i] = bf16_bits(src[i]);
        if (k < 0) continue;
        int64_t i = start;
        for (; i + 4 <= end; i += 4) {
            uint64_t a, b;
            memcpy(&a, out + i, 8);
            memcpy(&b, old + i, 8);
            if (a == b) continue;
            for (int64_t j = i; j < i + 4; j++) {
                idx[k] = j, fresh[k] = out[j], stale[k] = old[j];
                k += out[j] != old[j];
            }
        }
        for (; i < end; i++) {
            idx[k] = i, fresh[k] = out[i], stale[k] = old[i];
            k += out[i] != old[i];
        }
        if (k > cap) k = -1;
    }
    return k;
}
