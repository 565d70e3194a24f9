/* Sampling on the device: the pick rule of backend/pick.h, one block of 1024 threads per logits
 * row, so a step that picks its tokens here copies back 4 bytes per row instead of the row.
 *
 * Every threshold of the rule is a threshold on the 64-bit token keys (em_pick_key: logit, then
 * index), so the kernel never sorts:
 *  - argmax: a max-reduction of the keys;
 *  - top_k: the k-th largest candidate key, by radix select (8 passes of 8 bits, a 256-bin count
 *    histogram in shared memory per pass; the lanes of a warp combine equal bins before one atomic
 *    adds them, since most keys share their top digits);
 *  - top_p: the largest key whose "mass at or above" reaches the target, by the same radix select
 *    over mass histograms; masses are 64-bit integers (pick.h), so their sums are exact and equal
 *    the host's sequential ones whatever order the atomics add them in;
 *  - the draw: a (score, index) max-reduction of the Gumbel scores of the kept tokens, skipping
 *    the tokens em_pick_may_win rules out (most of them: two double logarithms spared each).
 * The masses of a row are computed once into scratch (pick_mass), not once per radix pass. Once
 * at most PICK_LIST tokens are kept (after top_k, or a deep min_p cut), their ids go to a list in
 * shared memory and the later passes walk the list instead of the row; top_k itself selects in
 * such a list when one pass finds a distance below the max that holds at least k and at most
 * PICK_LIST candidates (list_distance); every reduction here is
 * an integer sum, a max or a (score, index) max, so the list's order (atomics) changes nothing.
 *
 * Parameters and results travel through device buffers (pick_params, picked), so the launch
 * itself never changes from step to step; the buffers grow with the rows of a step, never per
 * step. */
#include <math.h>
#include <string.h>

#include "internal.cuh"

#define PICK_THREADS 1024
#define PICK_BINS 256
#define PICK_COPIES 8 /* histogram copies, so that warps adding to the same bin meet less */
#define PICK_LIST 2048 /* kept tokens the kernel lists in shared memory rather than rescanning the row */
#define PICK_PIVOTS 16 /* distances below the max tried at once to find a short list for top_k */

/* The block's maximum of v (unsigned 64-bit). */
__device__ uint64_t block_max_u64(uint64_t v, uint64_t *shared32) {
    for (int off = 16; off > 0; off >>= 1) {
        uint64_t o = __shfl_xor_sync(0xffffffffu, v, off);
        v = o > v ? o : v;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    v = shared32[lane];
    for (int off = 16; off > 0; off >>= 1) {
        uint64_t o = __shfl_xor_sync(0xffffffffu, v, off);
        v = o > v ? o : v;
    }
    return v;
}

/* The block's sum of v (unsigned 64-bit, exact). */
__device__ uint64_t block_sum_u64(uint64_t v, uint64_t *shared32) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    v = shared32[lane];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The better of two (score, index) pairs: the higher score, then the lower index. */
__device__ __forceinline__ void better_of(double &score, uint32_t &index, double s, uint32_t i) {
    if (s > score || (s == score && i < index)) score = s, index = i;
}

__device__ uint32_t block_best(double score, uint32_t index, double *scores32, uint32_t *indices32) {
    for (int off = 16; off > 0; off >>= 1)
        better_of(score, index, __shfl_xor_sync(0xffffffffu, score, off), __shfl_xor_sync(0xffffffffu, index, off));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) scores32[warp] = score, indices32[warp] = index;
    __syncthreads();
    score = scores32[lane], index = indices32[lane];
    for (int off = 16; off > 0; off >>= 1)
        better_of(score, index, __shfl_xor_sync(0xffffffffu, score, off), __shfl_xor_sync(0xffffffffu, index, off));
    return index;
}

/* One radix digit, from the top: the bin where a running total (above + bins from the highest
 * down) first reaches `want`; *above becomes the total of the bins over it. One thread runs it. */
