/* base: the growable buffer and the binary heap, checked against libc (snprintf, qsort). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"

/* ---- em_buf ---- */

static void buf_appends_like_snprintf(void **state) {
    (void)state;
    em_buf b = {0};
    char want[8192] = "";
    size_t used = 0;
    for (int i = 0; i < 300; i++) { /* past the first few growths */
        assert_true(em_buf_printf(&b, "%d:%s;", i, i % 2 ? "odd" : "even"));
        used += (size_t)snprintf(want + used, sizeof want - used, "%d:%s;", i, i % 2 ? "odd" : "even");
    }
    assert_true(em_buf_puts(&b, "end"));
    assert_true(em_buf_putc(&b, '!'));
    assert_true(em_buf_append(&b, "\0x", 2)); /* bytes, NUL included */
    used += (size_t)snprintf(want + used, sizeof want - used, "end!");
    assert_int_equal(b.len, used + 2);
    assert_memory_equal(b.data, want, used);
    assert_int_equal(b.data[used], 0);
    assert_int_equal(b.data[used + 1], 'x');
    assert_int_equal(b.data[b.len], 0); /* always terminated */
    assert_false(b.failed);
    em_buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
}

static void buf_failure_is_sticky(void **state) {
    (void)state;
    em_buf b = {0};
    assert_true(em_buf_puts(&b, "kept"));
    assert_false(em_buf_append(&b, "x", EM_BUF_MAX)); /* past the limit: refused, nothing allocated */
    assert_true(b.failed);
    assert_false(em_buf_puts(&b, "lost"));
    assert_false(em_buf_printf(&b, "%d", 1));
    assert_int_equal(b.len, 4);
    assert_string_equal(b.data, "kept");
    em_buf_free(&b);
    assert_false(b.failed);
    assert_true(em_buf_puts(&b, "again"));
    assert_string_equal(b.data, "again");
    em_buf_free(&b);
}

/* ---- em_heap ---- */

typedef struct item {
    int32_t key;
    uint32_t order; /* insertion order: ties come out first-in first (as the tokenizers break them) */
    char pad[7];    /* an odd size, so no alignment happens to hide a wrong stride */
} item;

static bool item_before(const void *a_, const void *b_) {
    const item *a = a_, *b = b_;
    return a->key < b->key || (a->key == b->key && a->order < b->order);
}

static int item_compare(const void *a, const void *b) { return item_before(a, b) ? -1 : item_before(b, a) ? 1 : 0; }

static uint64_t next_random(uint64_t *state) { /* xorshift64 */
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static void heap_pops_in_qsort_order(void **state) {
    (void)state;
    enum { N = 5000 };
    item *all = calloc(N, sizeof *all), *sorted = calloc(N, sizeof *sorted);
    assert_non_null(all);
    assert_non_null(sorted);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (uint32_t i = 0; i < N; i++) all[i] = (item){.key = (int32_t)(next_random(&rng) % 100) - 50, .order = i};
    memcpy(sorted, all, N * sizeof *all);
    qsort(sorted, N, sizeof *sorted, item_compare);

    em_heap h = {0};
    for (uint32_t i = 0; i < N; i++) assert_true(em_heap_push(&h, &all[i], sizeof(item), item_before));
    assert_int_equal(h.n, N);
    for (uint32_t i = 0; i < N; i++) {
        item got;
        em_heap_pop(&h, &got, sizeof got, item_before);
        assert_int_equal(got.key, sorted[i].key);
        assert_int_equal(got.order, sorted[i].order);
    }
    assert_int_equal(h.n, 0);

    /* Interleaved pushes and pops (as merging does): every pop is the least of what is in. */
    uint32_t in = 0;
    for (uint32_t i = 0; i < N; i++) {
        assert_true(em_heap_push(&h, &all[i], sizeof(item), item_before));
        in++;
        if (next_random(&rng) % 3 == 0) {
            item got;
            em_heap_pop(&h, &got, sizeof got, item_before);
            in--;
            for (size_t j = 0; j < h.n; j++) assert_false(item_before(h.items + j * sizeof(item), &got));
        }
    }
    assert_int_equal(h.n, in);
    em_heap_free(&h);
    assert_null(h.items);
    free(all);
    free(sorted);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buf_appends_like_snprintf),
        cmocka_unit_test(buf_failure_is_sticky),
        cmocka_unit_test(heap_pops_in_qsort_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
