/* The prefix cache's lower tiers (engine.h, "Prefix cache tiers") end to end on a tiny model (CPU):
 * a conversation evicted from the KV pool to host RAM, or on to disk, or kept on disk across an
 * engine's restart, comes back with the tokens and the logprobs of a cold run, bit for bit; each
 * tier stays within its bound; corrupt, truncated and foreign files are skipped; a disk that fails
 * its writes or a directory that cannot be made leaves the engine serving; two processes on one
 * directory each keep their own slot. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ember.h"
#include "model/model.h"

#define VOCAB EM_FIXTURES_DIR "/vocab/ggml-vocab-llama-spm.gguf"
#define FILES EM_BINARY_DIR "/test_tiers_files"
#define MODEL FILES "/tiny-qwen3.gguf"
#define OTHER_MODEL FILES "/tiny-qwen3-other.gguf"
#define HYBRID_MODEL FILES "/tiny-qwen35.gguf"
#define OUT 8
#define PROMPT 60
/* A prompt, its answer and 20 more tokens: the next turn of a conversation. */
#define NEXT (PROMPT + OUT + 20)

static uint32_t n_vocab;
static uint64_t block_bytes; /* one full block's KV in the CPU backend's layout */

static void synth(const char *preset, uint64_t seed, const char *path) {
    em_synth_options o = {.preset = preset, .type = "f32", .seed = seed, .vocab_path = VOCAB};
    em_err err = em_synth_write(&o, path);
    if (err) fail_msg("synth: %s", em_err_message(err));
}

static int setup(void **state) {
    (void)state;
    mkdir(FILES, 0755);
    synth("tiny-qwen3", 5, MODEL);
    synth("tiny-qwen3", 6, OTHER_MODEL);
    synth("tiny-qwen35", 5, HYBRID_MODEL);
    em_model *m;
    em_err err = em_model_load(MODEL, &m);
    if (err) fail_msg("load: %s", em_err_message(err));
    n_vocab = m->desc.n_vocab;
    block_bytes = em_backend_kv_bytes_per_token(m) * 16;
    em_model_free(m);
    return 0;
}

static void make_prompt(int32_t *tokens, uint32_t n, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = 3 + (int32_t)((seed >> 33) % (n_vocab - 3));
    }
}

/* An empty directory for one test's disk tier. */
static void fresh_dir(const char *path) {
    char command[512];
    snprintf(command, sizeof command, "rm -rf '%s' && mkdir -p '%s'", path, path);
    assert_int_equal(system(command), 0);
}

typedef struct tier_config {
    const char *model;
    uint64_t kv_blocks;        /* KV pool size in blocks */
    uint64_t ram;              /* bytes (0: off) */
    const char *dir;           /* disk tier, or NULL */
    uint64_t disk;             /* bytes (0: default) */
} tier_config;

static ember_engine *engine_with(const tier_config *c, ember_error **error) {
    ember_options o;
    ember_options_default(&o);
    o.model_path = c->model ? c->model : MODEL;
    o.device = "cpu";
    o.threads = 2;
    o.ctx_tokens = 512;
    o.kv_mem_bytes = c->kv_blocks * block_bytes;
    o.cache_ram_bytes = c->ram;
    o.cache_dir = c->dir;
    o.cache_disk_bytes = c->disk;
    ember_engine *e = NULL;
    *error = ember_engine_create(&o, &e);
    return e;
}

static ember_engine *new_engine(const tier_config *c) {
    ember_error *err;
    ember_engine *e = engine_with(c, &err);
    if (err) fail_msg("engine: %s", ember_error_message(err));
    return e;
}

typedef struct turn {
    int32_t tokens[OUT];
    float logprobs[OUT];
    uint32_t n;
    ember_timings timings;
} turn;

/* Greedy, OUT tokens, with each token's logprob: equal logprobs mean equal logits. Returns false
 * (without cmocka, for forked children) when the request failed. */
