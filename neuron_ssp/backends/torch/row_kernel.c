/* Few-row fp32 matrix products for speculative scoring on a CPU: y (rows, n) = x (rows, k) @ w.T.
 *
 * The weights are repacked once into panels of PANEL_COLS output columns, each panel k rows of
 * PANEL_COLS contiguous floats, so the whole matrix streams from memory once, in order, whatever the
 * row count: up to BLOCK_ROWS rows share each panel row while it is in registers (PANEL_VECS x
 * BLOCK_ROWS vector accumulators, below). More rows take the panel CHUNK_STEPS rows at a time, every
 * block of rows in turn, so the later blocks read the chunk from L1 while the stream from memory goes
 * on (the accumulators are parked in `out` between chunks). Every output element is one chain of fused
 * multiply-adds over k in order, so a row's result does not depend on how many rows came with it
 * (a width-8 call gives each row the bits a width-1 call gives it).
 *
 * GCC/Clang vector extensions, sized to the register file: with AVX-512 (32 registers of 16 floats)
 * 3 x 8 = 24 accumulators of 16 floats; elsewhere (AVX2: 16 registers of 8 floats; NEON) 2 x 6 = 12
 * accumulators of 8 floats, so the accumulators never spill.
 */
#include <stddef.h>
#include <string.h>

#ifdef __AVX512F__
#define LANES 16
#define PANEL_VECS 3
#define BLOCK_ROWS 8
#else
#define LANES 8
#define PANEL_VECS 2
#define BLOCK_ROWS 6
#endif
typedef float vec __attribute__((vector_size(4 * LANES), aligned(4)));

#define PANEL_COLS (LANES * PANEL_VECS)
#define PREFETCH_FLOATS 1024 /* prefetched 4 KiB ahead of the panel row being read, into L2 */
#define CHUNK_STEPS 32 /* panel rows per chunk with more than BLOCK_ROWS rows: 6 KiB (AVX-512), 2 KiB */

int panel_cols(void) { return PANEL_COLS; }

/* w (n, k) row-major -> panels (ceil(n / PANEL_COLS), k, PANEL_COLS), zero beyond column n */
void pack_panels(const float *w, float *panels, int n, int k) {
    int count = (n + PANEL_COLS - 1) / PANEL_COLS;
    for (int p = 0; p < count; p++) {
        float *dst = panels + (ptrdiff_t)p * k * PANEL_COLS;
        for (int c = 0; c < PANEL_COLS; c++) {
            int col = p * PANEL_COLS + c;
            for (int i = 0; i < k; i++)
                dst[(ptrdiff_t)i * PANEL_COLS + c] = col < n ? w[(ptrdiff_t)col * k + i] : 0.0f;
        }
    }
}

/* out (rows, PANEL_COLS) = or += (resume) x (rows, steps; rows x_stride apart) @ panel (steps, PANEL_COLS) */
static inline __attribute__((always_inline)) void panel_block(
    const float *restrict panel, const float *restrict x, int x_stride, int rows, int steps, int resume,
    float *restrict out) {
    vec acc[BLOCK_ROWS][PANEL_VECS];
    for (int m = 0; m < BLOCK_ROWS; m++)
        for (int v = 0; v < PANEL_VECS; v++)
            acc[m][v] = resume && m < rows ? *(const vec *)(out + m * PANEL_COLS + LANES * v) : (vec){0};
    for (int i = 0; i < steps; i++) {
        const float *row = panel + (ptrdiff_t)i * PANEL_COLS;
        vec w[PANEL_VECS];
        for (int v = 0; v < PANEL_VECS; v++) {
            __builtin_prefetch(row + PREFETCH_FLOATS + LANES * v, 0, 2);
            w[v] = *(const vec *)(row + LANES * v);
        }
        for (int m = 0; m < BLOCK_ROWS; m++)
            if (m < rows) {
                float s = x[(ptrdiff_t)m * x_stride + i]; /* vector * scalar: the scalar is broadcast */
                for (int v = 0; v < PANEL_VECS; v++) acc[m][v] += w[v] * s;
            }
    }
    for (int m = 0; m < BLOCK_ROWS; m++)
        if (m < rows)
            for (int v = 0; v < PANEL_VECS; v++) *(vec *)(out + m * PANEL_COLS + LANES * v) = acc[m][v];
}

