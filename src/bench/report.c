/* The HTML report of `ember bench --url` (bench.h): one self-contained page, no scripts, no
 * network, with one inline SVG chart per section and the medians under it in a table. Every server
 * is drawn on the same axes in its own colour. The page is well-formed XML as well as HTML, so
 * that tests (and any XML tool) can read it.
 *
 * Medians over rounds are computed here from the samples in results.json, so the page and the
 * JSON can never disagree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { CHART_W = 640, CHART_H = 320, LEFT = 70, RIGHT = 20, TOP = 20, BOTTOM = 50, MAX_POINTS = 16 };
static const char *const colours[] = {"#d9480f", "#1c7ed6"};
static const char *const switch_steps[] = {"A", "A'", "B", "A''", "A''-cold"};
#define SWITCH_STEPS 5

/* One server's line: values at the chart's x positions, NAN where it has none. */
typedef struct series {
    double y[MAX_POINTS];
} series;

static void escape(em_buf *b, const char *text) {
    for (const char *p = text ? text : ""; *p; p++) {
        switch (*p) {
        case '<': em_buf_append(b, "&lt;", 4); break;
        case '>': em_buf_append(b, "&gt;", 4); break;
        case '&': em_buf_append(b, "&amp;", 5); break;
        case '"': em_buf_append(b, "&quot;", 6); break;
        case '\'': em_buf_append(b, "&#39;", 5); break;
        default: em_buf_append(b, p, 1);
        }
    }
}

/* The median of `field` (in the entry, or in its "request") over the entries of `section` whose
 * server is `server` and whose `key` equals `value` (an integer or a string); NAN when none. */
static double median_of(const json_t *results, const char *section, int server, const char *key, const json_t *value,
                        const char *field) {
    double v[256];
    int n = 0;
    size_t i;
    json_t *entry;
    json_array_foreach(json_object_get(results, section), i, entry) {
        if (json_integer_value(json_object_get(entry, "server")) != server) continue;
        if (!json_equal(json_object_get(entry, key), (json_t *)value)) continue;
        json_t *x = json_object_get(entry, field);
        if (!x) x = json_object_get(json_object_get(entry, "request"), field);
        if (json_is_number(x) && n < 256) v[n++] = json_number_value(x);
    }
    return n ? bench_median(v, n) : NAN;
}

/* A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `top`. */
static double axis_top(double top) {
    if (!(top > 0)) return 1;
    double p = pow(10, floor(log10(top)));
    for (int i = 0; i < 3; i++) {
        double m = (double[]){1, 2, 5}[i] * p;
        if (m >= top) return m;
    }
    return 10 * p;
}

static double ys(double v, double top) {
    return TOP + (CHART_H - TOP - BOTTOM) * (1 - v / top);
}

/* The frame of a chart: y grid with labels, axis titles. */
static void frame(em_buf *b, const char *title, const char *x_title, const char *y_title, double top) {
    em_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                     "role=\"img\"><title>", CHART_W, CHART_H, CHART_W, CHART_H);
    escape(b, title);
    em_buf_printf(b, "</title>\n");
    for (int i = 0; i <= 5; i++) {
        double v = top * i / 5, y = ys(v, top);
        em_buf_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                         "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%g</text>\n",
                      LEFT, y, CHART_W - RIGHT, y, LEFT - 6, y + 4, v);
    }
    em_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">", (LEFT + CHART_W - RIGHT) / 2,
                  CHART_H - 8);
    escape(b, x_title);
    em_buf_printf(b, "</text><text transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">",
                  (TOP + CHART_H - BOTTOM) / 2);
    escape(b, y_title);
    em_buf_printf(b, "</text>\n");
}

/* A line per server over x positions `xs` (labelled by `labels`; the axis runs from `x_min` to the
 * largest) with the values in `lines`. */
