/* One Llama decoder layer for a few rows, in one call: what the compact forward does with ~25 torch
 * ops per layer (RMS norms, rotary, KV-cache writes, attention, SiLU, residuals) costs ~0.5 ms of
 * dispatch per layer at one row; here it is arithmetic only. The same order of operations as
 * Hugging Face's LlamaDecoderLayer, in fp32; the four matrix products go through panel_linear.
 *
 * Every row is computed on its own (its attention reads cache slots 0..its position), so a row's
 * result does not depend on how many rows came with it.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

typedef float vec __attribute__((vector_size(64), aligned(4)));
typedef int ivec __attribute__((vector_size(64), aligned(4)));
#define LANES 16

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

/* softmax(q.K^T / sqrt(d)) V over slots 0..last for one query row of one head */
static void attend(const float *q, const float *keys, const float *values, int last, int head_dim,
                   float *scores, float *out) {
    float scale = 1.0f / sqrtf((float)head_dim), top = -INFINITY;
    int slots = last + 1;
    for (int s = 0; s < slots; s++) {
        scores[s] = dot(q, keys + (ptrdiff_t)s * head_dim, head_dim) * scale;
        top = scores[s] > top ? scores[s] : top;
    }
    vec sum = {0};
    for (int s = 0; s < slots; s += LANES) {
        vec e = exp_lanes(load(scores, s, slots) - top);
        if (s + LANES > slots)
            for (int lane = slots - s; lane < LANES; lane++) e[lane] = 0.0f;
        store(scores, s, slots, e);
        sum += e;
    }
    float norm = 1.0f / total(sum);
    for (int i = 0; i < head_dim; i += LANES) {
        vec acc = {0};
        for (int s = 0; s < slots; s++) acc += scores[s] * load(values + (ptrdiff_t)s * head_dim, i, head_dim);
        store(out, i, head_dim, acc * norm);
    }
}

/* silu(gate) * up over one row */
static void silu_times(const float *gate, const float *up, float *out, int count) {
    for (int i = 0; i < count; i += LANES) {
        vec g = load(gate, i, count);
        store(out, i, count, g / (1.0f + exp_lanes(-g)) * load(up, i, count));
    }
}

/* x (rows, hidden) is updated in place; keys/values (kv_heads, n_positions, head_dim) get slots
 * start..start+rows-1; cos/sin (n_positions, head_dim); scratch holds llama_layer_scratch() floats */
void llama_layer(float *x, int rows, int start, const float *attn_norm, const float *qkv, const float *o,
                 const float *mlp_norm, const float *gate_up, const float *down, float *keys, float *values,
                 int n_positions, const float *cos, const float *sin, int hidden, int heads, int kv_heads,
                 int head_dim, int inter, float eps, float *scratch, int threads) {
    int q_width = heads * head_dim, kv_width = kv_heads * head_dim, qkv_width = q_width + 2 * kv_width;
    int group = heads / kv_heads;
    float *normed = scratch;                                  /* rows x hidden */
    float *fused = normed + (ptrdiff_t)rows * hidden;         /* rows x max(qkv_width, 2 inter) */
    int fused_width = qkv_width > 2 * inter ? qkv_width : 2 * inter;
    float *mixed = fused + (ptrdiff_t)rows * fused_width;      /* rows x max(q_width, inter) */
    int mixed_width = q_width > inter ? q_width : inter;
    float *projected = mixed + (ptrdiff_t)rows * mixed_width;  /* rows x hidden */
    float *q = projected + (ptrdiff_t)rows * hidden;           /* head_dim */
    float *scores = q + head_dim;                              /* start + rows */

    rms_norm(x, attn_norm, normed, rows, hidden, eps);
    panel_linear(normed, qkv, fused, rows, qkv_width, hidden, threads);
    for (int r = 0; r < rows; r++) {
        int slot = start + r;
        const float *row = fused + (ptrdiff_t)r * qkv_width;
        const float *c = cos + (ptrdiff_t)slot * head_dim, *s = sin + (ptrdiff_t)slot * head_dim;
        for (int h = 0; h < kv_heads; h++) {
            float *key = keys + ((ptrdiff_t)h * n_positions + slot) * head_dim;
            float *value = values + ((ptrdiff_t)h * n_positions + slot) * head_dim;
            rotate(row + q_width + h * head_dim, c, s, key, head_dim);
            for (int i = 0; i < head_dim; i++) value[i] = row[q_width + kv_width + h * head_dim + i];
        }
    }
    for (int r = 0; r < rows; r++) {
        int slot = start + r;
        const float *c = cos + (ptrdiff_t)slot * head_dim, *s = sin + (ptrdiff_t)slot * head_dim;
        for (int h = 0; h < heads; h++) {
            int kv = h / group;
            rotate(fused + (ptrdiff_t)r * qkv_width + h * head_dim, c, s, q, head_dim);
            attend(q, keys + (ptrdiff_t)kv * n_positions * head_dim, values + (ptrdiff_t)kv * n_positions * head_dim,
                   slot, head_dim, scores, mixed + (ptrdiff_t)r * q_width + h * head_dim);
        }
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
