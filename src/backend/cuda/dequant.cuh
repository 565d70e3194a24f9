/* Device decoders of the block formats the CUDA backend reads: each turns group g (elements
 * 8g..8g+7) of a row into 8 floats in registers. The byte layouts and the arithmetic are those of
 * the CPU reference decoders in src/quant/dequant.c (the definition of each format); loads are as
 * wide as the block's alignment inside a row allows. Included by the product kernels (matvec.cuh,
 * gemm.cu, mega.cu). */
#ifndef EMBER_BACKEND_CUDA_DEQUANT_CUH
#define EMBER_BACKEND_CUDA_DEQUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "../../quant/iq3xxs_grid.h"

/* IQ3_XXS lattice (quant's points, iq3xxs_grid.h), in device memory from the start: the module
 * loader writes the initializer, so no launch or copy at run time sets it. Read through the
 * read-only cache: the lanes of a warp look up different entries, which constant memory would
 * serve one address at a time. (Without relocatable device code a __device__ variable belongs to
 * the file that includes this header, so each .cu has its own, alike from the same list.) */
static __device__ uint32_t em_cuda_iq3xxs_grid[256] = EM_IQ3XXS_GRID_POINTS;

/* Decoders that also compile for the host, so that tests/cuda/check_decoders.cu can compare them
 * with the CPU reference on a machine without a GPU. */
#define EM_HD __host__ __device__ __forceinline__

EM_HD float ld_half(const uint8_t *p) { return __half2float(*(const __half *)p); }
EM_HD uint32_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }
/* 8 bytes from a 2-byte aligned address. */
EM_HD uint2 ld8_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return make_uint2(h[0] | ((uint32_t)h[1] << 16), h[2] | ((uint32_t)h[3] << 16));
}
EM_HD uint32_t byte_of(uint2 v, int i) { return ((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xff; }

template <int TYPE> struct deq;

template <> struct deq<EM_TYPE_F32> {
    __device__ static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const float4 *p = (const float4 *)(row + 32 * (uint64_t)g);
        float4 a = p[0], c = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
    }
};

template <> struct deq<EM_TYPE_F16> {
    __device__ static void get(const uint8_t *row, uint32_t g, float v[8]) {
        uint4 u = *(const uint4 *)(row + 16 * (uint64_t)g);
        const __half2 *h = (const __half2 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(h[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    }
};

template <> struct deq<EM_TYPE_BF16> {
    __device__ static void get(const uint8_t *row, uint32_t g, float v[8]) {
        uint4 u = *(const uint4 *)(row + 16 * (uint64_t)g);
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};

/* Q8_0: 34-byte blocks of 32: d, 32 signed bytes. */
template <> struct deq<EM_TYPE_Q8_0> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 34 * (uint64_t)(g >> 2);
        float d = ld_half(b);
        uint2 q = ld8_a2(b + 2 + 8 * (g & 3));
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = (float)(int8_t)byte_of(q, i) * d;
    }
};

/* Q4_K: 144-byte blocks of 256: d, dmin, 12 scale bytes, 128 nibble bytes (see dequant.c).
 * Sub-block sub's 6-bit scale sc and min mn from the scale bytes s[sub], s[sub + 4] and (from sub 4
 * on) s[sub - 4]. */
EM_HD void q4k_sc_mn(uint32_t s_sub, uint32_t s_hi, uint32_t s_lo, int sub, int *sc, int *mn) {
    *sc = sub < 4 ? (int)(s_sub & 63) : (int)((s_hi & 15) | ((s_lo >> 6) << 4));
    *mn = sub < 4 ? (int)(s_hi & 63) : (int)((s_hi >> 4) | ((s_sub >> 6) << 4));
}
/* Sub-block sub's scale d * sc and offset dmin * mn. */
EM_HD void q4k_scales(const uint8_t *b, int sub, float *dl, float *ml) {
    const uint8_t *s = b + 4;
    int sc, mn;
    q4k_sc_mn(s[sub], s[sub + 4], sub < 4 ? 0u : s[sub - 4], sub, &sc, &mn);
    *dl = ld_half(b) * (float)sc;
    *ml = ld_half(b + 2) * (float)mn;
}

template <> struct deq<EM_TYPE_Q4_K> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 144 * (uint64_t)(g >> 5);
        const int j = g & 31, sub = j >> 2, part = j & 3;
        float dl, ml;
        q4k_scales(b, sub, &dl, &ml);
        uint2 q = *(const uint2 *)(b + 16 + 32 * (sub >> 1) + 8 * part);
        const int shift = 4 * (sub & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * (float)((byte_of(q, i) >> shift) & 15) - ml;
    }
};

/* Q5_K: 176-byte blocks of 256: as Q4_K (d, dmin, 12 scale bytes) then 32 bytes of fifth bits (bit
 * sub of byte j: element 32 * sub + j) and the 128 nibble bytes. */
template <> struct deq<EM_TYPE_Q5_K> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 176 * (uint64_t)(g >> 5);
        const int j = g & 31, sub = j >> 2, part = j & 3;
        float dl, ml;
        q4k_scales(b, sub, &dl, &ml);
        const uint2 q = ld8_a2(b + 48 + 32 * (sub >> 1) + 8 * part), h = ld8_a2(b + 16 + 8 * part);
        const int shift = 4 * (sub & 1);
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = dl * (float)(((byte_of(q, i) >> shift) & 15) | (((byte_of(h, i) >> sub) & 1) << 4)) - ml;
    }
};

