/* JSON Schema → GBNF, shared by schema.c (the keywords) and pattern.c (string `pattern` and
 * `format`). Rules are written to `out` as they are made; a rule's body is built in a buffer of
 * its own while the rules it refers to are written first (GBNF does not care about order). */
#ifndef EMBER_GRAMMAR_SCHEMA_H
#define EMBER_GRAMMAR_SCHEMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/base.h"
#include "internal.h"

typedef struct em_schema_writer {
    FILE *out; /* the GBNF text (an open_memstream) */
    json_t *root;
    json_t *ref_rules; /* "$ref" string → the rule name made for it (recursion ends there) */
    json_t *ref_queue; /* the "$ref" strings whose rules are still to write, in order */
    unsigned next_rule;
    size_t trie_rules; /* rules the tries of choices wrote (choice.c), counted with next_rule against the limit */
    unsigned depth; /* schemas open around the one being converted (EM_SCHEMA_MAX_DEPTH) */
    unsigned written; /* EM_SCHEMA_*_RULE: shared rules already written */
    char path[512]; /* JSON pointer of the schema being converted, for errors */
    em_grammar_budget *budget; /* the conversion's watch (NULL: unwatched) */
    em_err err;
} em_schema_writer;

enum { EM_SCHEMA_DATE_RULE = 1, EM_SCHEMA_TIME_RULE = 2, EM_SCHEMA_LABEL_RULE = 4 };

/* Writes a shared rule the first time it is needed. */
static inline void em_schema_write_once(em_schema_writer *w, unsigned which, const char *rule) {
    if (w->written & which) return;
    w->written |= which;
    fputs(rule, w->out);
}

/* A fresh rule name with a readable stem ("string-7"). `name` has room for 64 bytes. */
void em_schema_rule_name(em_schema_writer *w, const char *stem, char name[64]);
/* Writes `bytes` as a GBNF literal ("..." with escapes) to f. */
void em_schema_write_literal(FILE *f, const char *bytes, size_t len);
/* Records an error at the current path (the first one wins); returns false. */
bool em_schema_fail(em_schema_writer *w, em_err_code code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* One unit of work (a schema, a member, a rule of a trie): false, with w->err the budget's error,
 * once the watch said to stop. */
bool em_schema_spend(em_schema_writer *w);

/* The characters a JSON string may hold unescaped, as a GBNF class, and the escapes. */
#define EM_SCHEMA_CHAR_RULE "char"

/* Schemas nested deeper than this (objects, arrays, combinators) are refused: the converter
 * follows them by recursion. A `$ref` starts again from 0 (its target is converted on its own),
 * so a chain of references costs rules, not depth. */
#define EM_SCHEMA_MAX_DEPTH 128
/* Regex groups nested deeper than this are refused (pattern.c follows them by recursion, and the
 * GBNF they become must stay within EM_GRAMMAR_MAX_NESTING). */
#define EM_SCHEMA_MAX_PATTERN_NESTING 64

/* A choice among byte strings as GBNF rules of a trie (choice.c). Versions are node ids: 0 is the
 * empty choice; em_schema_choice_add makes a new version from `version` with one more string,
 * which leads to rule `then` (NULL: the string ends the choice); every version stays valid.
 * em_schema_choice_write writes the rules of a non-empty version to w->out and its start rule's
 * name to `name`. */
typedef struct em_schema_choice em_schema_choice;
em_schema_choice *em_schema_choice_new(em_schema_writer *w, const char *stem);
void em_schema_choice_free(em_schema_choice *choice);
bool em_schema_choice_add(em_schema_choice *choice, uint32_t version, const char *bytes, size_t len, const char *then,
                          uint32_t *out);
bool em_schema_choice_write(em_schema_choice *choice, em_schema_writer *w, uint32_t version, char name[64]);

/* Writes to f the body of a string's contents (between the quotes) matching the regex `pattern`
 * (pattern.c documents the subset). False with w->err set when the pattern is outside it. */
bool em_schema_pattern(em_schema_writer *w, const char *pattern, FILE *f);
/* Writes to f a rule reference for a whole JSON string (quotes included) of the named format:
 * date, time, date-time, uuid, email. False with w->err for any other format. */
bool em_schema_format(em_schema_writer *w, const char *format, FILE *f);

#endif
