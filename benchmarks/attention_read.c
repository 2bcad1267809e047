/* Decode attention against the bytes it reads: llama_layer.c's attention for one row (its query group) of each of
 * 8 sequences, every kv head of 30 layers (the embedded model's shapes), each sequence's cache read cold, beside a
 * plain read of the same bytes (4 vector accumulators, in order), in CPU time of the thread, medians of 11 rounds.
 * `hot` reads one layer's cache of one sequence every time instead (it stays in L2): the arithmetic alone.
 *
 *     cc -O3 -march=native -DMAX_ROWS=64 benchmarks/attention_read.c neuron_ssp/backends/torch/row_kernel.c \
 *         -o /tmp/attention_read -lm && /tmp/attention_read 500 bf16 [hot]
 */
#include "../neuron_ssp/backends/torch/llama_layer.c"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { LAYERS = 30, SLOTS = 8, KV_HEADS = 3, HEADS = 9, HEAD_DIM = 64, POSITIONS = 2048, ROUNDS = 11 };

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int ascending(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

int main(int argc, char **argv) {
    int context = argc > 1 ? atoi(argv[1]) : 500, bf16 = argc > 2 && strcmp(argv[2], "bf16") == 0, hot = argc > 3;
    if (context < 1 || context >= POSITIONS) return fprintf(stderr, "context: 1..%d\n", POSITIONS - 1), 2;
    size_t element = bf16 ? 2 : 4, tiles = (POSITIONS + TILE - 1) / TILE;
    size_t key_head = tiles * TILE * HEAD_DIM, value_head = (size_t)POSITIONS * HEAD_DIM;
    size_t slot_bytes = KV_HEADS * (key_head + value_head) * element, layer_bytes = SLOTS * slot_bytes;
    char *cache = aligned_alloc(64, layer_bytes * LAYERS);
    for (size_t i = 0; i < layer_bytes * LAYERS / element; i++) /* small normal numbers: denormals are slow */
        store_cached(cache, (ptrdiff_t)i, bf16, 0.01f + 0.001f * (float)(i % 7));
    float *cos = malloc(sizeof(float) * POSITIONS * HEAD_DIM), *sin = malloc(sizeof(float) * POSITIONS * HEAD_DIM);
    for (int i = 0; i < POSITIONS * HEAD_DIM; i++) cos[i] = 1.0f, sin[i] = 0.0f;
    struct llama_model model = {0, LAYERS, 576, HEADS, KV_HEADS, HEAD_DIM, 1536, 1e-5f, POSITIONS, bf16, cos, sin};
    int qkv_width = (HEADS + 2 * KV_HEADS) * HEAD_DIM;
    float *fused = malloc(sizeof(float) * qkv_width), *out = malloc(sizeof(float) * HEADS * HEAD_DIM);
    float *work = malloc(sizeof(float) * task_floats(1, context, HEADS / KV_HEADS, HEAD_DIM));
    for (int i = 0; i < qkv_width; i++) fused[i] = 0.01f * (float)(i % 5);
    double attention[ROUNDS], reading[ROUNDS];
    float sink = 0.0f;
    size_t key_floats = (size_t)((context + TILE) / TILE) * TILE * HEAD_DIM * element / 4;
    size_t value_floats = (size_t)(context + 1) * HEAD_DIM * element / 4;
    for (int round = 0; round < ROUNDS; round++) {
        double begin = cpu_ms();
        for (int layer = 0; layer < LAYERS; layer++)
            for (int slot = 0; slot < SLOTS; slot++)
                for (int h = 0; h < KV_HEADS; h++) {
                    char *base = hot ? cache : cache + layer * layer_bytes + slot * slot_bytes;
                    const void *keys = base + h * key_head * element;
                    const void *values = base + (KV_HEADS * key_head + h * value_head) * element;
                    (bf16 ? attend_head_bf16 : attend_head_f32)(&model, fused, 1, context, h, keys, values, work, out);
                }
        attention[round] = cpu_ms() - begin;
        begin = cpu_ms();
        vec acc[4] = {{0}};
        for (int layer = 0; layer < LAYERS; layer++)
            for (int slot = 0; slot < SLOTS; slot++)
                for (int h = 0; h < KV_HEADS; h++) {
                    char *base = hot ? cache : cache + layer * layer_bytes + slot * slot_bytes;
                    const float *keys = (const float *)(base + h * key_head * element);
                    const float *values = (const float *)(base + (KV_HEADS * key_head + h * value_head) * element);
                    for (size_t i = 0; i + 4 * LANES <= key_floats; i += 4 * LANES)
                        for (int j = 0; j < 4; j++) acc[j] += *(const vec *)(keys + i + j * LANES);
                    for (size_t i = 0; i + 4 * LANES <= value_floats; i += 4 * LANES)
                        for (int j = 0; j < 4; j++) acc[j] += *(const vec *)(values + i + j * LANES);
                }
        reading[round] = cpu_ms() - begin;
        sink += total(acc[0] + acc[1] + acc[2] + acc[3]) + out[0];
    }
    qsort(attention, ROUNDS, sizeof(double), ascending);
    qsort(reading, ROUNDS, sizeof(double), ascending);
    double mb = (double)LAYERS * SLOTS * KV_HEADS * (key_floats + value_floats) * 4 / 1e6;
    printf("context %d, %s cache%s: attention %.2f ms (%.1f GB/s), "
           "a plain read of the same %.1f MB %.2f ms (%.1f GB/s)%s\n",
           context, bf16 ? "bf16" : "fp32", hot ? ", hot" : "", attention[ROUNDS / 2], mb / attention[ROUNDS / 2], mb,
           reading[ROUNDS / 2], mb / reading[ROUNDS / 2], sink != sink ? " (not finite)" : "");
    return 0;
}
