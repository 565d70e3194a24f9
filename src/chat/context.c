/*
 * The module's entry points: parsing a template, the global functions every render starts with
 * (namespace, range, raise_exception, strftime_now, true/false/none), and rendering from a
 * JSON context or from a conversation (em_chat_input). A render owns one arena for all its
 * values; the output buffer is the only allocation that outlives it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

em_err em_chat_template_parse(const char *src, size_t len, em_chat_template **out) {
    *out = NULL;
    em_chat_template *tpl = calloc(1, sizeof *tpl);
    if (!tpl) return em_errorf(EM_ERR_NOMEM, "out of memory parsing a chat template");
    char *text = em_chat_strdup(&tpl->arena, src ? src : "", src ? len : 0);
    if (!text) {
        em_chat_template_free(tpl);
        return em_errorf(EM_ERR_NOMEM, "out of memory parsing a chat template");
    }
    tpl->src = (em_chat_source){text, src ? len : 0};
    em_chat_token *tokens = NULL;
    size_t count = 0;
    em_err err = em_chat_tokenize(&tpl->arena, &tpl->src, &tokens, &count);
    if (!err) err = em_chat_parse_tokens(tpl, tokens, count);
    free(tokens);
    if (err) {
        em_chat_template_free(tpl);
        return em_err_prefix(err, "chat template");
    }
    *out = tpl;
    return NULL;
}

void em_chat_template_free(em_chat_template *tpl) {
    if (!tpl) return;
    em_chat_arena_free(&tpl->arena);
    free(tpl);
}

/* ---- globals ---- */
static em_err fn_raise_exception(em_chat_interp *in, const em_chat_value *fn, em_chat_args *args, size_t offset,
                                 em_chat_scope *caller, em_chat_value **out) {
    (void)fn, (void)caller, (void)out;
    em_buf b = {0};
    if (args->n_pos) em_chat_js_string(&b, args->pos[0]);
    em_err err = em_chat_error_at(&in->tpl->src, offset, EM_ERR_INVALID, "raise_exception: %s", b.data ? b.data : "");
    free(b.data);
    return err;
}

static em_err fn_range(em_chat_interp *in, const em_chat_value *fn, em_chat_args *args, size_t offset,
                       em_chat_scope *caller, em_chat_value **out) {
    (void)fn, (void)caller;
    double v[3] = {0, 0, 1};
    if (args->n_pos < 1 || args->n_pos > 3) return em_chat_err(in, offset, "range() takes 1 to 3 arguments");
    for (size_t i = 0; i < args->n_pos; i++) {
        if (!em_chat_is_number(args->pos[i])) return em_chat_err(in, offset, "range() arguments must be numbers");
        v[i] = em_chat_number(args->pos[i]);
    }
    double start = args->n_pos == 1 ? 0 : v[0], stop = args->n_pos == 1 ? v[0] : v[1], step = v[2];
    if (step == 0) return em_chat_err(in, offset, "range() step must not be zero");
    if ((stop - start) / step > 1e6) return em_chat_err(in, offset, "range() of more than a million numbers");
    em_chat_value *r = em_chat_list_new(&in->arena, 0);
    if (!r) return em_chat_oom();
    for (double x = start; step > 0 ? x < stop : x > stop; x += step) {
        em_chat_value *e = x == (double)(int64_t)x ? em_chat_int(&in->arena, (int64_t)x) : em_chat_float(&in->arena, x);
        if (!e || !em_chat_list_push(&in->arena, r->as.list, e)) return em_chat_oom();
    }
    *out = r;
    return NULL;
}

