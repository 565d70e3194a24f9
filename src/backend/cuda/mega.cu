/* The persistent decode kernel: a whole decode step of 1-4 sequences in one launch.
 *
 * A decode step reads every weight once; run as a kernel per operation (forward.cu), each kernel's
 * ramp and tail leave the memory idle, and at one sequence that idle time is most of the step. Here
 * one block per multiprocessor stays resident for the whole step and works through the step's
 * schedule (src/backend/schedule.h), built from the model's layer program when the backend is made:
 *
 *   for each layer:  x += O · attention(QKV · norm(x));  x += down · act(gate · norm(x)) * (up · norm(x))
 *   (a mixture-of-experts layer: router, then the chosen experts' gated units and down products)
 *   logits = output · norm(x)
 *
 * Every instruction is spread over all blocks (each block a contiguous slice of the rows) and ends
 * at a grid barrier: a counter in global memory that every block bumps and then waits on. A block
 * is MEGA_CONSUMERS warps that compute and one loader warp. The loader streams the block's slices
 * of the weights, instruction after instruction, into a ring of shared-memory stages with bulk asynchronous
 * copies (the "weight stream" below); it waits for nothing but a free stage, so it runs ahead of
 * the grid barriers into the next instructions' weights and the memory keeps streaming while the
 * consumers wait for the other blocks. The consumers take the rows of each stage a warp a row.
 *
 * Experts: after the router's product (EM_OP_ROUTE) and its barrier, every block works out the
 * step's routing itself (top k and weights as route.cuh, the same bits in every block), and so does
 * the loader warp, which waits for that one barrier before it streams the chosen experts' rows. The
 * gated units spread the chosen experts' rows over all blocks; the down products give every block
 * the same rows of x in every chosen expert, so that a block sums a row's experts in expert order
 * itself (run_expert_sums) without another barrier or an atomic add.
 *
 * Norms are recomputed by every block from x (it reads x into shared memory as the products'
 * input anyway), so no instruction waits for a norm. Attention is split over spans of positions,
 * a warp per (token, query head, span); the span holding the token's own position finishes its
 * key and value (bias, QK-norm, RoPE, as qkv.cuh) and the first query head of each group writes
 * them into the cache; the last span of a head to finish merges the spans' partial results.
 *
 * Everything a block reads that other blocks wrote in this launch (x, q, k, v, the partials, the
 * gated unit's output, the router's logits) is read past L1 (ld.global.cg): L1 is not coherent
 * between multiprocessors. The sums of each token are computed in the same order whatever the
 * number of tokens in the step, so a sequence gets the same bits alone and batched. The watchdogs
 * in the waits turn a wait of seconds (a bug) into a kernel error instead of a hung GPU.
 *
 * Weight types: F32, F16, BF16, Q8_0, Q4_K, Q6_K, IQ3_XXS. The products (mega_products.cuh) decode
 * them to f32 for f32 activations, or, for instructions whose matrices are all Q8_0, Q4_K, Q6_K or
 * IQ3_XXS, multiply their bytes with activations rounded to 8 bits (__dp4a), as the per-operation
 * kernels do (EMBER_CUDA_DP4A=0: f32 everywhere). Models and steps it does not take run the kernels
 * of forward.cu (em_cuda_mega_takes). */
#include "mega.cuh"
#include "mega_attention.cuh"
#include "mega_products.cuh"
#include "route.cuh"

/* The backend's persistent-kernel state (cuda_backend.mega). */
struct cuda_mega {
    em_schedule schedule;
    em_op *ops;                /* the schedule on the device */
    uint8_t *op_int8;          /* on the device: per instruction, whether it takes 8-bit activations */
    mega_layer *layers;        /* on the device */
    float *parts;
    uint32_t *att_done;
    uint32_t attention_warps;
    unsigned long long *barrier;
    unsigned long long barriers_passed; /* the counter's value after the last launch */
    unsigned long long *op_ns;  /* EMBER_CUDA_MEGA_PROFILE: [instruction][3], summed over the steps (device) */
    uint32_t ring_offset[MEGA_MAX_TOKENS + 1], n_stages[MEGA_MAX_TOKENS + 1], stage_bytes;
    uint32_t results_offset[MEGA_MAX_TOKENS + 1];
    uint32_t max_tokens;       /* the largest step whose shared memory fits */
    size_t smem[MEGA_MAX_TOKENS + 1];
    uint32_t max_head_dim, max_head;
    uint64_t steps;            /* steps run, for tests and the log */
};

/* ---- device side ---- */

__device__ __forceinline__ unsigned long long global_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Every block's consumers wait until all blocks have arrived at barrier k of this launch. */
__device__ __noinline__ void grid_barrier(const mega_args &a, uint32_t k) {
    consumer_sync();
    if (threadIdx.x == 0) {
        const unsigned long long target = a.barrier_base + (unsigned long long)k * gridDim.x;
        __threadfence();
        atomicAdd(a.barrier, 1ull);
        const long long start = clock64();
        while (load_acquire(a.barrier) < target) {
            if (clock64() - start > MEGA_WATCHDOG) __trap();
        }
    }
    consumer_sync();
}

/* The block's slice [begin, end) of `rows` rows. */
__device__ __forceinline__ void block_slice(uint32_t rows, uint32_t *begin, uint32_t *end) {
    *begin = (uint32_t)((uint64_t)rows * blockIdx.x / gridDim.x);
    *end = (uint32_t)((uint64_t)rows * (blockIdx.x + 1) / gridDim.x);
}

/* The matrices an instruction multiplies, as consecutive row ranges of one launch-wide row space
 * (Q, K, V: three parts), and the up matrix paired with the first (the gated unit). In the expert
 * instructions part u is the matrix of expert route->experts[u] (m[0] is expert 0's, the others
 * `stride` bytes apart); the down products slice every part by the same rows (`same_rows`), so
 * that a block holds all the chosen experts' results for its rows of x and sums them itself. */
struct op_parts {
    const mega_matrix *m0, *m1, *m2; /* not an array: indexed by a run-time part it would live in local memory */
    const mega_matrix *up;
    uint32_t n, rows;
    const mega_route *route;
    uint64_t stride;
    bool same_rows;
    uint32_t begin, end; /* same_rows: the block's rows of every part (worked out once) */
};

/* Matrix i of the parts (expert instructions: expert 0's, whose shape every expert shares). */
__device__ __forceinline__ const mega_matrix *part_of(const op_parts &p, uint32_t i) {
    return i == 0 || p.route ? p.m0 : i == 1 ? p.m1 : p.m2;
}