static bool run_turn(ember_engine *e, const int32_t *prompt, uint32_t n, turn *t) {
    ember_request_params p;
    ember_request_default(&p);
    p.prompt_ids = prompt;
    p.n_prompt_ids = n;
    p.max_tokens = OUT;
    p.sampling.temperature = 0;
    p.sampling.logprobs = 1;
    p.ignore_eos = true;
    memset(t, 0, sizeof *t);
    ember_request *r;
    ember_error *err = ember_submit(e, &p, &r);
    if (err) {
        fprintf(stderr, "submit: %s\n", ember_error_message(err));
        ember_error_free(err);
        return false;
    }
    ember_output out;
    do {
        if (!ember_request_next(r, &out, 300000)) break;
        for (size_t i = 0; i < out.n_tokens && t->n < OUT; i++) {
            t->tokens[t->n] = out.tokens[i].token;
            t->logprobs[t->n++] = out.tokens[i].logprob;
        }
    } while (out.finish == EMBER_FINISH_NONE);
    ember_request_timings(r, &t->timings);
    bool ok = out.finish == EMBER_FINISH_LENGTH && t->n == OUT;
    if (!ok) fprintf(stderr, "request ended with %d: %s\n", out.finish, out.error ? out.error : "");
    ember_request_release(r);
    return ok;
}

/* The same prompt on a fresh engine without tiers and with room to spare: the reference. */
static void cold(const int32_t *prompt, uint32_t n, turn *t) {
    tier_config c = {.kv_blocks = 64};
    ember_engine *e = new_engine(&c);
    assert_true(run_turn(e, prompt, n, t));
    assert_int_equal(t->timings.cached_tokens, 0);
    ember_engine_destroy(e);
}

static void assert_same(const turn *a, const turn *b) {
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->tokens, b->tokens, sizeof a->tokens);
    assert_memory_equal(a->logprobs, b->logprobs, sizeof a->logprobs); /* bit for bit */
}

/* A conversation: its first prompt, and the next turn once the first answer is known. */
typedef struct conversation {
    int32_t tokens[NEXT];
    turn first, next;
} conversation;

static void first_turn(ember_engine *e, conversation *c, uint64_t seed) {
    make_prompt(c->tokens, NEXT, seed);
    assert_true(run_turn(e, c->tokens, PROMPT, &c->first));
    memcpy(c->tokens + PROMPT, c->first.tokens, sizeof c->first.tokens);
}

/* The next turn, checked against a cold run; returns its timings. */
static ember_timings next_turn(ember_engine *e, conversation *c) {
    turn want;
    cold(c->tokens, NEXT, &want);
    assert_true(run_turn(e, c->tokens, NEXT, &c->next));
    assert_same(&c->next, &want);
    return c->next.timings;
}

static ember_stats stats_of(ember_engine *e) {
    ember_stats s;
    ember_engine_stats(e, &s);
    return s;
}

/* A pool of 12 blocks holds two conversations: the third pushes the first out to RAM, and its next
 * turn restores every token it had (PROMPT + OUT - 1: the last answer token has no KV yet). */
static void test_ram_tier(void **state) {
    (void)state;
    tier_config c = {.kv_blocks = 12, .ram = 64 * block_bytes};
    ember_engine *e = new_engine(&c);
    conversation a, b, d;
    first_turn(e, &a, 1);
    first_turn(e, &b, 2);
    first_turn(e, &d, 3);
    ember_stats s = stats_of(e);
    assert_true(s.cache_ram.enabled);
    assert_true(s.cache_ram.stored > 0);
    assert_int_equal(s.cache_ram.bytes, s.cache_ram.bytes_written); /* nothing has left it yet */
    ember_timings t = next_turn(e, &a);
    assert_int_equal(t.cached_tokens, PROMPT + OUT - 1);
    assert_true(t.ram_tokens > 0);
    assert_int_equal(t.disk_tokens, 0);
    s = stats_of(e);
    assert_true(s.cache_ram.hits > 0);
    assert_true(s.cache_ram.restore_ms > 0);
    assert_int_equal(s.cache_ram.bytes_read, s.cache_ram.hit_tokens * (block_bytes / 16));
    assert_true(s.cache_ram.bytes <= s.cache_ram.limit_bytes);
    assert_int_equal(s.prefix_tokens_evicted, 0); /* nothing was dropped */
    ember_engine_destroy(e);
}