/* Q2_K: 84-byte blocks of 256: 16 scale bytes (one per 16 elements: scale in the low nibble, min
 * in the high), 64 bytes of 2-bit levels (byte j of half h: elements 128h + 32k + j in pair k), d,
 * dmin. Value (d * scale) * q - dmin * min, levels 0..3. */
template <> struct deq<EM_TYPE_Q2_K> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 84 * (uint64_t)(g >> 5);
        const int e0 = 8 * (g & 31), half = e0 >> 7, pair = (e0 & 127) >> 5, j = e0 & 31;
        const uint2 q = ld8_a2(b + 16 + 32 * half + j);
        const uint32_t sc = b[e0 >> 4];
        const float dl = ld_half(b + 80) * (float)(sc & 15), ml = ld_half(b + 82) * (float)(sc >> 4);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * (float)((byte_of(q, i) >> (2 * pair)) & 3) - ml;
    }
};

/* Q3_K: 110-byte blocks of 256: 32 bytes of high bits (bit b of byte j: element 32 * b + j), 64
 * bytes of 2-bit pairs (byte j of half h: elements 128h + 32k + j in pair k), 12 bytes of 6-bit
 * scales (one per 16, offset 32), d. A clear high bit subtracts 4: levels -4..3. */
template <> struct deq<EM_TYPE_Q3_K> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 110 * (uint64_t)(g >> 5);
        const int e0 = 8 * (g & 31), half = e0 >> 7, pair = (e0 & 127) >> 5, j = e0 & 31, k = e0 >> 4;
        const uint2 low = ld8_a2(b + 32 + 32 * half + j), high = ld8_a2(b + j);
        const int lo = (b[96 + (k & 7)] >> (4 * (k >> 3))) & 15, hi = (b[104 + (k & 3)] >> (2 * (k >> 2))) & 3;
        const float dl = ld_half(b + 108) * (float)((lo | hi << 4) - 32);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = (int)((byte_of(low, i) >> (2 * pair)) & 3) - ((byte_of(high, i) >> (e0 >> 5)) & 1 ? 0 : 4);
            v[i] = dl * (float)q;
        }
    }
};

