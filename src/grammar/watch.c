/* Watched compilation (grammar.h's em_grammar_watch, internal.h's em_grammar_budget): the compiler
 * and the schema converter count their work and, every EM_GRAMMAR_WATCH_EVERY units, ask whether
 * the caller still wants it and whether the compiling thread's CPU time is past the deadline.
 * CPU time rather than wall time: a grammar refused for its size should be refused on a busy
 * machine as on an idle one. */
#include <time.h>

#include "internal.h"

double em_grammar_thread_seconds(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0;
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void em_grammar_watch_init(em_grammar_watch *watch, double cpu_seconds, bool (*stop)(void *self), void *self) {
    *watch = (em_grammar_watch){.cpu_seconds = cpu_seconds, .stop = stop, .self = self};
    if (cpu_seconds > 0) watch->cpu_deadline = em_grammar_thread_seconds() + cpu_seconds;
}

bool em_grammar_budget_check(em_grammar_budget *b) {
    if (b->verdict) return false;
    const em_grammar_watch *w = b->watch;
    if (w->stop && w->stop(w->self)) b->verdict = EM_GRAMMAR_STOPPED;
    else if (w->cpu_seconds > 0 && em_grammar_thread_seconds() > w->cpu_deadline) b->verdict = EM_GRAMMAR_OUT_OF_TIME;
    return !b->verdict;
}

em_err em_grammar_budget_error(const em_grammar_budget *b) {
    if (b->verdict == EM_GRAMMAR_OUT_OF_TIME)
        return em_errorf(EM_ERR_RANGE, "grammar: too large to compile within %g s of CPU time (the limit)",
                         b->watch->cpu_seconds);
    return em_errorf(EM_ERR_IO, "grammar: compilation stopped: its caller went away");
}
