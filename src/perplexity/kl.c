/* A model against saved base log-probabilities: KL divergence, top-1 agreement, Δp and the two
 * perplexities, with the uncertainty estimates of llama.cpp's --kl-divergence (perplexity.h). */
#include <math.h>
#include <stdlib.h>

#include "perplexity.h"

const double em_ppl_percentiles[EM_PPL_N_PERCENTILES] = {1.0,  0.999, 0.99, 0.95, 0.90, 0.75, 0.5,
                                                         0.25, 0.10,  0.05, 0.01, 0.001, 0.0};

em_err em_ppl_kl_add(em_ppl_kl *kl, const float *logits, uint32_t n_vocab, double lse, int32_t top, int32_t target,
                     const em_logprobs_row *base) {
    if (kl->count == kl->cap) {
        const uint64_t cap = kl->cap ? 2 * kl->cap : 1024;
        float *k = realloc(kl->kld_values, cap * sizeof *k);
        if (k) kl->kld_values = k;
        float *p = k ? realloc(kl->p_diff_values, cap * sizeof *p) : NULL;
        if (!p) return em_errorf(EM_ERR_NOMEM, "out of memory for %llu positions", (unsigned long long)cap);
        kl->p_diff_values = p;
        kl->cap = cap;
    }
    const double nll = lse - logits[target], nll_base = -(double)base->target_logprob;
    /* KL(base || model) = sum_i p_base(i) (log p_base(i) - log p_model(i)), over the tokens above
     * the base row's floor (those below carry a negligible share of the mass). The stored
     * log-probabilities are rounded, so the base row is normalized again (by its sum s): with
     * a = sum_i e^b(i) (b(i) - log p_model(i)), the divergence is a / s - log s. Rounding then
     * adds an error of the order of its square rather than of itself. */
    double s = 0, a = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (base->q[i] == 0) continue;
        const double log_p_base = base->floor + (double)base->step * (base->q[i] - 1), p_base = exp(log_p_base);
        s += p_base;
        a += p_base * (log_p_base - (logits[i] - lse));
    }
    const double kld = s > 0 ? a / s - log(s) : 0;
    const double p_diff = exp(-nll) - exp(-nll_base);
    kl->nll += nll;
    kl->nll2 += nll * nll;
    kl->nll_base += nll_base;
    kl->nll_base2 += nll_base * nll_base;
    kl->nll_nll_base += nll * nll_base;
    kl->kld += kld;
    kl->kld2 += kld * kld;
    kl->p_diff += p_diff;
    kl->p_diff2 += p_diff * p_diff;
    kl->p_diff4 += p_diff * p_diff * p_diff * p_diff;
    kl->same_top += top == base->top;
    kl->kld_values[kl->count] = (float)kld;
    kl->p_diff_values[kl->count] = (float)p_diff;
    kl->count++;
    return NULL;
}

void em_ppl_kl_free(em_ppl_kl *kl) {
    free(kl->kld_values);
    free(kl->p_diff_values);
    *kl = (em_ppl_kl){0};
}

/* Mean and standard error of the mean, as llama.cpp estimates them (none for 10 values or fewer). */
static em_ppl_estimate mean_and_error(double sum, double sum2, uint64_t count) {
    if (count == 0) return (em_ppl_estimate){0, 0};
    const double mean = sum / (double)count, var = sum2 / (double)count - mean * mean;
    return (em_ppl_estimate){mean, var > 0 && count > 10 ? sqrt(var / (double)(count - 1)) : 0};
}

/* The covariance of the two means (of a and of b), 0 for fewer than 10 values. */
static double covariance_of_means(double sum_a, double sum_b, double sum_ab, uint64_t count) {
    if (count < 10) return 0;
    const double n = (double)count;
    return (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1);
}

static int by_value(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double percentile(const float *sorted, uint64_t n, double fraction) {
    if (n == 0) return 0;
    const double at = fraction * (double)(n - 1);
    const uint64_t i = (uint64_t)at;
    const double frac = at - (double)i;
    return i + 1 < n ? (1 - frac) * sorted[i] + frac * sorted[i + 1] : sorted[n - 1];
}

void em_ppl_kl_finish(em_ppl_kl *kl, em_ppl_kl_report *r) {
    const uint64_t n = kl->count;
    /* ln PPL is the mean NLL; the perplexities and their ratio carry its error through exp. */
    const em_ppl_estimate log_ppl = mean_and_error(kl->nll, kl->nll2, n);
    const em_ppl_estimate log_base = mean_and_error(kl->nll_base, kl->nll_base2, n);
    const double cov = covariance_of_means(kl->nll, kl->nll_base, kl->nll_nll_base, n);
    r->ppl = (em_ppl_estimate){exp(log_ppl.value), exp(log_ppl.value) * log_ppl.uncertainty};
    r->ppl_base = (em_ppl_estimate){exp(log_base.value), exp(log_base.value) * log_base.uncertainty};
    const double denom = log_ppl.uncertainty * log_base.uncertainty;
    r->correlation = denom > 0 ? cov / denom : 0;
    const double var_ratio =
        log_ppl.uncertainty * log_ppl.uncertainty + log_base.uncertainty * log_base.uncertainty - 2 * cov;
    r->log_ratio = (em_ppl_estimate){log_ppl.value - log_base.value, var_ratio > 0 ? sqrt(var_ratio) : 0};
    r->ratio = (em_ppl_estimate){exp(r->log_ratio.value), exp(r->log_ratio.value) * r->log_ratio.uncertainty};
    const double ppl_cov = r->ppl.value * r->ppl_base.value * cov;
    const double var_diff = r->ppl.uncertainty * r->ppl.uncertainty +
                            r->ppl_base.uncertainty * r->ppl_base.uncertainty - 2 * ppl_cov;
    r->ppl_diff = (em_ppl_estimate){r->ppl.value - r->ppl_base.value, var_diff > 0 ? sqrt(var_diff) : 0};

    r->kld = mean_and_error(kl->kld, kl->kld2, n);
    r->p_diff = mean_and_error(kl->p_diff, kl->p_diff2, n);
    /* RMS Δp from the mean of Δp², its error through the square root: d sqrt(x) = dx / (2 sqrt(x)). */
    const em_ppl_estimate mse = mean_and_error(kl->p_diff2, kl->p_diff4, n);
    const double rms = sqrt(mse.value);
    r->rms_p_diff = (em_ppl_estimate){rms, rms > 0 ? 0.5 / rms * mse.uncertainty : 0};
    /* Agreement is a proportion: its error is the binomial sqrt(p (1 - p) / (n - 1)). */
    const double same = n ? (double)kl->same_top / (double)n : 0;
    r->same_top = (em_ppl_estimate){same, n > 1 ? sqrt(same * (1 - same) / (double)(n - 1)) : 0};

    if (n) {
        qsort(kl->kld_values, n, sizeof *kl->kld_values, by_value);
        qsort(kl->p_diff_values, n, sizeof *kl->p_diff_values, by_value);
    }
    for (int i = 0; i < EM_PPL_N_PERCENTILES; i++) {
        r->kld_at[i] = percentile(kl->kld_values, n, em_ppl_percentiles[i]);
        r->p_diff_at[i] = percentile(kl->p_diff_values, n, em_ppl_percentiles[i]);
    }
}