/* Without tiers the same sequence recomputes: the counts say the tier is what saved the work. */
static void test_no_tier_recomputes(void **state) {
    (void)state;
    tier_config c = {.kv_blocks = 12};
    ember_engine *e = new_engine(&c);
    conversation a, b, d;
    first_turn(e, &a, 1);
    first_turn(e, &b, 2);
    first_turn(e, &d, 3);
    ember_timings t = next_turn(e, &a);
    assert_true(t.cached_tokens < PROMPT + OUT - 1);
    assert_int_equal(t.ram_tokens, 0);
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_int_equal(info.cache_ram_bytes, 0);
    assert_null(info.cache_tiers_off); /* none was asked for */
    ember_engine_destroy(e);
}

/* Total bytes of the .kv files in a slot directory. */
static uint64_t slot_bytes(const char *slot, int *files) {
    DIR *d = opendir(slot);
    assert_non_null(d);
    uint64_t total = 0;
    *files = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (len < 3 || strcmp(ent->d_name + len - 3, ".kv")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", slot, ent->d_name);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        total += (uint64_t)st.st_size;
        (*files)++;
    }
    closedir(d);
    return total;
}

/* RAM holds two blocks, the disk the rest: five conversations through a pool of 12 blocks push the
 * first one down to disk, and its next turn comes back from there. */
static void test_disk_tier(void **state) {
    (void)state;
    fresh_dir(FILES "/disk");
    tier_config c = {.kv_blocks = 12, .ram = 2 * block_bytes, .dir = FILES "/disk", .disk = 1 << 20};
    ember_engine *e = new_engine(&c);
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_non_null(info.cache_dir);
    assert_non_null(strstr(info.cache_dir, "/slot-0"));
    assert_int_equal(info.cache_disk_bytes, 1 << 20);
    conversation v[5];
    for (int i = 0; i < 5; i++) first_turn(e, &v[i], 10 + (uint64_t)i);
    ember_stats s = stats_of(e);
    assert_true(s.cache_disk.stored > 0);
    assert_true(s.cache_ram.evictions > 0);
    assert_true(s.cache_ram.bytes <= 2 * block_bytes);
    int files;
    assert_int_equal(slot_bytes(info.cache_dir, &files), s.cache_disk.bytes);
    assert_int_equal((uint64_t)files, s.cache_disk.blocks);
    ember_timings t = next_turn(e, &v[0]);
    assert_int_equal(t.cached_tokens, PROMPT + OUT - 1);
    assert_true(t.disk_tokens > 0);
    s = stats_of(e);
    assert_true(s.cache_disk.hits > 0);
    assert_true(s.cache_disk.bytes_read > 0);
    ember_engine_destroy(e);
}

/* A disk bound of three blocks' files: whatever goes through it, the slot never holds more. */
static void test_disk_bound(void **state) {
    (void)state;
    fresh_dir(FILES "/bound");
    const uint64_t file = 104 + 16 * 4 + block_bytes + 32; /* a full block's file (disk.c's layout) */
    tier_config c = {.kv_blocks = 12, .dir = FILES "/bound", .disk = 3 * file};
    ember_engine *e = new_engine(&c);
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_int_equal(info.cache_ram_bytes, 0); /* straight from the pool to disk */
    char slot[512];
    snprintf(slot, sizeof slot, "%s", info.cache_dir);
    conversation v[6];
    for (int i = 0; i < 6; i++) {
        first_turn(e, &v[i], 20 + (uint64_t)i);
        int files;
        assert_true(slot_bytes(slot, &files) <= 3 * file);
        assert_true(stats_of(e).cache_disk.bytes <= 3 * file);
    }
    ember_stats s = stats_of(e);
    assert_true(s.cache_disk.evictions > 0);
    assert_true(s.prefix_tokens_evicted > 0);
    ember_engine_destroy(e); /* the shutdown's write-down keeps the bound too */
    int files;
    assert_true(slot_bytes(slot, &files) <= 3 * file);
    assert_true(files > 0);
}

