/* libFuzzer target: the reader of saved log-probabilities (`ember perplexity --kl-base`) must turn
 * any byte string into a file or an error, and every row of an accepted file must read and compare
 * (KL divergence against a flat distribution) without leaving its buffers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "perplexity/perplexity.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The reader takes a path (it checks the file's length against its header). */
    char path[] = "/tmp/fuzz_logprobs_XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return 0;
    const bool written = write(fd, data, size) == (ssize_t)size;
    close(fd);
    em_logprobs_file file = {0};
    em_err err = written ? em_logprobs_open(&file, path) : NULL;
    if (written && !err) {
        const em_logprobs_header *h = &file.h;
        float *logits = calloc(h->n_vocab, sizeof *logits);
        em_ppl_kl kl = {0};
        const uint64_t rows = (uint64_t)h->n_chunks * h->n_scored;
        for (uint64_t r = 0; logits && r < rows && !err; r++) {
            em_logprobs_row row;
            if (!(err = em_logprobs_read_row(&file, &row)))
                err = em_ppl_kl_add(&kl, logits, h->n_vocab, log((double)h->n_vocab), 0, 0, &row);
        }
        em_ppl_kl_report report;
        em_ppl_kl_finish(&kl, &report);
        em_ppl_kl_free(&kl);
        free(logits);
    }
    em_err_free(err);
    em_err_free(em_logprobs_close(&file));
    unlink(path);
    return 0;
}