__device__ __forceinline__ op_parts parts_of(const mega_args &a, const em_op &op, const mega_route *route) {
    const mega_layer &L = a.layers[op.layer];
    op_parts p = {};
    switch (op.kind) {
    case EM_OP_QKV: p.m0 = &L.wq, p.m1 = &L.wk, p.m2 = &L.wv, p.n = 3; break;
    case EM_OP_OUT_PROJ: p.m0 = &L.wo, p.n = 1; break;
    case EM_OP_FFN_UP: p.m0 = &L.gate, p.up = &L.up, p.n = 1; break;
    case EM_OP_FFN_DOWN: p.m0 = &L.down, p.n = 1; break;
    case EM_OP_HEAD: p.m0 = &a.output, p.n = 1; break;
    case EM_OP_ROUTE: p.m0 = &L.router, p.n = 1; break;
    case EM_OP_EXPERT_UP:
        p.m0 = &L.gate, p.up = &L.up, p.route = route, p.stride = L.expert_bytes, p.n = route->n;
        p.rows = p.n * L.gate.rows;
        return p;
    case EM_OP_EXPERT_DOWN:
        p.m0 = &L.down, p.route = route, p.stride = L.down_expert_bytes, p.n = route->n, p.same_rows = true;
        p.rows = p.n * L.down.rows;
        block_slice(L.down.rows, &p.begin, &p.end);
        return p;
    default: p.n = 0;
    }
    for (uint32_t i = 0; i < p.n; i++) p.rows += part_of(p, i)->rows;
    return p;
}

/* Part u's matrix (an expert's: expert 0's shape at its own address), and where its up rows start. */
__device__ __forceinline__ mega_matrix part_matrix(const op_parts &p, uint32_t u) {
    if (!p.route) return *part_of(p, u);
    mega_matrix m = *p.m0;
    m.data += p.route->experts[u] * p.stride;
    return m;
}

__device__ __forceinline__ const uint8_t *part_up(const op_parts &p, uint32_t u) {
    return p.up->data + (p.route ? p.route->experts[u] * p.stride : 0);
}

/* One warp works out the step's routing in an expert layer (mega_route): each token's choices and
 * weights from the router's logits, as the per-operation kernels do (route.cuh), then the distinct
 * chosen experts in ascending order and each token's choice index of each. */
template <int NT, int PER_LANE>
__device__ void route_step_lanes(const mega_args &a, const mega_layer &L, mega_route *r) {
    const uint32_t lane = threadIdx.x & 31, k = L.n_used, pairs = NT * k;
    for (uint32_t t = 0; t < NT; t++)
        route_token<PER_LANE>(a.router, r->chosen, r->weight, t, L.n_expert, k, L.sigmoid, L.renormalize,
                              L.expert_scale);
    __syncwarp();
    const uint32_t e = lane < pairs ? (uint32_t)r->chosen[lane] : UINT32_MAX;
    const uint32_t same = __match_any_sync(0xffffffffu, e);
    const uint32_t firsts = __ballot_sync(0xffffffffu, lane < pairs && __ffs(same) - 1 == (int)lane);
    uint32_t rank = 0; /* distinct chosen experts below e */
    for (uint32_t m = 0; m < 32; m++) {
        const uint32_t other = __shfl_sync(0xffffffffu, e, m);
        rank += (firsts >> m & 1) && other < e;
    }
    for (uint32_t i = lane; i < EM_SCHEDULE_MAX_USED * MEGA_MAX_TOKENS; i += 32) (&r->choice[0][0])[i] = MEGA_NO_CHOICE;
    __syncwarp();
    if (lane < pairs) {
        if (firsts >> lane & 1) r->experts[rank] = e;
        r->choice[rank][lane / k] = (uint8_t)(lane % k);
    }
    if (lane == 0) r->n = __popc(firsts);
    __syncwarp();
}

template <int NT>
__device__ void route_step(const mega_args &a, const mega_layer &L, mega_route *r) {
    if (L.n_expert <= 32) route_step_lanes<NT, 1>(a, L, r);
    else if (L.n_expert <= 64) route_step_lanes<NT, 2>(a, L, r);
    else if (L.n_expert <= 128) route_step_lanes<NT, 4>(a, L, r);
    else route_step_lanes<NT, 8>(a, L, r);
}

/* ---- the weight stream ----
 * The loader warp (lane 0) copies each instruction's slice of weights, chunk after chunk, into a
 * ring of stages in shared memory with bulk asynchronous copies, each completing on the stage's
 * "full" barrier; the consumers compute from the stages and release each one on its "empty"
 * barrier. The loader never waits for anything but a free stage, so it runs ahead of the grid
 * barriers into the next instructions' weights: the memory keeps streaming while the consumers
 * wait for the other blocks. A chunk is whole rows of one part (and the matching up rows), as
 * many as fit a stage; consumers and loader walk the same chunks in the same order. */
struct ring {
    uint8_t *stages;
    unsigned long long *full, *empty; /* mbarriers, one of each per stage */
    uint32_t *chunk;                  /* per stage: where its chunk starts in the slice, or MEGA_CHUNK_END */
    uint32_t n_stages, stage_bytes;
};

struct chunk {
    uint32_t part, row, n_rows; /* rows [row, row + n_rows) of part `part` */
};

#define MEGA_CHUNK_END 0xffffffffu /* a stage's descriptor: the instruction has no chunk left */

/* Rows a chunk of part `part` holds: as many as fit a stage, with their up rows and the slack of
 * the copy's alignment. */
__device__ __forceinline__ uint32_t chunk_rows(const op_parts &p, uint32_t part, uint32_t stage_bytes) {
    const uint64_t bytes = part_of(p, part)->row_bytes * (p.up ? 2 : 1) + 32;
    return bytes > stage_bytes ? 1 : (uint32_t)(stage_bytes / bytes);
}

/* The chunk that starts `slice_row` rows into the block's slice of the instruction's rows (whole
 * rows of one part, as many as fit a stage), false past the slice's end. */
__device__ __forceinline__ bool chunk_at(const op_parts &p, uint32_t stage_bytes, uint32_t slice_row, chunk *c) {
    uint32_t begin, end;
    if (p.same_rows) { /* the block's rows [begin, end) of every part in turn */
        const uint32_t per_part = p.end - p.begin;
        if (slice_row >= p.n * per_part) return false;
        c->part = slice_row / per_part, c->row = p.begin + slice_row % per_part;
        c->n_rows = min(chunk_rows(p, c->part, stage_bytes), p.end - c->row);
        return true;
    }
    block_slice(p.rows, &begin, &end);
    const uint32_t r = begin + slice_row;
    if (r >= end) return false;
    uint32_t part = 0, at = 0;
    if (p.route) part = r / p.m0->rows, at = part * p.m0->rows;
    else
        while (part + 1 < p.n && r >= at + part_of(p, part)->rows) at += part_of(p, part++)->rows;
    const uint32_t part_rows = part_of(p, part)->rows;
    c->part = part, c->row = r - at;
    c->n_rows = min(chunk_rows(p, part, stage_bytes), min(end, at + part_rows) - r);
    return true;
}