__device__ uint32_t find_bin(const unsigned long long *bins, uint64_t want, uint64_t *above) {
    uint64_t total = *above;
    for (int bin = PICK_BINS - 1; bin > 0; bin--) {
        if (total + bins[bin] >= want) {
            *above = total;
            return (uint32_t)bin;
        }
        total += bins[bin];
    }
    *above = total;
    return 0;
}

/* The tokens a pass walks: the whole row, or (once few are kept) the list of kept token ids. */
typedef struct pick_items {
    const uint32_t *list; /* NULL: token j is item j */
    uint32_t n;
} pick_items;

__device__ __forceinline__ uint32_t item_token(pick_items items, uint32_t j) { return items.list ? items.list[j] : j; }

/* Adds `add` to bin `bin` of the warp's copy of the histogram, once per distinct bin per warp:
 * most keys of a row share their top digits, so plain atomics would queue on one address. The
 * lanes with the same bin sum their values first (64-bit masses in three 20-bit parts, whose sums
 * over 32 lanes cannot overflow 32 bits: masses are below 2^41). Called by every lane of the warp
 * together; `take` says whether this lane has something to add. */
__device__ __forceinline__ void histogram_add(unsigned long long *bins, bool take, uint32_t bin, uint64_t add) {
    const unsigned takers = __ballot_sync(0xffffffffu, take);
    if (!take) return;
    const unsigned peers = __match_any_sync(takers, bin);
    const uint32_t lo = __reduce_add_sync(peers, (uint32_t)(add & 0xFFFFF));
    const uint32_t mid = __reduce_add_sync(peers, (uint32_t)((add >> 20) & 0xFFFFF));
    const uint32_t hi = __reduce_add_sync(peers, (uint32_t)(add >> 40));
    if ((threadIdx.x & 31) == (uint32_t)(__ffs(peers) - 1)) {
        const uint64_t sum = (uint64_t)lo + ((uint64_t)mid << 20) + ((uint64_t)hi << 40);
        atomicAdd(&bins[((threadIdx.x >> 5) % PICK_COPIES) * PICK_BINS + bin], (unsigned long long)sum);
    }
}

/* The largest key K among the kept items (candidates with key >= floor_key) such that the items
 * with keys >= K add up to `want`, counting 1 per item or, with `mass`, their masses. `bins` holds
 * PICK_COPIES histograms (warps spread over them), summed into the first before each digit. */
__device__ uint64_t radix_select(const float *l, pick_items items, float floor_logit, uint64_t floor_key,
                                 const uint64_t *mass, uint64_t want, unsigned long long *bins, uint64_t *shared) {
    uint64_t prefix = 0, mask = 0;
    if (threadIdx.x == 0) shared[1] = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (uint32_t b = threadIdx.x; b < PICK_COPIES * PICK_BINS; b += blockDim.x) bins[b] = 0;
        __syncthreads();
        for (uint32_t base = 0; base < items.n; base += blockDim.x) { /* whole warps, for histogram_add */
            const uint32_t j = base + threadIdx.x;
            bool take = false;
            uint32_t bin = 0;
            uint64_t add = 0;
            if (j < items.n) {
                const uint32_t i = item_token(items, j);
                const float li = l[i];
                const uint64_t key = em_pick_key(li, i);
                take = em_pick_candidate(li, floor_logit) && key >= floor_key && (key & mask) == prefix;
                add = take ? (mass ? mass[i] : 1) : 0;
                take = take && add;
                bin = (uint32_t)(key >> shift) & 0xFF;
            }
            histogram_add(bins, take, bin, add);
        }
        __syncthreads();
        for (uint32_t b = threadIdx.x; b < PICK_BINS; b += blockDim.x)
            for (uint32_t c = 1; c < PICK_COPIES; c++) bins[b] += bins[c * PICK_BINS + b];
        __syncthreads();
        if (threadIdx.x == 0) {
            uint64_t above = shared[1];
            uint32_t bin = find_bin(bins, want, &above);
            shared[0] = prefix | ((uint64_t)bin << shift);
            shared[1] = above;
        }
        __syncthreads();
        prefix = shared[0];
        mask |= (uint64_t)0xFF << shift;
        __syncthreads();
    }
    return prefix;
}