/* Two lifetimes of an engine on one directory: what the first had cached is written down at its
 * end, indexed by the second at its start, and the conversation goes on from disk. */
static void test_restart_warm(void **state) {
    (void)state;
    fresh_dir(FILES "/restart");
    tier_config c = {.kv_blocks = 64, .ram = 64 * block_bytes, .dir = FILES "/restart"};
    ember_engine *e = new_engine(&c);
    conversation a, b;
    first_turn(e, &a, 30);
    first_turn(e, &b, 31);
    ember_engine_destroy(e);
    e = new_engine(&c);
    ember_stats s = stats_of(e);
    /* Each conversation's PROMPT + OUT - 1 = 67 positions: four full blocks and a tail of three. */
    assert_int_equal(s.cache_disk.blocks, 10);
    assert_int_equal(s.cache_disk.files_skipped, 0);
    ember_timings t = next_turn(e, &a);
    assert_int_equal(t.cached_tokens, PROMPT + OUT - 1);
    assert_int_equal(t.disk_tokens, PROMPT + OUT - 1);
    assert_true(t.restore_ms > 0);
    ember_engine_destroy(e);
}

/* The slot's file whose tokens begin with `first` (a conversation's first block). */
static void file_starting(const char *slot, const int32_t *first, char *out, size_t size) {
    DIR *d = opendir(slot);
    assert_non_null(d);
    struct dirent *ent;
    out[0] = 0;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (len < 3 || strcmp(ent->d_name + len - 3, ".kv")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", slot, ent->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        uint8_t header[104];
        int32_t tokens[16];
        bool whole = fread(header, 1, sizeof header, f) == sizeof header && fread(tokens, 4, 16, f) == 16;
        fclose(f);
        if (whole && !memcmp(tokens, first, sizeof tokens)) snprintf(out, size, "%s", path);
    }
    closedir(d);
    assert_true(out[0] != 0);
}

