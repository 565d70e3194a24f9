/* Naming a model on the Hub (hub.h): the `ORG/NAME[:QUANT]` and `ORG/NAME/FILE.gguf` forms, the
 * quantization tags in file names, and which file of a repository a spec picks. Pure functions:
 * no network, no files. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../gguf/gguf.h"
#include "internal.h"

/* The order of the default pick: the quality-for-size middle first (4-bit K-quants), then larger
 * ones; a repository with none of them gives its first .gguf model. */
static const char *const default_quants[] = {"Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q8_0", NULL};

const char *const *em_hub_default_quants(void) { return default_quants; }

/* The Hub's rule for an ORG or NAME: letters, digits, '-', '_', '.', not starting or ending with
 * '-' or '.', no "--" or ".." (the cache folder joins ORG and NAME with "--"). */
static bool valid_name_part(const char *text, size_t len) {
    if (len == 0 || len > 96) return false;
    if (text[0] == '-' || text[0] == '.' || text[len - 1] == '-' || text[len - 1] == '.') return false;
    for (size_t i = 0; i < len; i++) {
        const char c = text[i];
        if (!isalnum((unsigned char)c) && c != '-' && c != '_' && c != '.') return false;
        if (i > 0 && (c == '-' || c == '.') && text[i - 1] == c) return false;
    }
    return true;
}

static bool ends_with_gguf(const char *text) {
    const size_t len = strlen(text);
    return len > 5 && !strcasecmp(text + len - 5, ".gguf");
}

em_err em_hub_spec_parse(const char *text, em_hub_spec *out) {
    memset(out, 0, sizeof *out);
    static const char expected[] = "expected ORG/NAME, ORG/NAME:QUANT (e.g. Q4_K_M) or ORG/NAME/FILE.gguf";
    const char *slash = strchr(text, '/');
    if (!slash) return em_errorf(EM_ERR_INVALID, "'%s' is not a Hub model: %s", text, expected);
    const size_t org_len = (size_t)(slash - text);
    const char *name = slash + 1;
    const size_t name_len = strcspn(name, "/:");
    if (!valid_name_part(text, org_len) || !valid_name_part(name, name_len))
        return em_errorf(EM_ERR_INVALID,
                         "'%s' is not a Hub model: ORG and NAME are letters, digits, '-', '_' and '.'; %s", text,
                         expected);
    snprintf(out->repo, sizeof out->repo, "%.*s/%.*s", (int)org_len, text, (int)name_len, name);
    const char *rest = name + name_len;
    if (*rest == ':') {
        const char *quant = rest + 1;
        const size_t len = strlen(quant);
        bool ok = len > 0 && len < sizeof out->quant;
        for (size_t i = 0; ok && i < len; i++) ok = isalnum((unsigned char)quant[i]) || quant[i] == '_';
        if (!ok)
            return em_errorf(EM_ERR_INVALID, "'%s': the quantization tag '%s' is not letters, digits and '_'; %s",
                             text, quant, expected);
        memcpy(out->quant, quant, len + 1);
    } else if (*rest == '/') {
        const char *file = rest + 1;
        const size_t len = strlen(file);
        const bool escapes = strstr(file, "..") != NULL || file[0] == '/' || strstr(file, "//") != NULL;
        if (len == 0 || len >= sizeof out->file || escapes || !ends_with_gguf(file))
            return em_errorf(EM_ERR_INVALID, "'%s': '%s' is not a .gguf file's path in the repository; %s", text,
                             file, expected);
        memcpy(out->file, file, len + 1);
    }
    return NULL;
}

bool em_hub_path_has_quant(const char *path, const char *quant) {
    const size_t len = strlen(quant);
    if (len == 0) return false;
    for (const char *p = path; *p; p++) {
        if (strncasecmp(p, quant, len)) continue;
        const bool starts = p == path || strchr("/-.", p[-1]);
        const bool ends = p[len] == '\0' || strchr("/-.", p[len]);
        if (starts && ends) return true;
    }
    return false;
}

/* A model of the repository: a .gguf file that is not a vision projector (mmproj) and not a later
 * part of a split set (the first part stands for the set). */
bool hub_is_model_file(const char *path) {
    if (!ends_with_gguf(path)) return false;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (!strncasecmp(base, "mmproj", 6)) return false;
    uint32_t part, count;
    size_t prefix_len;
    return !em_gguf_split_name(path, &part, &count, &prefix_len) || part == 1;
}

/* "a.gguf, b.gguf (3 parts)" of the models among `paths`; a `quant` other than NULL keeps those with
 * that tag. Writes "none" when there are none. */