/* The distance below the max of pivot j: 0.25 * 1.5^j, the same float on every thread. */
__device__ __forceinline__ float pivot_distance(int j) {
    float d = 0.25f;
    for (int k = 0; k < j; k++) d *= 1.5f;
    return d;
}

/* For top_k: the closest pivot distance d such that at least k candidates lie within d of the max
 * (max - l <= d, in float) but no more than PICK_LIST of them, or a negative number when none
 * does. That set holds the k best (it is closed upwards in l), so top_k can select in a list of
 * it instead of the row. Also returns the number of candidates in *kept. One pass, no atomics. */
__device__ float list_distance(const float *l, uint32_t n, float max, float floor_logit, uint32_t k, uint64_t *kept,
                               uint32_t (*counts32)[PICK_PIVOTS + 1]) {
    uint32_t c[PICK_PIVOTS + 1] = {0}; /* c[PICK_PIVOTS]: all candidates */
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float li = l[i];
        if (!em_pick_candidate(li, floor_logit)) continue;
        const float d = max - li;
#pragma unroll
        for (int j = 0; j < PICK_PIVOTS; j++) c[j] += d <= pivot_distance(j);
        c[PICK_PIVOTS]++;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j <= PICK_PIVOTS; j++) {
        for (int off = 16; off > 0; off >>= 1) c[j] += __shfl_xor_sync(0xffffffffu, c[j], off);
        if (lane == 0) counts32[warp][j] = c[j];
    }
    __syncthreads();
    if (threadIdx.x <= PICK_PIVOTS) {
        uint32_t total = 0;
        for (int w = 0; w < 32; w++) total += counts32[w][threadIdx.x];
        counts32[0][threadIdx.x] = total; /* every warp's row was read by this thread alone */
    }
    __syncthreads();
    *kept = counts32[0][PICK_PIVOTS];
    float distance = -1.0f;
    for (int j = 0; j < PICK_PIVOTS; j++)
        if (counts32[0][j] >= k) {
            if (counts32[0][j] <= PICK_LIST) distance = pivot_distance(j);
            break;
        }
    __syncthreads(); /* counts32 is free again */
    return distance;
}

