/* Llama decoder layers for a few rows, in one call: what the compact forward does with ~25 torch ops per layer
 * (RMS norms, rotary, KV-cache writes, attention, SiLU, residuals) costs ~0.5 ms of dispatch per layer at one row;
 * here it is arithmetic only. The same order of operations as Hugging Face's LlamaDecoderLayer, in fp32 (the
 * KV cache in fp32 or bf16); the four matrix products go through matrix_linear (fp32 panels or a GGUF's blocks).
 *
 * Every row is computed on its own (its attention reads its own sequence's positions 0..its position), so a
 * row's result does not depend on how many rows came with it, nor on which other sequences share the call.
 *
 * Attention reads the cache at memory speed: a decode step of 8 sequences at 500 positions reads 8 caches of
 * 23 MB (fp32) beside the 538 MB of weights. Keys are stored in tiles of TILE positions, each tile (head_dim,
 * TILE) contiguous, so a block of positions is one stream (scored a vector of positions at a time, no horizontal
 * sums); values (n_positions, head_dim) are read in one pass, every head dimension at once; each query keeps
 * several accumulators in flight (two tiles at a time; one chain per vector of the head); the next tiles and
 * rows are prefetched.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifdef __AVX512F__
#define LANES 16
#define SCORE_QUERIES 8 /* x 2 tiles: 16 accumulators of 32 registers */
#define TILES_AT_ONCE 2
#define VALUE_QUERIES 6 /* x VALUE_VECS: 24 accumulators */
#else
#define LANES 8 /* AVX2, NEON: two or one registers a vector */
#define SCORE_QUERIES 6 /* x 1 tile of 2 vectors: 12 accumulators of 16 registers */
#define TILES_AT_ONCE 1
#define VALUE_QUERIES 3 /* x VALUE_VECS: 12 accumulators */
#endif
#define TILE 16 /* positions per key tile, on every build: the cache's layout does not depend on the CPU */
#define TILE_VECS (TILE / LANES)
#define VALUE_VECS 4 /* vectors of a value row summed at once: a head_dim of 64 in one pass (AVX-512) */
/* prefetch distances, tuned on 8 caches of 500 positions read cold (benchmarks/attention_read.c): 2 tiles and 8 rows
 * ahead left bf16 attention at about 60 % of a plain read's speed on a loaded 2-core machine, 8 and 32 at about 75 %;
 * nothing is prefetched past a cache's last position (at 100 positions that cost fp32 attention a fifth) */
#define TILES_AHEAD 8 /* key tiles prefetched ahead of the ones being scored */
#define VALUES_AHEAD 32 /* value rows prefetched ahead */

typedef float vec __attribute__((vector_size(4 * LANES), aligned(4)));
typedef int ivec __attribute__((vector_size(4 * LANES), aligned(4)));
typedef unsigned short half_vec __attribute__((vector_size(2 * LANES), aligned(2)));

void matrix_linear(const float *x, const void *weights, int format, float *y, int rows, int n, int k, int threads);

/* One decoder layer's weights (row_kernel.c's fp32 panels or block panels, each matrix in its `formats` entry: q/k/v,
 * o, gate/up, down) and cache. keys: per slot (kv_heads, tiles, head_dim, TILE),
 * tiles = ceil(n_positions / TILE); values: per slot (kv_heads, n_positions, head_dim); fp32 or bf16 elements. */
struct layer_weights {
    const float *attn_norm;
    const void *qkv, *o;
    const float *mlp_norm;
    const void *gate_up, *down;
    int formats[4];
    void *keys, *values;
};

/* What stays the same for every call of a model: its shape, its layers, its cache's geometry, its rotary tables
 * cos / sign-folded sin (n_positions, head_dim). */
struct llama_model {
    const struct layer_weights *layers;
    int layer_count, hidden, heads, kv_heads, head_dim, inter;
    float eps;
    int n_positions, kv_bf16;
    const float *cos, *sin;
};

/* One call: x (rows, hidden), updated in place; segment s (spans[3s..3s+2]: cache slot, first position, rows) owns
 * the next rows of x, writes its keys and values at positions start.. of its slot and attends to that slot only;
 * scratch holds llama_scratch_floats(call) floats. */
struct layer_call {
    const struct llama_model *model;
    float *x;
    int rows, segments;
    const int *spans;
    float *scratch;
    int threads;
};

int key_tile(void) { return TILE; }

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

