/* The attention operation of the CPU backend (program.h's EM_PROGRAM_ATTENTION): each token's query
 * heads against the keys and values of its sequence in one paged KV cache, a block of positions at a
 * time. Tokens of one sequence share each block while it is in L1 (a tile); the work is split where
 * the positions attended to add up to equal parts. */
#include <string.h>

#include "cpu_internal.h"

/* The cache row of a position: its block from the table, then the row inside the block. */
static uint64_t cache_row(const em_cpu_attention *job, const em_batch_seq *seq, uint32_t pos) {
    return (uint64_t)seq->blocks[pos / job->block_tokens] * job->block_tokens + pos % job->block_tokens;
}

/* The first position a token at `pos` attends to. */
static uint32_t first_visible(const em_program_attention *a, uint32_t pos) {
    return a->window && pos + 1 > a->window ? pos + 1 - a->window : 0;
}

/* Tokens whose attention one unit of work computes together: consecutive tokens of a batch, when
 * they belong to one sequence (a prompt's chunk), share each block of keys and values while it is
 * in L1. */

/* The tokens of tile `tile`: [*from, *to). */
static void tile_tokens(const em_batch *batch, uint64_t tile, uint32_t *from, uint32_t *to) {
    *from = (uint32_t)tile * EM_CPU_ATTN_TILE;
    *to = batch->n_tokens - *from < EM_CPU_ATTN_TILE ? batch->n_tokens : *from + EM_CPU_ATTN_TILE;
}

/* Share `ith` of `nth` of the batch's (token tile, KV head) units, unit tile * n_head_kv + kvh, cut
 * where the positions attended to (each unit's work) add up to equal parts: in a prompt's causal
 * attention the last tokens see many times the positions the first ones do, so equal counts of
 * units would leave the thread with the early tokens waiting. */
static void attention_range(const em_batch *batch, const em_program_attention *ld, uint32_t ith, uint32_t nth,
                            uint64_t *begin, uint64_t *end) {
    const uint64_t n_tiles = (batch->n_tokens + EM_CPU_ATTN_TILE - 1) / EM_CPU_ATTN_TILE;
    uint64_t total = 0;
    for (uint32_t t = 0; t < batch->n_tokens; t++)
        total += (uint64_t)(batch->pos[t] + 1 - first_visible(ld, batch->pos[t])) * ld->n_head_kv;
    const uint64_t from = total * ith / nth, to = total * (ith + 1) / nth; /* this share's part */
    /* a tile's units begin at `done` positions into the line; unit i belongs to the share in which
     * its first position falls */
    uint64_t done = 0;
    *begin = *end = n_tiles * ld->n_head_kv;
    bool begun = false;
    for (uint64_t tile = 0; tile < n_tiles; tile++) {
        uint32_t first, last;
        tile_tokens(batch, tile, &first, &last);
        uint64_t seen = 0;
        for (uint32_t t = first; t < last; t++) seen += batch->pos[t] + 1 - first_visible(ld, batch->pos[t]);
        for (uint32_t kvh = 0; kvh < ld->n_head_kv; kvh++, done += seen) {
            const uint64_t i = tile * ld->n_head_kv + kvh;
            if (!begun && done >= from) {
                *begin = i;
                begun = true;
            }
            if (done >= to) {
                *end = i;
                return;
            }
        }
    }
}

/* Positions [first, end) of the tokens' sequence, a KV block's run at a time: run_end is where the
 * run of cache rows that begins at `p` ends. */
static uint32_t run_end(uint32_t p, uint32_t end, uint32_t block_tokens) {
    const uint32_t block_end = (p / block_tokens + 1) * block_tokens;
    return block_end < end ? block_end : end;
}

/* The part [from, to) of positions [p, pe) that a token at `pos` sees (its first visible position
 * in *first); false when it sees none of them. */
static bool visible_part(const em_program_attention *ld, uint32_t pos, uint32_t p, uint32_t pe, uint32_t *first,
                         uint32_t *from, uint32_t *to) {
    *first = first_visible(ld, pos);
    *from = p > *first ? p : *first;
    *to = pe < pos + 1 ? pe : pos + 1;
    return *from < *to;
}

/* One share of (token tile, KV head) units: for each token and each query head of the unit, scores
 * over the token's visible positions, softmax, weighted values. Positions are walked block by block
 * of the sequence's table: within a block the cache rows are consecutive, so each block's row is
 * looked up once, and the tile's tokens and the unit's query heads take each block's keys (and then
 * its values) in turn while they are in L1. A tile whose tokens are not all of one sequence takes
 * them one at a time. Each head's numbers are those of the head alone, whatever the tile. */
