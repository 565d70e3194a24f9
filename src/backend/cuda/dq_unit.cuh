/* Quantized weights as small integers for products on activations rounded to 8 bits (__dp4a: four
 * byte products and their sum in one instruction), shared by the per-operation kernels
 * (matvec_dp4a.cu, which says why) and the persistent decode kernel (mega.cu): dq_unit<TYPE> reads
 * 64 values of a row as 16 words of signed bytes with their scales and multiplies them with an
 * activation row rounded by dq_round's rule (layout: dq_xchunk in matvec.cuh). The loads assume the
 * row's alignment in global memory; a copy in shared memory that keeps each row's address modulo 16
 * keeps it. */
#pragma once

#include "matvec.cuh"

/* ---- weight units: 64 values as 16 words of signed bytes, and their scales ----
 * unit<TYPE>: load(row, u) reads unit u of a row; chunk(u, h) is the activation chunk of its half
 * h (values 32h..32h+31 of the unit); dot(x, xd, u) is the unit against one item's activation row
 * (bytes x, chunk scales xd). */

/* The dot product of 8 words (32 bytes) of weights with 32 activation bytes at x. */
__device__ __forceinline__ int dq_dot32(const uint32_t *q, const int8_t *x) {
    const uint4 a = ((const uint4 *)x)[0], b = ((const uint4 *)x)[1];
    int s = __dp4a((int)q[0], (int)a.x, 0);
    s = __dp4a((int)q[1], (int)a.y, s);
    s = __dp4a((int)q[2], (int)a.z, s);
    s = __dp4a((int)q[3], (int)a.w, s);
    s = __dp4a((int)q[4], (int)b.x, s);
    s = __dp4a((int)q[5], (int)b.y, s);
    s = __dp4a((int)q[6], (int)b.z, s);
    return __dp4a((int)q[7], (int)b.w, s);
}

/* Two 16-byte halves of the same, separately (Q6_K: one scale per 16 values). */
__device__ __forceinline__ void dq_dot16x2(const uint32_t *q, const int8_t *x, int *s0, int *s1) {
    const uint4 a = ((const uint4 *)x)[0], b = ((const uint4 *)x)[1];
    int s = __dp4a((int)q[0], (int)a.x, 0);
    s = __dp4a((int)q[1], (int)a.y, s);
    s = __dp4a((int)q[2], (int)a.z, s);
    *s0 = __dp4a((int)q[3], (int)a.w, s);
    s = __dp4a((int)q[4], (int)b.x, 0);
    s = __dp4a((int)q[5], (int)b.y, s);
    s = __dp4a((int)q[6], (int)b.z, s);
    *s1 = __dp4a((int)q[7], (int)b.w, s);
}

/* N words from a 2-byte aligned address p: N aligned loads, and when p is 2 bytes off a word one
 * more 2-byte load, funnel-shifted together. Reads only [p, p + 4N) and, when off, the 2 bytes
 * before p (inside the allocation: the buffer's first byte is aligned). */
template <int N> __device__ __forceinline__ void dq_words_a2(const uint8_t *p, uint32_t out[N]) {
    const uint32_t off = (uint32_t)(uintptr_t)p & 2;
    const uint32_t *base = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    uint32_t wd[N + 1];
#pragma unroll
    for (int k = 0; k < N; k++) wd[k] = base[k];
    wd[N] = off ? *(const uint16_t *)(base + N) : 0u;
#pragma unroll
    for (int k = 0; k < N; k++) out[k] = __funnelshift_r(wd[k], wd[k + 1], 8 * off);
}

__device__ __forceinline__ float dq_half(uint32_t bits16) { return __half2float(__ushort_as_half((unsigned short)bits16)); }

/* Unit u's two contiguous chunks (activation chunks 2u, 2u + 1), each with one weight scale. */
__device__ __forceinline__ float dq_dot_pair(const uint32_t q[16], const float d[2], const int8_t *x,
                                             const float2 *xd, uint32_t u) {
    const uint32_t c = 2 * u;
    return d[0] * xd[c].x * (float)dq_dot32(q, dq_xchunk(x, c)) +
           d[1] * xd[c + 1].x * (float)dq_dot32(q + 8, dq_xchunk(x, c + 1));
}