/* bf16 lanes as fp32: the upper halves of the fp32 bits (one zero-extension and one shift) */
static inline vec widen(half_vec h) {
    vec v;
#if defined(__AVX512F__)
    __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
#elif defined(__AVX2__)
    __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32((__m128i)h), 16);
#else
    ivec bits = __builtin_convertvector(h, ivec) << 16;
#endif
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* `count` (at most LANES) cache elements from element `at` of `cache` as floats, zeros past them: bf16 is the upper
 * half of an fp32 */
static inline __attribute__((always_inline)) vec load_cached(const void *cache, ptrdiff_t at, int count, int bf16) {
    if (!bf16) {
        if (count >= LANES) return *(const vec *)((const float *)cache + at);
        vec v = {0};
        memcpy(&v, (const float *)cache + at, sizeof(float) * (size_t)count);
        return v;
    }
    half_vec h = {0};
    if (count >= LANES) memcpy(&h, (const uint16_t *)cache + at, sizeof h);
    else memcpy(&h, (const uint16_t *)cache + at, sizeof(uint16_t) * (size_t)count);
    return widen(h);
}

/* every cache line of `count` cache elements from element `at` on, into L1 */
static inline __attribute__((always_inline)) void prefetch_row(const void *cache, ptrdiff_t at, int count, int bf16) {
    const char *first = (const char *)cache + at * (bf16 ? 2 : 4);
    for (int byte = 0; byte < count * (bf16 ? 2 : 4); byte += 64) __builtin_prefetch(first + byte, 0, 3);
}

/* torch's float -> bfloat16: round to nearest even, NaN to 0x7FC0 (c10/util/BFloat16.h round_to_nearest_even) */
static inline uint16_t to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if (value != value) return 0x7FC0;
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

