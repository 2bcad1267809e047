/* One Llama decoder layer for a few rows, in one call: what the compact forward does with ~25 torch
 * ops per layer (RMS norms, rotary, KV-cache writes, attention, SiLU, residuals) costs ~0.5 ms of
 * dispatch per layer at one row; here it is arithmetic only. The same order of operations as
 * Hugging Face's LlamaDecoderLayer, in fp32; the four matrix products go through panel_linear.
 *
 * Every row is computed on its own (its attention reads its own sequence's positions 0..its position), so a
 * row's result does not depend on how many rows came with it, nor on which other sequences share the call.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8 /* AVX2, NEON: two or one registers a vector */
#endif
typedef float vec __attribute__((vector_size(4 * LANES), aligned(4)));
typedef int ivec __attribute__((vector_size(4 * LANES), aligned(4)));

void panel_linear(const float *x, const float *panels, float *y, int rows, int n, int k, int threads);

/* lanes i..i+LANES-1 of p, zeros past `count` */
static inline vec load(const float *p, int i, int count) {
    if (i + LANES <= count) return *(const vec *)(p + i);
    vec v = {0};
    memcpy(&v, p + i, sizeof(float) * (size_t)(count - i));
    return v;
}

static inline void store(float *p, int i, int count, vec v) {
    if (i + LANES <= count) *(vec *)(p + i) = v;
    else memcpy(p + i, &v, sizeof(float) * (size_t)(count - i));
}

static inline float total(vec v) {
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += v[i];
    return s;
}

static inline float dot(const float *a, const float *b, int count) {
    vec acc = {0};
    for (int i = 0; i < count; i += LANES) acc += load(a, i, count) * load(b, i, count);
    return total(acc);
}

/* lanes of a where mask (a comparison's -1 / 0) is set, else of b */
static inline vec pick(ivec mask, vec a, vec b) {
    ivec ai, bi, out;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    out = (mask & ai) | (~mask & bi);
    memcpy(&a, &out, sizeof a);
    return a;
}

/* e^x per lane, Cephes' expf (range reduction by ln 2, degree-6 polynomial): within 2 ulp of expf */
static inline vec exp_lanes(vec x) {
    const vec lo = x * 0.0f - 87.3f, hi = x * 0.0f + 88.3f;
    x = pick(x < lo, lo, x);
    x = pick(x > hi, hi, x);
    vec half_up = x * 1.44269504088896341f + 0.5f;
    ivec n = __builtin_convertvector(half_up, ivec);           /* toward zero... */
    n += (ivec)(__builtin_convertvector(n, vec) > half_up);    /* ...then down: floor(x / ln 2 + 1/2) */
    vec nf = __builtin_convertvector(n, vec);
    vec r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    vec p = 1.9875691500e-4f + r * 0.0f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    ivec bits = (n + 127) << 23;
    vec two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

static void rms_norm(const float *x, const float *weight, float *out, int rows, int dim, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (ptrdiff_t)r * dim;
        float scale = 1.0f / sqrtf(dot(xr, xr, dim) / (float)dim + eps);
        for (int i = 0; i < dim; i += LANES)
            store(out + (ptrdiff_t)r * dim, i, dim, load(weight, i, dim) * (load(xr, i, dim) * scale));
    }
}

/* x*cos + rotate_half(x)*sin, with rotate_half's sign folded into `sin` (the torch path's tables) */
static void rotate(const float *x, const float *cos, const float *sin, float *out, int head_dim) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) out[i] = x[i] * cos[i] + x[i + half] * sin[i];
    for (int i = half; i < head_dim; i++) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

#define QUERY_BLOCK 8 /* queries sharing each loaded key / value vector: 8 accumulators */

int query_block(void) { return QUERY_BLOCK; }

/* prefetch distances, tuned on a 1000-position cache read cold: keys 64 positions ahead along each head
 * dimension's row (4 vectors of 16), values 8 positions ahead */
#define KEYS_AHEAD 64
#define VALUES_AHEAD 8

/* for each query q < count: out[q] lanes at..at+LANES-1 = scale[q] * sum over t < terms of
 * weights[q][t] * rows[t] (lanes at.., zero past limit), rows[t] = rows + t * row_stride. Both products of
 * attention are this loop: scores (rows: transposed keys, one per head dimension; weights: the queries;
 * 16 (8) positions per vector, no horizontal sums) and outputs (rows: values, one per position; weights: the
 * probabilities). One loaded row serves every query of the block. `ahead`: floats past each loaded vector
 * to prefetch (the cache, from memory after the weights went through: without it attention waits on it). */