/* Where a chunk's bytes of matrix m start in its stage (the copy starts at a 16-byte boundary). */
__device__ __forceinline__ uint32_t chunk_skew(const mega_matrix &m, uint32_t row) {
    return (uint32_t)(((uint64_t)row * m.row_bytes) & 15);
}


/* Waits until the mbarrier's phase of this parity has completed (the watchdog traps after seconds). */
__device__ __forceinline__ void mbar_wait(unsigned long long *bar, uint32_t parity) {
    const long long start = clock64();
    uint32_t done = 0;
    while (true) {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
        if (done) return;
        if (clock64() - start > MEGA_WATCHDOG) __trap();
    }
}

/* One bulk copy of `bytes` (a multiple of 16) from global to shared memory, completing on `bar`. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, unsigned long long *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

/* The loader warp waits until every block has passed barrier k of this launch (the routing of an
 * expert layer is complete) before it picks the experts whose weights it streams. */
__device__ void loader_wait_barrier(const mega_args &a, uint32_t k) {
    const unsigned long long target = a.barrier_base + (unsigned long long)k * gridDim.x;
    const long long start = clock64();
    while (load_acquire(a.barrier) < target)
        if (clock64() - start > MEGA_WATCHDOG) __trap();
    __syncwarp();
}

/* The loader (the last warp; lane 0 issues the copies): the block's slice of each instruction in
 * turn, chunk after chunk into the next stage, each stage's descriptor saying where its chunk
 * starts in the slice; a stage marked MEGA_CHUNK_END tells the consumers the instruction is done.
 * Before an expert layer's gated units it waits for the routing and works it out itself (the
 * whole warp), so it runs ahead of every barrier but that one. */
template <int NT>
__device__ void load_weights(const mega_args &a, const ring &rg, mega_route *route) {
    const bool issuer = (threadIdx.x & 31) == 0;
    uint32_t n = 0, barriers = 0; /* stages filled, barriers the schedule has had so far */
    for (uint32_t i = 0; i < a.n_ops; barriers += a.ops[i].barrier_after, i++) {
        const em_op op = a.ops[i];
        if (op.kind == EM_OP_EXPERT_UP) {
            loader_wait_barrier(a, barriers);
            route_step<NT>(a, a.layers[op.layer], route);
        }
        const op_parts p = parts_of(a, op, route);
        if (op.kind == EM_OP_ATTENTION) continue;
        uint32_t slice_row = 0;
        for (bool more = true; more; n++) {
            const uint32_t stage = n % rg.n_stages, fill = n / rg.n_stages;
            if (fill) mbar_wait(rg.empty + stage, (fill - 1) & 1);
            chunk c;
            more = chunk_at(p, rg.stage_bytes, slice_row, &c);
            if (!issuer) {
                if (more) slice_row += c.n_rows;
                continue;
            }
            rg.chunk[stage] = more ? slice_row : MEGA_CHUNK_END;
            if (!more) { /* the end mark takes its stage like a chunk (n counts it) */
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(rg.full + stage)) : "memory");
                continue;
            }
            slice_row += c.n_rows;
            const mega_matrix m = part_matrix(p, c.part);
            const uint64_t from = (uint64_t)c.row * m.row_bytes, bytes = (uint64_t)c.n_rows * m.row_bytes;
            const uint64_t lo = from & ~(uint64_t)15, hi = (from + bytes + 15) & ~(uint64_t)15;
            uint32_t total_bytes = (uint32_t)(hi - lo);
            if (p.up) total_bytes *= 2;
            uint8_t *dst = rg.stages + (uint64_t)stage * rg.stage_bytes;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(rg.full + stage)),
                         "r"(total_bytes)
                         : "memory");
            bulk_copy(dst, m.data + lo, (uint32_t)(hi - lo), rg.full + stage);
            if (p.up) bulk_copy(dst + (hi - lo), part_up(p, c.part) + lo, (uint32_t)(hi - lo), rg.full + stage);
        }
    }
}

/* Row `row` of the instruction's part `part`, token t's sum y (and the up row's y2, scaled): QKV's
 * outputs, x += y, the gated unit, the logits, the router's logits, an expert's gated unit for the
 * tokens that chose it, or an expert's down row kept in the block's `results` until all the
 * block's experts are done (EXPERT_DOWN sums them in expert order, run_expert_sums). */
template <int NT>
__device__ __forceinline__ void write_row(const mega_args &a, const em_op &op, const op_parts &p,
                                          const mega_matrix &m, uint32_t part, uint32_t row, uint32_t t, float y,
                                          float y2, float *results) {
    switch (op.kind) {
    case EM_OP_ROUTE: a.router[(uint64_t)t * m.rows + row] = y; break;
    case EM_OP_EXPERT_UP: {
        const uint32_t choice = p.route->choice[part][t];
        if (choice != MEGA_NO_CHOICE)
            a.moe_h[((uint64_t)t * a.layers[op.layer].n_used + choice) * m.rows + row] = mv_glu(y, y2, a.act);
        break;
    }
    case EM_OP_EXPERT_DOWN: {
        const uint32_t per_block = (m.rows + gridDim.x - 1) / gridDim.x;
        results[((uint64_t)part * per_block + row - p.begin) * NT + t] = y;
        break;
    }
    case EM_OP_QKV: {
        float *out = part == 0 ? a.q : part == 1 ? a.k : a.v;
        out[(uint64_t)t * m.rows + row] = y;
        break;
    }
    case EM_OP_OUT_PROJ:
    case EM_OP_FFN_DOWN: {
        float *x = a.x + (uint64_t)t * a.n_embd + row;
        *x = __ldcg(x) + y;
        break;
    }
    case EM_OP_FFN_UP: a.h[(uint64_t)t * m.rows + row] = mv_glu(y, y2, a.act); break;
    case EM_OP_HEAD:
        if (a.final_softcap > 0.0f) y = a.final_softcap * tanhf(y / a.final_softcap);
        a.logits[(uint64_t)t * a.n_vocab + row] = y;
        break;
    }
}