static void line_chart(em_buf *b, const char *title, const char *x_title, const char *y_title, double x_min,
                       const double *xs, const int *labels, int n, const series *lines, int n_servers) {
    double top = 0, x_max = x_min;
    for (int i = 0; i < n; i++) {
        if (xs[i] > x_max) x_max = xs[i];
        for (int s = 0; s < n_servers; s++)
            if (lines[s].y[i] > top) top = lines[s].y[i];
    }
    top = axis_top(top * 1.05);
    frame(b, title, x_title, y_title, top);
    double width = CHART_W - LEFT - RIGHT - 20, span = x_max > x_min ? x_max - x_min : 1;
    for (int i = 0; i < n; i++) {
        double x = LEFT + 10 + width * (xs[i] - x_min) / span;
        em_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\">%d</text>\n", x,
                      CHART_H - BOTTOM + 16, labels[i]);
    }
    for (int s = 0; s < n_servers; s++) {
        em_buf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", colours[s]);
        for (int i = 0; i < n; i++)
            if (!isnan(lines[s].y[i]))
                em_buf_printf(b, "%.1f,%.1f ", LEFT + 10 + width * (xs[i] - x_min) / span, ys(lines[s].y[i], top));
        em_buf_printf(b, "\"/>\n");
        for (int i = 0; i < n; i++)
            if (!isnan(lines[s].y[i]))
                em_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%.1f</title></circle>\n",
                              LEFT + 10 + width * (xs[i] - x_min) / span, ys(lines[s].y[i], top), colours[s],
                              lines[s].y[i]);
    }
    em_buf_printf(b, "</svg>\n");
}

/* Grouped bars: one group per label, one bar per server. */
static void bar_chart(em_buf *b, const char *title, const char *y_title, const char *const *labels, int n,
                      const series *bars, int n_servers) {
    double top = 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < n_servers; s++)
            if (bars[s].y[i] > top) top = bars[s].y[i];
    top = axis_top(top * 1.05);
    frame(b, title, "request", y_title, top);
    double group = (double)(CHART_W - LEFT - RIGHT) / n, bar = group * 0.7 / n_servers;
    for (int i = 0; i < n; i++) {
        double x0 = LEFT + group * i + group * 0.15;
        em_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\">", LEFT + group * (i + 0.5),
                      CHART_H - BOTTOM + 16);
        escape(b, labels[i]);
        em_buf_printf(b, "</text>\n");
        for (int s = 0; s < n_servers; s++) {
            if (isnan(bars[s].y[i])) continue;
            double y = ys(bars[s].y[i], top);
            em_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>%.1f</title></rect>\n",
                          x0 + bar * s, y, bar - 2, CHART_H - BOTTOM - y, colours[s], bars[s].y[i]);
        }
    }
    em_buf_printf(b, "</svg>\n");
}

/* A table of the medians: a row per x value, a column per server and field. */
static void table(em_buf *b, const char *x_title, const char *const *row_names, int n, const char *const *fields,
                  const series *values, int n_fields, int n_servers) {
    em_buf_printf(b, "<table><tr><th>");
    escape(b, x_title);
    em_buf_printf(b, "</th>");
    for (int s = 0; s < n_servers; s++)
        for (int f = 0; f < n_fields; f++) {
            em_buf_printf(b, "<th><span style=\"color:%s\">server %d</span> ", colours[s], s);
            escape(b, fields[f]);
            em_buf_printf(b, "</th>");
        }
    em_buf_printf(b, "</tr>\n");
    for (int i = 0; i < n; i++) {
        em_buf_printf(b, "<tr><td>");
        escape(b, row_names[i]);
        em_buf_printf(b, "</td>");
        for (int s = 0; s < n_servers; s++)
            for (int f = 0; f < n_fields; f++) {
                double v = values[s * n_fields + f].y[i];
                if (isnan(v)) em_buf_printf(b, "<td>–</td>");
                else em_buf_printf(b, v == floor(v) ? "<td>%.0f</td>" : "<td>%.1f</td>", v); /* counts as counts */
            }
        em_buf_printf(b, "</tr>\n");
    }
    em_buf_printf(b, "</table>\n");
}