static inline void store_cached(void *cache, ptrdiff_t at, int bf16, float value) {
    if (bf16) ((uint16_t *)cache)[at] = to_bf16(value);
    else ((float *)cache)[at] = value;
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

/* scores[q][t0 * TILE + ..] for `tiles` tiles from tile t0 (count <= SCORE_QUERIES queries): one chain of
 * fused multiply-adds over the head dimensions per (query, vector of positions), in order, whatever the tile
 * pairing or the count, so a query's scores do not depend on the queries or tiles beside it. */
static inline __attribute__((always_inline)) void score_tiles(
    const void *keys, int t0, int tiles, int all_tiles, int head_dim, const float *restrict queries, int count,
    float scale, float *restrict scores, int score_stride, int bf16) {
    ptrdiff_t tile_size = (ptrdiff_t)head_dim * TILE;
    vec acc[SCORE_QUERIES][TILES_AT_ONCE][TILE_VECS];
    for (int q = 0; q < SCORE_QUERIES; q++)
        for (int t = 0; t < TILES_AT_ONCE; t++)
            for (int v = 0; v < TILE_VECS; v++) acc[q][t][v] = (vec){0};
    ptrdiff_t base = (ptrdiff_t)t0 * tile_size;
    for (int d = 0; d < head_dim; d++) {
        vec key[TILES_AT_ONCE][TILE_VECS];
        for (int t = 0; t < TILES_AT_ONCE; t++) {
            if (t >= tiles) break;
            ptrdiff_t at = base + t * tile_size + (ptrdiff_t)d * TILE;
            if (t0 + t + TILES_AHEAD < all_tiles) /* past the last tile it would only spend bandwidth */
                __builtin_prefetch(bf16 ? (const void *)((const uint16_t *)keys + at + TILES_AHEAD * tile_size)
                                        : (const void *)((const float *)keys + at + TILES_AHEAD * tile_size),
                                   0, 3);
            for (int v = 0; v < TILE_VECS; v++) key[t][v] = load_cached(keys, at + v * LANES, LANES, bf16);
        }
        for (int q = 0; q < SCORE_QUERIES; q++) {
            if (q >= count) break;
            float w = queries[(ptrdiff_t)q * head_dim + d];
            for (int t = 0; t < TILES_AT_ONCE; t++) {
                if (t >= tiles) break;
                for (int v = 0; v < TILE_VECS; v++) acc[q][t][v] += key[t][v] * w;
            }
        }
    }
    for (int q = 0; q < SCORE_QUERIES; q++) {
        if (q >= count) break;
        for (int t = 0; t < TILES_AT_ONCE; t++) {
            if (t >= tiles) break;
            for (int v = 0; v < TILE_VECS; v++)
                *(vec *)(scores + (ptrdiff_t)q * score_stride + (t0 + t) * TILE + v * LANES) = acc[q][t][v] * scale;
        }
    }
}

/* out[q][i0..i0 + vecs * LANES) (the last vector's first `last_lanes` lanes) = norms[q] * sum over t < positions of
 * probs[q][t] * values[t][i0..]: one pass over the value rows, one chain per (query, vector) in position order.
 * `count` and `vecs` are constants where it is inlined (one copy each), so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void value_rows(
    const void *values, int positions, int head_dim, int i0, const float *restrict probs, int prob_stride,
    const float *restrict norms, int count, int vecs, int last_lanes, float *restrict out, int bf16) {
    vec acc[VALUE_QUERIES][VALUE_VECS];
    for (int q = 0; q < VALUE_QUERIES; q++)
        for (int v = 0; v < VALUE_VECS; v++) acc[q][v] = (vec){0};
    for (int t = 0; t < positions; t++) {
        ptrdiff_t at = (ptrdiff_t)t * head_dim + i0;
        if (t + VALUES_AHEAD < positions) prefetch_row(values, at + VALUES_AHEAD * head_dim, vecs * LANES, bf16);
        vec row[VALUE_VECS];
        for (int v = 0; v < VALUE_VECS; v++) {
            if (v >= vecs) break;
            row[v] = load_cached(values, at + v * LANES, v + 1 < vecs ? LANES : last_lanes, bf16);
        }
        for (int q = 0; q < VALUE_QUERIES; q++) {
            if (q >= count) break;
            float p = probs[(ptrdiff_t)q * prob_stride + t];
            for (int v = 0; v < VALUE_VECS; v++) {
                if (v >= vecs) break;
                acc[q][v] += row[v] * p;
            }
        }
    }
    for (int q = 0; q < VALUE_QUERIES; q++) {
        if (q >= count) break;
        for (int v = 0; v < VALUE_VECS; v++) {
            if (v >= vecs) break;
            int lanes = v + 1 < vecs ? LANES : last_lanes;
            store(out + (ptrdiff_t)q * head_dim + i0 + v * LANES, 0, lanes, acc[q][v] * norms[q]);
        }
    }
}

/* value_rows with `vecs` a constant, and whole vectors a constant too: one copy per vector count */
static inline __attribute__((always_inline)) void value_chunk(
    const void *values, int positions, int head_dim, int i0, const float *restrict probs, int prob_stride,
    const float *restrict norms, int count, int vecs, int last_lanes, float *restrict out, int bf16) {
#define ROWS(n, lanes) \
    value_rows(values, positions, head_dim, i0, probs, prob_stride, norms, count, n, lanes, out, bf16)
#define VECS(n)                          \
    case n:                              \
        if (last_lanes == LANES)         \
            ROWS(n, LANES);              \
        else                             \
            ROWS(n, last_lanes);         \
        break;
    switch (vecs) {
        VECS(1)
        VECS(2)
        VECS(3)
        VECS(VALUE_VECS)
    }
#undef VECS
#undef ROWS
}

/* one copy of each loop per query count, so the accumulators stay in registers */
#define BY_COUNT(call_with, most)                                                                    \
    switch (count < (most) ? count : (most)) {                                                       \
    case 1: call_with(1); break; case 2: call_with(2); break; case 3: call_with(3); break;            \
    case 4: call_with(4); break; case 5: call_with(5); break; case 6: call_with(6); break;            \
    case 7: call_with(7); break; default: call_with(8); break;                                       \
    }

/* each query's probabilities over positions 0..its own (zero beyond, up to `positions`, so a query's bits do not
 * depend on the later rows of its call), unnormalised; norms[q] = 1 / their sum */
static void softmax_rows(float *scores, int stride, int count, int positions, const int *last, float *norms) {
    ivec lane = {0};
    for (int i = 0; i < LANES; i++) lane[i] = i;
    for (int q = 0; q < count; q++) {
        float *row = scores + (ptrdiff_t)q * stride, top = -INFINITY;
        vec tops = {0};
        tops -= INFINITY;
        for (int j = 0; j <= last[q]; j += LANES) { /* lanes past last[q] keep -inf */
            vec v = load(row, j, stride);
            tops = pick((lane + j <= last[q]) & (v > tops), v, tops);
        }
        for (int i = 0; i < LANES; i++) top = tops[i] > top ? tops[i] : top;
        vec sum = {0}, zero = {0};
        for (int j = 0; j < positions; j += LANES) {
            vec e = pick(lane + j <= last[q], exp_lanes(load(row, j, stride) - top), zero);
            store(row, j, stride, e);
            sum += e;
        }
        norms[q] = 1.0f / total(sum);
    }
}

/* causal attention of a block of count <= SCORE_QUERIES queries (last[q]: the last position query q sees,
 * nondecreasing) against one kv head's keys and values; their outputs to out (count, head_dim). Positions past
 * the block's last are neither scored nor read: a prompt chunk's early rows skip its later positions. */
static inline __attribute__((always_inline)) void attend_block(
    const float *queries, int count, const int *last, const void *keys, const void *values, int head_dim,
    float *scores, float *out, int bf16) {
    int positions = last[count - 1] + 1, tiles = (positions + TILE - 1) / TILE, stride = tiles * TILE;
    float scale = 1.0f / sqrtf((float)head_dim), norms[SCORE_QUERIES];
    for (int t = 0; t < TILES_AHEAD && t < tiles; t++) /* the first tiles the scores read (the loop fetches ahead) */
        prefetch_row(keys, (ptrdiff_t)t * head_dim * TILE, head_dim * TILE, bf16);
    for (int t0 = 0; t0 < tiles; t0 += TILES_AT_ONCE) {
#define SCORES(n)                                                                                   \
    if (tiles - t0 >= TILES_AT_ONCE)                                                                \
        score_tiles(keys, t0, TILES_AT_ONCE, tiles, head_dim, queries, n, scale, scores, stride, bf16);    \
    else                                                                                            \
        score_tiles(keys, t0, 1, tiles, head_dim, queries, n, scale, scores, stride, bf16);
        BY_COUNT(SCORES, SCORE_QUERIES)
#undef SCORES
    }
    for (int t = 0; t < VALUES_AHEAD && t < positions; t++) /* the first rows the values pass reads */
        prefetch_row(values, (ptrdiff_t)t * head_dim, head_dim, bf16);
    softmax_rows(scores, stride, count, positions, last, norms);
    for (int q0 = 0; q0 < count; q0 += VALUE_QUERIES) {
        int n_q = count - q0 < VALUE_QUERIES ? count - q0 : VALUE_QUERIES;
        for (int i0 = 0; i0 < head_dim; i0 += VALUE_VECS * LANES) {
            int width = head_dim - i0 < VALUE_VECS * LANES ? head_dim - i0 : VALUE_VECS * LANES;
            int vecs = (width + LANES - 1) / LANES, last_lanes = width - (vecs - 1) * LANES;
#define VALUES(n) value_chunk(values, positions, head_dim, i0, scores + (ptrdiff_t)q0 * stride, stride, norms + q0, n, \
                              vecs, last_lanes, out + (ptrdiff_t)q0 * head_dim, bf16)
            int count = n_q;
            BY_COUNT(VALUES, VALUE_QUERIES)
#undef VALUES
        }
    }
}