static void describe_models(const char *const *paths, size_t n, const char *quant, char *out, size_t size) {
    size_t used = 0, shown = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && used + 1 < size; i++) {
        if (!hub_is_model_file(paths[i]) || (quant && !em_hub_path_has_quant(paths[i], quant))) continue;
        uint32_t part, count = 1;
        size_t prefix_len;
        em_gguf_split_name(paths[i], &part, &count, &prefix_len);
        char parts[32] = "";
        if (count > 1) snprintf(parts, sizeof parts, " (%u parts)", count);
        char *name = em_hub_printable(paths[i]);
        int wrote = snprintf(out + used, size - used, "%s%s%s", shown ? ", " : "", name ? name : "?", parts);
        free(name);
        if (wrote < 0) break;
        used += (size_t)wrote;
        shown++;
    }
    if (used >= size) snprintf(out + size - 5, 5, "...");
    if (!shown) snprintf(out, size, "none");
}

/* The first model (in path order) with `quant`, or SIZE_MAX; *matches counts them. */
static size_t first_with_quant(const char *const *paths, size_t n, const char *quant, size_t *matches) {
    size_t best = SIZE_MAX;
    *matches = 0;
    for (size_t i = 0; i < n; i++) {
        if (!hub_is_model_file(paths[i]) || (quant && !em_hub_path_has_quant(paths[i], quant))) continue;
        (*matches)++;
        if (best == SIZE_MAX || strcmp(paths[i], paths[best]) < 0) best = i;
    }
    return best;
}

em_err em_hub_select(const em_hub_spec *spec, const char *const *paths, size_t n, size_t *first) {
    char models[2048];
    size_t matches = 0;
    if (spec->file[0]) {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(paths[i], spec->file)) continue;
            uint32_t part, count;
            size_t prefix_len;
            if (!em_gguf_split_name(paths[i], &part, &count, &prefix_len) || part == 1) {
                *first = i;
                return NULL;
            }
            /* A later part names its set: open the set from its first part. */
            char want[1100];
            snprintf(want, sizeof want, "%.*s-00001-of-%05u.gguf", (int)prefix_len, paths[i], count);
            for (size_t j = 0; j < n; j++)
                if (!strcmp(paths[j], want)) {
                    *first = j;
                    return NULL;
                }
            return em_errorf(EM_ERR_NOT_FOUND, "%s: %s is part %u of a split model whose first part %s is missing",
                             spec->repo, spec->file, part, want);
        }
        describe_models(paths, n, NULL, models, sizeof models);
        return em_errorf(EM_ERR_NOT_FOUND, "%s has no file %s; its .gguf models: %s", spec->repo, spec->file, models);
    }
    if (spec->quant[0]) {
        const size_t pick = first_with_quant(paths, n, spec->quant, &matches);
        if (matches == 1) {
            *first = pick;
            return NULL;
        }
        if (matches > 1) {
            describe_models(paths, n, spec->quant, models, sizeof models);
            return em_errorf(EM_ERR_INVALID, "%s: the tag %s matches %zu models (%s): name one as %s/FILE.gguf",
                             spec->repo, spec->quant, matches, models, spec->repo);
        }
        describe_models(paths, n, NULL, models, sizeof models);
        return em_errorf(EM_ERR_NOT_FOUND, "%s has no .gguf model with the tag %s; it has: %s", spec->repo,
                         spec->quant, models);
    }
    for (const char *const *quant = default_quants; *quant; quant++) {
        const size_t pick = first_with_quant(paths, n, *quant, &matches);
        if (pick != SIZE_MAX) {
            *first = pick;
            return NULL;
        }
    }
    const size_t pick = first_with_quant(paths, n, NULL, &matches);
    if (pick == SIZE_MAX) return em_errorf(EM_ERR_NOT_FOUND, "%s has no .gguf model", spec->repo);
    *first = pick;
    return NULL;
}

void em_hub_repo_folder(const char *repo, char *out, size_t size) {
    const char *slash = strchr(repo, '/');
    if (slash) snprintf(out, size, "models--%.*s--%s", (int)(slash - repo), repo, slash + 1);
    else snprintf(out, size, "models--%s", repo);
}

em_err hub_model_parts(const char *const *paths, size_t n, size_t first, const char *where, hub_strings *parts) {
    uint32_t part, count;
    size_t prefix_len;
    if (!em_gguf_split_name(paths[first], &part, &count, &prefix_len)) return hub_strings_add(parts, paths[first]);
    for (uint32_t i = 1; i <= count; i++) {
        char want[EM_HUB_PATH_MAX];
        snprintf(want, sizeof want, "%.*s-%05u-of-%05u.gguf", (int)prefix_len, paths[first], i, count);
        size_t j = 0;
        while (j < n && strcmp(paths[j], want)) j++;
        if (j == n)
            return em_errorf(EM_ERR_NOT_FOUND, "%s lacks part %u of %u of the split model %s: %s", where, i, count,
                             paths[first], want);
        em_err err = hub_strings_add(parts, want);
        if (err) return err;
    }
    return NULL;
}
