/*
 * Case mapping as JavaScript's toUpperCase/toLowerCase do it (the reference renderer's `upper`,
 * `lower`, `capitalize` and the `lower`/`upper` tests): utf8proc's simple mappings, plus the
 * mappings where JavaScript differs from them. The table below is data from the Unicode
 * Character Database: the unconditional full mappings of SpecialCasing.txt (ß → SS, ligatures,
 * Greek with ypogegrammeni, İ → i̇) and the simple mappings of characters newer than utf8proc's
 * Unicode version. Final sigma (Σ → ς at the end of a word) is the one context rule.
 */
#include <stdlib.h>
#include <utf8proc.h>

#include "internal.h"

typedef struct case_row {
    uint32_t cp;
    uint8_t n_upper;
    uint32_t upper[3];
    uint8_t n_lower;
    uint32_t lower[3];
} case_row;

static const case_row rows[] = {
    {0xdf, 2, {0x53, 0x53}, 0, {0}},
    {0x130, 0, {0}, 2, {0x69, 0x307}},
    {0x149, 2, {0x2bc, 0x4e}, 0, {0}},
    {0x19b, 1, {0xa7dc}, 0, {0}},
    {0x1f0, 2, {0x4a, 0x30c}, 0, {0}},
    {0x264, 1, {0xa7cb}, 0, {0}},
    {0x390, 3, {0x399, 0x308, 0x301}, 0, {0}},
    {0x3b0, 3, {0x3a5, 0x308, 0x301}, 0, {0}},
    {0x587, 2, {0x535, 0x552}, 0, {0}},
    {0x1c89, 0, {0}, 1, {0x1c8a}},
    {0x1c8a, 1, {0x1c89}, 0, {0}},
    {0x1e96, 2, {0x48, 0x331}, 0, {0}},
    {0x1e97, 2, {0x54, 0x308}, 0, {0}},
    {0x1e98, 2, {0x57, 0x30a}, 0, {0}},
    {0x1e99, 2, {0x59, 0x30a}, 0, {0}},
    {0x1e9a, 2, {0x41, 0x2be}, 0, {0}},
    {0x1f50, 2, {0x3a5, 0x313}, 0, {0}},
    {0x1f52, 3, {0x3a5, 0x313, 0x300}, 0, {0}},
    {0x1f54, 3, {0x3a5, 0x313, 0x301}, 0, {0}},
    {0x1f56, 3, {0x3a5, 0x313, 0x342}, 0, {0}},
    {0x1f80, 2, {0x1f08, 0x399}, 0, {0}},
    {0x1f81, 2, {0x1f09, 0x399}, 0, {0}},
    {0x1f82, 2, {0x1f0a, 0x399}, 0, {0}},
    {0x1f83, 2, {0x1f0b, 0x399}, 0, {0}},
    {0x1f84, 2, {0x1f0c, 0x399}, 0, {0}},
    {0x1f85, 2, {0x1f0d, 0x399}, 0, {0}},
    {0x1f86, 2, {0x1f0e, 0x399}, 0, {0}},
    {0x1f87, 2, {0x1f0f, 0x399}, 0, {0}},
    {0x1f88, 2, {0x1f08, 0x399}, 0, {0}},
    {0x1f89, 2, {0x1f09, 0x399}, 0, {0}},
    {0x1f8a, 2, {0x1f0a, 0x399}, 0, {0}},
    {0x1f8b, 2, {0x1f0b, 0x399}, 0, {0}},
    {0x1f8c, 2, {0x1f0c, 0x399}, 0, {0}},
    {0x1f8d, 2, {0x1f0d, 0x399}, 0, {0}},
    {0x1f8e, 2, {0x1f0e, 0x399}, 0, {0}},
    {0x1f8f, 2, {0x1f0f, 0x399}, 0, {0}},
    {0x1f90, 2, {0x1f28, 0x399}, 0, {0}},
    {0x1f91, 2, {0x1f29, 0x399}, 0, {0}},
    {0x1f92, 2, {0x1f2a, 0x399}, 0, {0}},
    {0x1f93, 2, {0x1f2b, 0x399}, 0, {0}},
    {0x1f94, 2, {0x1f2c, 0x399}, 0, {0}},
    {0x1f95, 2, {0x1f2d, 0x399}, 0, {0}},
    {0x1f96, 2, {0x1f2e, 0x399}, 0, {0}},
    {0x1f97, 2, {0x1f2f, 0x399}, 0, {0}},
    {0x1f98, 2, {0x1f28, 0x399}, 0, {0}},
    {0x1f99, 2, {0x1f29, 0x399}, 0, {0}},
    {0x1f9a, 2, {0x1f2a, 0x399}, 0, {0}},
    {0x1f9b, 2, {0x1f2b, 0x399}, 0, {0}},
    {0x1f9c, 2, {0x1f2c, 0x399}, 0, {0}},
    {0x1f9d, 2, {0x1f2d, 0x399}, 0, {0}},
    {0x1f9e, 2, {0x1f2e, 0x399}, 0, {0}},
    {0x1f9f, 2, {0x1f2f, 0x399}, 0, {0}},
    {0x1fa0, 2, {0x1f68, 0x399}, 0, {0}},
    {0x1fa1, 2, {0x1f69, 0x399}, 0, {0}},
    {0x1fa2, 2, {0x1f6a, 0x399}, 0, {0}},
    {0x1fa3, 2, {0x1f6b, 0x399}, 0, {0}},
    {0x1fa4, 2, {0x1f6c, 0x399}, 0, {0}},
    {0x1fa5, 2, {0x1f6d, 0x399}, 0, {0}},
    {0x1fa6, 2, {0x1f6e, 0x399}, 0, {0}},
    {0x1fa7, 2, {0x1f6f, 0x399}, 0, {0}},
    {0x1fa8, 2, {0x1f68, 0x399}, 0, {0}},
    {0x1fa9, 2, {0x1f69, 0x399}, 0, {0}},
    {0x1faa, 2, {0x1f6a, 0x399}, 0, {0}},
    {0x1fab, 2, {0x1f6b, 0x399}, 0, {0}},
    {0x1fac, 2, {0x1f6c, 0x399}, 0, {0}},
    {0x1fad, 2, {0x1f6d, 0x399}, 0, {0}},
    {0x1fae, 2, {0x1f6e, 0x399}, 0, {0}},
    {0x1faf, 2, {0x1f6f, 0x399}, 0, {0}},
    {0x1fb2, 2, {0x1fba, 0x399}, 0, {0}},
    {0x1fb3, 2, {0x391, 0x399}, 0, {0}},
    {0x1fb4, 2, {0x386, 0x399}, 0, {0}},
    {0x1fb6, 2, {0x391, 0x342}, 0, {0}},
    {0x1fb7, 3, {0x391, 0x342, 0x399}, 0, {0}},
    {0x1fbc, 2, {0x391, 0x399}, 0, {0}},
    {0x1fc2, 2, {0x1fca, 0x399}, 0, {0}},
    {0x1fc3, 2, {0x397, 0x399}, 0, {0}},
    {0x1fc4, 2, {0x389, 0x399}, 0, {0}},
    {0x1fc6, 2, {0x397, 0x342}, 0, {0}},
    {0x1fc7, 3, {0x397, 0x342, 0x399}, 0, {0}},
    {0x1fcc, 2, {0x397, 0x399}, 0, {0}},
    {0x1fd2, 3, {0x399, 0x308, 0x300}, 0, {0}},
    {0x1fd3, 3, {0x399, 0x308, 0x301}, 0, {0}},
    {0x1fd6, 2, {0x399, 0x342}, 0, {0}},
    {0x1fd7, 3, {0x399, 0x308, 0x342}, 0, {0}},
    {0x1fe2, 3, {0x3a5, 0x308, 0x300}, 0, {0}},
    {0x1fe3, 3, {0x3a5, 0x308, 0x301}, 0, {0}},
    {0x1fe4, 2, {0x3a1, 0x313}, 0, {0}},
    {0x1fe6, 2, {0x3a5, 0x342}, 0, {0}},
    {0x1fe7, 3, {0x3a5, 0x308, 0x342}, 0, {0}},
    {0x1ff2, 2, {0x1ffa, 0x399}, 0, {0}},
    {0x1ff3, 2, {0x3a9, 0x399}, 0, {0}},
    {0x1ff4, 2, {0x38f, 0x399}, 0, {0}},
    {0x1ff6, 2, {0x3a9, 0x342}, 0, {0}},
    {0x1ff7, 3, {0x3a9, 0x342, 0x399}, 0, {0}},
    {0x1ffc, 2, {0x3a9, 0x399}, 0, {0}},
    {0xa7cb, 0, {0}, 1, {0x264}},
    {0xa7cc, 0, {0}, 1, {0xa7cd}},
    {0xa7cd, 1, {0xa7cc}, 0, {0}},
    {0xa7ce, 0, {0}, 1, {0xa7cf}},
    {0xa7cf, 1, {0xa7ce}, 0, {0}},
    {0xa7d2, 0, {0}, 1, {0xa7d3}},
    {0xa7d3, 1, {0xa7d2}, 0, {0}},
    {0xa7d4, 0, {0}, 1, {0xa7d5}},
    {0xa7d5, 1, {0xa7d4}, 0, {0}},
    {0xa7da, 0, {0}, 1, {0xa7db}},
    {0xa7db, 1, {0xa7da}, 0, {0}},
    {0xa7dc, 0, {0}, 1, {0x19b}},
    {0xfb00, 2, {0x46, 0x46}, 0, {0}},
    {0xfb01, 2, {0x46, 0x49}, 0, {0}},
    {0xfb02, 2, {0x46, 0x4c}, 0, {0}},
    {0xfb03, 3, {0x46, 0x46, 0x49}, 0, {0}},
    {0xfb04, 3, {0x46, 0x46, 0x4c}, 0, {0}},
    {0xfb05, 2, {0x53, 0x54}, 0, {0}},
    {0xfb06, 2, {0x53, 0x54}, 0, {0}},
    {0xfb13, 2, {0x544, 0x546}, 0, {0}},
    {0xfb14, 2, {0x544, 0x535}, 0, {0}},
    {0xfb15, 2, {0x544, 0x53b}, 0, {0}},
    {0xfb16, 2, {0x54e, 0x546}, 0, {0}},
    {0xfb17, 2, {0x544, 0x53d}, 0, {0}},
    {0x10d50, 0, {0}, 1, {0x10d70}},
    {0x10d51, 0, {0}, 1, {0x10d71}},
    {0x10d52, 0, {0}, 1, {0x10d72}},
    {0x10d53, 0, {0}, 1, {0x10d73}},
    {0x10d54, 0, {0}, 1, {0x10d74}},
    {0x10d55, 0, {0}, 1, {0x10d75}},
    {0x10d56, 0, {0}, 1, {0x10d76}},
    {0x10d57, 0, {0}, 1, {0x10d77}},
    {0x10d58, 0, {0}, 1, {0x10d78}},
    {0x10d59, 0, {0}, 1, {0x10d79}},
    {0x10d5a, 0, {0}, 1, {0x10d7a}},
    {0x10d5b, 0, {0}, 1, {0x10d7b}},
    {0x10d5c, 0, {0}, 1, {0x10d7c}},
    {0x10d5d, 0, {0}, 1, {0x10d7d}},
    {0x10d5e, 0, {0}, 1, {0x10d7e}},
    {0x10d5f, 0, {0}, 1, {0x10d7f}},
    {0x10d60, 0, {0}, 1, {0x10d80}},
    {0x10d61, 0, {0}, 1, {0x10d81}},
    {0x10d62, 0, {0}, 1, {0x10d82}},
    {0x10d63, 0, {0}, 1, {0x10d83}},
    {0x10d64, 0, {0}, 1, {0x10d84}},
    {0x10d65, 0, {0}, 1, {0x10d85}},
    {0x10d70, 1, {0x10d50}, 0, {0}},
    {0x10d71, 1, {0x10d51}, 0, {0}},
    {0x10d72, 1, {0x10d52}, 0, {0}},
    {0x10d73, 1, {0x10d53}, 0, {0}},
    {0x10d74, 1, {0x10d54}, 0, {0}},
    {0x10d75, 1, {0x10d55}, 0, {0}},
    {0x10d76, 1, {0x10d56}, 0, {0}},
    {0x10d77, 1, {0x10d57}, 0, {0}},
    {0x10d78, 1, {0x10d58}, 0, {0}},
    {0x10d79, 1, {0x10d59}, 0, {0}},
    {0x10d7a, 1, {0x10d5a}, 0, {0}},
    {0x10d7b, 1, {0x10d5b}, 0, {0}},
    {0x10d7c, 1, {0x10d5c}, 0, {0}},
    {0x10d7d, 1, {0x10d5d}, 0, {0}},
    {0x10d7e, 1, {0x10d5e}, 0, {0}},
    {0x10d7f, 1, {0x10d5f}, 0, {0}},
    {0x10d80, 1, {0x10d60}, 0, {0}},
    {0x10d81, 1, {0x10d61}, 0, {0}},
    {0x10d82, 1, {0x10d62}, 0, {0}},
    {0x10d83, 1, {0x10d63}, 0, {0}},
    {0x10d84, 1, {0x10d64}, 0, {0}},
    {0x10d85, 1, {0x10d65}, 0, {0}},
    {0x16ea0, 0, {0}, 1, {0x16ebb}},
    {0x16ea1, 0, {0}, 1, {0x16ebc}},
    {0x16ea2, 0, {0}, 1, {0x16ebd}},
    {0x16ea3, 0, {0}, 1, {0x16ebe}},
    {0x16ea4, 0, {0}, 1, {0x16ebf}},
    {0x16ea5, 0, {0}, 1, {0x16ec0}},
    {0x16ea6, 0, {0}, 1, {0x16ec1}},
    {0x16ea7, 0, {0}, 1, {0x16ec2}},
    {0x16ea8, 0, {0}, 1, {0x16ec3}},
    {0x16ea9, 0, {0}, 1, {0x16ec4}},
    {0x16eaa, 0, {0}, 1, {0x16ec5}},
    {0x16eab, 0, {0}, 1, {0x16ec6}},
    {0x16eac, 0, {0}, 1, {0x16ec7}},
    {0x16ead, 0, {0}, 1, {0x16ec8}},
    {0x16eae, 0, {0}, 1, {0x16ec9}},
    {0x16eaf, 0, {0}, 1, {0x16eca}},
    {0x16eb0, 0, {0}, 1, {0x16ecb}},
    {0x16eb1, 0, {0}, 1, {0x16ecc}},
    {0x16eb2, 0, {0}, 1, {0x16ecd}},
    {0x16eb3, 0, {0}, 1, {0x16ece}},
    {0x16eb4, 0, {0}, 1, {0x16ecf}},
    {0x16eb5, 0, {0}, 1, {0x16ed0}},
    {0x16eb6, 0, {0}, 1, {0x16ed1}},
    {0x16eb7, 0, {0}, 1, {0x16ed2}},
    {0x16eb8, 0, {0}, 1, {0x16ed3}},
    {0x16ebb, 1, {0x16ea0}, 0, {0}},
    {0x16ebc, 1, {0x16ea1}, 0, {0}},
    {0x16ebd, 1, {0x16ea2}, 0, {0}},
    {0x16ebe, 1, {0x16ea3}, 0, {0}},
    {0x16ebf, 1, {0x16ea4}, 0, {0}},
    {0x16ec0, 1, {0x16ea5}, 0, {0}},
    {0x16ec1, 1, {0x16ea6}, 0, {0}},
    {0x16ec2, 1, {0x16ea7}, 0, {0}},
    {0x16ec3, 1, {0x16ea8}, 0, {0}},
    {0x16ec4, 1, {0x16ea9}, 0, {0}},
    {0x16ec5, 1, {0x16eaa}, 0, {0}},
    {0x16ec6, 1, {0x16eab}, 0, {0}},
    {0x16ec7, 1, {0x16eac}, 0, {0}},
    {0x16ec8, 1, {0x16ead}, 0, {0}},
    {0x16ec9, 1, {0x16eae}, 0, {0}},
    {0x16eca, 1, {0x16eaf}, 0, {0}},
    {0x16ecb, 1, {0x16eb0}, 0, {0}},
    {0x16ecc, 1, {0x16eb1}, 0, {0}},
    {0x16ecd, 1, {0x16eb2}, 0, {0}},
    {0x16ece, 1, {0x16eb3}, 0, {0}},
    {0x16ecf, 1, {0x16eb4}, 0, {0}},
    {0x16ed0, 1, {0x16eb5}, 0, {0}},
    {0x16ed1, 1, {0x16eb6}, 0, {0}},
    {0x16ed2, 1, {0x16eb7}, 0, {0}},
    {0x16ed3, 1, {0x16eb8}, 0, {0}},
};