/* floats of scratch one attention task needs: its rotated queries (count rows x group), then one block's last
 * positions, scores and outputs */
static ptrdiff_t task_floats(int count, int start, int group, int head_dim) {
    int tiles = (start + count + TILE - 1) / TILE;
    return (ptrdiff_t)count * group * head_dim + SCORE_QUERIES * (1 + (ptrdiff_t)tiles * TILE + head_dim);
}

/* one segment's rows attend to their own slot through kv head h: their queries of that head's group, rotated,
 * in blocks of SCORE_QUERIES; the results go to heads h*group.. of out (count, q_width) */
static inline __attribute__((always_inline)) void attend_head(
    const struct llama_model *m, const float *fused, int count, int start, int h, const void *keys,
    const void *values, float *work, float *out, int bf16) {
    int q_width = m->heads * m->head_dim, qkv_width = q_width + 2 * m->kv_heads * m->head_dim;
    int group = m->heads / m->kv_heads, head_dim = m->head_dim, total_queries = count * group;
    float *queries = work;
    int *last = (int *)(queries + (ptrdiff_t)total_queries * head_dim);
    float *block = (float *)(last + SCORE_QUERIES), *scores = block + SCORE_QUERIES * head_dim;
    for (int r = 0; r < count; r++) {
        const float *c = m->cos + (ptrdiff_t)(start + r) * head_dim, *s = m->sin + (ptrdiff_t)(start + r) * head_dim;
        for (int g = 0; g < group; g++)
            rotate(fused + (ptrdiff_t)r * qkv_width + (h * group + g) * head_dim, c, s,
                   queries + ((ptrdiff_t)r * group + g) * head_dim, head_dim);
    }
    for (int q0 = 0; q0 < total_queries; q0 += SCORE_QUERIES) {
        int n = total_queries - q0 < SCORE_QUERIES ? total_queries - q0 : SCORE_QUERIES;
        for (int q = 0; q < n; q++) last[q] = start + (q0 + q) / group;
        attend_block(queries + (ptrdiff_t)q0 * head_dim, n, last, keys, values, head_dim, scores, block, bf16);
        for (int q = q0; q < q0 + n; q++) /* query q: row q / group, head h * group + q % group */
            memcpy(out + (ptrdiff_t)(q / group) * q_width + (ptrdiff_t)(h * group + q % group) * head_dim,
                   block + (ptrdiff_t)(q - q0) * head_dim, sizeof(float) * (size_t)head_dim);
    }
}