static inline __attribute__((always_inline)) void weighted_rows(
    const float *restrict rows, ptrdiff_t row_stride, int at, int limit, int terms, const float *restrict weights,
    ptrdiff_t weight_stride, int count, const float *restrict scale, float *restrict out, ptrdiff_t out_stride,
    ptrdiff_t ahead) {
    vec acc[QUERY_BLOCK];
    for (int q = 0; q < QUERY_BLOCK; q++) acc[q] = (vec){0};
    for (int t = 0; t < terms; t++) {
        __builtin_prefetch(rows + (ptrdiff_t)t * row_stride + at + ahead, 0, 3);
        vec row = load(rows + (ptrdiff_t)t * row_stride, at, limit);
        for (int q = 0; q < QUERY_BLOCK; q++)
            if (q < count) acc[q] += row * weights[(ptrdiff_t)q * weight_stride + t];
    }
    for (int q = 0; q < QUERY_BLOCK; q++)
        if (q < count) store(out + (ptrdiff_t)q * out_stride, at, limit, acc[q] * scale[q]);
}

/* scores (count, positions) = queries (count, head_dim) . keys_t[:, :positions] * scale[q],
 * keys_t (head_dim, key_stride) */
static inline __attribute__((always_inline)) void score_block(
    const float *queries, int count, const float *keys_t, int key_stride, int positions, int head_dim,
    const float *scale, float *scores) {
    for (int j = 0; j < positions; j += LANES)
        weighted_rows(keys_t, key_stride, j, positions, head_dim, queries, head_dim, count, scale, scores,
                      positions, KEYS_AHEAD);
}

/* out (count, head_dim) = probs (count, positions) . values (positions, head_dim) * norms[q] */
static inline __attribute__((always_inline)) void value_block(
    const float *probs, const float *norms, int count, const float *values, int positions, int head_dim,
    float *out) {
    for (int i = 0; i < head_dim; i += LANES)
        weighted_rows(values, head_dim, i, head_dim, positions, probs, positions, count, norms, out, head_dim,
                      VALUES_AHEAD * head_dim);
}

/* one copy of each loop per query count, so the accumulators stay in registers */
#define BY_COUNT(call_with)                                                               \
    switch (count) {                                                                      \
    case 1: call_with(1); break; case 2: call_with(2); break; case 3: call_with(3); break; \
    case 4: call_with(4); break; case 5: call_with(5); break; case 6: call_with(6); break; \
    case 7: call_with(7); break; default: call_with(8); break;                            \
    }

/* each query's probabilities over positions 0..its own (zero beyond, so a query's bits do not depend
 * on the later rows of its call), unnormalised; norms[q] = 1 / their sum */
static void softmax_rows(float *scores, int count, int positions, const int *last, float *norms) {
    ivec lane = {0};
    for (int i = 0; i < LANES; i++) lane[i] = i;
    for (int q = 0; q < count; q++) {
        float *row = scores + (ptrdiff_t)q * positions, top = -INFINITY;
        vec tops = {0};
        tops -= INFINITY;
        for (int j = 0; j <= last[q]; j += LANES) { /* lanes past last[q] keep -inf */
            vec v = load(row, j, positions);
            tops = pick(lane + j <= last[q] & v > tops, v, tops);
        }
        for (int i = 0; i < LANES; i++) top = tops[i] > top ? tops[i] : top;
        vec sum = {0}, zero = {0};
        for (int j = 0; j < positions; j += LANES) {
            vec e = pick(lane + j <= last[q], exp_lanes(load(row, j, positions) - top), zero);
            store(row, j, positions, e);
            sum += e;
        }
        norms[q] = 1.0f / total(sum);
    }
}

/* causal attention of one kv head's query group: queries (rows x group, head_dim), row r's queries at position
 * start + r; keys_t (head_dim, key_stride), values (n_positions, head_dim); out row r, head group*kv+g */