template <int TYPE> struct dq_unit;

/* Q8_0: a unit is two 34-byte blocks, 68 bytes at 68u: 4-byte aligned (rows hold an even number of
 * blocks), 17 word loads; the first block's bytes sit 2 bytes into its words. */
template <> struct dq_unit<EM_TYPE_Q8_0> {
    uint32_t q[16];
    float d[2];
    __device__ __forceinline__ void load(const uint8_t *row, uint32_t u, const uint32_t *lut) {
        const uint32_t *p = (const uint32_t *)(row + 68 * (uint64_t)u);
        uint32_t w[17];
#pragma unroll
        for (int k = 0; k < 17; k++) w[k] = p[k];
#pragma unroll
        for (int j = 0; j < 8; j++) q[j] = __funnelshift_r(w[j], w[j + 1], 16);
#pragma unroll
        for (int j = 0; j < 8; j++) q[8 + j] = w[9 + j];
        d[0] = dq_half(w[0] & 0xffff), d[1] = dq_half(w[8] >> 16);
    }
    static __device__ __forceinline__ uint32_t chunk(uint32_t u, int h) { return 2 * u + h; }
    __device__ __forceinline__ float dot(const int8_t *x, const float2 *xd, uint32_t u) const {
        return dq_dot_pair(q, d, x, xd, u);
    }
};

/* Q4_K: super-blocks of 256 in 144 bytes (d, dmin, 12 bytes of 6-bit scales and offsets, 128 bytes
 * of nibbles); unit u is 32 nibble bytes of block u / 4: low nibbles its first 32 values, high
 * nibbles the next 32. Value = d * sc * q - dmin * mn per sub-block of 32. */
template <> struct dq_unit<EM_TYPE_Q4_K> {
    uint32_t q[16];
    float dl[2], ml[2];
    __device__ __forceinline__ void load(const uint8_t *row, uint32_t u, const uint32_t *lut) {
        const uint8_t *b = row + 144 * (uint64_t)(u >> 2);
        const uint32_t g = u & 3;
        const uint32_t *hw = (const uint32_t *)b;
        const uint32_t dd = hw[0], s0 = hw[1], s1 = hw[2], s2 = hw[3];
        const uint4 *qp = (const uint4 *)(b + 16 + 32 * g);
        const uint4 a = qp[0], c = qp[1];
        const uint32_t n[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
        for (int j = 0; j < 8; j++) q[j] = n[j] & 0x0f0f0f0fu, q[8 + j] = (n[j] >> 4) & 0x0f0f0f0fu;
        const float d = dq_half(dd & 0xffff), dmin = dq_half(dd >> 16);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t sub = 2 * g + h; /* bytes s[0..11] = s0, s1, s2 (see dequant.cuh: q4k_scales) */
            uint32_t sc, mn;
            if (sub < 4) {
                sc = (s0 >> (8 * sub)) & 63;
                mn = (s1 >> (8 * sub)) & 63;
            } else {
                const uint32_t k = 8 * (sub - 4);
                sc = ((s2 >> k) & 15) | (((s0 >> k) >> 6 & 3) << 4);
                mn = ((s2 >> k) >> 4 & 15) | (((s1 >> k) >> 6 & 3) << 4);
            }
            dl[h] = d * (float)sc, ml[h] = dmin * (float)mn;
        }
    }
    static __device__ __forceinline__ uint32_t chunk(uint32_t u, int h) { return 2 * u + h; }
    __device__ __forceinline__ float dot(const int8_t *x, const float2 *xd, uint32_t u) const {
        const uint32_t c = 2 * u;
        const float2 x0 = xd[c], x1 = xd[c + 1];
        return dl[0] * x0.x * (float)dq_dot32(q, dq_xchunk(x, c)) - ml[0] * x0.y +
               dl[1] * x1.x * (float)dq_dot32(q + 8, dq_xchunk(x, c + 1)) - ml[1] * x1.y;
    }
};

