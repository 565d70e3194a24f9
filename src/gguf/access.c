/* Lookups and typed getters over a validated GGUF file (gguf.h). */
#include "gguf.h"

#include <stdlib.h>
#include <string.h>

/* Little-endian loads from the mapping (which need not be aligned for the value's type). */
static uint64_t load_le(const uint8_t *p, size_t size) {
    uint64_t v = 0;
    for (size_t i = 0; i < size; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int64_t load_int(em_gguf_type type, const uint8_t *p) {
    switch (type) {
    case EM_GGUF_UINT8: case EM_GGUF_BOOL: return p[0];
    case EM_GGUF_INT8: return (int8_t)p[0];
    case EM_GGUF_UINT16: return (uint16_t)load_le(p, 2);
    case EM_GGUF_INT16: return (int16_t)(uint16_t)load_le(p, 2);
    case EM_GGUF_UINT32: return (uint32_t)load_le(p, 4);
    case EM_GGUF_INT32: return (int32_t)(uint32_t)load_le(p, 4);
    case EM_GGUF_UINT64: case EM_GGUF_INT64: return (int64_t)load_le(p, 8);
    default: return 0;
    }
}

static double load_float(em_gguf_type type, const uint8_t *p) {
    if (type == EM_GGUF_FLOAT32) {
        uint32_t bits = (uint32_t)load_le(p, 4);
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    if (type == EM_GGUF_FLOAT64) {
        uint64_t bits = load_le(p, 8);
        double d;
        memcpy(&d, &bits, 8);
        return d;
    }
    return (double)load_int(type, p);
}

static bool is_integer(em_gguf_type t) {
    return t == EM_GGUF_UINT8 || t == EM_GGUF_INT8 || t == EM_GGUF_UINT16 || t == EM_GGUF_INT16 ||
           t == EM_GGUF_UINT32 || t == EM_GGUF_INT32 || t == EM_GGUF_UINT64 || t == EM_GGUF_INT64;
}


bool em_str_eq(em_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || !memcmp(s.ptr, cstr, n));
}

char *em_str_dup(em_str s) {
    char *copy = malloc((size_t)s.len + 1);
    if (!copy) return NULL;
    if (s.len) memcpy(copy, s.ptr, (size_t)s.len);
    copy[s.len] = '\0';
    return copy;
}

const em_gguf_kv *em_gguf_find(const em_gguf *g, const char *key) {
    for (uint64_t i = 0; i < em_gguf_kv_count(g); i++) {
        const em_gguf_kv *kv = em_gguf_kv_at(g, i);
        if (em_str_eq(kv->key, key)) return kv;
    }
    return NULL;
}

static em_err find_typed(const em_gguf *g, const char *key, const em_gguf_kv **out) {
    *out = em_gguf_find(g, key);
    if (!*out) return em_errorf(EM_ERR_NOT_FOUND, "%s: metadata key '%s' is missing", em_gguf_path(g), key);
    return NULL;
}

static em_err wrong_type(const em_gguf *g, const em_gguf_kv *kv, const char *key, const char *expected) {
    return em_errorf(EM_ERR_TYPE, "%s: offset %llu: metadata key '%s' has type %s, expected %s", em_gguf_path(g),
                     (unsigned long long)kv->offset, key, em_gguf_type_name(kv->type), expected);
}

static em_err get_integer(const em_gguf *g, const char *key, int64_t min, uint64_t max, const char *expected,
                          uint64_t *out_bits) {
    const em_gguf_kv *kv;
    em_err err = find_typed(g, key, &kv);
    if (err) return err;
    if (!is_integer(kv->type)) return wrong_type(g, kv, key, expected);
    uint64_t bits;
    bool fits;
    if (kv->type == EM_GGUF_UINT64) {
        bits = load_le(kv->data, 8);
        fits = bits <= max;
    } else {
        int64_t value = load_int(kv->type, kv->data);
        bits = (uint64_t)value;
        fits = value >= min && (value < 0 || (uint64_t)value <= max);
    }
    if (!fits)
        return em_errorf(EM_ERR_RANGE, "%s: offset %llu: metadata key '%s' = %s%llu does not fit %s", em_gguf_path(g),
                         (unsigned long long)kv->offset, key, kv->type != EM_GGUF_UINT64 && (int64_t)bits < 0 ? "-" : "",
                         kv->type != EM_GGUF_UINT64 && (int64_t)bits < 0 ? (unsigned long long)-(bits) : (unsigned long long)bits,
                         expected);
    *out_bits = bits;
    return NULL;
}

em_err em_gguf_get_u32(const em_gguf *g, const char *key, uint32_t *out) {
    uint64_t v = 0;
    em_err err = get_integer(g, key, 0, UINT32_MAX, "uint32", &v);
    if (!err) *out = (uint32_t)v;
    return err;
}

em_err em_gguf_get_u64(const em_gguf *g, const char *key, uint64_t *out) {
    return get_integer(g, key, 0, UINT64_MAX, "uint64", out);
}

em_err em_gguf_get_i64(const em_gguf *g, const char *key, int64_t *out) {
    uint64_t v = 0;
    em_err err = get_integer(g, key, INT64_MIN, INT64_MAX, "int64", &v);
    if (!err) *out = (int64_t)v;
    return err;
}

em_err em_gguf_get_f32(const em_gguf *g, const char *key, float *out) {
    const em_gguf_kv *kv;
    em_err err = find_typed(g, key, &kv);
    if (err) return err;
    if (kv->type != EM_GGUF_FLOAT32 && kv->type != EM_GGUF_FLOAT64) return wrong_type(g, kv, key, "float32");
    *out = (float)load_float(kv->type, kv->data);
    return NULL;
}

em_err em_gguf_get_bool(const em_gguf *g, const char *key, bool *out) {
    const em_gguf_kv *kv;
    em_err err = find_typed(g, key, &kv);
    if (err) return err;
    if (kv->type != EM_GGUF_BOOL) return wrong_type(g, kv, key, "bool");
    *out = kv->data[0] != 0;
    return NULL;
}

em_err em_gguf_get_str(const em_gguf *g, const char *key, em_str *out) {
    const em_gguf_kv *kv;
    em_err err = find_typed(g, key, &kv);
    if (err) return err;
    if (kv->type != EM_GGUF_STRING) return wrong_type(g, kv, key, "string");
    *out = kv->strings[0];
    return NULL;
}

em_err em_gguf_get_array(const em_gguf *g, const char *key, em_gguf_type element_type, const em_gguf_kv **out) {
    const em_gguf_kv *kv;
    em_err err = find_typed(g, key, &kv);
    if (err) return err;
    if (kv->type != EM_GGUF_ARRAY || kv->array_type != element_type)
        return em_errorf(EM_ERR_TYPE, "%s: offset %llu: metadata key '%s' has type %s%s%s, expected array of %s",
                         em_gguf_path(g), (unsigned long long)kv->offset, key, em_gguf_type_name(kv->type),
                         kv->type == EM_GGUF_ARRAY ? " of " : "",
                         kv->type == EM_GGUF_ARRAY ? em_gguf_type_name(kv->array_type) : "",
                         em_gguf_type_name(element_type));
    *out = kv;
    return NULL;
}

int64_t em_gguf_array_int(const em_gguf_kv *kv, uint64_t index) {
    if (kv->type != EM_GGUF_ARRAY || index >= kv->array_len ||
        (!is_integer(kv->array_type) && kv->array_type != EM_GGUF_BOOL))
        return 0;
    size_t size = em_gguf_type_size(kv->array_type);
    return load_int(kv->array_type, kv->data + index * size);
}

double em_gguf_array_float(const em_gguf_kv *kv, uint64_t index) {
    size_t size = em_gguf_type_size(kv->array_type);
    if (kv->type != EM_GGUF_ARRAY || index >= kv->array_len || size == 0) return 0;
    return load_float(kv->array_type, kv->data + index * size);
}

/* Float to integer without undefined behaviour: NaN reads 0, out-of-range values saturate. */
static int64_t saturate_to_int(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

int64_t em_gguf_kv_int(const em_gguf_kv *kv) {
    if (kv->type == EM_GGUF_FLOAT32 || kv->type == EM_GGUF_FLOAT64) return saturate_to_int(load_float(kv->type, kv->data));
    if (!is_integer(kv->type) && kv->type != EM_GGUF_BOOL) return 0;
    return load_int(kv->type, kv->data);
}

double em_gguf_kv_float(const em_gguf_kv *kv) {
    if (!is_integer(kv->type) && kv->type != EM_GGUF_BOOL && kv->type != EM_GGUF_FLOAT32 &&
        kv->type != EM_GGUF_FLOAT64)
        return 0;
    return load_float(kv->type, kv->data);
}

const em_gguf_tensor *em_gguf_find_tensor(const em_gguf *g, const char *name) {
    for (uint64_t i = 0; i < em_gguf_tensor_count(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        if (em_str_eq(t->name, name)) return t;
    }
    return NULL;
}

uint64_t em_gguf_tensor_elems(const em_gguf_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