/* one copy of the loop per row count, so the accumulators stay in registers */
static void panel_rows(const float *panel, const float *x, int x_stride, int rows, int steps, int resume, float *out) {
    switch (rows) {
#define ROWS(n) case n: panel_block(panel, x, x_stride, n, steps, resume, out); break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#if BLOCK_ROWS == 8
    ROWS(7) ROWS(8)
#endif
#undef ROWS
    default: break;
    }
}

#ifndef MAX_ROWS
#error "row_kernel.py builds this with -DMAX_ROWS=<its MAX_ROWS>: the bound its checks enforce"
#endif

/* y (rows <= MAX_ROWS, n) = x (rows, k) @ w.T, w given as pack_panels' panels; x and y row-major contiguous */
void panel_linear(const float *x, const float *panels, float *y, int rows, int n, int k, int threads) {
    int count = (n + PANEL_COLS - 1) / PANEL_COLS;
    int chunk = rows <= BLOCK_ROWS ? k : CHUNK_STEPS;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int p = 0; p < count; p++) {
        float out[MAX_ROWS * PANEL_COLS];
        int cols = n - p * PANEL_COLS < PANEL_COLS ? n - p * PANEL_COLS : PANEL_COLS;
        const float *panel = panels + (ptrdiff_t)p * k * PANEL_COLS;
        for (int i0 = 0; i0 < k; i0 += chunk) {
            int steps = k - i0 < chunk ? k - i0 : chunk;
            for (int m0 = 0; m0 < rows; m0 += BLOCK_ROWS) {
                int block = rows - m0 < BLOCK_ROWS ? rows - m0 : BLOCK_ROWS;
                panel_rows(panel + (ptrdiff_t)i0 * PANEL_COLS, x + (ptrdiff_t)m0 * k + i0, k, block, steps, i0 > 0,
                           out + m0 * PANEL_COLS);
            }
        }
        for (int m = 0; m < rows; m++)
            memcpy(y + (ptrdiff_t)m * n + (ptrdiff_t)p * PANEL_COLS, out + m * PANEL_COLS, sizeof(float) * cols);
    }
}

/* The same products on a GGUF's own quantised blocks (the embedded model is Q4_1 in its layers, Q8_0 in its head):
 * 0.75 or 1.125 bytes a weight read instead of 4. A panel's weights come in groups of GROUP steps: first PANEL_COLS
 * fp32 scales d, then (Q4) PANEL_COLS fp32 offsets m, then GROUP steps of PANEL_COLS quants: Q4 two a byte (per vector
 * of LANES columns, byte j holds column j's nibble low and column j + LANES / 2's high), Q8 one signed byte each.
 * A group is de-quantised once into a float buffer in L1 and every block of rows multiplies it there, through the
 * fp32 code above: w = q * d + m (Q4_1; Q4_0 is m = -8d) or q * d (Q8_0) is what GGUF's de-quantisation gives in
 * fp32 bit for bit, since q * d is exact (an 11-bit fp16 scale times a 4- or 8-bit integer fits fp32's 24 bits)
 * and the one addition rounds as it does there; each output is then the same chain of fused multiply-adds over k,
 * in the same order, so a row gets the fp32 kernel's bits on the de-quantised weights. */