/* Q6_K: super-blocks of 256 in 210 bytes (128 bytes of low nibbles, 64 of high bit pairs, 16 signed
 * scales, d), in two halves of 128 values; chunk k of a half takes low (k < 2) or high nibbles of
 * ql[32 (k & 1) + l] and bits 2k, 2k + 1 of qh[l]. Unit u (half (u >> 1) & 1, p = u & 1) is the
 * chunks p and p + 2, which share those bytes. Value = d * sc * (q - 32), a scale per 16. */
template <> struct dq_unit<EM_TYPE_Q6_K> {
    uint32_t q[16];
    int sc[4];
    float d;
    __device__ __forceinline__ void load(const uint8_t *row, uint32_t u, const uint32_t *lut) {
        const uint8_t *b = row + 210 * (uint64_t)(u >> 2);
        const uint32_t half = (u >> 1) & 1, p = u & 1;
        uint32_t lo[8], hi[8];
        dq_words_a2<8>(b + 64 * half + 32 * p, lo);
        dq_words_a2<8>(b + 128 + 32 * half, hi);
        const uint32_t hs = 2 * p;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            q[j] = __vsub4((lo[j] & 0x0f0f0f0fu) | (((hi[j] >> hs) & 0x03030303u) << 4), 0x20202020u);
            q[8 + j] = __vsub4(((lo[j] >> 4) & 0x0f0f0f0fu) | (((hi[j] >> (hs + 4)) & 0x03030303u) << 4), 0x20202020u);
        }
        const uint8_t *s = b + 192 + 8 * half + 2 * p;
        const uint32_t s01 = *(const uint16_t *)s, s23 = *(const uint16_t *)(s + 4);
        sc[0] = (int8_t)(s01 & 0xff), sc[1] = (int8_t)(s01 >> 8), sc[2] = (int8_t)(s23 & 0xff), sc[3] = (int8_t)(s23 >> 8);
        d = dq_half(*(const uint16_t *)(b + 208));
    }
    static __device__ __forceinline__ uint32_t chunk(uint32_t u, int h) {
        return 8 * (u >> 2) + 4 * ((u >> 1) & 1) + (u & 1) + 2 * h;
    }
    __device__ __forceinline__ float dot(const int8_t *x, const float2 *xd, uint32_t u) const {
        const uint32_t c0 = chunk(u, 0), c1 = chunk(u, 1);
        int a0, a1, b0, b1;
        dq_dot16x2(q, dq_xchunk(x, c0), &a0, &a1);
        dq_dot16x2(q + 8, dq_xchunk(x, c1), &b0, &b1);
        return d * (xd[c0].x * (float)(sc[0] * a0 + sc[1] * a1) + xd[c1].x * (float)(sc[2] * b0 + sc[3] * b1));
    }
};


/* Bits 0-3 of s as bytes 0x00 / 0x01. */
__device__ __forceinline__ uint32_t dq_sign_ones(uint32_t s) { return (s & 15) * 0x00204081u & 0x01010101u; }

/* The bytes of w (each 1..127: the lattice's magnitudes are 4..62) negated where `ones` has a 1:
 * (w ^ 0xff) + 1 = 256 - w stays inside its byte, so one 32-bit add does what a per-byte
 * subtraction (__vsub4, several instructions here) did. */
__device__ __forceinline__ uint32_t dq_negate_bytes(uint32_t w, uint32_t ones) { return (w ^ (ones * 0xffu)) + ones; }

/* IQ3_XXS: super-blocks of 256 in 98 bytes (d, 64 lattice indices, 8 words of signs and scales);
 * a 32-value chunk has 8 indices (each four magnitudes from the lattice), 4 x 7 sign bits (the
 * eighth of each 8 is their parity) and a 4-bit scale. Unit u is chunks 2 (u & 3) and +1 of block
 * u / 4. Value = d * (0.5 + scale) / 2 * sign * magnitude. */