static int int_list(const json_t *array, int *out) {
    int n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(array, i, v) if (n < MAX_POINTS) out[n++] = (int)json_integer_value(v);
    return n;
}

static void concurrency_section(em_buf *b, const json_t *results, int n_servers) {
    int clients[MAX_POINTS], n = int_list(json_object_get(json_object_get(results, "settings"), "concurrency"), clients);
    double xs[MAX_POINTS] = {0};
    char names[MAX_POINTS][16];
    const char *rows[MAX_POINTS];
    series rate[2] = {0}, slowest[2] = {0}, table_values[6] = {0};
    for (int i = 0; i < n; i++) {
        xs[i] = i; /* evenly spaced: the usual levels double */
        snprintf(names[i], sizeof names[i], "%d", clients[i]);
        rows[i] = names[i];
        json_t *c = json_integer(clients[i]);
        for (int s = 0; s < n_servers; s++) {
            rate[s].y[i] = median_of(results, "concurrency", s, "clients", c, "aggregate_tok_s");
            slowest[s].y[i] = median_of(results, "concurrency", s, "clients", c, "slowest_ms");
            table_values[3 * s].y[i] = rate[s].y[i];
            table_values[3 * s + 1].y[i] = slowest[s].y[i];
            table_values[3 * s + 2].y[i] = median_of(results, "concurrency", s, "clients", c, "first_token_ms_median");
        }
        json_decref(c);
    }
    em_buf_printf(b, "<section id=\"throughput\"><h2>Aggregate throughput against clients</h2>\n");
    line_chart(b, "aggregate tokens per second against concurrent clients", "concurrent clients",
               "aggregate tokens/s (client side)", 0, xs, clients, n, rate, n_servers);
    const char *fields[] = {"tok/s", "slowest ms", "first token ms"};
    table(b, "clients", rows, n, fields, table_values, 3, n_servers);
    em_buf_printf(b, "</section>\n<section id=\"slowest\"><h2>Slowest request against clients</h2>\n");
    line_chart(b, "the slowest request's time against concurrent clients", "concurrent clients",
               "slowest request (ms)", 0, xs, clients, n, slowest, n_servers);
    em_buf_printf(b, "</section>\n");
}

static void prefill_section(em_buf *b, const json_t *results, int n_servers) {
    int lengths[MAX_POINTS], n = int_list(json_object_get(json_object_get(results, "settings"), "prefill"), lengths);
    double xs[MAX_POINTS] = {0};
    char names[MAX_POINTS][16];
    const char *rows[MAX_POINTS];
    series first[2] = {0}, table_values[4] = {0};
    for (int i = 0; i < n; i++) {
        xs[i] = lengths[i];
        snprintf(names[i], sizeof names[i], "%d", lengths[i]);
        rows[i] = names[i];
        json_t *l = json_integer(lengths[i]);
        for (int s = 0; s < n_servers; s++) {
            first[s].y[i] = median_of(results, "prefill", s, "prompt_tokens_asked", l, "first_token_ms");
            table_values[2 * s].y[i] = first[s].y[i];
            table_values[2 * s + 1].y[i] = median_of(results, "prefill", s, "prompt_tokens_asked", l, "server_prefill_ms");
        }
        json_decref(l);
    }
    em_buf_printf(b, "<section id=\"prefill\"><h2>Cold prefill: time to first token against prompt length</h2>\n");
    line_chart(b, "time to first token of a cold prompt against its length", "prompt tokens",
               "time to first token (ms)", 0, xs, lengths, n, first, n_servers);
    const char *fields[] = {"first token ms", "server prefill ms"};
    table(b, "prompt tokens", rows, n, fields, table_values, 2, n_servers);
    em_buf_printf(b, "</section>\n");
}