/* A warp's RW rows of a chunk in its stage, then their results written. */
template <int NT, int RW, bool GLU>
__device__ __forceinline__ void chunk_rows_of_warp(const mega_args &a, const em_op &op, const op_parts &p,
                                                   const mega_matrix &m, uint32_t part, const uint8_t *w,
                                                   uint64_t up_offset, uint32_t row, uint32_t n_rows,
                                                   const mega_input &in, const uint32_t *lut, const float *scale,
                                                   float *results) {
    const uint32_t lane = threadIdx.x & 31;
    float acc[RW][NT], acc2[RW][NT];
#pragma unroll
    for (int j = 0; j < RW; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[j][t] = acc2[j][t] = 0.0f;
    /* token t's input row: its own, or in the experts' down products its gated unit for this expert
     * (a token that did not choose the expert reads another row, and its sum is dropped) */
    uint32_t x_row[NT], x_off[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        x_row[t] = t;
        if (op.kind == EM_OP_EXPERT_DOWN) {
            const uint32_t choice = p.route->choice[part][t];
            x_row[t] = choice == MEGA_NO_CHOICE ? 0 : (uint32_t)t * a.layers[op.layer].n_used + choice;
        }
        x_off[t] = x_row[t] * in.cols;
    }
    if (in.int8) dot_rows_q_typed<NT, RW, GLU>(m.type, w, m.row_bytes, up_offset, n_rows, in, x_row, lut, acc, acc2);
    else dot_rows_typed<NT, RW, GLU>(m.type, w, m.row_bytes, up_offset, n_rows, in.xs, x_off, in.cols, acc, acc2);
    /* lane j * NT + t writes row j's token t (a run-time index into acc would go to local memory) */
    float y = 0.0f, y2 = 0.0f;
#pragma unroll
    for (int j = 0; j < RW; j++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (lane == (uint32_t)(j * NT + t)) y = acc[j][t], y2 = acc2[j][t];
    const uint32_t j = lane / NT, t = lane % NT;
    if (lane < RW * NT && j < n_rows)
        write_row<NT>(a, op, p, m, part, row + j, t, y * scale[t], y2 * scale[t], results);
}

#define MEGA_RW 4     /* rows a warp takes at once from a stage, at most */
#define MEGA_RW_GLU 2 /* with their up rows */

/* Rows a warp takes at once in this instruction: as few as give every consumer warp a share of the
 * block's slice, so that a small product (QKV, the output projection: a couple of dozen rows a block)
 * runs on all warps at once instead of a few warps with MEGA_RW rows each; at most MEGA_RW, whose
 * loads in flight and shared activation reads pay where the slice has rows for every warp. */
__device__ __forceinline__ uint32_t rows_per_warp(const op_parts &p) {
    const uint32_t most = p.up ? MEGA_RW_GLU : MEGA_RW;
    uint32_t begin, end;
    if (p.same_rows) begin = 0, end = p.n * (p.end - p.begin);
    else block_slice(p.rows, &begin, &end);
    const uint32_t need = (end - begin + MEGA_CONSUMERS - 1) / MEGA_CONSUMERS;
    return min(most, need <= 1 ? 1u : need <= 2 ? 2u : 4u);
}

/* The chunks of the block's slice of the instruction, stage after stage from the ring (*stages: the
 * stages the consumers have taken so far in this launch) until the end mark, RW rows per consumer
 * warp, the warps taking turns from chunk to chunk: y = scale[t] * (W · xs[t]), written by write_row. */
template <int NT>
__device__ __forceinline__ void run_rows(const mega_args &a, const ring &rg, uint32_t *stages, const em_op &op,
                                         const mega_input &in, const uint32_t *lut, const float *scale,
                                         const mega_route *route, float *results) {
    const op_parts p = parts_of(a, op, route);
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rw = rows_per_warp(p);
    uint32_t turn = 0; /* the warp that takes the next chunk's first rows */
    for (bool more = true; more; (*stages)++) {
        const uint32_t stage = *stages % rg.n_stages, fill = *stages / rg.n_stages;
        /* every consumer waits for every stage, its rows there or not: its release below must count
         * towards this fill of the stage, not an earlier one that slower warps still read */
        mbar_wait(rg.full + stage, fill & 1);
        const uint32_t slice_row = rg.chunk[stage];
        chunk c;
        more = slice_row != MEGA_CHUNK_END && chunk_at(p, rg.stage_bytes, slice_row, &c);
        if (more) {
            const mega_matrix m = part_matrix(p, c.part);
            const uint32_t sets = (c.n_rows + rw - 1) / rw; /* row sets of this chunk */
            const uint8_t *base = rg.stages + (uint64_t)stage * rg.stage_bytes + chunk_skew(m, c.row);
            const uint64_t from = (uint64_t)c.row * m.row_bytes;
            const uint64_t up_offset =
                ((from + (uint64_t)c.n_rows * m.row_bytes + 15) & ~(uint64_t)15) - (from & ~(uint64_t)15);
            for (uint32_t set = (warp + MEGA_CONSUMERS - turn) % MEGA_CONSUMERS; set < sets; set += MEGA_CONSUMERS) {
                const uint32_t k = set * rw, n = min(rw, c.n_rows - k);
                const uint8_t *w = base + (uint64_t)k * m.row_bytes;
                /* as many rows as the set has (a row computed twice would cost its shared-memory reads) */
#define EM_CHUNK_ROWS(RW, GLU, UP_OFFSET)                                                                 \
    chunk_rows_of_warp<NT, RW, GLU>(a, op, p, m, c.part, w, UP_OFFSET, c.row + k, n, in, lut, scale, results)
                if (p.up && n == 1) EM_CHUNK_ROWS(1, true, up_offset);
                else if (p.up) EM_CHUNK_ROWS(MEGA_RW_GLU, true, up_offset);
                else if (n == 1) EM_CHUNK_ROWS(1, false, 0);
                else if (n == 2) EM_CHUNK_ROWS(2, false, 0);
                else EM_CHUNK_ROWS(MEGA_RW, false, 0);
#undef EM_CHUNK_ROWS
            }
            turn = (turn + sets) % MEGA_CONSUMERS;
        }
        __syncwarp();
        if (lane == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(rg.empty + stage)) : "memory");
    }
}

/* EMBER_CUDA_MEGA_PROFILE: block 0 adds the time since the last stamp to part `what` of
 * instruction i's sums. */
__device__ __forceinline__ void profile_stamp(const mega_args &a, unsigned long long *stamp, uint32_t i, int what) {
    if (!*stamp) return;
    const unsigned long long now = global_ns();
    a.op_ns[3 * i + what] += now - *stamp;
    *stamp = now;
}

/* The end of an expert layer's down products in a block: x[t][r] += the weighted sum of token t's
 * experts' rows r, in ascending expert order as the CPU and the per-operation kernels add them,
 * for the block's rows r (the same rows of every expert's matrix: op_parts.same_rows). */
template <int NT>
__device__ void run_expert_sums(const mega_args &a, const mega_layer &L, const mega_route *route,
                                const float *results) {
    uint32_t begin, end;
    block_slice(a.n_embd, &begin, &end);
    const uint32_t per_block = (a.n_embd + gridDim.x - 1) / gridDim.x;
    for (uint32_t i = threadIdx.x; i < (end - begin) * NT; i += MEGA_CONSUMER_THREADS) {
        const uint32_t t = i % NT, r = i / NT;
        float sum = 0.0f;
        for (uint32_t u = 0; u < route->n; u++) {
            const uint32_t choice = route->choice[u][t];
            if (choice != MEGA_NO_CHOICE)
                sum += route->weight[t * L.n_used + choice] * results[((uint64_t)u * per_block + r) * NT + t];
        }
        float *x = a.x + (uint64_t)t * a.n_embd + begin + r;
        *x = __ldcg(x) + sum;
    }
}

template <int NT>
__global__ void __launch_bounds__(MEGA_THREADS, 1) mega_kernel(const __grid_constant__ mega_args a) {
    /* shared memory: the instructions' input (or the attention warps' tiles), then the ring */
    extern __shared__ __align__(128) float smem[];
    __shared__ float scale[MEGA_MAX_TOKENS];
    __shared__ __align__(8) unsigned long long full[MEGA_MAX_STAGES], empty[MEGA_MAX_STAGES];
    __shared__ uint32_t stage_chunk[MEGA_MAX_STAGES];
    __shared__ mega_route route, loader_route; /* the consumers' and the loader's */
    __shared__ uint32_t lut[256];              /* IQ3_XXS's lattice */
    for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = em_cuda_iq3xxs_grid[i];
    float *results = (float *)((uint8_t *)smem + a.results_offset);
    const ring rg = {(uint8_t *)smem + a.ring_offset, full, empty, stage_chunk, a.n_stages, a.stage_bytes};
    if (threadIdx.x == 0) {
        for (uint32_t i = 0; i < a.n_stages; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(full + i)) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(empty + i)), "n"(MEGA_CONSUMERS)
                         : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads(); /* the last barrier of the whole block: from here the loader runs on its own */
    if (threadIdx.x >> 5 == MEGA_CONSUMERS) {
        load_weights<NT>(a, rg, &loader_route);
        return;
    }
    uint32_t barriers = 0, stages = 0;
    unsigned long long stamp = a.op_ns && blockIdx.x == 0 && threadIdx.x == 0 ? global_ns() : 0;
    for (uint32_t i = 0; i < a.n_ops; i++) {
        const em_op op = a.ops[i];
        const mega_layer &L = a.layers[op.layer];
        /* the instruction's input in shared memory (all but attention): `rows` rows of `cols` values
         * from x_in, times the norm weights when given (the tokens' rows; an expert layer's down
         * products read each token's choices' gated units) */
        const float *x_in = a.x, *norm_w = NULL;
        uint32_t cols = a.n_embd, rows = NT;
        switch (op.kind) {
        case EM_OP_QKV: norm_w = L.attn_norm; break;
        case EM_OP_OUT_PROJ: x_in = a.attn, cols = L.n_head * L.head_dim; break;
        case EM_OP_FFN_UP:
        case EM_OP_ROUTE:
        case EM_OP_EXPERT_UP: norm_w = L.ffn_norm; break;
        case EM_OP_FFN_DOWN: x_in = a.h, cols = L.down.cols; break;
        case EM_OP_HEAD: norm_w = a.output_norm; break;
        case EM_OP_EXPERT_DOWN: x_in = a.moe_h, cols = L.down.cols, rows = NT * L.n_used; break;
        }
        if (op.kind == EM_OP_EXPERT_UP && threadIdx.x < 32)
            route_step<NT>(a, L, &route); /* visible after the input's barriers */
        const mega_input in = input_at(smem, rows, cols, a.op_int8[i]);
        if (op.kind == EM_OP_ATTENTION);
        else if (in.int8) load_input_q<NT>(a, x_in, rows, cols, norm_w, in, scale);
        else load_input<NT>(a, x_in, rows / NT * cols, norm_w, smem, scale);
        profile_stamp(a, &stamp, i, 0);
        if (op.kind == EM_OP_ATTENTION) run_attention<NT>(a, op, (uint8_t *)smem);
        else run_rows<NT>(a, rg, &stages, op, in, lut, scale, &route, results);
        if (op.kind == EM_OP_EXPERT_DOWN) {
            consumer_sync(); /* every warp's results */
            run_expert_sums<NT>(a, L, &route, results);
        }
        if (a.op_ns) consumer_sync(); /* the profile's stamp after the whole block's rows */
        profile_stamp(a, &stamp, i, 1);
        if (op.barrier_after) grid_barrier(a, ++barriers);
        else consumer_sync(); /* the block's shared memory is the next instruction's */
        profile_stamp(a, &stamp, i, 2);
    }
}

/* ---- host side ---- */

static bool type_taken(uint32_t type) {
    return type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16 || type == EM_TYPE_Q8_0 ||
           type == EM_TYPE_Q4_K || type == EM_TYPE_Q6_K || type == EM_TYPE_IQ3_XXS;
}

/* Why w cannot be a matrix of the kernel (of n_mat stacked matrices: an expert tensor), or NULL;
 * *m is the first matrix. */
static em_err matrix_of(const cuda_weight *w, const char *what, uint32_t il, mega_matrix *m, uint32_t n_mat = 1) {
    if (!w->data) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: no %s matrix", il, what);
    if (!type_taken(w->type))
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %s matrix of type %s", il, what, em_type_name(w->type));
    if (w->n_mat != n_mat)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %u %s matrices, %u expected", il, w->n_mat, what, n_mat);
    const bool k_block = w->type == EM_TYPE_Q4_K || w->type == EM_TYPE_Q6_K || w->type == EM_TYPE_IQ3_XXS;
    const uint32_t unit = k_block ? 256 : w->type == EM_TYPE_Q8_0 ? 32 : 8;
    if (w->cols % unit || w->cols % 4)
        return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: %s matrix of %u columns", il, what, w->cols);
    *m = mega_matrix{w->data, w->row_bytes, w->rows, w->cols, w->type};
    return NULL;
}

static em_err build_layers(const cuda_backend *b, mega_layer *out) {
    const cuda_step *d = &b->step;
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const cuda_layer *lw = &b->layers[il];
        const em_program_attention *at = &lw->att;
        mega_layer L = {};
        em_err err;
        if ((err = matrix_of(&lw->wq, "q", il, &L.wq)) || (err = matrix_of(&lw->wk, "k", il, &L.wk)) ||
            (err = matrix_of(&lw->wv, "v", il, &L.wv)) || (err = matrix_of(&lw->wo, "output", il, &L.wo)))
            return err;
        if (lw->moe) {
            const uint32_t n = lw->route.n_expert;
            if ((err = matrix_of(&lw->gate_inp, "router", il, &L.router)) ||
                (err = matrix_of(&lw->gate_exps, "expert gate", il, &L.gate, n)) ||
                (err = matrix_of(&lw->up_exps, "expert up", il, &L.up, n)) ||
                (err = matrix_of(&lw->down_exps, "expert down", il, &L.down, n)))
                return err;
            if (L.router.rows != n || L.router.cols != d->n_embd)
                return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: a router of %u x %u", il, L.router.rows, L.router.cols);
            L.expert_bytes = (uint64_t)L.gate.rows * L.gate.row_bytes;
            L.down_expert_bytes = (uint64_t)L.down.rows * L.down.row_bytes;
            L.n_expert = n, L.n_used = lw->route.n_used;
            L.sigmoid = lw->route.gating == EM_GATING_SIGMOID, L.renormalize = lw->route.renormalize;
            L.expert_scale = lw->route.scale;
        } else if ((err = matrix_of(&lw->ffn_gate, "gate", il, &L.gate)) ||
                   (err = matrix_of(&lw->ffn_up, "up", il, &L.up)) ||
                   (err = matrix_of(&lw->ffn_down, "down", il, &L.down)))
            return err;
        if (L.gate.type != L.up.type || L.gate.rows != L.up.rows)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: gate and up matrices differ in type or shape", il);
        if (L.wq.cols != d->n_embd || L.wk.cols != d->n_embd || L.wv.cols != d->n_embd || L.gate.cols != d->n_embd ||
            L.wo.rows != d->n_embd || L.down.rows != d->n_embd || L.down.cols != L.gate.rows ||
            L.wq.rows != at->n_head * at->head_dim || L.wk.rows != at->n_head_kv * at->head_dim ||
            L.wv.rows != at->n_head_kv * at->head_dim || L.wo.cols != at->n_head * at->head_dim)
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: matrix shapes the schedule does not expect", il);
        if (!lw->attn_norm || !lw->ffn_norm) return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: no norm weights", il);
        L.attn_norm = lw->attn_norm, L.ffn_norm = lw->ffn_norm;
        L.bq = lw->bq, L.bk = lw->bk, L.bv = lw->bv, L.q_norm = lw->q_norm, L.k_norm = lw->k_norm;
        L.keys = (__half *)lw->keys, L.values = (__half *)lw->values;
        L.rope = em_cuda_rope_args(b, il);
        L.n_head = at->n_head, L.n_head_kv = at->n_head_kv, L.head_dim = at->head_dim;
        L.window = at->window;
        L.scale = at->scale, L.softcap = at->softcap;
        out[il] = L;
    }
    return NULL;
}

