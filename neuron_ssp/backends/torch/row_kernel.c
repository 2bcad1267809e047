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
