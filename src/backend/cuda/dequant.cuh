/* Device decoders of the block formats the CUDA backend reads: each turns group g (elements
 * 8g..8g+7) of a row into 8 floats in registers. The byte layouts and the arithmetic are those of
 * the CPU reference decoders in src/quant/dequant.c (the definition of each format); loads are as
 * wide as the block's alignment inside a row allows. Included by matvec.cu and gemm.cu (each then
 * has its own copy of the IQ3_XXS lattice, see below). */
#ifndef EMBER_BACKEND_CUDA_DEQUANT_CUH
#define EMBER_BACKEND_CUDA_DEQUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* IQ3_XXS lattice (quant's em_iq3xxs_grid), copied to device memory at startup. Read through the
 * read-only cache: the lanes of a warp look up different entries, which constant memory would
 * serve one address at a time. Without relocatable device code each file that includes this
 * header has its own copy: matvec.cu's is uploaded when the backend is made (em_cuda_upload_grids),
 * gemm.cu uploads its own. */
static __device__ uint32_t em_cuda_iq3xxs_grid[256];

__device__ __forceinline__ float ld_half(const uint8_t *p) { return __half2float(*(const __half *)p); }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }
/* 8 bytes from a 2-byte aligned address. */
__device__ __forceinline__ uint2 ld8_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return make_uint2(h[0] | ((uint32_t)h[1] << 16), h[2] | ((uint32_t)h[3] << 16));
}
__device__ __forceinline__ uint32_t byte_of(uint2 v, int i) { return ((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xff; }

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
    __device__ static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 34 * (uint64_t)(g >> 2);
        float d = ld_half(b);
        uint2 q = ld8_a2(b + 2 + 8 * (g & 3));
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = (float)(int8_t)byte_of(q, i) * d;
    }
};

/* Q4_K: 144-byte blocks of 256: d, dmin, 12 scale bytes, 128 nibble bytes (see dequant.c). */
template <> struct deq<EM_TYPE_Q4_K> {
    __device__ static void get(const uint8_t *row, uint32_t g, float v[8]) {
        const uint8_t *b = row + 144 * (uint64_t)(g >> 5);
        const int j = g & 31, sub = j >> 2, part = j & 3;
        float d = ld_half(b), dmin = ld_half(b + 2);
        const uint8_t *s = b + 4;
        int sc, mn;
        if (sub < 4) {
            sc = s[sub] & 63;
            mn = s[sub + 4] & 63;
        } else {
            sc = (s[sub + 4] & 15) | ((s[sub - 4] >> 6) << 4);
            mn = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
        }
        float dl = d * (float)sc, ml = dmin * (float)mn;
        uint2 q = *(const uint2 *)(b + 16 + 32 * (sub >> 1) + 8 * part);
        const int shift = 4 * (sub & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = dl * (float)((byte_of(q, i) >> shift) & 15) - ml;
    }
};

/* Q6_K: 210-byte blocks of 256: 128 low-nibble bytes, 64 high-pair bytes, 16 scales, d. */
template <> struct deq<EM_TYPE_Q6_K> {
    __device__ static void get(const uint8_t *row, uint32_t g, float v[8]) {
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

#endif