static void attend(const float *queries, int rows, int group, int start, const float *keys_t,
                   int key_stride, const float *values, int head_dim, float *work, float *out, int out_width,
                   int head0) {
    int total_queries = rows * group, positions = start + rows;
    float scales[QUERY_BLOCK];
    for (int q = 0; q < QUERY_BLOCK; q++) scales[q] = 1.0f / sqrtf((float)head_dim);
    float *scores = work, *norms = scores + (ptrdiff_t)total_queries * positions;
    int *last = (int *)(norms + total_queries);
    for (int q = 0; q < total_queries; q++) last[q] = start + q / group;
    for (int q0 = 0; q0 < total_queries; q0 += QUERY_BLOCK) {
        int count = total_queries - q0 < QUERY_BLOCK ? total_queries - q0 : QUERY_BLOCK;
#define SCORES(n) score_block(queries + (ptrdiff_t)q0 * head_dim, n, keys_t, key_stride, positions, head_dim, \
                              scales, scores + (ptrdiff_t)q0 * positions)
        BY_COUNT(SCORES)
#undef SCORES
    }
    softmax_rows(scores, total_queries, positions, last, norms);
    float *block = (float *)(last + total_queries); /* QUERY_BLOCK x head_dim */
    for (int q0 = 0; q0 < total_queries; q0 += QUERY_BLOCK) {
        int count = total_queries - q0 < QUERY_BLOCK ? total_queries - q0 : QUERY_BLOCK;
#define VALUES(n) value_block(scores + (ptrdiff_t)q0 * positions, norms + q0, n, values, positions, head_dim, \
                              block)
        BY_COUNT(VALUES)
#undef VALUES
        for (int q = q0; q < q0 + count; q++) /* query q: row q / group, head head0 + q % group */
            memcpy(out + (ptrdiff_t)(q / group) * out_width + (ptrdiff_t)(head0 + q % group) * head_dim,
                   block + (ptrdiff_t)(q - q0) * head_dim, sizeof(float) * (size_t)head_dim);
    }
}

/* silu(gate) * up over one row */
static void silu_times(const float *gate, const float *up, float *out, int count) {
    for (int i = 0; i < count; i += LANES) {
        vec g = load(gate, i, count);
        store(out, i, count, g / (1.0f + exp_lanes(-g)) * load(up, i, count));
    }
}

/* one segment's keys (rotated) and values into its slot of the cache: fused holds its rows' q/k/v products,
 * row r at position start + r; rotated is head_dim floats of room */
static void write_cache(const float *fused, int count, int start, const float *cos, const float *sin, float *keys,
                        int key_stride, float *values, int n_positions, int q_width, int kv_heads, int head_dim,
                        float *rotated) {
    int kv_width = kv_heads * head_dim, qkv_width = q_width + 2 * kv_width;
    for (int r = 0; r < count; r++) {
        int position = start + r;
        const float *row = fused + (ptrdiff_t)r * qkv_width;
        const float *c = cos + (ptrdiff_t)position * head_dim, *s = sin + (ptrdiff_t)position * head_dim;
        for (int h = 0; h < kv_heads; h++) {
            float *key_t = keys + (ptrdiff_t)h * head_dim * key_stride + position;
            float *value = values + ((ptrdiff_t)h * n_positions + position) * head_dim;
            rotate(row + q_width + h * head_dim, c, s, rotated, head_dim);
            for (int i = 0; i < head_dim; i++) key_t[(ptrdiff_t)i * key_stride] = rotated[i];
            for (int i = 0; i < head_dim; i++) value[i] = row[q_width + kv_width + h * head_dim + i];
        }
    }
}

/* floats of scratch one attention task (a segment's rows, one kv head) works in: its rotated queries
 * (count x group x head_dim), then attend's scores, norms, last positions and block */
static ptrdiff_t task_floats(int count, int start, int group, int head_dim) {
    return (ptrdiff_t)count * group * (head_dim + start + count + 2) + QUERY_BLOCK * head_dim;
}

/* the first row of segment s in x, and where its tasks' scratch begins (tasks in segment order, then heads) */
static void segment_place(const int *spans, int s, int kv_heads, int group, int head_dim, int *row, ptrdiff_t *at) {
    *row = 0;
    *at = 0;
    for (int i = 0; i < s; i++) {
        *row += spans[3 * i + 2];
        *at += kv_heads * task_floats(spans[3 * i + 2], spans[3 * i + 1], group, head_dim);
    }
}

/* one segment's rows attend to their own slot through kv head h: their queries of that head's group are
 * rotated into `work` first; the results go to heads h*group.. of out (count, q_width) */
static void attend_head(const float *fused, int count, int start, int h, const float *cos, const float *sin,
                        const float *keys, int key_stride, const float *values, int n_positions, int heads,
                        int kv_heads, int head_dim, float *work, float *out) {
    int q_width = heads * head_dim, qkv_width = q_width + 2 * kv_heads * head_dim, group = heads / kv_heads;
    float *queries = work;
    for (int r = 0; r < count; r++) {
        const float *c = cos + (ptrdiff_t)(start + r) * head_dim, *s = sin + (ptrdiff_t)(start + r) * head_dim;
        for (int g = 0; g < group; g++)
            rotate(fused + (ptrdiff_t)r * qkv_width + (h * group + g) * head_dim, c, s,
                   queries + ((ptrdiff_t)r * group + g) * head_dim, head_dim);
    }
    attend(queries, count, group, start, keys + (ptrdiff_t)h * head_dim * key_stride, key_stride,
           values + (ptrdiff_t)h * n_positions * head_dim, head_dim, queries + (ptrdiff_t)count * group * head_dim,
           out, q_width, h * group);
}