/* IQ4_NL's 16 non-linear levels, as bytes of two words (no memory lookup). */
EM_HD float iq4nl_level(uint32_t q) {
    const uint64_t low = 0xF6EADDCFBFAD9881ull, high = 0x7159453526190D01ull; /* -127..-10, 1..113 */
    return (float)(int8_t)((q < 8 ? low : high) >> (8 * (q & 7)));
}

/* IQ4_XS: 136-byte blocks of 256: d, a u16 of scale high bit pairs, 4 bytes of scale low nibbles,
 * 128 bytes: sub-block s (32 elements) in bytes 16s..16s+15, low nibbles first; scales offset 32. */
template <> struct deq<EM_TYPE_IQ4_XS> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 136 * (uint64_t)(g >> 5);
        const int j = g & 31, s = j >> 2, part = j & 3;
        const int scale = (((b[4 + (s >> 1)] >> (4 * (s & 1))) & 15) | (((ld_u16(b + 2) >> (2 * s)) & 3) << 4)) - 32;
        const float dl = ld_half(b) * (float)scale;
        const uint2 q = ld8_a2(b + 8 + 16 * s + 8 * (part & 1));
        const int shift = 4 * (part >> 1);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * iq4nl_level((byte_of(q, i) >> shift) & 15);
    }
};

/* MXFP4's 16 levels (the E2M1 code points doubled, so integers: 0, 1, 2, 3, 4, 6, 8, 12 and their
 * negatives), as bytes of two words (no memory lookup). */
EM_HD float mxfp4_level(uint32_t q) {
    const uint64_t low = 0x0C08060403020100ull, high = 0xF4F8FAFCFDFEFF00ull; /* 0..12, -0..-12 */
    return (float)(int8_t)((q < 8 ? low : high) >> (8 * (q & 7)));
}

/* An E8M0 exponent byte as MXFP4 scales by it: 2^(e - 128) (half of 2^(e - 127), which makes the
 * doubled levels right), e < 2 a subnormal float; quant's em_e8m0_half. */
EM_HD float e8m0_half(uint32_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* MXFP4: 17-byte blocks of 32: an E8M0 exponent e, then 16 bytes whose low nibbles are elements
 * 0..15 and high nibbles 16..31. Group g is the low (g & 3 < 2) or high nibbles of 8 bytes; blocks
 * sit at any byte offset, so bytes are loaded one by one. Value = level * 2^(e - 128). */
template <> struct deq<EM_TYPE_MXFP4> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 17 * (uint64_t)(g >> 2);
        const uint8_t *q = b + 1 + 8 * (g & 1);
        const int shift = 4 * ((g >> 1) & 1);
        const float d = e8m0_half(b[0]);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = d * mxfp4_level((q[i] >> shift) & 15);
    }
};

/* Q6_K: 210-byte blocks of 256: 128 low-nibble bytes, 64 high-pair bytes, 16 scales, d. */
template <> struct deq<EM_TYPE_Q6_K> {
    EM_HD static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 210 * (uint64_t)(g >> 5);
        const int e0 = 8 * (g & 31), half = e0 >> 7, r = e0 & 127;
        uint2 lo = ld8_a2(b + 64 * half + (r & 63));
        uint2 hi = ld8_a2(b + 128 + 32 * half + (r & 31));
        const int ls = 4 * (r >> 6), hs = 2 * (r >> 5);
        float dl = ld_half(b + 208) * (float)(int8_t)b[192 + (e0 >> 4)];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = (int)((byte_of(lo, i) >> ls) & 15) | (int)(((byte_of(hi, i) >> hs) & 3) << 4);
            v[i] = dl * (float)(q - 32);
        }
    }
};

/* IQ3_XXS: 98-byte blocks of 256: d, 64 grid indices, 8 u32 of signs and scale (see dequant.c).
 * The lattice copy may live in any memory (LDG: read through the read-only cache). */