__global__ void __launch_bounds__(PICK_THREADS) pick_kernel(const float *logits, uint32_t n,
                                                            const em_pick_params *params, int32_t *picked,
                                                            uint64_t *mass_scratch) {
    em_pdl_wait();
    __shared__ uint64_t shared32[32];
    __shared__ double scores32[32];
    __shared__ uint32_t indices32[32];
    __shared__ unsigned long long bins[PICK_COPIES * PICK_BINS];
    __shared__ uint64_t radix_state[2];
    __shared__ uint32_t list[PICK_LIST];
    __shared__ uint32_t list_n;
    __shared__ uint32_t counts32[32][PICK_PIVOTS + 1];
    const uint32_t row = blockIdx.x;
    const float *l = logits + (uint64_t)row * n;
    const em_pick_params p = params[row];

    /* argmax: the largest key of a non-NaN logit (0 = none) */
    uint64_t best_key = 0;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        if (l[i] == l[i]) {
            const uint64_t key = em_pick_key(l[i], i);
            best_key = key > best_key ? key : best_key;
        }
    best_key = block_max_u64(best_key, shared32);
    const uint32_t top = best_key ? em_pick_key_index(best_key) : 0;
    const float max = l[top];
    if (p.temperature == 0.0f || !(max > -INFINITY && max < INFINITY)) {
        if (threadIdx.x == 0) picked[row] = (int32_t)top;
        return;
    }
    const float floor_logit = max + p.min_p_shift;
    uint64_t floor_key = 0; /* kept: candidates with key >= floor_key */
    uint64_t kept = n; /* an upper bound is enough when neither top_k nor min_p cuts */
    pick_items items = {NULL, n};
    if (p.top_k > 0) {
        const float distance = list_distance(l, n, max, floor_logit, p.top_k, &kept, counts32);
        if (distance >= 0.0f && p.top_k < kept) { /* select among the few near the max */
            if (threadIdx.x == 0) list_n = 0;
            __syncthreads();
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
                if (em_pick_candidate(l[i], floor_logit) && max - l[i] <= distance) list[atomicAdd(&list_n, 1u)] = i;
            __syncthreads();
            items.list = list, items.n = list_n;
        }
    } else if (p.min_p_shift > -INFINITY) {
        kept = 0;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) kept += em_pick_candidate(l[i], floor_logit);
        kept = block_sum_u64(kept, shared32);
    }
    if (p.top_k > 0 && p.top_k < kept) {
        floor_key = radix_select(l, items, floor_logit, 0, NULL, p.top_k, bins, radix_state);
        kept = p.top_k;
    }
    /* Few kept (top_k, or a min_p that cuts deep): the remaining passes walk a list of them. */
    if (kept <= PICK_LIST && !items.list) {
        if (threadIdx.x == 0) list_n = 0;
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            if (em_pick_candidate(l[i], floor_logit) && em_pick_key(l[i], i) >= floor_key) list[atomicAdd(&list_n, 1u)] = i;
        __syncthreads();
        items.list = list, items.n = list_n;
    }
    if (p.top_p < 1.0f) {
        uint64_t *mass = mass_scratch + (uint64_t)row * n, total = 0;
        for (uint32_t j = threadIdx.x; j < items.n; j += blockDim.x) {
            const uint32_t i = item_token(items, j);
            const bool is_kept = em_pick_candidate(l[i], floor_logit) && em_pick_key(l[i], i) >= floor_key;
            mass[i] = is_kept ? em_pick_mass(l[i], max, p.temperature) : 0;
            total += mass[i];
        }
        total = block_sum_u64(total, shared32); /* its barriers also publish the masses to the block */
        floor_key = radix_select(l, items, floor_logit, floor_key, mass, em_pick_mass_target(total, p.top_p), bins,
                                 radix_state);
    }
    /* Gumbel-max over the kept tokens, against the bar of the top token's own score */
    const float t = p.temperature;
    const double bar = em_pick_score(max, t, em_pick_bits(p.seed, p.counter, top));
    const float inv_t = 1.0f / t, bar_f = (float)bar, slack = em_pick_slack(bar_f);
    double score = bar;
    uint32_t chosen = top;
    for (uint32_t j = threadIdx.x; j < items.n; j += blockDim.x) {
        const uint32_t i = item_token(items, j);
        const float li = l[i];
        if (i == top || !em_pick_candidate(li, floor_logit)) continue;
        const float gap = li * inv_t - bar_f;
        if (gap < -38.0f - slack || em_pick_key(li, i) < floor_key) continue;
        const uint64_t bits = em_pick_bits(p.seed, p.counter, i);
        if (!em_pick_may_win(gap, slack, bits)) continue;
        better_of(score, chosen, em_pick_score(li, t, bits), i);
    }
    chosen = block_best(score, chosen, scores32, indices32);
    if (threadIdx.x == 0) picked[row] = (int32_t)chosen;
}

/* Greedy rows (every row of the step at temperature 0, the common case): the argmax split over
 * ARGMAX_SPLITS blocks per row instead of one block walking a long row alone, each
 * block's best key left in scratch and the last block of the row (a counter) taking the best of
 * them; the same keys as pick_kernel, so the same token. */
