/* The persistent decode kernel's attention (mega.cu): a warp per (token, query head, span of
 * positions), its tiles of keys and values copied to shared memory, the own position's key and
 * value finished here and written to the cache, the spans merged by the last to finish. */
#pragma once

#include "mega.cuh"

/* 16 bytes from global to shared memory without the registers (and past L1). */
__device__ __forceinline__ void copy16_async(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

/* A warp's shared memory for attention items of head size hd (bytes): the tile's keys (rows padded
 * by 16 bytes against bank conflicts) and values, then the query and the own key and value. */
__host__ __device__ constexpr uint32_t attention_warp_bytes(uint32_t hd) {
    return 32 * (hd * 2 + 16) + 32 * hd * 2 + 12 * hd;
}

/* The last of a head's spans to finish merges the partials: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M). */
template <int HD>
__device__ void merge_head(const float *part, uint32_t n, float *out) {
    const uint32_t lane = threadIdx.x & 31;
    float m = -INFINITY;
    for (uint32_t s = lane; s < n; s += 32) m = fmaxf(m, __ldcg(part + s * (HD + 2) + HD));
    m = em_warp_max(m);
    float l = 0.0f;
    for (uint32_t s = lane; s < n; s += 32) {
        const float *ps = part + s * (HD + 2);
        l += __ldcg(ps + HD + 1) * expf(__ldcg(ps + HD) - m);
    }
    const float inv = 1.0f / em_warp_sum(l);
    float o[HD / 32];
#pragma unroll
    for (int i = 0; i < HD / 32; i++) o[i] = 0.0f;
    for (uint32_t s0 = 0; s0 < n; s0 += 32) {
        const float f = s0 + lane < n ? expf(__ldcg(part + (s0 + lane) * (HD + 2) + HD) - m) : 0.0f;
        const uint32_t k = min(32u, n - s0);
#pragma unroll 4
        for (uint32_t j = 0; j < k; j++) {
            const float fj = __shfl_sync(0xffffffffu, f, j);
            const float *ps = part + (s0 + j) * (HD + 2);
#pragma unroll
            for (int i = 0; i < HD / 32; i++) o[i] += __ldcg(ps + lane + 32 * i) * fj;
        }
    }
#pragma unroll
    for (int i = 0; i < HD / 32; i++) out[lane + 32 * i] = o[i] * inv;
}

/* A head's raw values (src + bias), lane l holding elements l, l + 32, ... (src read past L1). */
template <int HD> __device__ __forceinline__ void load_head(float r[HD / 32], const float *src, const float *bias) {
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < HD / 32; i++) r[i] = __ldcg(src + lane + 32 * i) + (bias ? bias[lane + 32 * i] : 0.0f);
}

/* qkv_head's work on a head already loaded by load_head (the same arithmetic in the same order, so
 * the same bits): into shared memory h, RMSNorm with `norm` when given, RoPE at pos when `rotate`. */
template <int HD>
__device__ __forceinline__ void finish_head(float *h, float r[HD / 32], const float *norm, float eps, bool plus_one,
                                            bool rotate, uint32_t pos, const rope_args &rope) {
    const uint32_t lane = threadIdx.x & 31;
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < HD / 32; i++) ss += r[i] * r[i];
    if (norm) {
        const float scale = rsqrtf(em_warp_sum(ss) / HD + eps);
#pragma unroll
        for (int i = 0; i < HD / 32; i++) {
            const float w = norm[lane + 32 * i];
            r[i] = r[i] * scale * (plus_one ? 1.0f + w : w);
        }
    }
#pragma unroll
    for (int i = 0; i < HD / 32; i++) h[lane + 32 * i] = r[i];
    __syncwarp();
    if (rotate) rope_head(h, pos, rope);
}

/* One warp's attention item: token t, query head hq, span s of positions, 32 positions a tile:
 * each lane copies its position's key and value row to shared memory (all in flight while the
 * query is finished), scores its key, then the warp adds the weighted values. The partial result
 * (unnormalized values, maximum, sum) goes to a.parts; the head's last span to finish merges them
 * into a.attn. The span holding the token's own position finishes its key and value (qkv.cuh),
 * puts them in its tile as the cache holds them (f16), and the group's first query head writes them
 * into the cache. */