template <bool LDG>
__device__ __forceinline__ void iq3xxs_get(const uint8_t *row, uint32_t g, const uint32_t *grid, float v[8]) {
    const uint8_t *b = row + 98 * (uint64_t)(g >> 5);
    const int j = g & 31, ib = j >> 2, l = j & 3;
    float d = ld_half(b);
    uint32_t aux = ld_u16(b + 66 + 4 * ib) | (ld_u16(b + 68 + 4 * ib) << 16);
    float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
    uint32_t idx = ld_u16(b + 2 + 8 * ib + 2 * l);
    uint32_t p0 = LDG ? __ldg(grid + (idx & 0xff)) : grid[idx & 0xff];
    uint32_t p1 = LDG ? __ldg(grid + (idx >> 8)) : grid[idx >> 8];
    /* the eighth sign is the parity of the seven stored ones */
    uint32_t s = (aux >> (7 * l)) & 127;
    s |= (__popc(s) & 1) << 7;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float m = db * (float)(((i < 4 ? p0 : p1) >> (8 * (i & 3))) & 0xff);
        v[i] = (s >> i) & 1 ? -m : m;
    }
}

template <> struct deq<EM_TYPE_IQ3_XXS> {
    __device__ static void get(const uint8_t *row, uint32_t g, float v[8]) {
        iq3xxs_get<true>(row, g, em_cuda_iq3xxs_grid, v);
    }
};

/* ---- f16 output, for the tensor-core products (gemm.cu) ----
 * Group g of a row as 8 f16 (element 8g + i in bits 16i..16i+15 of the uint4), rounded to nearest
 * from the decoders above. f16 rather than bf16: three more bits of mantissa (BF16 weights and
 * the decoded quantized ones convert exactly or nearly so, activations lose 2^-12 instead of
 * 2^-9), at the price of range: values are clamped to f16's largest, +-65504, which activations
 * entering a product (normalized rows, gated-unit outputs) stay far below. */
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const float m = 65504.0f;
    __half2 h = __floats2half2_rn(fminf(fmaxf(lo, -m), m), fminf(fmaxf(hi, -m), m));
    return *(const uint32_t *)&h;
}

/* Two floats as bf16, round to nearest (the wgmma kernel's activations for BF16 weights: bf16's
 * range, 2^-9 of precision). */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&h;
}

__device__ __forceinline__ uint4 pack_f16x8(const float v[8]) {
    return make_uint4(pack_f16x2(v[0], v[1]), pack_f16x2(v[2], v[3]), pack_f16x2(v[4], v[5]),
                      pack_f16x2(v[6], v[7]));
}

/* Two bf16 (as stored in a BF16 row, the first in the low half) as two f16. */
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t r) {
    return pack_f16x2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
}

/* `grid` is IQ3_XXS's lattice (any memory space; gemm.cu passes a copy in shared memory, where
 * the scattered lookups of a whole block of threads are cheaper than in constant memory). */
template <int TYPE> __device__ __forceinline__ uint4 deq_f16x8(const uint8_t *row, uint32_t g, const uint32_t *grid) {
    (void)grid;
    float v[8];
    deq<TYPE>::get(row, g, v);
    return pack_f16x8(v);
}

/* IQ3_XXS with the lattice passed in. */
template <>
__device__ __forceinline__ uint4 deq_f16x8<EM_TYPE_IQ3_XXS>(const uint8_t *row, uint32_t g, const uint32_t *grid) {
    float v[8];
    iq3xxs_get<false>(row, g, grid, v);
    return pack_f16x8(v);
}

/* ---- f16 output computed in f16, for the decode tensor-core kernel (matvec_tc.cu) ----
 * Group g as 8 f16 like deq_f16x8, but with packed half arithmetic instead of a float per
 * element: integer levels become f16 exactly through the 0x6400 exponent (the half with bits
 * 0x6400 | b is 1024 + b for a byte b), then one scaling in f16. The results are the stored values
 * rounded to f16 once, except that a block's scale (d * sub-block scale) is itself rounded to f16
 * first for Q4_K, Q6_K and IQ3_XXS, a relative difference of at most 2^-11. No clamping: weights
 * past f16's range (65504) do not occur in these formats' use. */