#define ARGMAX_SPLITS 32
#define ARGMAX_THREADS 256

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *logits, uint32_t n, int32_t *picked,
                                                                 uint64_t *partial, uint32_t *counter) {
    em_pdl_wait();
    __shared__ uint64_t shared32[32];
    __shared__ bool last;
    const uint32_t row = blockIdx.y, split = blockIdx.x;
    const float *l = logits + (uint64_t)row * n;
    const uint32_t per = (n + ARGMAX_SPLITS - 1) / ARGMAX_SPLITS, begin = split * per;
    const uint32_t end = begin + per < n ? begin + per : n;
    uint64_t best = 0; /* the largest key of a non-NaN logit (0 = none) */
    for (uint32_t i = begin + threadIdx.x; i < end; i += ARGMAX_THREADS)
        if (l[i] == l[i]) {
            const uint64_t key = em_pick_key(l[i], i);
            best = key > best ? key : best;
        }
    for (int off = 16; off > 0; off >>= 1) {
        const uint64_t o = __shfl_xor_sync(0xffffffffu, best, off);
        best = o > best ? o : best;
    }
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) shared32[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (uint32_t w = 1; w < ARGMAX_THREADS / 32; w++) best = shared32[w] > best ? shared32[w] : best;
        partial[(uint64_t)row * ARGMAX_SPLITS + split] = best;
        __threadfence();
        last = atomicAdd(&counter[row], 1u) == ARGMAX_SPLITS - 1;
    }
    __syncthreads();
    if (!last || warp != 0) return;
    __threadfence();
    best = ((volatile uint64_t *)partial)[(uint64_t)row * ARGMAX_SPLITS + lane];
    for (int off = 16; off > 0; off >>= 1) {
        const uint64_t o = __shfl_xor_sync(0xffffffffu, best, off);
        best = o > best ? o : best;
    }
    if (lane == 0) {
        picked[row] = best ? (int32_t)em_pick_key_index(best) : 0;
        counter[row] = 0; /* ready for the next launch */
    }
}

/* A grammar's masks (backend.h: em_batch.pick_masks) applied before the pick: the logits of the
 * tokens a masked row may not choose become -inf. Grid: (chunks of the row, masked rows); row
 * ids[y]'s bits are mask words y * words ... */
#define MASK_THREADS 256
#define MASK_CHUNK 8192 /* logits a block covers */

__global__ void __launch_bounds__(MASK_THREADS) mask_kernel(float *logits, uint32_t n, const uint32_t *ids,
                                                            const uint32_t *masks, uint32_t words) {
    em_pdl_wait();
    const uint32_t *mask = masks + (uint64_t)blockIdx.y * words;
    float *row = logits + (uint64_t)ids[blockIdx.y] * n;
    const uint32_t end = min(n, (blockIdx.x + 1) * MASK_CHUNK);
    for (uint32_t t = blockIdx.x * MASK_CHUNK + threadIdx.x; t < end; t += MASK_THREADS)
        if (!((mask[t >> 5] >> (t & 31)) & 1u)) row[t] = -INFINITY;
}

/* Pinned staging (one per pick slot, a slot's copy may not have run when the other is written) and
 * the device copy of up to cap rows of masks: the masked rows' ids, then their mask words. */
static uint64_t mask_slot_words(const cuda_backend *b, uint32_t cap) {
    return (uint64_t)cap * (1 + (b->step.n_vocab + 31) / 32);
}

static em_err reserve_masks(cuda_backend *b, uint32_t rows) {
    if (rows <= b->cap_mask_rows) return NULL;
    CU_TRY(cudaStreamSynchronize(b->stream)); /* a begun step's copy may still read the old staging */
    cudaFreeHost(b->mask_host);
    cudaFree(b->mask_dev);
    b->mask_host = NULL, b->mask_dev = NULL, b->cap_mask_rows = 0;
    const uint64_t words = mask_slot_words(b, rows);
    if (cudaMallocHost((void **)&b->mask_host, 2 * words * sizeof(uint32_t)) != cudaSuccess ||
        cudaMalloc((void **)&b->mask_dev, words * sizeof(uint32_t)) != cudaSuccess)
        return em_errorf(EM_ERR_NOMEM, "cuda pick: no memory for the grammar masks of %u rows", rows);
    b->cap_mask_rows = rows;
    return NULL;
}

