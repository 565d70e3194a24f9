/* The binary heap of base.h: its memory. Push and pop are inline in base.h. */
#include <stdlib.h>

#include "base.h"

bool em_heap_reserve(em_heap *h, size_t bytes) {
    if (bytes <= h->cap_bytes) return true;
    size_t cap = h->cap_bytes ? 2 * h->cap_bytes : 4096;
    while (cap < bytes) cap *= 2;
    unsigned char *grown = realloc(h->items, cap);
    if (!grown) return false;
    h->items = grown;
    h->cap_bytes = cap;
    return true;
}

void em_heap_free(em_heap *h) {
    free(h->items);
    *h = (em_heap){0};
}