__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(const uint32_t *)&h; }
__device__ __forceinline__ __half2 h2_of(uint32_t u) { return *(const __half2 *)&u; }
/* Bytes 0-1 (sel 0x4140) or 2-3 (0x4342) of w as two halves 1024 + byte. */
__device__ __forceinline__ __half2 h2_bytes(uint32_t w, uint32_t sel) { return h2_of(__byte_perm(w, 0x64646464u, sel)); }
/* Two floats as a half pair, the first in the low half. */
__device__ __forceinline__ uint32_t h2_rn(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
/* The four bytes of w (each a level 0..255 after `bias` is added back) times `scale`. */
__device__ __forceinline__ void h2_levels(uint32_t w, __half2 offset, __half2 scale, uint32_t out[2]) {
    out[0] = h2_bits(__hmul2(__hsub2(h2_bytes(w, 0x4140), offset), scale));
    out[1] = h2_bits(__hmul2(__hsub2(h2_bytes(w, 0x4342), offset), scale));
}

template <int TYPE> __device__ __forceinline__ uint4 deq_h8(const uint8_t *row, uint32_t g) {
    return deq_f16x8<TYPE>(row, g, em_cuda_iq3xxs_grid);
}

template <> __device__ __forceinline__ uint4 deq_h8<EM_TYPE_F16>(const uint8_t *row, uint32_t g) {
    return *(const uint4 *)(row + 16 * (uint64_t)g);
}

template <> __device__ __forceinline__ uint4 deq_h8<EM_TYPE_BF16>(const uint8_t *row, uint32_t g) {
    const uint4 u = *(const uint4 *)(row + 16 * (uint64_t)g);
    return make_uint4(h2_rn(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u)),
                      h2_rn(__uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u)),
                      h2_rn(__uint_as_float(u.z << 16), __uint_as_float(u.z & 0xffff0000u)),
                      h2_rn(__uint_as_float(u.w << 16), __uint_as_float(u.w & 0xffff0000u)));
}

/* The quantized types' deq_h8 in two halves: h8_fetch loads the bytes group g needs, as stored,
 * and h8_decode turns them into the 8 halves, so that a kernel can issue a step's loads well
 * before it needs their values (gemm.cu's wgmma kernel). deq_h8 is the two back to back. */
template <int TYPE> struct h8_raw;

