/* The file of saved log-probabilities (perplexity.h; docs/perplexity.md has the layout).
 *
 * Everything is little-endian, which every supported host is, so values are written in host order.
 * A row keeps each token's log-probability as a 16-bit step above the row's floor: the floor is at
 * most EM_LOGPROBS_RANGE below the row's largest log-probability, so a step is at most
 * EM_LOGPROBS_RANGE / 65534 nats and the rounding error half that; the divergence such an error
 * adds is of the order of its square, far below what a comparison of two models reads. The
 * probability of the right token and the most likely token are kept exactly beside it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "perplexity.h"

#define HEADER_BYTES 48u
#define ROW_HEAD_BYTES 16u
#define Q_MAX 65535u

static uint64_t row_bytes(uint32_t n_vocab) { return ROW_HEAD_BYTES + 2ull * n_vocab; }

uint64_t em_ppl_vocab_hash(const em_tokenizer *tokenizer) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a offset basis and prime */
    const int32_t n = em_tokenizer_n_vocab(tokenizer);
    for (int32_t id = 0; id < n; id++) {
        const char *text;
        const size_t len = em_tokenizer_token_text(tokenizer, id, &text);
        for (size_t i = 0; i <= len; i++) {
            h ^= i < len ? (unsigned char)text[i] : 0;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static em_err start(em_logprobs_file *file, const char *path, bool writing) {
    *file = (em_logprobs_file){.writing = writing};
    file->path = strdup(path);
    if (!file->path) return em_errorf(EM_ERR_NOMEM, "out of memory");
    file->f = fopen(path, writing ? "wb" : "rb");
    if (!file->f) return em_errorf(EM_ERR_IO, "%s: cannot %s", path, writing ? "create" : "open");
    return NULL;
}

/* The sizes a header implies, checked for overflow: tokens and rows. */
static em_err sizes(const char *path, const em_logprobs_header *h, uint64_t *n_tokens, uint64_t *total) {
    uint64_t rows, bytes;
    if (em_mul_overflows(h->n_chunks, h->ctx, n_tokens) || em_mul_overflows(h->n_chunks, h->n_scored, &rows) ||
        em_mul_overflows(rows, row_bytes(h->n_vocab), &bytes) || em_add_overflows(bytes, HEADER_BYTES, &bytes) ||
        em_add_overflows(bytes, *n_tokens * 4, total) || *n_tokens > SIZE_MAX / 4)
        return em_errorf(EM_ERR_FORMAT, "%s: the header's sizes overflow", path);
    return NULL;
}

em_err em_logprobs_create(em_logprobs_file *file, const char *path, const em_logprobs_header *h,
                          const int32_t *tokens) {
    em_err err = start(file, path, true);
    if (err) return err;
    file->h = *h;
    uint64_t n_tokens, total;
    if ((err = sizes(path, h, &n_tokens, &total))) return err;
    file->row = malloc(row_bytes(h->n_vocab));
    if (!file->row) return em_errorf(EM_ERR_NOMEM, "out of memory for a row of %u tokens", h->n_vocab);
    unsigned char head[HEADER_BYTES] = {0};
    memcpy(head, EM_LOGPROBS_MAGIC, 8);
    put_u32(head + 8, EM_LOGPROBS_VERSION);
    put_u32(head + 12, h->n_vocab);
    put_u32(head + 16, h->ctx);
    put_u32(head + 20, h->n_chunks);
    put_u32(head + 24, h->first);
    put_u32(head + 28, h->n_scored);
    memcpy(head + 32, &h->bos, 4);
    memcpy(head + 40, &h->vocab_hash, 8);
    if (fwrite(head, 1, sizeof head, file->f) != sizeof head ||
        fwrite(tokens, 4, (size_t)n_tokens, file->f) != (size_t)n_tokens)
        return em_errorf(EM_ERR_IO, "%s: write failed", path);
    return NULL;
}

em_err em_logprobs_write_row(em_logprobs_file *file, const float *logits, double lse, int32_t target) {
    const uint32_t n = file->h.n_vocab;
    int32_t top = 0;
    double low = logits[0];
    for (uint32_t i = 1; i < n; i++) {
        if (logits[i] > logits[top]) top = (int32_t)i;
        if (logits[i] < low) low = logits[i];
    }
    const double high = logits[top] - lse;
    low -= lse;
    const double floor_d = low > high - EM_LOGPROBS_RANGE ? low : high - EM_LOGPROBS_RANGE;
    float floor_f = (float)floor_d;
    if (floor_f > floor_d) floor_f = nextafterf(floor_f, -INFINITY); /* the least log-probability stays above it */
    const float step = (float)((high - floor_f) / (Q_MAX - 1));
    const float target_logprob = (float)(logits[target] - lse);
    unsigned char *head = (unsigned char *)file->row;
    memcpy(head, &floor_f, 4);
    memcpy(head + 4, &step, 4);
    memcpy(head + 8, &target_logprob, 4);
    memcpy(head + 12, &top, 4);
    uint16_t *q = file->row + ROW_HEAD_BYTES / 2;
    for (uint32_t i = 0; i < n; i++) {
        const double lp = logits[i] - lse;
        if (lp < floor_f) {
            q[i] = 0;
        } else if (step > 0) {
            const double k = 1 + floor((lp - floor_f) / step + 0.5);
            q[i] = (uint16_t)(k > Q_MAX ? Q_MAX : k);
        } else {
            q[i] = 1; /* every logit alike */
        }
    }
    if (fwrite(file->row, 1, row_bytes(n), file->f) != row_bytes(n))
        return em_errorf(EM_ERR_IO, "%s: write failed at row %llu", file->path, (unsigned long long)file->rows_done);
    file->rows_done++;
    return NULL;
}

em_err em_logprobs_open(em_logprobs_file *file, const char *path) {
    em_err err = start(file, path, false);
    if (err) return err;
    unsigned char head[HEADER_BYTES];
    if (fread(head, 1, sizeof head, file->f) != sizeof head || memcmp(head, EM_LOGPROBS_MAGIC, 8))
        return em_errorf(EM_ERR_FORMAT, "%s: not a file of saved log-probabilities (no %s header)", path,
                         EM_LOGPROBS_MAGIC);
    if (get_u32(head + 8) != EM_LOGPROBS_VERSION)
        return em_errorf(EM_ERR_FORMAT, "%s: version %u, this build reads version %u", path, get_u32(head + 8),
                         EM_LOGPROBS_VERSION);
    em_logprobs_header *h = &file->h;
    h->n_vocab = get_u32(head + 12);
    h->ctx = get_u32(head + 16);
    h->n_chunks = get_u32(head + 20);
    h->first = get_u32(head + 24);
    h->n_scored = get_u32(head + 28);
    memcpy(&h->bos, head + 32, 4);
    memcpy(&h->vocab_hash, head + 40, 8);
    if (h->n_vocab == 0 || h->ctx < EM_PPL_MIN_CTX || h->n_chunks == 0 || h->first != h->ctx / 2 ||
        h->n_scored != h->ctx - 1 - h->first)
        return em_errorf(EM_ERR_FORMAT, "%s: inconsistent header (vocabulary %u, window %u, %u windows, scored %u+%u)",
                         path, h->n_vocab, h->ctx, h->n_chunks, h->first, h->n_scored);
    uint64_t n_tokens, total;
    if ((err = sizes(path, h, &n_tokens, &total))) return err;
    struct stat st;
    if (fstat(fileno(file->f), &st) || (uint64_t)st.st_size != total)
        return em_errorf(EM_ERR_FORMAT, "%s: %lld bytes, but its header describes %llu (truncated or not this format)",
                         path, (long long)st.st_size, (unsigned long long)total);
    file->tokens = malloc(n_tokens ? n_tokens * 4 : 4);
    file->row = malloc(row_bytes(h->n_vocab));
    if (!file->tokens || !file->row) return em_errorf(EM_ERR_NOMEM, "%s: out of memory", path);
    if (fread(file->tokens, 4, (size_t)n_tokens, file->f) != (size_t)n_tokens)
        return em_errorf(EM_ERR_IO, "%s: read failed in the tokens", path);
    for (uint64_t i = 0; i < n_tokens; i++)
        if (file->tokens[i] < 0 || (uint32_t)file->tokens[i] >= h->n_vocab)
            return em_errorf(EM_ERR_FORMAT, "%s: token %llu is %d, outside the vocabulary of %u", path,
                             (unsigned long long)i, file->tokens[i], h->n_vocab);
    return NULL;
}

em_err em_logprobs_read_row(em_logprobs_file *file, em_logprobs_row *row) {
    const uint32_t n = file->h.n_vocab;
    if (fread(file->row, 1, row_bytes(n), file->f) != row_bytes(n))
        return em_errorf(EM_ERR_IO, "%s: read failed at row %llu", file->path, (unsigned long long)file->rows_done);
    const unsigned char *head = (const unsigned char *)file->row;
    memcpy(&row->floor, head, 4);
    memcpy(&row->step, head + 4, 4);
    memcpy(&row->target_logprob, head + 8, 4);
    memcpy(&row->top, head + 12, 4);
    row->q = file->row + ROW_HEAD_BYTES / 2;
    if (!isfinite(row->floor) || !isfinite(row->step) || row->step < 0 || !isfinite(row->target_logprob) ||
        row->top < 0 || (uint32_t)row->top >= n)
        return em_errorf(EM_ERR_FORMAT, "%s: row %llu is damaged", file->path, (unsigned long long)file->rows_done);
    file->rows_done++;
    return NULL;
}

em_err em_logprobs_close(em_logprobs_file *file) {
    em_err err = NULL;
    if (file->f && fclose(file->f) && file->writing)
        err = em_errorf(EM_ERR_IO, "%s: write failed when closing", file->path);
    free(file->path);
    free(file->tokens);
    free(file->row);
    *file = (em_logprobs_file){0};
    return err;
}
