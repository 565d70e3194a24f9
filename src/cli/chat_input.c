/*
 * The lines `ember chat` reads (cli.h's em_cli_line_reader), apart from what it does with them.
 *
 * On a terminal, in a build with libedit (EM_HAVE_LIBEDIT), an editor reads them: the arrow keys
 * and the Emacs keys edit the line, Up and Down walk the history of the turns, a bracketed paste
 * joins the line with its newlines (one turn), and Ctrl-C clears the line: the editor turns the
 * terminal's interrupt character into a key bound to clear_line, so no signal is raised while it
 * reads. Otherwise lines come plainly from standard input: from a pipe or a file as they are; from a
 * terminal with the terminal's own editing (Backspace, Ctrl-U), where Ctrl-C raises SIGINT, the
 * read returns early (em_cli_catch_interrupts(true) installs the handler without SA_RESTART for it)
 * and the line is dropped as the editor drops it. libedit is the one optional dependency of the
 * program: the plain reader keeps `ember chat` whole without it, less the editing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#ifdef EM_HAVE_LIBEDIT
#include <histedit.h>
#include <wchar.h>
#endif

struct em_cli_line_reader {
#ifdef EM_HAVE_LIBEDIT
    EditLine *editor; /* NULL when standard input or output is not a terminal */
    History *history;
#endif
    bool terminal;   /* standard input is a terminal (Ctrl-C then interrupts a plain read) */
    bool shown_on_stdout; /* standard output is a terminal: the prompt goes there */
    bool continuing; /* the prompt is "... " */
    bool cleared;    /* Ctrl-C dropped the line being read */
    char *line;      /* the last line read, without its newline */
    size_t line_cap;
};

static const char *prompt_for(const em_cli_line_reader *r) { return r->continuing ? "... " : ">>> "; }

/* Keeps `len` bytes of `text` as the last line read. */
static bool keep_line(em_cli_line_reader *r, const char *text, size_t len) {
    if (len + 1 > r->line_cap) {
        char *grown = realloc(r->line, len + 1);
        if (!grown) return false;
        r->line = grown, r->line_cap = len + 1;
    }
    memcpy(r->line, text, len);
    r->line[len] = '\0';
    return true;
}

#ifdef EM_HAVE_LIBEDIT

static const char *editor_prompt(EditLine *editor) {
    em_cli_line_reader *r = NULL;
    el_get(editor, EL_CLIENTDATA, &r);
    return r ? prompt_for(r) : ">>> ";
}

/* Ctrl-C at the prompt: the line is dropped; a fresh prompt follows. */
static unsigned char clear_line(EditLine *editor, int key) {
    (void)key;
    em_cli_line_reader *r = NULL;
    el_get(editor, EL_CLIENTDATA, &r);
    const LineInfoW *line = el_wline(editor);
    el_cursor(editor, (int)(line->lastchar - line->cursor));
    el_deletestr(editor, (int)(line->lastchar - line->buffer));
    el_insertstr(editor, "\n"); /* an empty line: el_gets returns nothing (end of input) for one without its newline */
    fputs("^C\n", stdout);
    if (r) r->cleared = true;
    return CC_NEWLINE;
}

/* A bracketed paste (the terminal wraps it in ESC [200~ ... ESC [201~): its text, newlines
 * included, joins the line being edited, so that a pasted paragraph is one turn. */
static unsigned char paste(EditLine *editor, int key) {
    (void)key;
    static const wchar_t end[] = L"\033[201~";
    const size_t end_len = 6;
    size_t cap = 256, n = 0;
    wchar_t *text = malloc(cap * sizeof *text);
    wchar_t c;
    bool after_return = false;
    while (text && el_wgetc(editor, &c) == 1) {
        if (n + 2 > cap) {
            wchar_t *grown = realloc(text, 2 * cap * sizeof *text);
            if (!grown) break;
            text = grown, cap *= 2;
        }
        if (c == L'\n' && n && text[n - 1] == L'\n' && after_return) continue; /* CR LF: one newline */
        after_return = c == L'\r';
        text[n++] = c == L'\r' ? L'\n' : c; /* terminals send a pasted newline as CR */
        if (n >= end_len && !wmemcmp(text + n - end_len, end, end_len)) {
            n -= end_len;
            break;
        }
    }
    if (!text) return CC_ERROR;
    text[n] = L'\0';
    el_winsertstr(editor, text);
    free(text);
    return CC_REDISPLAY;
}