static em_err fn_strftime_now(em_chat_interp *in, const em_chat_value *fn, em_chat_args *args, size_t offset,
                              em_chat_scope *caller, em_chat_value **out) {
    (void)fn, (void)caller;
    static const char *months[] = {"January", "February", "March", "April", "May", "June", "July",
                                   "August", "September", "October", "November", "December"};
    if (args->n_pos < 1 || args->pos[0]->kind != VAL_STRING) return em_chat_err(in, offset, "strftime_now() needs a format string");
    time_t t = in->now >= 0 ? (time_t)in->now : time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm)) return em_chat_err(in, offset, "strftime_now(): cannot convert the time");
    const char *f = args->pos[0]->as.s.ptr;
    size_t n = args->pos[0]->as.s.len;
    em_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (f[i] != '%' || i + 1 >= n || !strchr("YmdbBHM%", f[i + 1]) || !f[i + 1]) {
            em_buf_putc(&b, f[i]);
            continue;
        }
        switch (f[++i]) {
        case 'Y': em_buf_printf(&b, "%d", tm.tm_year + 1900); break;
        case 'm': em_buf_printf(&b, "%02d", tm.tm_mon + 1); break;
        case 'd': em_buf_printf(&b, "%02d", tm.tm_mday); break;
        case 'b': em_buf_printf(&b, "%.3s", months[tm.tm_mon]); break;
        case 'B': em_buf_puts(&b, months[tm.tm_mon]); break;
        case 'H': em_buf_printf(&b, "%02d", tm.tm_hour); break;
        case 'M': em_buf_printf(&b, "%02d", tm.tm_min); break;
        default: em_buf_putc(&b, '%'); break;
        }
    }
    em_chat_value *v = b.failed ? NULL : em_chat_string(&in->arena, b.data, b.len);
    free(b.data);
    return (*out = v) ? NULL : em_chat_oom();
}

static em_err fn_namespace(em_chat_interp *in, const em_chat_value *fn, em_chat_args *args, size_t offset,
                           em_chat_scope *caller, em_chat_value **out) {
    (void)fn, (void)caller;
    em_chat_value *ns = em_chat_dict_new(&in->arena, VAL_NAMESPACE);
    if (!ns) return em_chat_oom();
    if (args->n_pos > 1) return em_chat_err(in, offset, "namespace() takes at most 1 positional argument");
    if (args->n_pos == 1) {
        em_chat_value *src = args->pos[0];
        if (src->kind == VAL_DICT) {
            for (size_t i = 0; i < src->as.dict->n; i++)
                if (!em_chat_dict_set(&in->arena, ns->as.dict, src->as.dict->at[i].key, src->as.dict->at[i].key_len,
                                      src->as.dict->at[i].value))
                    return em_chat_oom();
        } else if (src->kind == VAL_LIST) {
            for (size_t i = 0; i < src->as.list->n; i++) {
                em_chat_value *p = src->as.list->at[i];
                if (p->kind != VAL_LIST || p->as.list->n != 2 || p->as.list->at[0]->kind != VAL_STRING)
                    return em_chat_err(in, offset, "namespace() needs [key, value] pairs with string keys");
                em_chat_value *k = p->as.list->at[0];
                if (!em_chat_dict_set(&in->arena, ns->as.dict, k->as.s.ptr, k->as.s.len, p->as.list->at[1])) return em_chat_oom();
            }
        } else {
            return em_chat_err(in, offset, "namespace() cannot take %s", em_chat_kind_name(src));
        }
    }
    if (args->kw)
        for (size_t i = 0; i < args->kw->n; i++)
            if (!em_chat_dict_set(&in->arena, ns->as.dict, args->kw->at[i].key, args->kw->at[i].key_len, args->kw->at[i].value))
                return em_chat_oom();
    *out = ns;
    return NULL;
}

em_err em_chat_add_globals(em_chat_interp *in, em_chat_scope *g) {
    static const struct {
        const char *name;
        em_chat_native fn;
    } fns[] = {{"namespace", fn_namespace}, {"raise_exception", fn_raise_exception},
               {"range", fn_range}, {"strftime_now", fn_strftime_now}};
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
        em_chat_value *v = em_chat_new(&in->arena, VAL_FUNCTION);
        if (!v || !(v->as.fn = em_chat_alloc(&in->arena, sizeof *v->as.fn))) return em_chat_oom();
        v->as.fn->name = fns[i].name;
        v->as.fn->call = fns[i].fn;
        if (!em_chat_scope_set(in, g, fns[i].name, strlen(fns[i].name), v)) return em_chat_oom();
    }
    static const char *names[] = {"true", "false", "none", "True", "False", "None"};
    em_chat_value *vals[] = {&em_chat_true, &em_chat_false, &em_chat_none, &em_chat_true, &em_chat_false, &em_chat_none};
    for (size_t i = 0; i < 6; i++)
        if (!em_chat_scope_set(in, g, names[i], strlen(names[i]), vals[i])) return em_chat_oom();
    return NULL;
}