/* Enqueues the masks of the rows that have one (none: nothing). */
static em_err enqueue_masks(cuda_backend *b, const uint32_t *const *masks, uint32_t rows, uint32_t slot) {
    uint32_t n_masked = 0;
    for (uint32_t r = 0; masks && r < rows; r++) n_masked += masks[r] != NULL;
    if (!n_masked) return NULL;
    em_err err = reserve_masks(b, rows);
    if (err) return err;
    const uint32_t words = (b->step.n_vocab + 31) / 32;
    uint32_t *h = b->mask_host + slot * mask_slot_words(b, b->cap_mask_rows), *ids = h, *bits = h + n_masked;
    for (uint32_t r = 0, k = 0; r < rows; r++)
        if (masks[r]) ids[k] = r, memcpy(bits + (uint64_t)k++ * words, masks[r], words * sizeof(uint32_t));
    CU_TRY(cudaMemcpyAsync(b->mask_dev, h, ((uint64_t)n_masked * (1 + words)) * sizeof(uint32_t),
                           cudaMemcpyHostToDevice, b->stream));
    const dim3 grid((b->step.n_vocab + MASK_CHUNK - 1) / MASK_CHUNK, n_masked);
    em_cuda_launch(b, mask_kernel, grid, dim3(MASK_THREADS), 0, b->logits, b->step.n_vocab,
                   (const uint32_t *)b->mask_dev, (const uint32_t *)(b->mask_dev + n_masked), words);
    CU_LAUNCHED();
    return NULL;
}

static bool all_greedy(const em_pick_params *params, uint32_t rows) {
    for (uint32_t r = 0; r < rows; r++)
        if (params[r].temperature != 0.0f) return false;
    return true;
}

void em_cuda_free_pick(cuda_backend *b) {
    cudaFreeHost(b->mask_host);
    cudaFree(b->mask_dev);
    b->mask_host = NULL, b->mask_dev = NULL, b->cap_mask_rows = 0;
    cudaFree(b->pick_partial);
    cudaFree(b->pick_counter);
    b->pick_partial = NULL, b->pick_counter = NULL;
    cudaFree(b->pick_params);
    cudaFree(b->picked);
    cudaFree(b->pick_mass);
    cudaFreeHost(b->pick_host);
    b->pick_params = NULL, b->picked = NULL, b->pick_mass = NULL, b->pick_host = NULL;
    b->cap_pick_rows = 0;
}

/* A pick slot in pinned memory: cap_pick_rows parameters, then as many tokens. */
static size_t pick_slot_bytes(uint32_t cap) { return cap * (sizeof(em_pick_params) + sizeof(int32_t)); }
static em_pick_params *params_host(const cuda_backend *b, uint32_t slot) {
    return (em_pick_params *)(b->pick_host + slot * pick_slot_bytes(b->cap_pick_rows));
}
const int32_t *em_cuda_picked_host(const cuda_backend *b, uint32_t slot) {
    return (const int32_t *)(params_host(b, slot) + b->cap_pick_rows);
}

/* Device and pinned buffers for `rows` rows of picks (grown, never shrunk). Growing while steps
 * are in flight waits for them and carries their tokens over: the pinned ones for pick_end and the
 * device ones, which the next begun step's embedding reads. The captured graphs read `picked`, so
 * they are dropped. */