template <int HD>
__device__ void attention_item(const mega_args &a, const mega_layer &L, uint32_t t, uint32_t hq, uint32_t s,
                               uint8_t *scratch) {
    constexpr int DL = HD / 32, KROW = HD + 8; /* halves a key row takes in shared memory */
    const uint32_t lane = threadIdx.x & 31, group = L.n_head / L.n_head_kv, g = hq / group;
    const uint32_t pos = a.pos[t], first = first_position(pos, L.window);
    const uint32_t span = span_of(pos, L.window), lo = first + s * span, hi = min(lo + span, pos + 1);
    const uint32_t *table = a.blocks + a.table_start[a.seq[t]];
    __half *ks = (__half *)scratch, *vs = ks + 32 * KROW;
    float *qh = (float *)(vs + 32 * HD), *kh = qh + HD, *vh = kh + HD;
    const bool own = lo <= pos && pos < hi;
    float m = -INFINITY, l = 0.0f, acc[DL];
#pragma unroll
    for (int i = 0; i < DL; i++) acc[i] = 0.0f;
    for (uint32_t p0 = lo; p0 < hi; p0 += 32) {
        const uint32_t p = p0 + lane;
        if (p < hi) {
            const uint32_t row = table[p / a.block_tokens] * a.block_tokens + p % a.block_tokens;
            const uint64_t off = ((uint64_t)row * L.n_head_kv + g) * HD;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                copy16_async(ks + lane * KROW + 8 * c, L.keys + off + 8 * c);
                copy16_async(vs + lane * HD + 8 * c, L.values + off + 8 * c);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (p0 == lo) {
            /* the raw query (and key, value) first, all loads in flight together, then each finished */
            float qr[DL], kr[DL], vr[DL];
            load_head<HD>(qr, a.q + ((uint64_t)t * L.n_head + hq) * HD, L.bq ? L.bq + hq * HD : NULL);
            if (own) {
                load_head<HD>(kr, a.k + ((uint64_t)t * L.n_head_kv + g) * HD, L.bk ? L.bk + g * HD : NULL);
                load_head<HD>(vr, a.v + ((uint64_t)t * L.n_head_kv + g) * HD, L.bv ? L.bv + g * HD : NULL);
            }
            finish_head<HD>(qh, qr, L.q_norm, a.eps, a.plus_one, true, pos, L.rope);
            if (own) {
                finish_head<HD>(kh, kr, L.k_norm, a.eps, a.plus_one, true, pos, L.rope);
                finish_head<HD>(vh, vr, NULL, a.eps, a.plus_one, false, pos, L.rope);
                if (hq % group == 0) {
                    const uint32_t row = table[pos / a.block_tokens] * a.block_tokens + pos % a.block_tokens;
                    const uint64_t off = ((uint64_t)row * L.n_head_kv + g) * HD;
                    for (uint32_t i = lane; i < HD; i += 32)
                        L.keys[off + i] = __float2half(kh[i]), L.values[off + i] = __float2half(vh[i]);
                }
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();
        if (own && p0 <= pos && pos < p0 + 32) { /* the own position, finished here, as the cache holds it */
            for (uint32_t i = lane; i < HD; i += 32)
                ks[(pos - p0) * KROW + i] = __float2half(kh[i]), vs[(pos - p0) * HD + i] = __float2half(vh[i]);
            __syncwarp();
        }
        float score = -INFINITY;
        if (p < hi) {
            float d = 0.0f;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                const uint4 u = *(const uint4 *)(ks + lane * KROW + 8 * c);
                const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float2 f = __half22float2(h2[j]);
                    d += qh[8 * c + 2 * j] * f.x + qh[8 * c + 2 * j + 1] * f.y;
                }
            }
            score = d * L.scale;
            if (L.softcap > 0.0f) score = L.softcap * tanhf(score / L.softcap);
        }
        const float m_new = fmaxf(m, em_warp_max(score));
        const float corr = expf(m - m_new), w = p < hi ? expf(score - m_new) : 0.0f;
        l = l * corr + em_warp_sum(w);
        m = m_new;
#pragma unroll
        for (int i = 0; i < DL; i++) acc[i] *= corr;
        const uint32_t n = min(32u, hi - p0);
#pragma unroll 8
        for (uint32_t j = 0; j < n; j++) {
            const float wj = __shfl_sync(0xffffffffu, w, j);
#pragma unroll
            for (int i = 0; i < DL; i++) acc[i] += wj * __half2float(vs[j * HD + lane + 32 * i]);
        }
        __syncwarp(); /* the tile is consumed before the next one's copies land */
    }
    const uint32_t head = t * L.n_head + hq, n_spans = spans_of(pos, L.window);
    float *part = a.parts + (uint64_t)head * MEGA_MAX_SPANS * (HD + 2);
    float *out = part + s * (HD + 2);
#pragma unroll
    for (int i = 0; i < DL; i++) out[lane + 32 * i] = acc[i];
    if (lane == 0) out[HD] = m, out[HD + 1] = l;
    if (n_spans == 1) {
        __syncwarp();
        merge_head<HD>(part, 1, a.attn + (uint64_t)head * HD);
        return;
    }
    /* the last span to finish merges (its partial and the others' are visible after the fences) */
    __threadfence();
    uint32_t done = 0;
    if (lane == 0) done = atomicAdd(a.att_done + head, 1u);
    done = __shfl_sync(0xffffffffu, done, 0);
    if (done + 1 == n_spans) {
        __threadfence();
        merge_head<HD>(part, n_spans, a.attn + (uint64_t)head * HD);
        if (lane == 0) a.att_done[head] = 0; /* for the next layer, after its barriers */
    }
}

template <int NT>
__device__ void run_attention(const mega_args &a, const em_op &op, uint8_t *smem) {
    const mega_layer &L = a.layers[op.layer];
    const uint32_t warp = threadIdx.x >> 5;
    if (warp >= a.attention_warps) return; /* (consumers beyond the tiles' shared memory) */
    uint8_t *scratch = smem + warp * attention_warp_bytes(L.head_dim);
    const uint32_t items = NT * L.n_head * MEGA_MAX_SPANS;
    for (uint32_t i = blockIdx.x * a.attention_warps + warp; i < items; i += gridDim.x * a.attention_warps) {
        /* spans innermost: the spans of a head on neighbouring warps */
        const uint32_t s = i % MEGA_MAX_SPANS, hq = (i / MEGA_MAX_SPANS) % L.n_head, t = i / MEGA_MAX_SPANS / L.n_head;
        if (s >= spans_of(a.pos[t], L.window)) continue;
        switch (L.head_dim) {
        case 32: attention_item<32>(a, L, t, hq, s, scratch); break;
        case 64: attention_item<64>(a, L, t, hq, s, scratch); break;
        case 128: attention_item<128>(a, L, t, hq, s, scratch); break;
        case 256: attention_item<256>(a, L, t, hq, s, scratch); break;
        }
    }
}