/* ---- rendering ---- */
em_err em_chat_render(const em_chat_template *tpl, const json_t *context, const em_chat_render_options *options,
                      char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (context && !json_is_object(context)) return em_errorf(EM_ERR_INVALID, "chat template context must be a JSON object");
    em_chat_interp in = {.tpl = tpl, .now = options ? options->now : -1};
    uint64_t max_bytes = options && options->max_bytes ? options->max_bytes : (uint64_t)1 << 30;
    in.max_steps = options && options->max_steps ? options->max_steps : 50000000;
    in.arena.limit = max_bytes / 2; /* half for values, half for the output */
    in.max_output = max_bytes / 2;
    em_buf b = {0};
    em_err err = NULL;
    in.global = em_chat_scope_new(&in, NULL);
    if (!in.global) err = em_chat_oom();
    if (!err) err = em_chat_add_globals(&in, in.global);
    const char *key;
    json_t *value;
    if (!err && context) {
        json_object_foreach((json_t *)context, key, value) {
            size_t klen = strlen(key);
            if (em_chat_dict_get(&in.global->vars, key, klen)) {
                err = em_errorf(EM_ERR_INVALID, "chat template variable '%s' is already declared (a built-in name)", key);
                break;
            }
            em_chat_value *v = em_chat_from_json(&in.arena, value);
            char *k = em_chat_strdup(&in.arena, key, klen);
            if (!v || !k || !em_chat_scope_set(&in, in.global, k, klen, v)) {
                err = em_chat_oom();
                break;
            }
        }
    }
    if (!err) err = em_chat_eval_block(&in, &tpl->body, in.global, &b);
    if (!err && in.control) err = em_errorf(EM_ERR_INVALID, "chat template: 'break' or 'continue' outside a loop");
    if (!err && b.failed) err = em_chat_oom();
    em_chat_arena_free(&in.arena);
    if (err) {
        free(b.data);
        return em_err_prefix(err, "rendering chat template");
    }
    if (!b.data) {
        b.data = calloc(1, 1);
        if (!b.data) return em_chat_oom();
    }
    *out = b.data;
    *len = b.len;
    return NULL;
}

em_err em_chat_render_input(const em_chat_template *tpl, const em_chat_input *input,
                            const em_chat_render_options *options, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!input->messages || !json_is_array(input->messages))
        return em_errorf(EM_ERR_INVALID, "chat template: messages must be a JSON array");
    if (input->extra && !json_is_object(input->extra))
        return em_errorf(EM_ERR_INVALID, "chat template: extra variables must be a JSON object");
    json_t *ctx = json_object();
    if (!ctx) return em_chat_oom();
    int bad = json_object_set(ctx, "messages", (json_t *)input->messages);
    if (input->tools) bad |= json_object_set(ctx, "tools", (json_t *)input->tools);
    if (input->bos_token) bad |= json_object_set_new(ctx, "bos_token", json_string(input->bos_token));
    if (input->eos_token) bad |= json_object_set_new(ctx, "eos_token", json_string(input->eos_token));
    bad |= json_object_set_new(ctx, "add_generation_prompt", json_boolean(input->add_generation_prompt));
    if (input->extra) bad |= json_object_update(ctx, (json_t *)input->extra);
    em_err err = bad ? em_errorf(EM_ERR_INVALID, "chat template: cannot build the context (tokens must be UTF-8)")
                     : em_chat_render(tpl, ctx, options, out, len);
    json_decref(ctx);
    return err;
}