/* Whether the instruction's products take activations rounded to 8 bits: all its matrices of the
 * types dq_unit decodes, rows of whole 64-value units, and EMBER_CUDA_DP4A not 0 (then, as in the
 * per-operation kernels, every product keeps f32 activations). */
static bool int8_matrix(const mega_matrix &m) {
    return (m.type == EM_TYPE_Q8_0 || m.type == EM_TYPE_Q4_K || m.type == EM_TYPE_Q6_K || m.type == EM_TYPE_IQ3_XXS) &&
           m.cols % DQ_UNIT == 0;
}

static bool op_takes_int8(const em_op &op, const mega_layer &L, const mega_matrix &output) {
    switch (op.kind) {
    case EM_OP_QKV: return int8_matrix(L.wq) && int8_matrix(L.wk) && int8_matrix(L.wv);
    case EM_OP_OUT_PROJ: return int8_matrix(L.wo);
    case EM_OP_FFN_UP:
    case EM_OP_EXPERT_UP: return int8_matrix(L.gate) && int8_matrix(L.up);
    case EM_OP_FFN_DOWN:
    case EM_OP_EXPERT_DOWN: return int8_matrix(L.down);
    case EM_OP_HEAD: return int8_matrix(output);
    case EM_OP_ROUTE: return int8_matrix(L.router);
    default: return false;
    }
}

