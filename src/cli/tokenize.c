/* `ember tokenize`: text → token ids, and ids → text with --decode (see docs/tokenize.md).
 *
 *   ember tokenize -m MODEL.gguf [--raw] [--ids] [-f FILE | TEXT]
 *   ember tokenize -m MODEL.gguf [--raw] --decode ID...
 *
 * --ids prints the ids on one line separated by single spaces; otherwise one token per line:
 * the id, a tab, and the token's bytes (control characters, backslashes and bytes that are not
 * complete UTF-8 escaped as \n, \t, \\, \xNN). --raw adds no BOS/EOS and does not parse
 * special-token text; with --decode it leaves control tokens out. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tokenizer.h"
#include "cli.h"

static const char usage[] = "usage: ember tokenize -m MODEL.gguf [--raw] [--ids] [-f FILE | TEXT]\n"
                            "       ember tokenize -m MODEL.gguf [--raw] --decode ID...\n";

/* Prints bytes readably on one line: complete UTF-8 as is, the rest escaped. */
static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout), i++;
        else if (c == '\t') fputs("\\t", stdout), i++;
        else if (c == '\r') fputs("\\r", stdout), i++;
        else if (c == '\\') fputs("\\\\", stdout), i++;
        else if (c < 0x20 || c == 0x7F) printf("\\x%02X", c), i++;
        else if (c < 0x80) putchar(c), i++;
        else {
            size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            bool whole = k > 1 && i + k <= n;
            for (size_t j = 1; whole && j < k; j++) whole = ((unsigned char)s[i + j] & 0xC0) == 0x80;
            if (whole) fwrite(s + i, 1, k, stdout), i += k;
            else printf("\\x%02X", c), i++;
        }
    }
}

static int decode(const em_tokenizer *t, int argc, char **argv, int first, bool raw) {
    size_t n = (size_t)(argc - first);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return em_cli_fail("tokenize", em_errorf(EM_ERR_NOMEM, "out of memory"));
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long v = strtol(argv[first + (int)i], &end, 10);
        if (errno || *end || end == argv[first + (int)i] || v < 0 || v >= em_tokenizer_n_vocab(t)) {
            free(ids);
            return em_cli_fail("tokenize", em_errorf(EM_ERR_INVALID, "--decode: '%s' is not a token id (0..%d)",
                                                     argv[first + (int)i], (int)em_tokenizer_n_vocab(t) - 1));
        }
        ids[i] = (int32_t)v;
    }
    char *text;
    size_t len;
    em_err err = em_detokenize(t, ids, n, !raw, &text, &len);
    free(ids);
    if (err) return em_cli_fail("tokenize", err);
    fwrite(text, 1, len, stdout);
    putchar('\n');
    free(text);
    return 0;
}

int em_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL;
    bool raw = false, ids_only = false;
    int decode_from = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc) return fprintf(stderr, "ember tokenize: %s needs a file\n%s", a, usage), 1;
            model = argv[i];
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (++i >= argc) return fprintf(stderr, "ember tokenize: %s needs a file\n%s", a, usage), 1;
            file = argv[i];
        } else if (!strcmp(a, "--raw")) {
            raw = true;
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--decode")) {
            decode_from = i + 1;
            break;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] && !text) {
            return fprintf(stderr, "ember tokenize: unknown option '%s'\n%s", a, usage), 1;
        } else if (!text) {
            text = a;
        } else {
            return fprintf(stderr, "ember tokenize: more than one TEXT (quote it)\n%s", usage), 1;
        }
    }
    if (!model) return fprintf(stderr, "ember tokenize: -m MODEL.gguf is required\n%s", usage), 1;
    if (!decode_from && !!file == !!text)
        return fprintf(stderr, "ember tokenize: give either -f FILE or TEXT\n%s", usage), 1;

    em_gguf *gguf;
    em_err err = em_gguf_open(model, &gguf);
    if (err) return em_cli_fail("tokenize", err);
    em_tokenizer *t;
    err = em_tokenizer_from_gguf(gguf, &t);
    em_gguf_close(gguf);
    if (err) return em_cli_fail("tokenize", err);
    if (decode_from) {
        int rc = decode(t, argc, argv, decode_from, raw);
        em_tokenizer_free(t);
        return rc;
    }
    char *data = NULL;
    size_t len = text ? strlen(text) : 0;
    if (file && (err = em_cli_read_file(file, &data, &len))) {
        em_tokenizer_free(t);
        return em_cli_fail("tokenize", err);
    }
    int32_t *ids;
    size_t n;
    err = em_tokenize(t, file ? data : text, len, !raw, !raw, &ids, &n);
    free(data);
    if (err) {
        em_tokenizer_free(t);
        return em_cli_fail("tokenize", err);
    }
    for (size_t i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", (int)ids[i]);
            continue;
        }
        const char *piece;
        size_t k = em_token_to_piece(t, ids[i], true, &piece);
        printf("%d\t", (int)ids[i]);
        print_escaped(piece, k);
        putchar('\n');
    }
    if (ids_only) putchar('\n');
    free(ids);
    em_tokenizer_free(t);
    return 0;
}