static void attend_head_f32(const struct llama_model *m, const float *fused, int count, int start, int h,
                            const void *keys, const void *values, float *work, float *out) {
    attend_head(m, fused, count, start, h, keys, values, work, out, 0);
}

static void attend_head_bf16(const struct llama_model *m, const float *fused, int count, int start, int h,
                             const void *keys, const void *values, float *work, float *out) {
    attend_head(m, fused, count, start, h, keys, values, work, out, 1);
}

/* silu(gate) * up over one row */
static void silu_times(const float *gate, const float *up, float *out, int count) {
    for (int i = 0; i < count; i += LANES) {
        vec g = load(gate, i, count);
        store(out, i, count, g / (1.0f + exp_lanes(-g)) * load(up, i, count));
    }
}

static ptrdiff_t key_head_size(const struct llama_model *m) {
    return (ptrdiff_t)((m->n_positions + TILE - 1) / TILE) * TILE * m->head_dim;
}

static ptrdiff_t value_head_size(const struct llama_model *m) { return (ptrdiff_t)m->n_positions * m->head_dim; }

/* one segment's keys (rotated) and values into its slot of the cache (keys, values: the slot's): fused holds its
 * rows' q/k/v products, row r at position start + r; rotated is head_dim floats of room */
static void write_cache(const struct llama_model *m, const float *fused, int count, int start, void *keys,
                        void *values, float *rotated) {
    int head_dim = m->head_dim, q_width = m->heads * head_dim, kv_width = m->kv_heads * head_dim;
    int qkv_width = q_width + 2 * kv_width;
    for (int r = 0; r < count; r++) {
        int position = start + r;
        const float *row = fused + (ptrdiff_t)r * qkv_width;
        const float *c = m->cos + (ptrdiff_t)position * head_dim, *s = m->sin + (ptrdiff_t)position * head_dim;
        for (int h = 0; h < m->kv_heads; h++) {
            ptrdiff_t key = h * key_head_size(m) + (ptrdiff_t)(position / TILE) * TILE * head_dim + position % TILE;
            ptrdiff_t value = h * value_head_size(m) + (ptrdiff_t)position * head_dim;
            rotate(row + q_width + h * head_dim, c, s, rotated, head_dim);
            for (int i = 0; i < head_dim; i++) store_cached(keys, key + (ptrdiff_t)i * TILE, m->kv_bf16, rotated[i]);
            for (int i = 0; i < head_dim; i++)
                store_cached(values, value + i, m->kv_bf16, row[q_width + kv_width + h * head_dim + i]);
        }
    }
}

/* a slot's part of a layer's keys or values */
static void *slot_of(void *cache, int slot, ptrdiff_t head_size, const struct llama_model *m) {
    ptrdiff_t at = (ptrdiff_t)slot * m->kv_heads * head_size;
    return m->kv_bf16 ? (void *)((uint16_t *)cache + at) : (void *)((float *)cache + at);
}

static ptrdiff_t fused_width(const struct llama_model *m) {
    int qkv_width = (m->heads + 2 * m->kv_heads) * m->head_dim;
    return qkv_width > 2 * m->inter ? qkv_width : 2 * m->inter;
}

static ptrdiff_t mixed_width(const struct llama_model *m) {
    int q_width = m->heads * m->head_dim;
    return q_width > m->inter ? q_width : m->inter;
}