static em_err reserve_pick(cuda_backend *b, uint32_t rows) {
    if (rows <= b->cap_pick_rows) return NULL;
    uint32_t cap = b->cap_pick_rows ? b->cap_pick_rows : 16;
    while (cap < rows) cap *= 2;
    CU_TRY(cudaStreamSynchronize(b->stream));
    int32_t carried[2][1024], *carry[2] = {NULL, NULL};
    const uint32_t old_cap = b->cap_pick_rows;
    for (uint32_t s = 0; s < 2 && old_cap; s++) {
        carry[s] = old_cap <= 1024 ? carried[s] : (int32_t *)malloc(old_cap * sizeof(int32_t));
        if (!carry[s]) return em_errorf(EM_ERR_NOMEM, "cuda pick: out of memory");
        memcpy(carry[s], em_cuda_picked_host(b, s), old_cap * sizeof(int32_t));
    }
    int32_t *old_picked = b->picked;
    b->picked = NULL;
    cudaFree(b->pick_params);
    cudaFree(b->pick_mass);
    cudaFree(b->pick_partial);
    cudaFree(b->pick_counter);
    cudaFreeHost(b->pick_host);
    b->pick_params = NULL, b->pick_mass = NULL, b->pick_host = NULL, b->pick_partial = NULL, b->pick_counter = NULL;
    em_err err = NULL;
    if (cudaMalloc((void **)&b->pick_params, cap * sizeof(em_pick_params)) != cudaSuccess ||
        cudaMalloc((void **)&b->pick_partial, (uint64_t)cap * ARGMAX_SPLITS * sizeof(uint64_t)) != cudaSuccess ||
        cudaMalloc((void **)&b->pick_counter, cap * sizeof(uint32_t)) != cudaSuccess ||
        cudaMemset(b->pick_counter, 0, cap * sizeof(uint32_t)) != cudaSuccess ||
        cudaMalloc((void **)&b->picked, cap * sizeof(int32_t)) != cudaSuccess ||
        cudaMalloc((void **)&b->pick_mass, (uint64_t)cap * b->step.n_vocab * sizeof(uint64_t)) != cudaSuccess ||
        cudaMallocHost((void **)&b->pick_host, 2 * pick_slot_bytes(cap)) != cudaSuccess)
        err = em_errorf(EM_ERR_NOMEM, "cuda pick: no memory for %u rows", cap);
    if (!err) {
        b->cap_pick_rows = cap;
        for (uint32_t s = 0; s < 2 && old_cap; s++)
            memcpy((void *)em_cuda_picked_host(b, s), carry[s], old_cap * sizeof(int32_t));
        if (old_picked && cudaMemcpy(b->picked, old_picked, old_cap * sizeof(int32_t), cudaMemcpyDeviceToDevice) != cudaSuccess)
            err = em_errorf(EM_ERR_INTERNAL, "cuda pick: carrying the picked tokens over failed");
    } else {
        b->cap_pick_rows = 0;
    }
    cudaFree(old_picked);
    for (uint32_t s = 0; s < 2; s++)
        if (carry[s] != carried[s]) free(carry[s]);
    em_cuda_drop_graphs(b);
    return err;
}

em_err em_cuda_pick_enqueue(cuda_backend *b, const em_pick_params *params, const uint32_t *const *masks, uint32_t rows,
                            uint32_t slot, uint32_t event) {
    em_err err = reserve_pick(b, rows);
    if (!err) err = enqueue_masks(b, masks, rows, slot);
    if (err) return err;
    em_pick_params *ph = params_host(b, slot);
    memcpy(ph, params, rows * sizeof *params);
    CU_TRY(cudaMemcpyAsync(b->pick_params, ph, rows * sizeof *params, cudaMemcpyHostToDevice, b->stream));
    if (all_greedy(params, rows))
        em_cuda_launch(b, argmax_kernel, dim3(ARGMAX_SPLITS, rows), dim3(ARGMAX_THREADS), 0, (const float *)b->logits,
                       b->step.n_vocab, b->picked, b->pick_partial, b->pick_counter);
    else
        em_cuda_launch(b, pick_kernel, dim3(rows), dim3(PICK_THREADS), 0, (const float *)b->logits, b->step.n_vocab,
                       (const em_pick_params *)b->pick_params, b->picked, b->pick_mass);
    CU_LAUNCHED();
    CU_TRY(cudaMemcpyAsync((void *)em_cuda_picked_host(b, slot), b->picked, rows * sizeof(int32_t),
                           cudaMemcpyDeviceToHost, b->stream));
    CU_TRY(cudaEventRecord(b->pick_done[event], b->stream));
    return NULL;
}