static void open_editor(em_cli_line_reader *r) {
    if (!r->terminal || !r->shown_on_stdout) return;
    r->editor = el_init("ember", stdin, stdout, stderr);
    r->history = history_init();
    if (!r->editor || !r->history) {
        if (r->editor) el_end(r->editor);
        if (r->history) history_end(r->history);
        r->editor = NULL, r->history = NULL;
        return;
    }
    HistEvent event;
    history(r->history, &event, H_SETSIZE, 1000);
    el_set(r->editor, EL_CLIENTDATA, r);
    el_set(r->editor, EL_EDITOR, "emacs");
    el_set(r->editor, EL_PROMPT, editor_prompt);
    el_set(r->editor, EL_HIST, history, r->history);
    el_set(r->editor, EL_SETTY, "-d", "-isig", NULL); /* Ctrl-C reaches the editor as a key while it reads */
    /* el_wset: the narrow el_set copies a function's name and help and never frees them */
    el_wset(r->editor, EL_ADDFN, L"ember-clear-line", L"drop the line (Ctrl-C)", clear_line);
    el_set(r->editor, EL_BIND, "^C", "ember-clear-line", NULL);
    el_wset(r->editor, EL_ADDFN, L"ember-paste", L"a bracketed paste, newlines kept", paste);
    el_set(r->editor, EL_BIND, "\033[200~", "ember-paste", NULL);
}

/* One line from the editor into r->line; false at the end of input (Ctrl-D). */
static bool edit_line(em_cli_line_reader *r) {
    fputs("\033[?2004h", stdout); /* bracketed paste, only while the editor reads */
    fflush(stdout);
    int count = 0;
    const char *text = el_gets(r->editor, &count);
    fputs("\033[?2004l", stdout);
    fflush(stdout);
    if (!text || count <= 0) {
        fputc('\n', stdout);
        return false;
    }
    return keep_line(r, text, strlen(text)); /* bytes; count is in characters */
}

#endif /* EM_HAVE_LIBEDIT */

/* One line from standard input as it comes into r->line; false at the end of input. */
static bool plain_line(em_cli_line_reader *r) {
    /* The prompt goes with the replies to a terminal, and never into a file of replies. */
    FILE *shown = r->shown_on_stdout ? stdout : stderr;
    fputs(prompt_for(r), shown);
    fflush(shown);
    if (r->terminal) em_cli_catch_interrupts(true);
    errno = 0;
    ssize_t got = getline(&r->line, &r->line_cap, stdin);
    int read_error = errno;
    if (r->terminal) em_cli_catch_interrupts(false);
    if (got < 0 && read_error == EINTR && em_cli_interrupted()) {
        /* The terminal dropped what was typed of the line when it raised the signal. */
        clearerr(stdin);
        fputc('\n', shown);
        r->cleared = true;
        return keep_line(r, "", 0);
    }
    if (got <= 0) {
        if (r->terminal) fputc('\n', shown);
        return false;
    }
    return true;
}

em_err em_cli_line_reader_open(em_cli_line_reader **reader) {
    em_cli_line_reader *r = calloc(1, sizeof *r);
    if (!r) return em_errorf(EM_ERR_NOMEM, "out of memory for the chat's line reader");
    r->terminal = isatty(STDIN_FILENO);
    r->shown_on_stdout = isatty(STDOUT_FILENO);
#ifdef EM_HAVE_LIBEDIT
    open_editor(r);
#endif
    *reader = r;
    return NULL;
}

bool em_cli_line_reader_editing(const em_cli_line_reader *r) {
#ifdef EM_HAVE_LIBEDIT
    return r->editor != NULL;
#else
    (void)r;
    return false;
#endif
}

const char *em_cli_read_line(em_cli_line_reader *r, bool continuing, bool *cleared) {
    r->continuing = continuing;
    r->cleared = false;
    bool got;
#ifdef EM_HAVE_LIBEDIT
    if (r->editor) got = edit_line(r);
    else
#endif
        got = plain_line(r);
    *cleared = got && r->cleared;
    if (!got) return NULL;
    if (*cleared) r->line[0] = '\0'; /* what the editor hands back of a dropped line is no text */
    size_t len = strlen(r->line);
    while (len > 0 && (r->line[len - 1] == '\n' || r->line[len - 1] == '\r')) r->line[--len] = '\0';
    em_cli_interrupted(); /* from here on, a Ctrl-C is meant for the reply to come */
    return r->line;
}

void em_cli_line_reader_remember(em_cli_line_reader *r, const char *turn) {
#ifdef EM_HAVE_LIBEDIT
    if (r->history) {
        HistEvent event;
        history(r->history, &event, H_ENTER, turn);
    }
#else
    (void)r, (void)turn;
#endif
}

void em_cli_line_reader_close(em_cli_line_reader *r) {
    if (!r) return;
#ifdef EM_HAVE_LIBEDIT
    if (r->editor) el_end(r->editor);
    if (r->history) history_end(r->history);
#endif
    free(r->line);
    free(r);
}