#define GROUP 32
enum { FORMAT_F32 = 0, FORMAT_Q4 = 1, FORMAT_Q8 = 2 };
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* LANES quants of step `i`, vector `v` as floats: Q4 nibbles (byte j: lane j low, lane j + LANES / 2 high), Q8 bytes */
static inline vec q4_lanes(const unsigned char *packed) {
    vec out;
#if defined(__AVX512F__)
    __m128i bytes = _mm_loadl_epi64((const __m128i *)packed), low = _mm_set1_epi8(15);
    __m128i both = _mm_unpacklo_epi64(_mm_and_si128(bytes, low), _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(both));
    memcpy(&out, &f, sizeof out);
#elif defined(__AVX2__)
    int word;
    memcpy(&word, packed, sizeof word);
    __m128i bytes = _mm_cvtsi32_si128(word), low = _mm_set1_epi8(15);
    __m128i both = _mm_unpacklo_epi32(_mm_and_si128(bytes, low), _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(both));
    memcpy(&out, &f, sizeof out);
#else
    for (int j = 0; j < LANES / 2; j++) {
        out[j] = (float)(packed[j] & 15);
        out[j + LANES / 2] = (float)(packed[j] >> 4);
    }
#endif
    return out;
}

static inline vec q8_lanes(const signed char *quants) {
    vec out;
#if defined(__AVX512F__)
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)quants)));
    memcpy(&out, &f, sizeof out);
#elif defined(__AVX2__)
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)quants)));
    memcpy(&out, &f, sizeof out);
#else
    for (int j = 0; j < LANES; j++) out[j] = (float)quants[j];
#endif
    return out;
}

static size_t group_bytes(int format) {
    return format == FORMAT_Q4 ? (size_t)PANEL_COLS * 8 + GROUP * PANEL_COLS / 2 : (size_t)PANEL_COLS * 4 + GROUP * PANEL_COLS;
}

int block_group_bytes(int format) { return (int)group_bytes(format); }

/* one group of a panel -> w (GROUP, PANEL_COLS) floats */
static inline void dequantise_group(const unsigned char *restrict group, int format, float *restrict w) {
    vec d[PANEL_VECS], m[PANEL_VECS];
    for (int v = 0; v < PANEL_VECS; v++) {
        memcpy(&d[v], group + sizeof(float) * LANES * v, sizeof(vec));
        m[v] = (vec){0};
        if (format == FORMAT_Q4) memcpy(&m[v], group + sizeof(float) * (PANEL_COLS + LANES * v), sizeof(vec));
    }
    if (format == FORMAT_Q4) {
        const unsigned char *q = group + PANEL_COLS * 8;
        for (int i = 0; i < GROUP; i++)
            for (int v = 0; v < PANEL_VECS; v++) {
                vec quants = q4_lanes(q + (ptrdiff_t)(i * PANEL_VECS + v) * (LANES / 2));
                *(vec *)(w + i * PANEL_COLS + LANES * v) = quants * d[v] + m[v];
            }
    } else {
        const signed char *q = (const signed char *)(group + PANEL_COLS * 4);
        for (int i = 0; i < GROUP; i++)
            for (int v = 0; v < PANEL_VECS; v++) {
                *(vec *)(w + i * PANEL_COLS + LANES * v) = q8_lanes(q + (ptrdiff_t)i * PANEL_COLS + LANES * v) * d[v];
            }
    }
}

/* out (rows <= BLOCK_ROWS, PANEL_COLS) = or += (resume) x (rows, GROUP) @ one group, de-quantised in registers step by
 * step: a call of up to BLOCK_ROWS rows uses each step once, so it needs no buffer (the same chains as panel_block) */