static void switch_section(em_buf *b, const json_t *results, int n_servers) {
    series first[2], table_values[6];
    for (int i = 0; i < SWITCH_STEPS; i++) {
        json_t *step = json_string(switch_steps[i]);
        for (int s = 0; s < n_servers; s++) {
            first[s].y[i] = median_of(results, "switch", s, "step", step, "first_token_ms");
            table_values[3 * s].y[i] = median_of(results, "switch", s, "step", step, "prompt_tokens");
            table_values[3 * s + 1].y[i] = median_of(results, "switch", s, "step", step, "cached_tokens");
            table_values[3 * s + 2].y[i] = first[s].y[i];
        }
        json_decref(step);
    }
    em_buf_printf(b, "<section id=\"switch\"><h2>Conversation switch: A, A&#8242;, B, A&#8243; and A&#8243; cold</h2>\n");
    bar_chart(b, "time to first token of each request of the conversation switch", "time to first token (ms)",
              switch_steps, SWITCH_STEPS, first, n_servers);
    const char *fields[] = {"prompt tokens", "cached tokens", "first token ms"};
    table(b, "request", switch_steps, SWITCH_STEPS, fields, table_values, 3, n_servers);
    em_buf_printf(b, "</section>\n");
}

em_err bench_report_write(const json_t *results, const char *path) {
    em_buf b = {0};
    json_t *servers = json_object_get(results, "servers"), *settings = json_object_get(results, "settings");
    int n_servers = (int)json_array_size(servers);
    if (n_servers > 2) n_servers = 2;
    em_buf_printf(&b, "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\"><head><meta charset=\"utf-8\"/>"
                      "<title>ember bench report</title><style>"
                      "body{font-family:system-ui,sans-serif;max-width:720px;margin:2em auto;color:#222}"
                      "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
                      "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
                      "</style></head><body>\n<h1>ember bench</h1>\n<ul id=\"servers\">\n");
    size_t i;
    json_t *s;
    json_array_foreach(servers, i, s) {
        if (i >= 2) break;
        em_buf_printf(&b, "<li><span style=\"color:%s\">&#9632; server %zu</span>: ", colours[i], i);
        escape(&b, json_string_value(json_object_get(s, "model")));
        em_buf_printf(&b, " at ");
        escape(&b, json_string_value(json_object_get(s, "url")));
        em_buf_printf(&b, " (%s API; prompt tokens counted by ", json_string_value(json_object_get(s, "api")));
        escape(&b, json_string_value(json_object_get(s, "token_count_method")));
        em_buf_printf(&b, ")</li>\n");
    }
    em_buf_printf(&b, "</ul>\n<p>%d generated tokens a request (greedy, end-of-generation ignored), prompts of %d "
                      "tokens, medians over %d rounds%s.</p>\n",
                  (int)json_integer_value(json_object_get(settings, "max_tokens")),
                  (int)json_integer_value(json_object_get(settings, "prompt_tokens")),
                  (int)json_integer_value(json_object_get(settings, "rounds")),
                  json_is_true(json_object_get(settings, "warm_prompts")) ? ", prompts prefilled before each round" : "");
    if (json_array_size(json_object_get(results, "concurrency"))) concurrency_section(&b, results, n_servers);
    if (json_array_size(json_object_get(results, "prefill"))) prefill_section(&b, results, n_servers);
    if (json_array_size(json_object_get(results, "switch"))) switch_section(&b, results, n_servers);
    bool ok = em_buf_printf(&b, "</body></html>\n");
    em_err err = ok ? NULL : em_errorf(EM_ERR_NOMEM, "bench: out of memory writing %s", path);
    FILE *f = err ? NULL : fopen(path, "w");
    if (!err && (!f || fwrite(b.data, 1, b.len, f) != b.len)) err = em_errorf(EM_ERR_IO, "cannot write %s", path);
    if (f && fclose(f) && !err) err = em_errorf(EM_ERR_IO, "cannot write %s", path);
    em_buf_free(&b);
    return err;
}
