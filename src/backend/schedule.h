/*
 * schedule — a decode step as a list of instructions, built from the layer program, for a
 * persistent kernel that runs the whole step in one launch (src/backend/cuda/mega.cu).
 *
 * The schedule is derived from the layer program (program.h): each layer's run of operations is
 * matched against the instructions' shapes and rewritten into them, so the program stays the one
 * definition of a step.
 *
 * A decode step of a few sequences is memory-bound: its time is the bytes of the weights over the
 * memory bandwidth, plus every moment the memory idles. Run as a kernel per operation, each kernel's
 * ramp and tail leave it idle; one resident kernel that works through a schedule does not. The
 * schedule says what the step is, layer by layer, in the shape of the CPU reference's
 * forward_layer:
 *
 *   x += O · attention(QKV · norm(x))          EM_OP_QKV, EM_OP_ATTENTION, EM_OP_OUT_PROJ
 *   x += down · act(gate · norm(x)) * (up · norm(x))   EM_OP_FFN_UP, EM_OP_FFN_DOWN
 *   or, in a mixture-of-experts layer, the same unit run by each token's chosen experts:
 *   r = router · norm(x)                       EM_OP_ROUTE
 *   h[e] = act(gate_e · norm(x)) * (up_e · norm(x)) for the top k of r     EM_OP_EXPERT_UP
 *   x += sum over the chosen e of weight_e · down_e · h[e]                 EM_OP_EXPERT_DOWN
 *   logits = output · norm(x)                  EM_OP_HEAD
 *
 * Each instruction reads and writes named buffers and may end at a grid barrier: every block of
 * the kernel waits there until all blocks have finished what came before. A new family or step
 * shape is a new schedule, not new GPU code. em_schedule_check proves that a schedule is safe to
 * run before the first launch: an instruction reads only buffers that an earlier instruction wrote
 * with a barrier between them (or the step's input), and no two instructions between two barriers
 * write or read-and-write the same buffer. A persistent kernel whose blocks wait for each other
 * must never be given a schedule that would make them wait forever, and every block executes every
 * barrier, so the barriers themselves cannot deadlock.
 *
 * Plain C, no GPU: the builder and the checker are tested in CI (tests/test_schedule.c).
 * Ownership: a schedule owns its instruction array (em_schedule_free).
 */
#ifndef EMBER_BACKEND_SCHEDULE_H
#define EMBER_BACKEND_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../program/program.h"

typedef enum em_op_kind {
    EM_OP_QKV,       /* q, k, v = W_qkv · norm(x): raw, before bias, QK-norm and RoPE */
    EM_OP_ATTENTION, /* finish q, k, v; write k, v to the cache; partial attention per span of positions */
    EM_OP_OUT_PROJ,  /* merge the partials; x += W_o · attention */
    EM_OP_FFN_UP,    /* h = act(W_gate · norm(x)) * (W_up · norm(x)) */
    EM_OP_FFN_DOWN,  /* x += W_down · h */
    EM_OP_HEAD,      /* logits = W_output · norm(x), soft-capped */
    EM_OP_ROUTE,     /* router logits = W_router · norm(x) */
    EM_OP_EXPERT_UP, /* each block routes (top k, weights); h[choice] = the chosen experts' gated units */
    EM_OP_EXPERT_DOWN, /* x += the chosen experts' down products, weighted, summed in expert order */
    EM_OP_KINDS
} em_op_kind;

/* The buffers instructions pass to each other (bits of em_op.reads / writes). */
enum {
    EM_BUF_X = 1u << 0,      /* the residual stream: the step's input (the embeddings) */
    EM_BUF_QKV = 1u << 1,    /* raw q, k, v */
    EM_BUF_KV = 1u << 2,     /* the layer's KV cache */
    EM_BUF_PARTS = 1u << 3,  /* attention partials */
    EM_BUF_H = 1u << 4,      /* the gated unit's output */
    EM_BUF_LOGITS = 1u << 5,
    EM_BUF_ROUTER = 1u << 6, /* the router's logits */
};

#define EM_SCHEDULE_MAX_EXPERTS 256 /* a warp routes a token: 8 experts a lane */
#define EM_SCHEDULE_MAX_USED 32     /* the choices of a step's tokens are one warp's lanes */

typedef struct em_op {
    uint8_t kind;            /* em_op_kind */
    bool barrier_after;      /* every block waits here for all the others */
    uint16_t layer;          /* unused by EM_OP_HEAD */
    uint32_t reads, writes;  /* EM_BUF_* bits */
} em_op;

typedef struct em_schedule {
    em_op *ops;
    uint32_t n_ops;
    uint32_t n_barriers;
} em_schedule;

/* The decode schedule of a layer program, or an error that says why it has none (the operation that
 * does not fit an instruction, and where): each layer's operations must be a block of QKV, attention (head sizes of 32-256, keys and values alike), the output projection and
 * a gated unit, dense or through experts (at most EM_SCHEDULE_MAX_EXPERTS, of which at most
 * EM_SCHEDULE_MAX_USED a token), with no post-norms and no shared expert. */
em_err em_schedule_build(const em_program *p, em_schedule *out);
/* NULL when `s` is safe to run (see above), else the first instruction that is not, and why. */
em_err em_schedule_check(const em_schedule *s);
void em_schedule_free(em_schedule *s);
const char *em_op_name(em_op_kind kind);

#endif
