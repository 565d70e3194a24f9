/* `split_gguf IN.gguf N OUT_PREFIX`: writes IN as a split set OUT_PREFIX-0000i-of-0000N.gguf (test
 * helper: the command-line tests make their split models with it). */
#include <stdio.h>
#include <stdlib.h>

#include "gguf/gguf.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: split_gguf IN.gguf N OUT_PREFIX\n");
        return 1;
    }
    em_gguf *g;
    em_err err = em_gguf_open(argv[1], &g);
    if (!err) {
        err = em_gguf_write_split(g, (uint32_t)strtoul(argv[2], NULL, 10), argv[3]);
        em_gguf_close(g);
    }
    if (err) {
        fprintf(stderr, "split_gguf: %s\n", em_err_message(err));
        em_err_free(err);
        return 1;
    }
    return 0;
}
