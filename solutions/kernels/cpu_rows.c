/* A few rows times a weight matrix on a CPU, streaming the weight once: the product of a verify pass (a root
 * and its drafts) or of a few sequences decoding together. Built and loaded by cpu_rows.py; read that file
 * first.
 *
 * The weight [N, K] is packed as [N / 16][K][16] (N rounded up, the padding zero): a block of 16 output columns, k-major, so a block is one
 * contiguous run of memory and one 16-wide vector per k. For each block (blocks split between the threads)
 * and each group of up to 8 rows:
 *
 *     acc[r] = 0                                   (8 vectors of 16 partial sums, in registers)
 *     for k in 0..K:  w = block[k]                 (16 weights, one load)
 *                     acc[r] += x[r, k] * w        (a broadcast and a fused multiply-add per row)
 *
 * Each weight is read from memory once whatever the row count: a second group of 8 rows re-reads its block
 * (K * 64 bytes, at most a few hundred KB) from the core's cache, not from memory. Each row's sums run in the
 * same order (k ascending, one lane per output) whatever the rows beside it: a row's result does not depend
 * on how many rows share the call (batch-invariant), and one row alone gives the same bits.
 *
 * Written with GCC's vector extensions, so one source compiles to AVX-512, AVX2 or NEON (-march=native).
 * The threads are OpenMP's: the library links libgomp.so.1, which resolves to the copy torch has loaded,
 * so both share one pool of threads.
 */
#include <stdint.h>
#include <string.h>

#define LANES 16
#define GROUP 8