template <> struct dq_unit<EM_TYPE_IQ3_XXS> {
    uint32_t q[16];
    float db[2];
    __device__ __forceinline__ void load(const uint8_t *row, uint32_t u, const uint32_t *lut) {
        const uint8_t *b = row + 98 * (uint64_t)(u >> 2);
        const uint32_t k = u & 3;
        uint32_t idx[4], aux[2];
        dq_words_a2<4>(b + 2 + 16 * k, idx);
        dq_words_a2<2>(b + 66 + 8 * k, aux);
        const float d = dq_half(*(const uint16_t *)b);
#pragma unroll
        for (int j = 0; j < 16; j++) q[j] = lut[(idx[j >> 2] >> (8 * (j & 3))) & 0xff];
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int l = 0; l < 4; l++) {
                uint32_t s = (aux[h] >> (7 * l)) & 127;
                s |= (__popc(s) & 1) << 7;
                uint32_t *w = q + 8 * h + 2 * l;
                w[0] = dq_negate_bytes(w[0], dq_sign_ones(s)), w[1] = dq_negate_bytes(w[1], dq_sign_ones(s >> 4));
            }
            db[h] = d * (0.5f + (float)(aux[h] >> 28)) * 0.5f;
        }
    }
    static __device__ __forceinline__ uint32_t chunk(uint32_t u, int h) { return 2 * u + h; }
    __device__ __forceinline__ float dot(const int8_t *x, const float2 *xd, uint32_t u) const {
        return dq_dot_pair(q, db, x, xd, u);
    }
};

/* __byte_perm and the funnel shifts, also for the host, so that tests/cuda/check_decoders.cu can
 * hold MXFP4's unit (below) against the CPU reference on a machine without a GPU. Byte n of
 * dq_perm is byte (s >> 4n) & 7 of y:x (a selector's fourth bit is never set here). */
EM_HD uint32_t dq_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = x | (uint64_t)y << 32;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)(v >> (8 * ((s >> (4 * n)) & 7)) & 0xff) << (8 * n);
    return r;
#endif
}
/* The low word of hi:lo shifted right by shift & 31 (funnel_r) or by min(shift, 32) (funnel_rc). */
EM_HD uint32_t dq_funnel_r(uint32_t lo, uint32_t hi, uint32_t shift) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, shift);
#else
    return (uint32_t)((lo | (uint64_t)hi << 32) >> (shift & 31));
#endif
}
EM_HD uint32_t dq_funnel_rc(uint32_t lo, uint32_t hi, uint32_t shift) {
#ifdef __CUDA_ARCH__
    return __funnelshift_rc(lo, hi, shift);
#else
    return (uint32_t)((lo | (uint64_t)hi << 32) >> (shift < 32 ? shift : 32));
#endif
}

/* MXFP4's levels of the eight nibbles of w (byte i: low nibble element i, high nibble element
 * i + 16 of its block), as signed bytes: those of the low nibbles in *lo, of the high ones in *hi,
 * each in the order of w's bytes. A nibble's low three bits pick its entry among eight bytes, with
 * two byte permutes (the non-negative levels and the negative ones); its top bit picks which of
 * the two it takes. */
EM_HD void dq_mxfp4_levels(uint32_t w, uint32_t *lo, uint32_t *hi) {
    const uint32_t pos_lo = 0x03020100u, pos_hi = 0x0c080604u; /* levels 0, 1, 2, 3 | 4, 6, 8, 12 */
    const uint32_t neg_lo = 0xfdfeff00u, neg_hi = 0xf4f8fafcu; /* -0, -1, -2, -3 | -4, -6, -8, -12 */
    const uint32_t index = w & 0x77777777u;
    /* selector nibble n: byte n of the non-negative (n) or the negative (n + 4) permute */
    const uint32_t pick = 0x32103210u | ((w & 0x88888888u) >> 1);
    /* nibbles 0-3 of w (bytes 0 and 1, low then high), then 4-7 (bytes 2 and 3) */
    const uint32_t a = dq_perm(dq_perm(pos_lo, pos_hi, index), dq_perm(neg_lo, neg_hi, index), pick);
    const uint32_t b = dq_perm(dq_perm(pos_lo, pos_hi, index >> 16), dq_perm(neg_lo, neg_hi, index >> 16), pick >> 16);
    *lo = dq_perm(a, b, 0x6420);
    *hi = dq_perm(a, b, 0x7531);
}

