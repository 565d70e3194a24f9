/* The type table: elements and bytes per block for each GGML type id (see quant.h). */
#include "quant.h"

#include <ctype.h>
#include <string.h>

static const em_type_info type_table[EM_TYPE_COUNT] = {
    [EM_TYPE_F32] = {"F32", 1, 4},
    [EM_TYPE_F16] = {"F16", 1, 2},
    [EM_TYPE_Q4_0] = {"Q4_0", 32, 18},
    [EM_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [EM_TYPE_Q5_0] = {"Q5_0", 32, 22},
    [EM_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [EM_TYPE_Q8_0] = {"Q8_0", 32, 34},
    [EM_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [EM_TYPE_Q2_K] = {"Q2_K", 256, 84},
    [EM_TYPE_Q3_K] = {"Q3_K", 256, 110},
    [EM_TYPE_Q4_K] = {"Q4_K", 256, 144},
    [EM_TYPE_Q5_K] = {"Q5_K", 256, 176},
    [EM_TYPE_Q6_K] = {"Q6_K", 256, 210},
    [EM_TYPE_Q8_K] = {"Q8_K", 256, 292},
    [EM_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66},
    [EM_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74},
    [EM_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98},
    [EM_TYPE_IQ1_S] = {"IQ1_S", 256, 50},
    [EM_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18},
    [EM_TYPE_IQ3_S] = {"IQ3_S", 256, 110},
    [EM_TYPE_IQ2_S] = {"IQ2_S", 256, 82},
    [EM_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136},
    [EM_TYPE_I8] = {"I8", 1, 1},
    [EM_TYPE_I16] = {"I16", 1, 2},
    [EM_TYPE_I32] = {"I32", 1, 4},
    [EM_TYPE_I64] = {"I64", 1, 8},
    [EM_TYPE_F64] = {"F64", 1, 8},
    [EM_TYPE_IQ1_M] = {"IQ1_M", 256, 56},
    [EM_TYPE_BF16] = {"BF16", 1, 2},
    [EM_TYPE_TQ1_0] = {"TQ1_0", 256, 54},
    [EM_TYPE_TQ2_0] = {"TQ2_0", 256, 66},
    [EM_TYPE_MXFP4] = {"MXFP4", 32, 17},
};

const em_type_info *em_type_info_of(uint32_t type) {
    if (type >= EM_TYPE_COUNT || type_table[type].name == NULL) return NULL;
    return &type_table[type];
}

const char *em_type_name(uint32_t type) {
    const em_type_info *info = em_type_info_of(type);
    return info ? info->name : "unknown";
}

static int names_equal_ignoring_case(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
    return *a == *b;
}

em_err em_type_from_name(const char *name, em_type *out) {
    for (uint32_t id = 0; id < EM_TYPE_COUNT; id++) {
        if (type_table[id].name && names_equal_ignoring_case(type_table[id].name, name)) {
            *out = (em_type)id;
            return NULL;
        }
    }
    return em_errorf(EM_ERR_NOT_FOUND, "unknown tensor type '%s'", name);
}

em_err em_type_row_bytes(uint32_t type, uint64_t elems, uint64_t *out) {
    const em_type_info *info = em_type_info_of(type);
    if (!info) return em_errorf(EM_ERR_UNSUPPORTED, "unknown tensor type id %u", type);
    if (elems % info->block_elems != 0)
        return em_errorf(EM_ERR_FORMAT, "row of %llu elements is not a multiple of the %s block (%u elements)",
                         (unsigned long long)elems, info->name, info->block_elems);
    if (em_mul_overflows(elems / info->block_elems, info->block_bytes, out))
        return em_errorf(EM_ERR_FORMAT, "row of %llu %s elements overflows 64-bit size", (unsigned long long)elems,
                         info->name);
    return NULL;
}