/* x (rows, hidden) is updated in place, rows = the sum of the segments' row counts. Segment s (spans[3s..3s+2]:
 * cache slot, first position, rows) owns the next rows of x; its keys and values go to positions start.. of
 * its slot, and its rows attend to that slot only. keys: per slot (kv_heads, head_dim, key_stride: transposed;
 * key_stride >= n_positions, padded so that a position's head_dim floats fall in different L1 sets), slots
 * key_slot_stride floats apart; values: per slot (kv_heads, n_positions, head_dim), value_slot_stride apart;
 * cos/sin (n_positions, head_dim); scratch holds LayerShape.scratch_floats (row_kernel.py) floats. The four
 * products run once over all rows (each weight read once); attention runs as one task per (segment, kv head),
 * on the threads, each in its own scratch, so its result does not depend on the thread count. */
void llama_layer(float *x, int segments, const int *spans, const float *attn_norm, const float *qkv,
                 const float *o, const float *mlp_norm, const float *gate_up, const float *down, float *keys,
                 float *values, int key_stride, ptrdiff_t key_slot_stride, int n_positions,
                 ptrdiff_t value_slot_stride, const float *cos, const float *sin, int hidden, int heads, int kv_heads,
                 int head_dim, int inter, float eps, float *scratch, int threads) {
    int q_width = heads * head_dim, qkv_width = q_width + 2 * kv_heads * head_dim, group = heads / kv_heads;
    int rows = 0;
    for (int s = 0; s < segments; s++) rows += spans[3 * s + 2];
    float *normed = scratch;                                  /* rows x hidden */
    float *fused = normed + (ptrdiff_t)rows * hidden;         /* rows x max(qkv_width, 2 inter) */
    int fused_width = qkv_width > 2 * inter ? qkv_width : 2 * inter;
    float *mixed = fused + (ptrdiff_t)rows * fused_width;      /* rows x max(q_width, inter) */
    int mixed_width = q_width > inter ? q_width : inter;
    float *projected = mixed + (ptrdiff_t)rows * mixed_width;  /* rows x hidden */
    float *work = projected + (ptrdiff_t)rows * hidden;       /* kv_heads tasks per segment: task_floats each */

    rms_norm(x, attn_norm, normed, rows, hidden, eps);
    panel_linear(normed, qkv, fused, rows, qkv_width, hidden, threads);
    for (int s = 0, r0 = 0; s < segments; r0 += spans[3 * s + 2], s++)
        write_cache(fused + (ptrdiff_t)r0 * qkv_width, spans[3 * s + 2], spans[3 * s + 1], cos, sin,
                    keys + spans[3 * s] * key_slot_stride, key_stride, values + spans[3 * s] * value_slot_stride,
                    n_positions, q_width, kv_heads, head_dim, work);
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1)
    for (int task = 0; task < segments * kv_heads; task++) {
        int s = task / kv_heads, h = task % kv_heads, slot = spans[3 * s], start = spans[3 * s + 1];
        int count = spans[3 * s + 2], r0;
        ptrdiff_t at;
        segment_place(spans, s, kv_heads, group, head_dim, &r0, &at);
        attend_head(fused + (ptrdiff_t)r0 * qkv_width, count, start, h, cos, sin, keys + slot * key_slot_stride,
                    key_stride, values + slot * value_slot_stride, n_positions, heads, kv_heads, head_dim,
                    work + at + h * task_floats(count, start, group, head_dim), mixed + (ptrdiff_t)r0 * q_width);
    }
    panel_linear(mixed, o, projected, rows, hidden, q_width, threads);
    for (ptrdiff_t i = 0; i < (ptrdiff_t)rows * hidden; i++) x[i] += projected[i];

    rms_norm(x, mlp_norm, normed, rows, hidden, eps);
    panel_linear(normed, gate_up, fused, rows, 2 * inter, hidden, threads);
    for (int r = 0; r < rows; r++) {
        const float *gate = fused + (ptrdiff_t)r * 2 * inter, *up = gate + inter;
        silu_times(gate, up, mixed + (ptrdiff_t)r * inter, inter);
    }
    panel_linear(mixed, down, projected, rows, hidden, inter, threads);
    for (ptrdiff_t i = 0; i < (ptrdiff_t)rows * hidden; i++) x[i] += projected[i];
}
