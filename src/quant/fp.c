/* Half-precision (IEEE binary16) and bfloat16 conversions, bit-exact and portable. */
#include "internal.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float em_fp16_to_f32(uint16_t h) { return em_fp16_decode(h); }

uint16_t em_f32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t magnitude = x & 0x7fffffff;
    if (magnitude > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((magnitude >> 13) & 0x3ff)); /* NaN */
    if (magnitude >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to infinity */
    if (magnitude < 0x38800000) {                                   /* below 2^-14: f16 subnormal */
        uint32_t exponent = magnitude >> 23;
        if (exponent < 102) return sign; /* below half the smallest subnormal (2^-25): zero */
        uint32_t mantissa = (magnitude & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - exponent; /* value = mantissa * 2^(exponent-150); unit 2^-24 */
        uint32_t q = mantissa >> shift;
        uint32_t rest = mantissa & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1))) q++;
        return (uint16_t)(sign | q); /* q == 0x400 carries into the smallest normal, as it should */
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even. */
    uint32_t rounded = magnitude - (112u << 23) + 0xfff + ((magnitude >> 13) & 1);
    return (uint16_t)(sign | (rounded >> 13));
}

float em_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t em_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* NaN: force quiet */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