/* MXFP4: blocks of 32 in 17 bytes (an E8M0 exponent e, then 16 bytes: low nibbles elements 0..15,
 * high nibbles 16..31); unit u is blocks 2u and 2u + 1, 34 bytes at 34u. Rows of whole units
 * (DP4A's) are an even number of bytes long, so a unit starts on a 2-byte boundary: nine words
 * from the 4-byte boundary at or before it cover it (when it is 4-byte aligned, the ninth is read
 * as 2 bytes, the unit's last), funnel-shifted into place. Value = level * 2^(e - 128), levels
 * twice the E2M1 values (0, 1, 2, 3, 4, 6, 8, 12 and negatives), so the block's scale is d[h]. */
template <> struct dq_unit<EM_TYPE_MXFP4> {
    uint32_t q[16];
    float d[2];
    EM_HD void load(const uint8_t *row, uint32_t u, const uint32_t *lut) {
        (void)lut;
        const uint8_t *p = row + 34 * (uint64_t)u;
        const uint32_t off = (uint32_t)(uintptr_t)p & 2; /* 0 or 2: bytes of the first word before p */
        const uint32_t *base = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
        uint32_t wd[9];
#pragma unroll
        for (int k = 0; k < 8; k++) wd[k] = base[k];
        wd[8] = off ? base[8] : (uint32_t) * (const uint16_t *)(base + 8);
        /* block 0: e at byte off of wd, nibbles at off + 1..; block 1: e at off + 17, nibbles at
         * off + 18.. (a whole word boundary when off is 2: the clamped shift of 32 takes wd[5 + j]) */
        const uint32_t shift0 = 8 + 8 * off, shift1 = 16 + 8 * off;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            dq_mxfp4_levels(dq_funnel_r(wd[j], wd[j + 1], shift0), &q[j], &q[4 + j]);
            dq_mxfp4_levels(dq_funnel_rc(wd[4 + j], wd[5 + j], shift1), &q[8 + j], &q[12 + j]);
        }
        d[0] = e8m0_half((wd[0] >> (8 * off)) & 0xff);
        d[1] = e8m0_half((wd[4] >> (8 + 8 * off)) & 0xff);
    }
    static __device__ __forceinline__ uint32_t chunk(uint32_t u, int h) { return 2 * u + h; }
    __device__ __forceinline__ float dot(const int8_t *x, const float2 *xd, uint32_t u) const {
        return dq_dot_pair(q, d, x, xd, u);
    }
};

/* The rounding of a chunk of 32 activations, one definition for dq_quantize_kernel and dq_stage
 * (the same bits either way): d = max|x| / 127 and q = round(x / d), Q8_0's rounding; the chunk's
 * scales {d f, d f * sum of its q}, f the item's RMS factor with a fused norm (em_warp_rms_factor;
 * else 1). */
__device__ __forceinline__ int dq_round(float v, float d) { return d > 0.0f ? __float2int_rn(v / d) : 0; }
/* Four values of a chunk, the same rounding, one test of d for the four. */
__device__ __forceinline__ int4 dq_round4(float4 v, float d) {
    return d > 0.0f ? make_int4(__float2int_rn(v.x / d), __float2int_rn(v.y / d), __float2int_rn(v.z / d),
                                __float2int_rn(v.w / d))
                    : make_int4(0, 0, 0, 0);
}
__device__ __forceinline__ float2 dq_chunk_scales(float d, float f, int sum) {
    const float df = d * f;
    return make_float2(df, df * (float)sum);
}