/* this thread's number in the parallel region it runs in (0 outside one, or without OpenMP) */
static int thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* the floats a call's scratch must hold: the rows' buffers, then one task's room per thread */
ptrdiff_t llama_scratch_floats(const struct layer_call *call) {
    const struct llama_model *m = call->model;
    ptrdiff_t task = m->head_dim, group = m->heads / m->kv_heads;
    for (int s = 0; s < call->segments; s++) {
        ptrdiff_t need = task_floats(call->spans[3 * s + 2], call->spans[3 * s + 1], (int)group, m->head_dim);
        task = need > task ? need : task;
    }
    return (ptrdiff_t)call->rows * (2 * m->hidden + fused_width(m) + mixed_width(m)) + call->threads * task;
}

/* layers first..last-1 of the model on the call's rows. The four products run once over all rows (each weight read
 * once); attention runs as one task per (segment, kv head), on the threads, each in its thread's scratch, so its
 * result does not depend on the thread count. */
void llama_layers(const struct layer_call *call, int first, int last) {
    const struct llama_model *m = call->model;
    int rows = call->rows, segments = call->segments, hidden = m->hidden, inter = m->inter, threads = call->threads;
    const int *spans = call->spans;
    int q_width = m->heads * m->head_dim, qkv_width = q_width + 2 * m->kv_heads * m->head_dim;
    float *x = call->x;
    float *normed = call->scratch;                                  /* rows x hidden */
    float *fused = normed + (ptrdiff_t)rows * hidden;               /* rows x fused_width */
    float *mixed = fused + (ptrdiff_t)rows * fused_width(m);        /* rows x mixed_width */
    float *projected = mixed + (ptrdiff_t)rows * mixed_width(m);    /* rows x hidden */
    float *work = projected + (ptrdiff_t)rows * hidden;             /* per thread: task_floats */
    ptrdiff_t task = (llama_scratch_floats(call) - (work - call->scratch)) / threads;
    ptrdiff_t key_head = key_head_size(m), value_head = value_head_size(m);
    for (int layer = first; layer < last; layer++) {
        const struct layer_weights *w = &m->layers[layer];
        rms_norm(x, w->attn_norm, normed, rows, hidden, m->eps);
        matrix_linear(normed, w->qkv, w->formats[0], fused, rows, qkv_width, hidden, threads);
        for (int s = 0, r0 = 0; s < segments; r0 += spans[3 * s + 2], s++)
            write_cache(m, fused + (ptrdiff_t)r0 * qkv_width, spans[3 * s + 2], spans[3 * s + 1],
                        slot_of(w->keys, spans[3 * s], key_head, m), slot_of(w->values, spans[3 * s], value_head, m),
                        work);
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1)
        for (int t = 0; t < segments * m->kv_heads; t++) {
            int s = t / m->kv_heads, h = t % m->kv_heads, slot = spans[3 * s], start = spans[3 * s + 1];
            int count = spans[3 * s + 2], r0 = 0;
            for (int i = 0; i < s; i++) r0 += spans[3 * i + 2];
            float *own = work + thread_index() * task;
            const void *keys = slot_of(w->keys, slot, key_head, m), *values = slot_of(w->values, slot, value_head, m);
            keys = m->kv_bf16 ? (const void *)((const uint16_t *)keys + h * key_head)
                              : (const void *)((const float *)keys + h * key_head);
            values = m->kv_bf16 ? (const void *)((const uint16_t *)values + h * value_head)
                                : (const void *)((const float *)values + h * value_head);
            (m->kv_bf16 ? attend_head_bf16 : attend_head_f32)(m, fused + (ptrdiff_t)r0 * qkv_width, count, start, h,
                                                              keys, values, own, mixed + (ptrdiff_t)r0 * q_width);
        }
        matrix_linear(mixed, w->o, w->formats[1], projected, rows, hidden, q_width, threads);
        for (ptrdiff_t i = 0; i < (ptrdiff_t)rows * hidden; i++) x[i] += projected[i];

        rms_norm(x, w->mlp_norm, normed, rows, hidden, m->eps);
        matrix_linear(normed, w->gate_up, w->formats[2], fused, rows, 2 * inter, hidden, threads);
        for (int r = 0; r < rows; r++) {
            const float *gate = fused + (ptrdiff_t)r * 2 * inter, *up = gate + inter;
            silu_times(gate, up, mixed + (ptrdiff_t)r * inter, inter);
        }
        matrix_linear(mixed, w->down, w->formats[3], projected, rows, hidden, inter, threads);
        for (ptrdiff_t i = 0; i < (ptrdiff_t)rows * hidden; i++) x[i] += projected[i];
    }
}