static inline __attribute__((always_inline)) void group_block(
    const unsigned char *restrict group, int format, const float *restrict x, int x_stride, int rows, int resume,
    float *restrict out) {
    vec acc[BLOCK_ROWS][PANEL_VECS], d[PANEL_VECS], m[PANEL_VECS];
    for (int v = 0; v < PANEL_VECS; v++) {
        memcpy(&d[v], group + sizeof(float) * LANES * v, sizeof(vec));
        m[v] = (vec){0};
        if (format == FORMAT_Q4) memcpy(&m[v], group + sizeof(float) * (PANEL_COLS + LANES * v), sizeof(vec));
    }
    for (int r = 0; r < BLOCK_ROWS; r++)
        for (int v = 0; v < PANEL_VECS; v++)
            acc[r][v] = resume && r < rows ? *(const vec *)(out + r * PANEL_COLS + LANES * v) : (vec){0};
    const unsigned char *q4 = group + PANEL_COLS * 8;
    const signed char *q8 = (const signed char *)(group + PANEL_COLS * 4);
    for (int i = 0; i < GROUP; i++) {
        vec w[PANEL_VECS];
        for (int v = 0; v < PANEL_VECS; v++)
            w[v] = format == FORMAT_Q4 ? q4_lanes(q4 + (ptrdiff_t)(i * PANEL_VECS + v) * (LANES / 2)) * d[v] + m[v]
                                       : q8_lanes(q8 + (ptrdiff_t)i * PANEL_COLS + LANES * v) * d[v];
        for (int r = 0; r < BLOCK_ROWS; r++)
            if (r < rows) {
                float s = x[(ptrdiff_t)r * x_stride + i];
                for (int v = 0; v < PANEL_VECS; v++) acc[r][v] += w[v] * s;
            }
    }
    for (int r = 0; r < BLOCK_ROWS; r++)
        if (r < rows)
            for (int v = 0; v < PANEL_VECS; v++) *(vec *)(out + r * PANEL_COLS + LANES * v) = acc[r][v];
}

static void group_rows(const unsigned char *group, int format, const float *x, int x_stride, int rows, int resume,
                       float *out) {
    switch (rows) {
#define ROWS(n) case n: group_block(group, format, x, x_stride, n, resume, out); break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#if BLOCK_ROWS == 8
    ROWS(7) ROWS(8)
#endif
#undef ROWS
    default: break;
    }
}

/* y (rows <= MAX_ROWS, n) = x (rows, k) @ w.T, w as block panels of `format` (k a multiple of GROUP) */
void block_linear(const float *x, const unsigned char *blocks, float *y, int rows, int n, int k, int format,
                  int threads) {
    int count = (n + PANEL_COLS - 1) / PANEL_COLS, groups = k / GROUP;
    size_t bytes = group_bytes(format);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int p = 0; p < count; p++) {
        float out[MAX_ROWS * PANEL_COLS];
        float w[GROUP * PANEL_COLS];
        int cols = n - p * PANEL_COLS < PANEL_COLS ? n - p * PANEL_COLS : PANEL_COLS;
        const unsigned char *panel = blocks + (size_t)p * groups * bytes;
        for (int g = 0; g < groups; g++) {
            const unsigned char *ahead = panel + (size_t)(g + 2) * bytes; /* two groups on: the stream goes on */
            for (size_t line = 0; line < bytes; line += 64) __builtin_prefetch(ahead + line, 0, 2);
            if (rows <= BLOCK_ROWS) { /* each step used once: in registers */
                group_rows(panel + (size_t)g * bytes, format, x + g * GROUP, k, rows, g > 0, out);
                continue;
            }
            dequantise_group(panel + (size_t)g * bytes, format, w); /* once, for every block of rows */
            for (int m0 = 0; m0 < rows; m0 += BLOCK_ROWS) {
                int block = rows - m0 < BLOCK_ROWS ? rows - m0 : BLOCK_ROWS;
                panel_rows(w, x + (ptrdiff_t)m0 * k + g * GROUP, k, block, GROUP, g > 0, out + m0 * PANEL_COLS);
            }
        }
        for (int m = 0; m < rows; m++)
            memcpy(y + (ptrdiff_t)m * n + (ptrdiff_t)p * PANEL_COLS, out + m * PANEL_COLS, sizeof(float) * cols);
    }
}

/* either layout: what llama_layer.c calls for each of its four products */
void matrix_linear(const float *x, const void *weights, int format, float *y, int rows, int n, int k, int threads) {
    if (format == FORMAT_F32) panel_linear(x, (const float *)weights, y, rows, n, k, threads);
    else block_linear(x, (const unsigned char *)weights, y, rows, n, k, format, threads);
}

int kernel_lanes(void) { return LANES; }