static void attention_share(void *ctx, uint32_t ith, uint32_t nth) {
    const em_cpu_attention *job = ctx;
    const em_batch *batch = job->batch;
    const em_program_attention *ld = job->op;
    const uint32_t group = ld->n_head / ld->n_head_kv, block_tokens = job->block_tokens;
    const uint64_t key_row = (uint64_t)ld->n_head_kv * ld->head_dim;
    const uint64_t value_row = (uint64_t)ld->n_head_kv * ld->head_dim_v;
    /* token j of the tile, head g: scores at (j * group + g) * cap_positions, from its first position */
    float *scores = job->scores + (uint64_t)ith * job->scores_per_thread;
    uint64_t begin, end;
    attention_range(batch, ld, ith, nth, &begin, &end);
    for (uint64_t i = begin; i < end; i++) {
        const uint32_t kvh = (uint32_t)(i % ld->n_head_kv);
        uint32_t tile_first, tile_end;
        tile_tokens(batch, i / ld->n_head_kv, &tile_first, &tile_end);
        for (uint32_t t0 = tile_first; t0 < tile_end;) {
            /* the tokens [t0, t1) that share a sequence */
            uint32_t t1 = t0 + 1;
            while (t1 < tile_end && batch->seq[t1] == batch->seq[t0]) t1++;
            const em_batch_seq *seq = &batch->seqs[batch->seq[t0]];
            uint32_t lo = UINT32_MAX, hi = 0; /* the positions any of them sees: [lo, hi) */
            for (uint32_t t = t0; t < t1; t++) {
                const uint32_t f = first_visible(ld, batch->pos[t]);
                if (f < lo) lo = f;
                if (batch->pos[t] + 1 > hi) hi = batch->pos[t] + 1;
            }
            for (uint32_t p = lo; p < hi; p = run_end(p, hi, block_tokens)) {
                const uint32_t pe = run_end(p, hi, block_tokens);
                const float *k = job->keys + cache_row(job, seq, p) * key_row + (uint64_t)kvh * ld->head_dim;
                for (uint32_t t = t0; t < t1; t++) {
                    uint32_t first, from, to;
                    if (!visible_part(ld, batch->pos[t], p, pe, &first, &from, &to)) continue;
                    const float *q = job->q + ((uint64_t)t * ld->n_head + (uint64_t)kvh * group) * ld->head_dim;
                    for (uint32_t g = 0; g < group; g++) {
                        float *run_scores =
                            scores + ((uint64_t)(t - t0) * group + g) * job->cap_positions + (from - first);
                        em_f32_dot_rows(k + (uint64_t)(from - p) * key_row, key_row, to - from,
                                        q + (uint64_t)g * ld->head_dim, ld->head_dim, run_scores); /* q·k */
                        for (uint32_t r = 0; r < to - from; r++) {
                            float sc = run_scores[r] * ld->scale;
                            if (ld->softcap > 0.0f) sc = ld->softcap * tanhf(sc / ld->softcap);
                            run_scores[r] = sc;
                        }
                    }
                }
            }
            for (uint32_t t = t0; t < t1; t++) {
                const uint32_t seen = batch->pos[t] + 1 - first_visible(ld, batch->pos[t]);
                for (uint32_t g = 0; g < group; g++) {
                    float *head_scores = scores + ((uint64_t)(t - t0) * group + g) * job->cap_positions;
                    /* a sink is one more logit in the softmax, after the positions; its weight is dropped */
                    if (ld->sinks) head_scores[seen] = ld->sinks[kvh * group + g];
                    em_f32_softmax(head_scores, seen + (ld->sinks ? 1 : 0));
                }
                float *o = job->out + ((uint64_t)t * ld->n_head + (uint64_t)kvh * group) * ld->head_dim_v;
                memset(o, 0, (uint64_t)group * ld->head_dim_v * sizeof *o);
            }
            for (uint32_t p = lo; p < hi; p = run_end(p, hi, block_tokens)) {
                const uint32_t pe = run_end(p, hi, block_tokens);
                const float *v = job->values + cache_row(job, seq, p) * value_row + (uint64_t)kvh * ld->head_dim_v;
                for (uint32_t t = t0; t < t1; t++) {
                    uint32_t first, from, to;
                    if (!visible_part(ld, batch->pos[t], p, pe, &first, &from, &to)) continue;
                    float *o = job->out + ((uint64_t)t * ld->n_head + (uint64_t)kvh * group) * ld->head_dim_v;
                    em_f32_add_weighted_rows(o, ld->head_dim_v,
                                             scores + (uint64_t)(t - t0) * group * job->cap_positions + (from - first),
                                             job->cap_positions, group, v + (uint64_t)(from - p) * value_row, value_row,
                                             to - from, ld->head_dim_v);
                }
            }
            t0 = t1;
        }
    }
}

void em_cpu_attention_run(em_cpu_pool *pool, const em_cpu_attention *job) {
    const em_program_attention *a = job->op;
    uint64_t work = 0; /* bytes of keys and values read, as if for each query head alone */
    for (uint32_t t = 0; t < job->batch->n_tokens; t++)
        work += ((uint64_t)job->batch->pos[t] + 1) * a->n_head * (a->head_dim + a->head_dim_v) * sizeof(float);
    em_cpu_pool_run_sized(pool, attention_share, (void *)job, work);
}