typedef float vf __attribute__((vector_size(LANES * sizeof(float))));
typedef uint32_t vu __attribute__((vector_size(LANES * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(LANES * sizeof(uint16_t))));

static inline vf load_f32(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* bfloat16 is the top half of a float32: widen and shift. */
static inline vf load_bf16(const uint16_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* One block of 16 columns for `rows` (<= GROUP) rows of x; `rows` is a constant after inlining, so the
 * accumulators live in registers. */
#define BLOCK_KERNEL(NAME, WTYPE, LOAD)                                                                      \
    static inline __attribute__((always_inline)) void NAME(const float *x, int64_t K, const WTYPE *w,       \
                                                           vf *acc, const int rows) {                        \
        for (int r = 0; r < rows; r++) acc[r] = (vf){0};                                                     \
        for (int64_t k = 0; k < K; k++) {                                                                    \
            const vf wk = LOAD(w + k * LANES);                                                               \
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) acc[r] += x[r * K + k] * wk;              \
        }                                                                                                    \
    }

BLOCK_KERNEL(block_f32, float, load_f32)
BLOCK_KERNEL(block_bf16, uint16_t, load_bf16)

/* The block's columns col .. col + 15 of each row, the last block's padding columns left out. */
static inline void store_rows(const vf *acc, int rows, const float *bias, int64_t col, int64_t N,
                              float *out) {
    const size_t bytes = (size_t)(N - col < LANES ? N - col : LANES) * sizeof(float);
    vf b = (vf){0};
    if (bias) memcpy(&b, bias + col, bytes);
    for (int r = 0; r < rows; r++) {
        vf v = acc[r] + b;
        memcpy(out + r * N + col, &v, bytes);
    }
}

/* The dispatch on the group's row count, so that each case compiles with its count fixed. */
#define GROUP_CASES(BLOCK)                                                                                   \
    switch (rows) {                                                                                          \
    case 1: BLOCK(xg, K, wb, acc, 1); break;                                                                 \
    case 2: BLOCK(xg, K, wb, acc, 2); break;                                                                 \
    case 3: BLOCK(xg, K, wb, acc, 3); break;                                                                 \
    case 4: BLOCK(xg, K, wb, acc, 4); break;                                                                 \
    case 5: BLOCK(xg, K, wb, acc, 5); break;                                                                 \
    case 6: BLOCK(xg, K, wb, acc, 6); break;                                                                 \
    case 7: BLOCK(xg, K, wb, acc, 7); break;                                                                 \
    default: BLOCK(xg, K, wb, acc, 8); break;                                                                \
    }

/* out[M, N] = x[M, K] @ W^T (+ bias): x, bias and out float32, the packed weight float32 or bfloat16, its
 * last block padded with zero columns up to a multiple of 16. */
#define ROWS_FUNCTION(NAME, WTYPE, BLOCK)                                                                    \
    void NAME(const float *x, int64_t M, int64_t K, const WTYPE *packed, int64_t N, const float *bias,       \
              float *out) {                                                                                  \
        const int64_t blocks = (N + LANES - 1) / LANES;                                                                    \
        _Pragma("omp parallel for schedule(static)") for (int64_t nb = 0; nb < blocks; nb++) {               \
            const WTYPE *wb = packed + nb * K * LANES;                                                       \
            for (int64_t m0 = 0; m0 < M; m0 += GROUP) {                                                      \
                const int rows = (int)(M - m0 < GROUP ? M - m0 : GROUP);                                     \
                const float *xg = x + m0 * K;                                                                \
                vf acc[GROUP];                                                                               \
                GROUP_CASES(BLOCK)                                                                           \
                store_rows(acc, rows, bias, nb * LANES, N, out + m0 * N);                                    \
            }                                                                                                \
        }                                                                                                    \
    }

ROWS_FUNCTION(rows_f32, float, block_f32)
ROWS_FUNCTION(rows_bf16, uint16_t, block_bf16)

/* INT4: torch's CPU layout read as it is (quant/linear.py), so no second copy of the weight. Output columns
 * in blocks of 64; for each block and input channel k, 32 bytes whose low nibbles are columns 0..31 and high
 * nibbles columns 32..63; W[k, n] = (q - 8) * scale[g, n] + offset[g, n], g = k / group, scale and offset
 * interleaved bfloat16 [K / group, N, 2].
 *
 * A unit of work is 16 columns of a block (a quarter: bytes 0..15 or 16..31, low or high nibbles). Within a
 * group the codes are summed as integers turned float, the scale and offset applied once per group:
 *     sum_k x[k] W[k, n] = sum_g scale[g, n] * sum_{k in g} x[k] (q[k, n] - 8) + offset[g, n] * sum_{k in g} x[k]
 * A block (K * 32 bytes) is read from memory by its first quarter and from the core's cache by the other three.
 * The group size is even (torch's kernel takes 32 to 256).
 */
typedef uint8_t vb __attribute__((vector_size(LANES)));

#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 codes (bytes, the nibble at `shift`) as floats q - 8: zero-extend, shift, and a 16-entry table lookup
 * (vpermps reads an index's low 4 bits, so the other nibble needs no mask). */
static inline vf load_codes(const uint8_t *p, int shift) {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    codes = _mm512_srl_epi32(codes, _mm_cvtsi32_si128(shift));
    __m512 v = _mm512_permutexvar_ps(codes, table);
    vf out;
    memcpy(&out, &v, sizeof out);
    return out;
}
#else
static inline vf load_codes(const uint8_t *p, int shift) {
    vb b;
    memcpy(&b, p, sizeof b);
    /* widened in two steps: GCC turns a one-step byte-to-int conversion into scalar code */
    vu u = (__builtin_convertvector(__builtin_convertvector(b, vh), vu) >> shift) & 15;
    return __builtin_convertvector(u, vf) - 8.0f;
}
#endif

/* 16 interleaved (scale, offset) bfloat16 pairs as two vectors. */
static inline void load_scale_offset(const uint16_t *p, vf *scale, vf *offset) {
    uint16_t s[LANES], o[LANES];
    for (int j = 0; j < LANES; j++) {
        s[j] = p[2 * j];
        o[j] = p[2 * j + 1];
    }
    *scale = load_bf16(s);
    *offset = load_bf16(o);
}

/* Two partial sums per row within a group (even and odd k), so that a lone row keeps two multiply-adds in
 * flight, not one; the same for every row count, so a row's result does not depend on the rows beside it. */
static inline __attribute__((always_inline)) void block_int4(const float *x, const float *xsum, int64_t K,
                                                             int64_t group, const uint8_t *w, int shift,
                                                             const uint16_t *so, int64_t N, vf *acc,
                                                             const int rows) {
    const int64_t groups = K / group;
    for (int r = 0; r < rows; r++) acc[r] = (vf){0};
    for (int64_t g = 0; g < groups; g++) {
        vf even[GROUP], odd[GROUP];
        for (int r = 0; r < rows; r++) even[r] = odd[r] = (vf){0};
        for (int64_t k = g * group; k < (g + 1) * group; k += 2) {
            const vf w0 = load_codes(w + k * 32, shift), w1 = load_codes(w + (k + 1) * 32, shift);
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
                even[r] += x[r * K + k] * w0;
                odd[r] += x[r * K + k + 1] * w1;
            }
        }
        vf scale, offset;
        load_scale_offset(so + g * N * 2, &scale, &offset);
        for (int r = 0; r < rows; r++) acc[r] += scale * (even[r] + odd[r]) + offset * xsum[r * groups + g];
    }
}

#define INT4_CASES                                                                                           \
    switch (rows) {                                                                                          \
    case 1: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 1); break;                                   \
    case 2: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 2); break;                                   \
    case 3: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 3); break;                                   \
    case 4: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 4); break;                                   \
    case 5: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 5); break;                                   \
    case 6: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 6); break;                                   \
    case 7: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 7); break;                                   \
    default: block_int4(xg, sg, K, group, wq, shift, sq, N, acc, 8); break;                                  \
    }