static void flip_byte(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    int byte = fgetc(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    fputc(byte ^ 0x40, f);
    fclose(f);
}

static void copy_file(const char *from, const char *to) {
    char command[4096];
    snprintf(command, sizeof command, "cp '%s' '%s'", from, to);
    assert_int_equal(system(command), 0);
}

/* Four conversations on disk; then one's first file gets a flipped byte in its rows, one's is cut
 * short, one's is replaced by a file of another model. The next lifetime skips the cut and the
 * foreign one at start-up (and the files below them, now unreachable), the corrupt one when it is
 * read; those conversations are computed again, and every answer is still a cold run's. */
static void test_bad_files(void **state) {
    (void)state;
    fresh_dir(FILES "/bad");
    fresh_dir(FILES "/other");
    tier_config c = {.kv_blocks = 64, .ram = 64 * block_bytes, .dir = FILES "/bad"};
    ember_engine *e = new_engine(&c);
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    char slot[512];
    snprintf(slot, sizeof slot, "%s", info.cache_dir);
    conversation v[4];
    for (int i = 0; i < 4; i++) first_turn(e, &v[i], 40 + (uint64_t)i);
    ember_engine_destroy(e);
    /* A file of another model, of the same shape. */
    tier_config other = {.model = OTHER_MODEL, .kv_blocks = 64, .ram = 64 * block_bytes, .dir = FILES "/other"};
    e = new_engine(&other);
    ember_engine_get_info(e, &info);
    char other_slot[512];
    snprintf(other_slot, sizeof other_slot, "%s", info.cache_dir);
    assert_string_not_equal(strstr(other_slot, FILES "/other/") + strlen(FILES "/other/"),
                            strstr(slot, FILES "/bad/") + strlen(FILES "/bad/")); /* another identity */
    conversation stranger;
    first_turn(e, &stranger, 40);
    ember_engine_destroy(e);
    char corrupt[1024], truncated[1024], foreign[1024], foreign_source[1024];
    file_starting(slot, v[0].tokens, corrupt, sizeof corrupt);
    file_starting(slot, v[1].tokens, truncated, sizeof truncated);
    file_starting(slot, v[2].tokens, foreign, sizeof foreign);
    file_starting(other_slot, stranger.tokens, foreign_source, sizeof foreign_source);
    flip_byte(corrupt, 104 + 16 * 4 + 100); /* inside the rows: only the checksum can tell */
    assert_int_equal(truncate(truncated, 104 + 16 * 4 + 10), 0);
    copy_file(foreign_source, foreign);

    e = new_engine(&c);
    ember_stats s = stats_of(e);
    /* The cut and the foreign file, and the four files below each of them. */
    assert_int_equal(s.cache_disk.files_skipped, 2 + 2 * 4);
    assert_int_equal(s.cache_disk.blocks, 2 * 5);
    ember_timings t = next_turn(e, &v[0]); /* the corrupt one: found when read, recomputed */
    assert_int_equal(t.disk_tokens, 0);
    assert_int_equal(t.cached_tokens, 0);
    assert_int_equal(stats_of(e).cache_disk.files_skipped, 2 + 2 * 4 + 1);
    for (int i = 1; i < 3; i++) {
        t = next_turn(e, &v[i]);
        assert_int_equal(t.cached_tokens, 0);
    }
    t = next_turn(e, &v[3]); /* the one left alone */
    assert_int_equal(t.disk_tokens, PROMPT + OUT - 1);
    assert_int_equal(stats_of(e).cache_disk.blocks, 0); /* every file was either restored or dropped */
    int files;
    assert_int_equal(slot_bytes(slot, &files), 0); /* skipped files are removed */
    assert_int_equal(files, 0);
    ember_engine_destroy(e); /* (which writes the four conversations down again) */
    assert_true(slot_bytes(slot, &files) > 0);
    assert_int_equal(files, 4 * 6);
}

/* A directory that cannot be made (under a regular file): the disk tier is off, with the reason,
 * and the engine serves with its RAM tier. */
static void test_unwritable_dir(void **state) {
    (void)state;
    tier_config c = {.kv_blocks = 12, .ram = 64 * block_bytes, .dir = MODEL "/cache"};
    ember_engine *e = new_engine(&c);
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_null(info.cache_dir);
    assert_int_equal(info.cache_disk_bytes, 0);
    assert_non_null(info.cache_tiers_off);
    assert_true(info.cache_ram_bytes > 0);
    conversation a, b, d;
    first_turn(e, &a, 1);
    first_turn(e, &b, 2);
    first_turn(e, &d, 3);
    ember_timings t = next_turn(e, &a);
    assert_true(t.ram_tokens > 0);
    assert_false(stats_of(e).cache_disk.enabled);
    ember_engine_destroy(e);
}

/* A disk that fails its writes (a file size limit below one block's file: writes fail with EFBIG,
 * as on a full disk), in a child process so the limit binds nothing else: the first write turns
 * the tier off, and every answer is still a cold run's. The child reports by its exit status. */
static void test_disk_full(void **state) {
    (void)state;
    fresh_dir(FILES "/full");
    conversation want[4];
    {
        tier_config c = {.kv_blocks = 64};
        ember_engine *e = new_engine(&c);
        for (int i = 0; i < 4; i++) first_turn(e, &want[i], 50 + (uint64_t)i);
        ember_engine_destroy(e);
    }
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit limit = {.rlim_cur = 1024, .rlim_max = RLIM_INFINITY};
        if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(10);
        tier_config c = {.kv_blocks = 12, .dir = FILES "/full"};
        ember_error *err;
        ember_engine *e = engine_with(&c, &err);
        if (err) _exit(11);
        int status = 0;
        for (int i = 0; i < 4 && !status; i++) {
            turn t;
            if (!run_turn(e, want[i].tokens, PROMPT, &t)) status = 12;
            else if (memcmp(t.tokens, want[i].first.tokens, sizeof t.tokens) ||
                     memcmp(t.logprobs, want[i].first.logprobs, sizeof t.logprobs))
                status = 13;
        }
        ember_stats s;
        ember_engine_stats(e, &s);
        if (!status && (s.cache_disk.enabled || s.cache_disk.stored != 0)) status = 14;
        ember_engine_destroy(e);
        _exit(status);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Two processes on one directory at once: each takes a slot of its own (slot-0, slot-1), and what
 * each leaves there is whole: a later engine takes slot-0 back and resumes its conversation. */
static void test_two_processes(void **state) {
    (void)state;
    fresh_dir(FILES "/shared");
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t children[2];
    for (int k = 0; k < 2; k++) {
        children[k] = fork();
        assert_true(children[k] >= 0);
        if (children[k]) continue;
        tier_config c = {.kv_blocks = 12, .ram = 2 * block_bytes, .dir = FILES "/shared"};
        ember_error *err;
        ember_engine *e = engine_with(&c, &err);
        if (err) _exit(20);
        char byte = 1;
        if (write(ready[1], &byte, 1) != 1) _exit(21); /* both engines hold their slots at once */
        if (read(go[0], &byte, 1) != 1) _exit(22);
        int status = 0;
        for (int i = 0; i < 4 && !status; i++) {
            int32_t prompt[PROMPT];
            make_prompt(prompt, PROMPT, 60 + (uint64_t)i); /* the same conversations in both */
            turn t;
            if (!run_turn(e, prompt, PROMPT, &t)) status = 23;
        }
        ember_engine_destroy(e);
        _exit(status);
    }
    char byte;
    for (int k = 0; k < 2; k++) assert_int_equal(read(ready[0], &byte, 1), 1);
    assert_int_equal(write(go[1], "xx", 2), 2);
    for (int k = 0; k < 2; k++) {
        int status = 0;
        assert_int_equal(waitpid(children[k], &status, 0), children[k]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);
    tier_config c = {.kv_blocks = 64, .ram = 64 * block_bytes, .dir = FILES "/shared"};
    ember_engine *e = new_engine(&c);
    ember_engine *second = new_engine(&c); /* in one process too, a second engine takes another slot */
    ember_engine_info info, second_info;
    ember_engine_get_info(e, &info);
    ember_engine_get_info(second, &second_info);
    assert_non_null(strstr(info.cache_dir, "/slot-0"));
    assert_non_null(strstr(second_info.cache_dir, "/slot-1"));
    for (ember_engine *x = e; x; x = x == e ? second : NULL) {
        ember_stats s = stats_of(x);
        assert_int_equal(s.cache_disk.files_skipped, 0);
        assert_true(s.cache_disk.blocks > 0);
    }
    conversation a;
    make_prompt(a.tokens, NEXT, 63); /* the last conversation the children had */
    turn first;
    assert_true(run_turn(second, a.tokens, PROMPT, &first));
    memcpy(a.tokens + PROMPT, first.tokens, sizeof first.tokens);
    ember_engine_destroy(second);
    ember_timings t = next_turn(e, &a);
    assert_true(t.disk_tokens > 0);
    ember_engine_destroy(e);
}

/* A model with recurrent state keeps no tiers, and says why. */
static void test_hybrid_keeps_no_tiers(void **state) {
    (void)state;
    fresh_dir(FILES "/hybrid");
    tier_config c = {.model = HYBRID_MODEL, .kv_blocks = 64, .ram = 64 * block_bytes, .dir = FILES "/hybrid"};
    ember_engine *e = new_engine(&c);
    ember_engine_info info;
    ember_engine_get_info(e, &info);
    assert_int_equal(info.cache_ram_bytes, 0);
    assert_null(info.cache_dir);
    assert_non_null(info.cache_tiers_off);
    assert_non_null(strstr(info.cache_tiers_off, "recurrent state"));
    ember_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ram_tier),          cmocka_unit_test(test_no_tier_recomputes),
        cmocka_unit_test(test_disk_tier),         cmocka_unit_test(test_disk_bound),
        cmocka_unit_test(test_restart_warm),      cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_unwritable_dir),    cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_two_processes),     cmocka_unit_test(test_hybrid_keeps_no_tiers),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