/* Q8_0: the signed bytes, flipped to 0..255 (+128), become 1024 + q + 128; minus 1152, times d. */
template <> struct h8_raw<EM_TYPE_Q8_0> {
    uint32_t d; /* the block's scale, f16 bits */
    uint2 q;
};
__device__ __forceinline__ h8_raw<EM_TYPE_Q8_0> h8_fetch_q8_0(const uint8_t *row, uint32_t g) {
    const uint8_t *b = row + 34 * (uint64_t)(g >> 2);
    return {ld_u16(b), ld8_a2(b + 2 + 8 * (g & 3))};
}
__device__ __forceinline__ uint4 h8_decode_q8_0(const h8_raw<EM_TYPE_Q8_0> &r) {
    const __half2 d = __half2half2(__ushort_as_half((unsigned short)r.d)), offset = __float2half2_rn(1152.0f);
    uint32_t o[4];
    h2_levels(r.q.x ^ 0x80808080u, offset, d, o);
    h2_levels(r.q.y ^ 0x80808080u, offset, d, o + 2);
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* Q4_K: nibbles q, then q * dl - ml in one f16 fused multiply-add. */
template <> struct h8_raw<EM_TYPE_Q4_K> {
    uint32_t dm;     /* d and dmin, f16 bits */
    uint32_t scales; /* scale bytes sub, sub + 4 and (from sub 4 on) sub - 4 of the 12 */
    uint2 q;
};
__device__ __forceinline__ h8_raw<EM_TYPE_Q4_K> h8_fetch_q4_k(const uint8_t *row, uint32_t g) {
    const uint8_t *b = row + 144 * (uint64_t)(g >> 5);
    const int j = g & 31, sub = j >> 2, part = j & 3;
    const uint8_t *s = b + 4;
    const uint32_t scales = s[sub] | (uint32_t)s[sub + 4] << 8 | (sub < 4 ? 0u : (uint32_t)s[sub - 4] << 16);
    return {ld_u16(b) | ld_u16(b + 2) << 16, scales, *(const uint2 *)(b + 16 + 32 * (sub >> 1) + 8 * part)};
}
__device__ __forceinline__ uint4 h8_decode_q4_k(const h8_raw<EM_TYPE_Q4_K> &r, uint32_t g) {
    const int sub = (g & 31) >> 2;
    int sc, mn;
    q4k_sc_mn(r.scales & 0xff, (r.scales >> 8) & 0xff, r.scales >> 16, sub, &sc, &mn);
    const float dlf = __half2float(__ushort_as_half((unsigned short)(r.dm & 0xffff))) * (float)sc;
    const float mlf = __half2float(__ushort_as_half((unsigned short)(r.dm >> 16))) * (float)mn;
    const __half2 dl = __float2half2_rn(dlf), ml = __float2half2_rn(-mlf);
    const __half2 offset = __float2half2_rn(1024.0f);
    const int shift = 4 * (sub & 1);
    const uint32_t w[2] = {(r.q.x >> shift) & 0x0f0f0f0fu, (r.q.y >> shift) & 0x0f0f0f0fu};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        o[2 * i] = h2_bits(__hfma2(__hsub2(h2_bytes(w[i], 0x4140), offset), dl, ml));
        o[2 * i + 1] = h2_bits(__hfma2(__hsub2(h2_bytes(w[i], 0x4342), offset), dl, ml));
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* Q6_K: the 6-bit levels q assembled four at a time, then (q - 32) * dl. */
template <> struct h8_raw<EM_TYPE_Q6_K> {
    uint2 lo, hi;
    uint32_t d_scale; /* d's f16 bits, the sub-block's int8 scale in bits 16-23 */
};
__device__ __forceinline__ h8_raw<EM_TYPE_Q6_K> h8_fetch_q6_k(const uint8_t *row, uint32_t g) {
    const uint8_t *b = row + 210 * (uint64_t)(g >> 5);
    const int e0 = 8 * (g & 31), half = e0 >> 7, r = e0 & 127;
    return {ld8_a2(b + 64 * half + (r & 63)), ld8_a2(b + 128 + 32 * half + (r & 31)),
            ld_u16(b + 208) | (uint32_t)b[192 + (e0 >> 4)] << 16};
}
__device__ __forceinline__ uint4 h8_decode_q6_k(const h8_raw<EM_TYPE_Q6_K> &raw, uint32_t g) {
    const int r = (8 * (g & 31)) & 127;
    const int ls = 4 * (r >> 6), hs = 2 * (r >> 5);
    const float d = __half2float(__ushort_as_half((unsigned short)(raw.d_scale & 0xffff)));
    const __half2 dl = __float2half2_rn(d * (float)(int8_t)(raw.d_scale >> 16));
    const __half2 offset = __float2half2_rn(1056.0f);
    uint32_t o[4];
    h2_levels(((raw.lo.x >> ls) & 0x0f0f0f0fu) | (((raw.hi.x >> hs) & 0x03030303u) << 4), offset, dl, o);
    h2_levels(((raw.lo.y >> ls) & 0x0f0f0f0fu) | (((raw.hi.y >> hs) & 0x03030303u) << 4), offset, dl, o + 2);
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* IQ3_XXS: the lattice bytes as halves, the signs xor-ed into their sign bits, times db. */
template <> struct h8_raw<EM_TYPE_IQ3_XXS> {
    uint32_t d;   /* f16 bits */
    uint32_t aux; /* the sub-block's signs and scale */
    uint32_t idx; /* two lattice indices */
};
__device__ __forceinline__ h8_raw<EM_TYPE_IQ3_XXS> h8_fetch_iq3_xxs(const uint8_t *row, uint32_t g) {
    const uint8_t *b = row + 98 * (uint64_t)(g >> 5);
    const int j = g & 31, ib = j >> 2, l = j & 3;
    return {ld_u16(b), ld_u16(b + 66 + 4 * ib) | (ld_u16(b + 68 + 4 * ib) << 16), ld_u16(b + 2 + 8 * ib + 2 * l)};
}
/* The lattice in device memory (LDG: through the read-only cache), or a copy in shared memory. */
template <bool LDG = true>
__device__ __forceinline__ uint4 h8_decode_iq3_xxs(const h8_raw<EM_TYPE_IQ3_XXS> &r, uint32_t g,
                                                   const uint32_t *grid = em_cuda_iq3xxs_grid) {
    const int l = g & 3;
    const float d = __half2float(__ushort_as_half((unsigned short)r.d));
    const __half2 db = __float2half2_rn(d * (0.5f + (float)(r.aux >> 28)) * 0.5f);
    const uint32_t p[2] = {LDG ? __ldg(grid + (r.idx & 0xff)) : grid[r.idx & 0xff],
                           LDG ? __ldg(grid + (r.idx >> 8)) : grid[r.idx >> 8]};
    uint32_t s = (r.aux >> (7 * l)) & 127;
    s |= (__popc(s) & 1) << 7;
    const __half2 offset = __float2half2_rn(1024.0f);
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t bits = s >> (2 * i);
        const uint32_t sign = ((bits & 1u) << 15) | ((bits & 2u) << 30);
        const __half2 m = __hsub2(h2_bytes(p[i >> 1], i & 1 ? 0x4342 : 0x4140), offset);
        o[i] = h2_bits(__hmul2(h2_of(h2_bits(m) ^ sign), db));
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* BF16, for the wgmma kernel: its conversion to f16 clamped like the GEMMs' (bf16x2_to_f16x2),
 * where deq_h8<EM_TYPE_BF16> (the decode tensor-core kernel's) rounds without the clamp. */
template <> struct h8_raw<EM_TYPE_BF16> {
    uint4 u;
};
__device__ __forceinline__ h8_raw<EM_TYPE_BF16> h8_fetch_bf16(const uint8_t *row, uint32_t g) {
    return {*(const uint4 *)(row + 16 * (uint64_t)g)};
}
__device__ __forceinline__ uint4 h8_decode_bf16(const h8_raw<EM_TYPE_BF16> &r) {
    return make_uint4(bf16x2_to_f16x2(r.u.x), bf16x2_to_f16x2(r.u.y), bf16x2_to_f16x2(r.u.z), bf16x2_to_f16x2(r.u.w));
}

/* The other types (F16: the wgmma kernel copies it as stored) keep their place. */
template <int TYPE> struct h8_raw {
    const uint8_t *row;
    uint32_t g;
};
template <int TYPE> __device__ __forceinline__ h8_raw<TYPE> h8_fetch(const uint8_t *row, uint32_t g) {
    if constexpr (TYPE == EM_TYPE_Q8_0) return h8_fetch_q8_0(row, g);
    else if constexpr (TYPE == EM_TYPE_Q4_K) return h8_fetch_q4_k(row, g);
    else if constexpr (TYPE == EM_TYPE_Q6_K) return h8_fetch_q6_k(row, g);
    else if constexpr (TYPE == EM_TYPE_IQ3_XXS) return h8_fetch_iq3_xxs(row, g);
    else if constexpr (TYPE == EM_TYPE_BF16) return h8_fetch_bf16(row, g);
    else return {row, g};
}
template <int TYPE> __device__ __forceinline__ uint4 h8_decode(const h8_raw<TYPE> &r, uint32_t g) {
    if constexpr (TYPE == EM_TYPE_Q8_0) return h8_decode_q8_0(r);
    else if constexpr (TYPE == EM_TYPE_Q4_K) return h8_decode_q4_k(r, g);
    else if constexpr (TYPE == EM_TYPE_Q6_K) return h8_decode_q6_k(r, g);
    else if constexpr (TYPE == EM_TYPE_IQ3_XXS) return h8_decode_iq3_xxs(r, g);
    else if constexpr (TYPE == EM_TYPE_BF16) return h8_decode_bf16(r);
    else return deq_h8<TYPE>(r.row, r.g);
}
template <> __device__ __forceinline__ uint4 deq_h8<EM_TYPE_Q8_0>(const uint8_t *row, uint32_t g) {
    return h8_decode_q8_0(h8_fetch_q8_0(row, g));
}
template <> __device__ __forceinline__ uint4 deq_h8<EM_TYPE_Q4_K>(const uint8_t *row, uint32_t g) {
    return h8_decode_q4_k(h8_fetch_q4_k(row, g), g);
}
template <> __device__ __forceinline__ uint4 deq_h8<EM_TYPE_Q6_K>(const uint8_t *row, uint32_t g) {
    return h8_decode_q6_k(h8_fetch_q6_k(row, g), g);
}
template <> __device__ __forceinline__ uint4 deq_h8<EM_TYPE_IQ3_XXS>(const uint8_t *row, uint32_t g) {
    return h8_decode_iq3_xxs(h8_fetch_iq3_xxs(row, g), g);
}

/* A weight type as a compile-time value, for choosing a kernel template. */
template <int TYPE> struct em_type_tag {
    static constexpr int value = TYPE;
};

/* Calls f(em_type_tag<T>()) for each weight type T the device decoders read: F16, BF16, Q8_0,
 * Q4_K, Q6_K, IQ3_XXS, MXFP4, Q5_K, Q3_K, IQ4_XS and Q2_K, and F32 first when WITH_F32 (the f32
 * kernels). MXFP4 (the experts of gpt-oss and of llama.cpp's MXFP4_MOE files) and the last four go
 * through the generic decoders above (deq<T>::get), the last four for the mixed recipes of
 * llama.cpp's file types: the f32, TC and GEMM kernels take them; DP4A, IMMA and the persistent
 * kernel read only their own lists of types (DP4A's includes MXFP4). The one list of the types the
 * kernels are built for, so that every launch and every "supported" check agree. */
template <bool WITH_F32, typename F> static inline void em_cuda_each_type(F &&f) {
    if constexpr (WITH_F32) f(em_type_tag<EM_TYPE_F32>());
    f(em_type_tag<EM_TYPE_F16>());
    f(em_type_tag<EM_TYPE_BF16>());
    f(em_type_tag<EM_TYPE_Q8_0>());
    f(em_type_tag<EM_TYPE_Q4_K>());
    f(em_type_tag<EM_TYPE_Q6_K>());
    f(em_type_tag<EM_TYPE_IQ3_XXS>());
    f(em_type_tag<EM_TYPE_MXFP4>());
    f(em_type_tag<EM_TYPE_Q5_K>());
    f(em_type_tag<EM_TYPE_Q3_K>());
    f(em_type_tag<EM_TYPE_IQ4_XS>());
    f(em_type_tag<EM_TYPE_Q2_K>());
}

/* Calls f(em_type_tag<T>()) for T == type if it is one of em_cuda_each_type's; false otherwise
 * (f not called). */
template <bool WITH_F32, typename F> static inline bool em_cuda_with_type(uint32_t type, F &&f) {
    bool found = false;
    em_cuda_each_type<WITH_F32>([&](auto t) {
        if (decltype(t)::value == (int)type) f(t), found = true;
    });
    return found;
}

#endif