template <int NT> static em_err allow_smem(size_t bytes) {
    CU_TRY(cudaFuncSetAttribute(mega_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return NULL;
}

/* EMBER_CUDA_MEGA_PROFILE: the time of each instruction kind per step and the bytes of weights it
 * read per second, logged when the backend goes. The stamps are block 0's (each instruction's
 * time includes its barrier, so block 0 sees the slowest block). */
static void log_profile(const cuda_backend *b, const cuda_mega *m) {
    const uint32_t n = m->schedule.n_ops;
    unsigned long long *ns = (unsigned long long *)calloc(3 * n, sizeof *ns);
    if (!ns || !m->steps || cudaMemcpy(ns, m->op_ns, 3 * n * sizeof *ns, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(ns);
        return;
    }
    double kind_ns[EM_OP_KINDS] = {0}, kind_part[EM_OP_KINDS][3] = {}, kind_bytes[EM_OP_KINDS] = {0}, total = 0;
    for (uint32_t i = 0; i < n; i++) {
        const em_op *op = &m->schedule.ops[i];
        const cuda_layer *lw = &b->layers[op->layer];
        double bytes = 0;
        switch (op->kind) {
        case EM_OP_QKV:
            bytes = (double)lw->wq.rows * lw->wq.row_bytes + (double)lw->wk.rows * lw->wk.row_bytes +
                    (double)lw->wv.rows * lw->wv.row_bytes;
            break;
        case EM_OP_OUT_PROJ: bytes = (double)lw->wo.rows * lw->wo.row_bytes; break;
        case EM_OP_FFN_UP:
            bytes = (double)lw->ffn_gate.rows * lw->ffn_gate.row_bytes + (double)lw->ffn_up.rows * lw->ffn_up.row_bytes;
            break;
        case EM_OP_FFN_DOWN: bytes = (double)lw->ffn_down.rows * lw->ffn_down.row_bytes; break;
        case EM_OP_HEAD: bytes = (double)b->output.rows * b->output.row_bytes; break;
        case EM_OP_ROUTE: bytes = (double)lw->gate_inp.rows * lw->gate_inp.row_bytes; break;
        case EM_OP_EXPERT_UP: /* at one sequence: its chosen experts */
            bytes = (double)lw->route.n_used * 2 * lw->gate_exps.rows * lw->gate_exps.row_bytes;
            break;
        case EM_OP_EXPERT_DOWN:
            bytes = (double)lw->route.n_used * lw->down_exps.rows * lw->down_exps.row_bytes;
            break;
        }
        for (int k = 0; k < 3; k++) {
            const double t = (double)ns[3 * i + k] / m->steps;
            kind_part[op->kind][k] += t, kind_ns[op->kind] += t, total += t;
        }
        kind_bytes[op->kind] += bytes;
    }
    em_log(EM_LOG_INFO, "cuda mega profile over %llu steps: %.1f us a step", (unsigned long long)m->steps, total / 1e3);
    for (int k = 0; k < EM_OP_KINDS; k++)
        em_log(EM_LOG_INFO,
               "cuda mega profile: %-11s %7.1f us a step (%4.1f%%; input %.1f, work %.1f, barrier %.1f), weights "
               "%7.2f MB -> %6.0f GB/s",
               em_op_name((em_op_kind)k), kind_ns[k] / 1e3, 100.0 * kind_ns[k] / (total > 0 ? total : 1),
               kind_part[k][0] / 1e3, kind_part[k][1] / 1e3, kind_part[k][2] / 1e3, kind_bytes[k] / 1e6,
               kind_ns[k] > 0 ? kind_bytes[k] / kind_ns[k] : 0.0);
    free(ns);
}

void em_cuda_mega_free(cuda_backend *b) {
    cuda_mega *m = b->mega;
    if (!m) return;
    if (m->op_ns) log_profile(b, m);
    cudaFree(m->op_ns);
    cudaFree(m->ops);
    cudaFree(m->op_int8);
    cudaFree(m->layers);
    cudaFree(m->parts);
    cudaFree(m->att_done);
    cudaFree(m->barrier);
    em_schedule_free(&m->schedule);
    free(m);
    b->mega = NULL;
}

static em_err setup(cuda_backend *b, cuda_mega *m) {
    const cuda_step *d = &b->step;
    em_err err = em_schedule_build(&b->base.model->program, &m->schedule);
    if (err) return err;
    if ((err = em_schedule_check(&m->schedule))) return err;
    if (b->kv_elem != 2) return em_errorf(EM_ERR_UNSUPPORTED, "the kernel reads an f16 KV cache");
    if (!b->output.data || !b->output_norm) return em_errorf(EM_ERR_UNSUPPORTED, "no output matrix or norm");
    mega_matrix output;
    if ((err = matrix_of(&b->output, "output head", d->n_layer, &output))) return err;
    if (output.cols != d->n_embd || output.rows != d->n_vocab || d->n_embd % 4)
        return em_errorf(EM_ERR_UNSUPPORTED, "output head of %u x %u", output.rows, output.cols);
    mega_layer *layers = (mega_layer *)calloc(d->n_layer, sizeof *layers);
    if (!layers) return em_errorf(EM_ERR_NOMEM, "out of memory for %u layers", d->n_layer);
    if ((err = build_layers(b, layers))) {
        free(layers);
        return err;
    }
    uint32_t widest = d->n_embd, most_used = 0; /* values of the widest input row; choices a token */
    uint64_t widest_row = output.row_bytes;      /* bytes of the longest row a stage must hold */
    for (uint32_t il = 0; il < d->n_layer; il++) {
        const mega_layer &L = layers[il];
        const uint64_t rows[] = {L.wq.row_bytes, L.wk.row_bytes,      L.wv.row_bytes,  L.wo.row_bytes,
                                 2 * L.gate.row_bytes, L.down.row_bytes, L.router.row_bytes};
        for (uint64_t r : rows) widest_row = max(widest_row, r);
        /* an expert layer's down products read all of a token's choices' gated units */
        widest = max(widest, max(max(L.n_used, 1u) * L.down.cols, L.wo.cols));
        most_used = max(most_used, L.n_used);
        m->max_head_dim = max(m->max_head_dim, layers[il].head_dim);
        m->max_head = max(m->max_head, layers[il].n_head);
        const uint32_t hd = layers[il].head_dim;
        if (hd != 32 && hd != 64 && hd != 128 && hd != 256) {
            free(layers);
            return em_errorf(EM_ERR_UNSUPPORTED, "layer %u: head size %u (32, 64, 128, 256)", il, hd);
        }
    }
    uint8_t *op_int8 = (uint8_t *)calloc(m->schedule.n_ops, 1);
    if (!op_int8) {
        free(layers);
        return em_errorf(EM_ERR_NOMEM, "out of memory for %u instructions", m->schedule.n_ops);
    }
    const bool int8 = b->tuning.int8_activations;
    for (uint32_t i = 0; i < m->schedule.n_ops; i++)
        op_int8[i] = int8 && op_takes_int8(m->schedule.ops[i], layers[m->schedule.ops[i].layer], output);
    cudaError_t status = cudaMalloc((void **)&m->layers, d->n_layer * sizeof *layers);
    if (status == cudaSuccess)
        status = cudaMemcpy(m->layers, layers, d->n_layer * sizeof *layers, cudaMemcpyHostToDevice);
    if (status == cudaSuccess) status = cudaMalloc((void **)&m->op_int8, m->schedule.n_ops);
    if (status == cudaSuccess) status = cudaMemcpy(m->op_int8, op_int8, m->schedule.n_ops, cudaMemcpyHostToDevice);
    free(op_int8);
    free(layers);
    if (status != cudaSuccess)
        return em_errorf(EM_ERR_INTERNAL, "uploading the layers: %s", cudaGetErrorString(status));
    CU_TRY(cudaMalloc((void **)&m->ops, m->schedule.n_ops * sizeof(em_op)));
    CU_TRY(cudaMemcpy(m->ops, m->schedule.ops, m->schedule.n_ops * sizeof(em_op), cudaMemcpyHostToDevice));
    CU_TRY(cudaMalloc((void **)&m->parts, (uint64_t)MEGA_MAX_TOKENS * m->max_head * MEGA_MAX_SPANS *
                                              (m->max_head_dim + 2) * sizeof(float)));
    CU_TRY(cudaMalloc((void **)&m->att_done, (uint64_t)MEGA_MAX_TOKENS * m->max_head * sizeof(uint32_t)));
    CU_TRY(cudaMemset(m->att_done, 0, (uint64_t)MEGA_MAX_TOKENS * m->max_head * sizeof(uint32_t)));
    CU_TRY(cudaMalloc((void **)&m->barrier, sizeof *m->barrier));
    CU_TRY(cudaMemset(m->barrier, 0, sizeof *m->barrier));
    if (b->tuning.mega_profile) {
        CU_TRY(cudaMalloc((void **)&m->op_ns, 3 * m->schedule.n_ops * sizeof *m->op_ns));
        CU_TRY(cudaMemset(m->op_ns, 0, 3 * m->schedule.n_ops * sizeof *m->op_ns));
    }
    int smem_max = 0;
    CU_TRY(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, b->device));
    /* Shared memory: the input rows (or the attention tiles), then the ring of weight stages. A stage
     * holds at least one row (with the gated unit's up row) and its alignment slack. */
    const size_t static_smem = 4096; /* load_input's reduction, the RMS factors, the ring's barriers, the routes */
    const size_t per_warp = attention_warp_bytes(m->max_head_dim);
    m->attention_warps = MEGA_ATTENTION_WARPS;
    /* EMBER_CUDA_MEGA_STAGE_KB: the stages' size, a measurement knob (bench/mega_probe.sh); at least
     * the longest row */
    const uint64_t stage_kb = b->tuning.mega_stage_kb;
    m->stage_bytes = (uint32_t)max(stage_kb * 1024 + 256, (widest_row + 64 + 127) / 128 * 128);
    /* the expert down products' results: a block's rows of x for each of the step's chosen experts */
    const size_t rows_per_block = (d->n_embd + b->n_sm - 1) / b->n_sm;
    for (uint32_t nt = 1; nt <= MEGA_MAX_TOKENS; nt++) {
        if (nt * most_used > EM_SCHEDULE_MAX_USED) break; /* a step's choices are one warp's lanes */
        const size_t rows = (size_t)nt * widest * sizeof(float), tiles = m->attention_warps * per_warp;
        const size_t results = most_used ? (size_t)nt * most_used * rows_per_block * nt * sizeof(float) : 0;
        m->results_offset[nt] = (uint32_t)((max(rows, tiles) + 127) / 128 * 128);
        const size_t input = (m->results_offset[nt] + results + 127) / 128 * 128;
        if (input + 2 * m->stage_bytes + static_smem > (size_t)smem_max) break;
        m->ring_offset[nt] = (uint32_t)input;
        const size_t stages = ((size_t)smem_max - static_smem - input) / m->stage_bytes;
        m->n_stages[nt] = (uint32_t)min((size_t)MEGA_MAX_STAGES, stages);
        m->smem[nt] = input + (size_t)m->n_stages[nt] * m->stage_bytes;
        m->max_tokens = nt;
    }
    if (!m->max_tokens) return em_errorf(EM_ERR_UNSUPPORTED, "rows of %u values do not fit shared memory", widest);
    if ((err = allow_smem<1>(m->smem[1]))) return err;
    if (m->max_tokens >= 2 && (err = allow_smem<2>(m->smem[2]))) return err;
    if (m->max_tokens >= 3 && (err = allow_smem<3>(m->smem[3]))) return err;
    if (m->max_tokens >= 4 && (err = allow_smem<4>(m->smem[4]))) return err;
    return NULL;
}

/* Steps of up to EMBER_CUDA_MEGA=N sequences take the kernel (at most MEGA_MAX_TOKENS and what
 * shared memory fits; tuning.cu has the default and why). */
em_err em_cuda_mega_setup(cuda_backend *b) {
    b->mega = NULL;
    const uint32_t wanted = b->tuning.mega_tokens;
    if (wanted == 0) return NULL;
    cuda_mega *m = (cuda_mega *)calloc(1, sizeof *m);
    if (!m) return em_errorf(EM_ERR_NOMEM, "out of memory for the persistent decode kernel");
    b->mega = m;
    em_err err = setup(b, m);
    if (!err) {
        m->max_tokens = min(m->max_tokens, wanted);
        em_log(EM_LOG_INFO, "cuda: decode steps of up to %u sequences run the persistent kernel (%u instructions)",
               m->max_tokens, m->schedule.n_ops);
        return NULL;
    }
    em_cuda_mega_free(b);
    /* a model the kernel does not take runs the per-operation kernels; a failing CUDA call is an error */
    if (em_err_code_of(err) == EM_ERR_UNSUPPORTED) {
        em_log(EM_LOG_INFO, "cuda: decode steps run per-operation kernels (persistent kernel: %s)",
               em_err_message(err));
        em_err_free(err);
        return NULL;
    }
    return em_err_prefix(err, "persistent decode kernel");
}

bool em_cuda_mega_takes(const cuda_backend *b, const cuda_batch *cb) {
    return b->mega && cb->one_per_seq && cb->n_segments == 0 && cb->n_tokens >= 1 &&
           cb->n_tokens <= b->mega->max_tokens && cb->n_rows == cb->n_tokens && !b->capturing;
}

uint64_t em_cuda_mega_steps(const em_backend *base) {
    const cuda_backend *b = (const cuda_backend *)base;
    return b->mega ? b->mega->steps : 0;
}

em_err em_cuda_mega_run(cuda_backend *b, const cuda_batch *cb) {
    cuda_mega *m = b->mega;
    const cuda_step *d = &b->step;
    em_err err = em_cuda_embed(b, cb, b->x, NULL, NULL);
    if (err) return err;
    mega_args a = {};
    a.ops = m->ops, a.op_int8 = m->op_int8, a.n_ops = m->schedule.n_ops, a.layers = m->layers;
    a.output = mega_matrix{b->output.data, b->output.row_bytes, b->output.rows, b->output.cols, b->output.type};
    a.output_norm = b->output_norm;
    a.x = b->x, a.q = b->q, a.k = b->k, a.v = b->v, a.attn = b->attn, a.h = b->gate, a.logits = b->logits;
    a.router = b->router, a.moe_h = b->moe_h;
    a.parts = m->parts, a.att_done = m->att_done, a.attention_warps = m->attention_warps;
    a.pos = cb->pos, a.seq = cb->seq, a.table_start = cb->table_start, a.blocks = cb->blocks;
    a.block_tokens = b->base.block_tokens, a.n_embd = d->n_embd, a.n_vocab = d->n_vocab;
    a.eps = d->eps, a.final_softcap = d->final_softcap, a.plus_one = d->plus_one;
    a.act = d->act;
    a.barrier = m->barrier, a.barrier_base = m->barriers_passed;
    a.op_ns = m->op_ns;
    a.ring_offset = m->ring_offset[cb->n_tokens], a.n_stages = m->n_stages[cb->n_tokens];
    a.stage_bytes = m->stage_bytes, a.results_offset = m->results_offset[cb->n_tokens];
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(b->n_sm);
    config.blockDim = dim3(MEGA_THREADS);
    config.dynamicSmemBytes = m->smem[cb->n_tokens];
    config.stream = b->stream;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeCooperative; /* every block resident at once, or the launch fails */
    attr.val.cooperative = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    switch (cb->n_tokens) {
    case 1: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<1>, a)); break;
    case 2: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<2>, a)); break;
    case 3: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<3>, a)); break;
    case 4: CU_TRY(cudaLaunchKernelEx(&config, mega_kernel<4>, a)); break;
    default: return em_errorf(EM_ERR_INTERNAL, "persistent kernel: a step of %u tokens", cb->n_tokens);
    }
    m->barriers_passed += (unsigned long long)m->schedule.n_barriers * b->n_sm;
    m->steps++;
    return NULL;
}
