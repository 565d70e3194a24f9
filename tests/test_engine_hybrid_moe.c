/* The hybrid engine tests (test_engine_hybrid.c) on tiny-qwen35moe: the same Gated DeltaNet and
 * gated attention layers with a feed-forward of routed experts beside a shared expert that its own
 * sigmoid gate scales (qwen35moe, Qwen3.6-35B-A3B's layout). */
#define ENGINE_TEST_PRESET "tiny-qwen35moe"
#include "test_engine_hybrid.c"