/* x rounded to bfloat16's precision (to nearest, ties to even), as torch's kernel rounds its inputs. */
static inline float round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float read_value(const void *x, int bf16, int64_t i) {
    if (!bf16) return ((const float *)x)[i];
    const uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The block's 16 columns of each row, rounded to bfloat16 as torch's kernel returns them: stored as bfloat16
 * (bf16 set) or as float32. */
static inline void store_rounded(const vf *acc, int rows, int64_t col, int64_t N, int bf16, void *out) {
    for (int r = 0; r < rows; r++) {
        float v[LANES];
        memcpy(v, &acc[r], sizeof v);
        for (int j = 0; j < LANES; j++) {
            const float f = round_bf16(v[j]);
            if (bf16) {
                uint32_t u;
                memcpy(&u, &f, sizeof u);
                ((uint16_t *)out)[r * N + col + j] = (uint16_t)(u >> 16);
            } else {
                ((float *)out)[r * N + col + j] = f;
            }
        }
    }
}

/* out[M, N] = x[M, K] @ W^T, W in torch's INT4 layout; N a multiple of 64, K of the group. x and out are
 * bfloat16 (bf16 set) or float32. scratch: room for M * K + M * K / group floats, where x rounded to bfloat16
 * and each row's sum over each group go first (once, not once per thread). */
void rows_int4(const void *x, int bf16, float *scratch, int64_t M, int64_t K, const uint8_t *qweight,
               int64_t N, const uint16_t *scale_offset, int64_t group, void *out) {
    float *xr = scratch, *xsum = scratch + M * K;
    for (int64_t i = 0; i < M * (K / group); i++) {
        float sum = 0;
        for (int64_t k = 0; k < group; k++) {
            xr[i * group + k] = round_bf16(read_value(x, bf16, i * group + k));
            sum += xr[i * group + k];
        }
        xsum[i] = sum;
    }
    const int64_t quarters = N / LANES;
    _Pragma("omp parallel for schedule(static)") for (int64_t unit = 0; unit < quarters; unit++) {
        const int64_t block = unit / 4, quarter = unit % 4;
        const uint8_t *wq = qweight + block * K * 32 + (quarter & 1) * LANES;
        const int shift = (int)(quarter >> 1) * 4;
        const int64_t col = block * 64 + (quarter & 1) * LANES + (quarter >> 1) * 32;
        const uint16_t *sq = scale_offset + col * 2;
        for (int64_t m0 = 0; m0 < M; m0 += GROUP) {
            const int rows = (int)(M - m0 < GROUP ? M - m0 : GROUP);
            const float *xg = xr + m0 * K, *sg = xsum + m0 * (K / group);
            vf acc[GROUP];
            INT4_CASES
            store_rounded(acc, rows, col, N, bf16, (char *)out + m0 * N * (bf16 ? 2 : 4));
        }
    }
}