em_err em_cuda_pick(cuda_backend *b, const em_pick_params *params, const uint32_t *const *masks, uint32_t rows,
                    int32_t *picked) {
    em_err err = em_cuda_pick_enqueue(b, params, masks, rows, 0, 0);
    if (err) return err;
    CU_TRY(cudaEventSynchronize(b->pick_done[0]));
    memcpy(picked, em_cuda_picked_host(b, 0), rows * sizeof(int32_t));
    return NULL;
}

/* For tests/cuda/check_sample.c (cuda.h): the kernel alone, on rows uploaded from the host. */
em_err em_cuda_pick_rows(const float *logits, uint32_t rows, uint32_t n_vocab, const em_pick_params *params,
                         int32_t *picked, uint32_t repeats, float *ms_per_launch) {
    float *d_logits = NULL;
    em_pick_params *d_params = NULL;
    int32_t *d_picked = NULL;
    uint64_t *d_mass = NULL, *d_partial = NULL;
    uint32_t *d_counter = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    const bool greedy = all_greedy(params, rows);
    em_err err = NULL;
#define PICK_TRY(call)                                                                                          \
    do {                                                                                                        \
        cudaError_t status_ = (call);                                                                           \
        if (status_ != cudaSuccess && !err) err = em_errorf(EM_ERR_INTERNAL, "%s: %s", #call, cudaGetErrorString(status_)); \
    } while (0)
    PICK_TRY(cudaMalloc((void **)&d_logits, (uint64_t)rows * n_vocab * 4));
    PICK_TRY(cudaMalloc((void **)&d_params, rows * sizeof *params));
    PICK_TRY(cudaMalloc((void **)&d_picked, rows * 4));
    PICK_TRY(cudaMalloc((void **)&d_mass, (uint64_t)rows * n_vocab * 8));
    PICK_TRY(cudaMalloc((void **)&d_partial, (uint64_t)rows * ARGMAX_SPLITS * 8));
    PICK_TRY(cudaMalloc((void **)&d_counter, rows * 4));
    if (d_counter) PICK_TRY(cudaMemset(d_counter, 0, rows * 4));
    PICK_TRY(cudaEventCreate(&start));
    PICK_TRY(cudaEventCreate(&stop));
    if (!err) {
        PICK_TRY(cudaMemcpy(d_logits, logits, (uint64_t)rows * n_vocab * 4, cudaMemcpyHostToDevice));
        PICK_TRY(cudaMemcpy(d_params, params, rows * sizeof *params, cudaMemcpyHostToDevice));
        /* the backend's choice: the split argmax when every row is greedy */
        auto launch = [&]() {
            if (greedy)
                argmax_kernel<<<dim3(ARGMAX_SPLITS, rows), ARGMAX_THREADS>>>(d_logits, n_vocab, d_picked, d_partial,
                                                                            d_counter);
            else
                pick_kernel<<<rows, PICK_THREADS>>>(d_logits, n_vocab, d_params, d_picked, d_mass);
        };
        launch(); /* warm-up */
        PICK_TRY(cudaGetLastError());
        PICK_TRY(cudaEventRecord(start));
        for (uint32_t r = 0; r < repeats; r++) launch();
        PICK_TRY(cudaEventRecord(stop));
        PICK_TRY(cudaEventSynchronize(stop));
        float ms = 0;
        PICK_TRY(cudaEventElapsedTime(&ms, start, stop));
        if (ms_per_launch) *ms_per_launch = repeats ? ms / repeats : 0;
        PICK_TRY(cudaMemcpy(picked, d_picked, rows * 4, cudaMemcpyDeviceToHost));
    }
#undef PICK_TRY
    cudaFree(d_logits);
    cudaFree(d_params);
    cudaFree(d_picked);
    cudaFree(d_mass);
    cudaFree(d_partial);
    cudaFree(d_counter);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    return err;
}
