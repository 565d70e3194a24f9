/* A generator for the fuzz targets whose inputs nest or fan out (grammar, schema, regex, template):
 * a few bytes stand for a text far larger than libFuzzer's inputs, so depth and width limits are
 * reached (issue #62: 30,000 nested groups took the server down; 257 enum values were refused).
 *
 * An amplified input is `count` (two bytes, little-endian), then five parts separated by NUL
 * bytes: prefix, open, middle, close, suffix. The text is the prefix, open repeated count times,
 * the middle, close repeated count times, the suffix (deep nesting: "root ::= " / "(" / "\"a\"" /
 * ")" / ""; fan-out: "root ::= " / "\"a\" | " / "\"b\"" / "" / ""). The text is capped at 4 MiB,
 * the largest body the server accepts. */
#ifndef EMBER_FUZZ_AMPLIFY_H
#define EMBER_FUZZ_AMPLIFY_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The amplified text of data[0..size) (malloc'd, NUL-terminated; *len its length), or NULL when
 * the input is not of that shape or the text would pass the cap. */
static inline char *em_fuzz_amplify(const uint8_t *data, size_t size, size_t *len) {
    if (size < 2) return NULL;
    const size_t count = data[0] | (size_t)data[1] << 8;
    const char *part[5], *end = (const char *)data + size, *at = (const char *)data + 2;
    size_t n[5];
    for (int i = 0; i < 5; i++) { /* the last part runs to the end */
        const char *stop = i < 4 ? memchr(at, 0, (size_t)(end - at)) : end;
        if (!stop) return NULL;
        part[i] = at;
        n[i] = (size_t)(stop - at);
        at = stop < end ? stop + 1 : end;
    }
    const size_t total = n[0] + count * (n[1] + n[3]) + n[2] + n[4];
    if (total > ((size_t)4 << 20)) return NULL;
    char *text = malloc(total + 1), *p = text;
    if (!text) return NULL;
    memcpy(p, part[0], n[0]);
    p += n[0];
    for (size_t i = 0; i < count; i++, p += n[1]) memcpy(p, part[1], n[1]);
    memcpy(p, part[2], n[2]);
    p += n[2];
    for (size_t i = 0; i < count; i++, p += n[3]) memcpy(p, part[3], n[3]);
    memcpy(p, part[4], n[4]);
    p += n[4];
    *p = '\0';
    *len = total;
    return text;
}

#endif