static const case_row *find_row(uint32_t cp) {
    size_t lo = 0, hi = sizeof rows / sizeof rows[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rows[mid].cp == cp) return &rows[mid];
        if (rows[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static bool is_cased(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp;
}

static bool is_case_ignorable(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == '.' || cp == ':' ||
           cp == 0xb7 || cp == 0x2019;
}

/* Final_Sigma: a cased letter (skipping case-ignorables) before, none after. */
static bool final_sigma(const char *s, size_t n, size_t at, size_t len) {
    bool before = false;
    for (size_t i = at; i > 0;) {
        size_t j = i - 1;
        while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
        utf8proc_int32_t cp;
        if (utf8proc_iterate((const utf8proc_uint8_t *)s + j, (utf8proc_ssize_t)(i - j), &cp) <= 0) break;
        if (is_case_ignorable(cp)) {
            i = j;
            continue;
        }
        before = is_cased(cp);
        break;
    }
    if (!before) return false;
    for (size_t i = at + len; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) break;
        if (!is_case_ignorable(cp)) return !is_cased(cp);
        i += (size_t)k;
    }
    return true;
}

void em_chat_case_map(em_buf *b, const char *s, size_t n, bool upper, bool first_only) {
    size_t i = 0;
    bool done = false;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || done) {
            size_t rest = k <= 0 ? 1 : (size_t)k;
            em_buf_append(b, s + i, rest);
            i += rest;
            continue;
        }
        uint32_t out[3];
        size_t n_out = 1;
        const case_row *row = find_row((uint32_t)cp);
        if (row && (upper ? row->n_upper : row->n_lower)) {
            n_out = upper ? row->n_upper : row->n_lower;
            for (size_t j = 0; j < n_out; j++) out[j] = upper ? row->upper[j] : row->lower[j];
        } else if (!upper && cp == 0x3a3 && final_sigma(s, n, i, (size_t)k)) {
            out[0] = 0x3c2;
        } else {
            out[0] = (uint32_t)(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
        }
        for (size_t j = 0; j < n_out; j++) {
            utf8proc_uint8_t enc[4];
            utf8proc_ssize_t len = utf8proc_encode_char((utf8proc_int32_t)out[j], enc);
            em_buf_append(b, (const char *)enc, (size_t)len);
        }
        i += (size_t)k;
        if (first_only) done = true;
    }
}
