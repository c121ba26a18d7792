/* Fused rounding kernels for the sparse log: one pass over a tensor instead of a dozen torch ops;
 * the log's LEB128 varints (at the end), one byte at a time instead of numpy's many passes; and a
 * transcript step's file writes in one call that holds no GIL (vg_write_step, last).
 *
 * Every function works on the int64 bit patterns of float64 values and computes exactly what the
 * torch code in game/training/numerics/bandcheck.py and rounding.py computes (integer arithmetic only, so the
 * result is the same on every machine). They handle the common lanes: +-0 and normal values up to
 * the grid's largest finite value. When a tensor holds anything else (the float32-subnormal range,
 * past the range, inf, NaN) they return -1 and the caller takes the torch path for that tensor; the
 * trainer and auditor kernels find that out in a read-only pass (which also finds the tensor's top)
 * before they write anything, so they can round in place.
 *
 * Geometry of a lane (bandcheck.geometry): r = dropped bits, d = |r - half| (distance to the rounding
 * midpoint in float64 ulps of x), band = min(2^(52 + rel) + floor, half / 4) with
 * floor = 2^(52 + abs + top - e(x)) when that exponent is >= 0 (capped at 2^62), else 0.
 */
#define _POSIX_C_SOURCE 200809L /* fsync, for vg_write_step */
#include <stdint.h>
#include <string.h>

/* Where GCC can build them, the kernels come in two versions, picked when the library loads: one
 * for AVX2 (the 64-bit compares and shifts of the scans vectorise) and one for any x86-64. They
 * are integer code and exact conversions, so both give the same bits. The loader's pick needs
 * glibc (an ifunc). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

#define ABS_MASK 0x7fffffffffffffffLL
#define MANT 52
#define MIN_NORMAL_BIASED (1023 - 126)

typedef struct {
    int64_t k0;          /* dropped mantissa bits */
    int64_t step;        /* 1 << k0 */
    int64_t half;        /* step / 2 */
    int64_t max_finite;  /* bit pattern of the largest finite grid value */
    int64_t rel_units;   /* 2^(52 + rel), or 0 */
    int64_t floor_base;  /* 52 + abs + top_biased */
} grid_t;

/* 0 < a < float32's smallest normal (a = |x|'s pattern): a - 1 wraps to the largest unsigned
 * value at a = 0, so one unsigned compare tests both ends. */
static inline int64_t below_normal(int64_t a) {
    return (uint64_t)a - 1 < ((uint64_t)MIN_NORMAL_BIASED << MANT) - 1 ? 1 : 0;
}

static inline int64_t band_of(int64_t a, const grid_t *g) {
    /* The band, written so that AVX2 vectorises it (no constant shifted by a lane, logical shifts,
     * selects): cap = half / 4 = 2^(k0 - 3) (or 0 when k0 < 3), and 2^shift = cap >> (k0 - 3 -
     * shift) for 0 <= shift < k0 - 3; at or past k0 - 3 the floor reaches the cap, below 0 it is 0,
     * which the count clamped to [0, 63] gives too. The same as min(2^clamp(shift, 0, 62) [0 when
     * shift < 0] + rel_units, cap), the formula in the header. */
    int64_t cap = g->half >> 2;
    int64_t shift = g->floor_base - (int64_t)((uint64_t)a >> MANT);
    int64_t count = g->k0 - 3 - shift;
    count = count < 0 ? 0 : (count > 63 ? 63 : count);
    int64_t limit = (int64_t)((uint64_t)cap >> count) + g->rel_units;
    return limit < cap ? limit : cap;
}

static inline int64_t dist_of(int64_t x, const grid_t *g) {
    int64_t d = (x & (g->step - 1)) - g->half;
    return d < 0 ? -d : d;
}

static inline int64_t in_band(int64_t x, const grid_t *g, int widen) {
    /* off the grid, and within (band << widen) of the midpoint: 0 or 1, as a select (vectorises) */
    return (((x & (g->step - 1)) != 0) & (dist_of(x, g) <= (band_of(x & ABS_MASK, g) << widen))) ? 1 : 0;
}

static inline int64_t nearest(int64_t x, const grid_t *g) {
    /* round half to even on the signed pattern (rounding.rnd's fast path) */
    return (x + (g->half - 1) + (int64_t)(((uint64_t)x >> g->k0) & 1)) & -g->step;
}

static inline int64_t neighbour(int64_t x, const grid_t *g, int odd) {
    /* the grid neighbour of x (x itself when on the grid, else one of the two around it) whose last
     * kept bit is odd (odd = 1) or even (odd = 0) */
    int64_t lo = x - (x & (g->step - 1));
    return ((lo & g->step) != 0) == odd ? lo : lo + g->step;
}

static void init(grid_t *g, int64_t k0, int64_t max_finite, int64_t rel, int64_t abs_, int64_t top) {
    g->k0 = k0;
    g->step = (int64_t)1 << k0;
    g->half = g->step >> 1;
    g->max_finite = max_finite;
    g->rel_units = (MANT + rel >= 0) ? ((int64_t)1 << (MANT + rel)) : 0;
    g->floor_base = MANT + abs_ + top;
}

/* Read-only pass: the largest magnitude's biased exponent (at least float32's smallest normal, as
 * bandcheck.top_binade), or -1 when a lane is rare. Branch-free so the compiler vectorises it. Per
 * lane it tests only the low end of the range (0 < a < smallest normal, one unsigned compare): a
 * lane past the largest finite value (inf and NaN included) makes the largest lane past it too. */
static int64_t scan(const int64_t *x, int64_t n, const grid_t *g) {
    int64_t top = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t a = x[i] & ABS_MASK;
        bad |= below_normal(a);
        top = a > top ? a : top;
    }
    if (bad | (top > g->max_finite)) return -1;
    top >>= MANT;
    return top > MIN_NORMAL_BIASED ? top : MIN_NORMAL_BIASED;
}

/* The sieve. The trainer lists a lane, and the auditor moves one to its even neighbour, only when
 * it went to the odd neighbour and lies off the grid within a few bands of its rounding midpoint:
 * a gpt-shakespeare step lists about 3,300 of its 1.85M lanes. The exact band test costs a dozen
 * vector operations a lane (the band depends on the lane's binade), so where the band is narrow the
 * kernels first run a cheaper test that every such lane passes, sixteen lanes at a time, and give
 * the exact test only to the lanes that pass it (0.1 to 0.9 in a hundred on the presets' tensors).
 * The band only grows as the binade falls (its floor term), so every lane at or above binade `cut`
 * has a band at most band_of(cut), and every lane from `cut2` up one at most band_of(cut2). A lane
 * passes when it went odd, is off the grid, and lies within reach = band_of(cut) << widen of its
 * midpoint, or below `cut` within reach2 = band_of(cut2) << widen, or below `cut2`. `cut` is the
 * binade where the floor is 2^s, s the larger of the relative term's exponent and k0 - 12, so
 * band_of(cut) is at most 2^(s + 1); `cut2` is SIEVE_TIER binades lower. The three tiers are one
 * compare: with y how far a lane lies past its midpoint on the side that rounds to odd, less one
 * (modulo a step), a lane passes when y < reach, reach2 or half - 1 by its tier (sieve4 says why).
 * The second tier matters as training goes on: at cnn-digits' step 800 one lane in ten lies below
 * `cut`, and with one tier the sieve let 5% of the lanes through, with two 0.9%. `useful` says
 * whether reach is small enough (at most a 32nd of half a step) for few lanes to pass; otherwise
 * (a wide band, or the auditor counting free lanes, which need not have gone odd) the exact test
 * runs on every lane, in the loops further down. Both give the same bits. On a gpt-shakespeare
 * step's tensors the sieved loops (on 32-bit words) take the trainer's kernel 0.65x and the
 * auditor's 0.64x the time of the exact ones. */
typedef struct {
    int64_t cut;        /* the pattern of binade `cut`'s first value */
    int64_t cut2;       /* the same for the second tier's binade: lanes with |x| below it pass */
    int64_t reach;      /* at or above cut, a lane passes when y < reach */
    int64_t more;       /* reach2 - reach: added to the bound below cut */
    int64_t most;       /* half - 1 - reach2: added below cut2 (every lane that went odd off the grid) */
    int useful;
} sieve_t;

#define SIEVE_TIER 5 /* binades between the sieve's two cuts (4 to 6 did as well; 8 worse) */

static inline sieve_t sieve_for(const grid_t *g, int64_t rel, int widen) {
    int64_t s = g->k0 - 12;
    if (g->rel_units != 0 && MANT + rel > s) s = MANT + rel;
    int64_t cut = g->floor_base - s;
    cut = cut < 0 ? 0 : (cut > 2047 ? 2047 : cut);
    int64_t cut2 = cut - SIEVE_TIER < 0 ? 0 : cut - SIEVE_TIER;
    int64_t reach = band_of(cut << MANT, g) << widen, reach2 = band_of(cut2 << MANT, g) << widen;
    if (reach2 > (g->half >> 1)) { /* no second tier: one band test below cut */
        cut2 = cut;
        reach2 = reach;
    }
    sieve_t sv;
    sv.cut = cut << MANT;
    sv.cut2 = cut2 << MANT;
    sv.reach = reach;
    sv.more = reach2 - reach;
    sv.most = g->half - 1 - reach2;
    sv.useful = reach <= (g->half >> 5);
    return sv;
}

/* Whether the trainer lists a lane: it went to the odd neighbour, within 4 bands of a midpoint. */
static inline int64_t listed(int64_t v, const grid_t *g) {
    return ((nearest(v, g) & g->step) != 0) & in_band(v, g, 2);
}

/* Auditor: one lane that is not listed, rounded (one band: the even neighbour, else nearest r),
 * adding to counts[0] a correction and to counts[1] a free lane (off the grid, within 16 bands). */
static inline int64_t with_band(int64_t v, int64_t r, const grid_t *g, int64_t *counts) {
    int64_t band = band_of(v & ABS_MASK, g), d = dist_of(v, g), off = (v & (g->step - 1)) != 0;
    int64_t out = (off & (d <= band)) ? neighbour(v, g, 0) : r;
    counts[0] += out != r;
    counts[1] += off & (d <= (band << 4));
    return out;
}

#if defined(__GNUC__)
/* Four lanes as one value (GCC's and Clang's vector extension: AVX2 registers in the kernels' AVX2
 * versions, pairs of SSE or NEON registers elsewhere). Comparisons give -1 or 0 a lane. */
typedef int64_t lanes_t __attribute__((vector_size(32)));
typedef uint64_t ulanes_t __attribute__((vector_size(32)));
#define SIEVE 1
/* Always inlined into the exported kernels, so that each of their versions (AVX2 or not) compiles
 * them for its own instruction set. */
#define LANES static inline __attribute__((always_inline))

LANES lanes_t load4(const int64_t *p) {
    lanes_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

LANES void store4(int64_t *p, lanes_t v) { memcpy(p, &v, sizeof v); }

LANES lanes_t nearest4(lanes_t x, const grid_t *g) { /* nearest(), four lanes, wrapping on any lane */
    ulanes_t u = (ulanes_t)x;
    return (lanes_t)((u + (uint64_t)(g->half - 1) + ((u >> g->k0) & 1)) & (uint64_t)-g->step);
}

/* Negative in the lanes that pass the sieve. y = (x - half - 1) mod step for a lane whose last
 * kept bit is even, (-x - half - 1) mod step for an odd one (the dropped bits u then count as
 * step - u): it is below half - 1 exactly when the lane lies off the grid and rounds to the odd
 * neighbour (u > half from even, 0 < u < half from odd; ties go to even), and below reach when it
 * does so within reach of its midpoint. The negation is (x ^ -bit) + bit, in unsigned lanes so
 * that it wraps. The bound is reach, plus `more` below cut, plus `most` below cut2. */
LANES lanes_t sieve4(lanes_t x, const grid_t *g, const sieve_t *sv) {
    ulanes_t bit = ((ulanes_t)x >> g->k0) & 1;
    lanes_t y = (lanes_t)((((ulanes_t)x ^ -bit) + bit - (uint64_t)(g->half + 1)) & (uint64_t)(g->step - 1));
    lanes_t a = x & ABS_MASK;
    lanes_t bound = sv->reach + ((sv->cut > a) & sv->more) + ((sv->cut2 > a) & sv->most);
    return bound > y;
}

/* Eight 32-bit words a vector. float32's grid drops 29 bits: where the dropped bits and the last
 * kept one lie in a lane's low word (k0 <= 31), the sieve runs on the low and high words of eight
 * lanes at once, twice the lanes an operation of sieve4 (on a gpt-shakespeare step's tensors the
 * trainer's kernel takes 0.79x, the auditor's 0.87x the time). The words are split with a float
 * shuffle, one vshufps for each. */
typedef int32_t words_t __attribute__((vector_size(32)));
typedef uint32_t uwords_t __attribute__((vector_size(32)));
typedef float floats_t __attribute__((vector_size(32)));
#define NARROW_K0 31
/* The eight words at positions i of a's and b's sixteen (Clang names GCC's builtin otherwise). */
#if defined(__clang__)
#define SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
    __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
#define SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
    __builtin_shuffle(a, b, (words_t){i0, i1, i2, i3, i4, i5, i6, i7})
#endif

/* sieve4 on the eight lanes of x0 and x1, in the order of passed(). */
LANES words_t sieve8(lanes_t x0, lanes_t x1, const grid_t *g, const sieve_t *sv) {
    floats_t f0 = (floats_t)x0, f1 = (floats_t)x1;
    uwords_t lo = (uwords_t)SHUFFLE8(f0, f1, 0, 2, 8, 10, 4, 6, 12, 14);
    words_t hi = (words_t)SHUFFLE8(f0, f1, 1, 3, 9, 11, 5, 7, 13, 15);
    uwords_t bit = (lo >> (int)g->k0) & 1;
    words_t y = (words_t)(((lo ^ -bit) + bit - (uint32_t)(g->half + 1)) & (uint32_t)(g->step - 1));
    words_t a = hi & 0x7fffffff; /* cut and cut2 start binades: their low words are 0 */
    words_t bound = (int32_t)sv->reach + (((int32_t)(sv->cut >> 32) > a) & (int32_t)sv->more) +
                    (((int32_t)(sv->cut2 >> 32) > a) & (int32_t)sv->most);
    return bound > y;
}

/* Lanes a turn of the sieved loops: one test of the sieve for all of them. */
#define TURN 16
#define VECS (TURN / 4)

/* One turn: the lanes v, rounded to nearest r, and the sieve's verdicts p (negative: passed):
 * sieve4's, or when narrow sieve8's in the first VECS / 2 vectors. */
typedef struct {
    lanes_t v[VECS], r[VECS], p[VECS];
} turn_t;

/* Loads, rounds and sieves the TURN lanes at x; returns whether any passed. The kernels call it
 * with narrow a constant (k0 <= NARROW_K0: sieve8), so each of their loops is compiled for one. */
LANES int64_t sieve_turn(turn_t *t, const int64_t *x, const grid_t *g, const sieve_t *sv, int narrow) {
    lanes_t any = {0, 0, 0, 0};
    for (int j = 0; j < VECS; j++) {
        t->v[j] = load4(x + 4 * j);
        t->r[j] = nearest4(t->v[j], g);
    }
    for (int j = 0; j < (narrow ? VECS / 2 : VECS); j++) {
        t->p[j] = narrow ? (lanes_t)sieve8(t->v[2 * j], t->v[2 * j + 1], g, sv) : sieve4(t->v[j], g, sv);
        any |= t->p[j];
    }
    return ((any[0] | any[1]) | (any[2] | any[3])) != 0;
}

/* Whether lane k of vector j passed. sieve8 takes its words two by two from each of its vectors
 * (a's lanes 0 1, b's 0 1, a's 2 3, b's 2 3), as vshufps does. */
LANES int passed(const turn_t *t, int j, int k, int narrow) {
    if (!narrow) return t->p[j][k] < 0;
    return ((words_t)t->p[j >> 1])[(k & 1) + (j & 1) * 2 + (k >> 1) * 4] < 0;
}

/* Trainer, where the sieve is useful: rounds x in place and lists positions as vg_round_and_band. */
LANES int64_t round_and_band_sieved(int64_t *restrict x, int64_t n, const grid_t *g, const sieve_t *sv,
                                    int64_t *restrict out, int narrow) {
    int64_t m = 0, i = 0;
    for (; i + TURN <= n; i += TURN) {
        turn_t t;
        if (sieve_turn(&t, x + i, g, sv, narrow)) { /* rare: the band test, for the lanes that
                                                       passed (they went odd already, which
                                                       listed() would test again) */
            for (int j = 0; j < VECS; j++)
                for (int k = 0; k < 4; k++) {
                    if (!passed(&t, j, k, narrow)) continue;
                    out[m] = i + 4 * j + k; /* appended without a branch: out has room for n */
                    m += in_band(t.v[j][k], g, 2);
                }
        }
        for (int j = 0; j < VECS; j++) store4(x + i + 4 * j, t.r[j]);
    }
    for (; i < n; i++) {
        out[m] = i;
        m += listed(x[i], g);
        x[i] = nearest(x[i], g);
    }
    return m;
}

/* Auditor, where the sieve is useful: one block of vg_round_with_entries before its listed lanes,
 * adding the corrections to counts[0] (counts[1] is left short: the sieve passes only lanes that
 * went odd, not every free lane). */
LANES void with_band_sieved(int64_t *restrict xb, int64_t len, const grid_t *g, const sieve_t *sv,
                            int64_t *counts, int narrow) {
    int64_t i = 0;
    for (; i + TURN <= len; i += TURN) {
        turn_t t;
        int64_t any = sieve_turn(&t, xb + i, g, sv, narrow);
        for (int j = 0; j < VECS; j++) store4(xb + i + 4 * j, t.r[j]);
        if (any) { /* rare: the exact test, for the lanes that passed, written over their r (not
                      into t.r: a lane written into a vector costs the auditor's kernel 2%) */
            for (int j = 0; j < VECS; j++)
                for (int k = 0; k < 4; k++)
                    if (passed(&t, j, k, narrow))
                        xb[i + 4 * j + k] = with_band(t.v[j][k], t.r[j][k], g, counts);
        }
    }
    for (; i < len; i++) xb[i] = with_band(xb[i], nearest(xb[i], g), g, counts);
}
#else
#define SIEVE 0
#endif

/* Without the sieve, the hot loops run over blocks of lanes: a first loop with no exits and no
 * lane-dependent stores (it vectorises) writes the rounded lanes and a flag per lane; a second one
 * acts on the few flagged lanes, skipping four clear flags at a time, or the whole block when the
 * first loop's OR of its flags is 0. */
#define BLOCK 1024

/* Trainer, in place: round x to nearest (ties to even) and write to out the positions of the lanes
 * within 4 bands of a midpoint that went to the odd neighbour. Returns how many, or -1 when a lane
 * is rare (then nothing is written). */
VECTOR_CLONES int64_t vg_round_and_band(int64_t *restrict x, int64_t n, int64_t k0, int64_t max_finite,
                                        int64_t rel, int64_t abs_, int64_t *restrict out) {
    grid_t g;
    init(&g, k0, max_finite, rel, abs_, 0);
    int64_t top = scan(x, n, &g);
    if (top < 0) return -1;
    init(&g, k0, max_finite, rel, abs_, top);
#if SIEVE
    sieve_t sv = sieve_for(&g, rel, 2);
    if (sv.useful && k0 <= NARROW_K0) return round_and_band_sieved(x, n, &g, &sv, out, 1);
    if (sv.useful) return round_and_band_sieved(x, n, &g, &sv, out, 0);
#endif
    int64_t flag[BLOCK + 4];
    int64_t m = 0;
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t len = n - b < BLOCK ? n - b : BLOCK;
        int64_t *restrict xb = x + b;
        int64_t any = 0;
        for (int64_t i = 0; i < len; i++) {
            int64_t v = xb[i];
            int64_t r = nearest(v, &g);
            int64_t f = ((r & g.step) != 0) & in_band(v, &g, 2); /* listed: went odd, within 4 bands */
            xb[i] = r;
            flag[i] = f;
            any |= f;
        }
        if (!any) continue; /* most blocks list nothing */
        flag[len] = flag[len + 1] = flag[len + 2] = 0;
        for (int64_t i = 0; i < len; i += 4) {
            if (!(flag[i] | flag[i + 1] | flag[i + 2] | flag[i + 3])) continue;
            for (int64_t k = i; k < i + 4 && k < len; k++) {
                out[m] = b + k; /* appended without a branch: out has room for n */
                m += flag[k];
            }
        }
    }
    return m;
}

/* Auditor, in place, with the entries: listed -> odd neighbour, else within one band -> even
 * neighbour, else nearest. Returns 0 and sets stats[0] = corrections (lanes not at their nearest),
 * stats[1] = free (lanes within 16 bands, when count_free, else -1); or, writing nothing, -1 (a rare
 * lane, a listed zero, whose neighbours come from the rare path, or entries out of range or not
 * strictly ascending, which the caller words) or -2 with stats[0] = the first entry farther than
 * 16 bands from a midpoint. */
VECTOR_CLONES int64_t vg_round_with_entries(int64_t *restrict x, int64_t n, int64_t k0, int64_t max_finite,
                                            int64_t rel, int64_t abs_, const int64_t *pos, int64_t npos,
                                            int64_t count_free, int64_t *stats) {
    grid_t g;
    init(&g, k0, max_finite, rel, abs_, 0);
    int64_t top = scan(x, n, &g);
    if (top < 0) return -1;
    init(&g, k0, max_finite, rel, abs_, top);
    for (int64_t j = 0; j < npos; j++) {
        if (pos[j] < 0 || pos[j] >= n || (j > 0 && pos[j] <= pos[j - 1])) return -1;
        int64_t v = x[pos[j]];
        int64_t a = v & ABS_MASK;
        if (a == 0) return -1;
        /* bandcheck.check_entries: the distance alone (a listed grid value is judged the same way) */
        if (dist_of(v, &g) > (band_of(a, &g) << 4)) {
            stats[0] = pos[j];
            return -2;
        }
    }
#if SIEVE /* the moved lanes are within one band and went odd; counting free lanes needs them all */
    sieve_t sv = sieve_for(&g, rel, 0);
    sv.useful &= !count_free;
#endif
    int64_t odd[BLOCK], near[BLOCK];
    int64_t corrections = 0, free = 0, j = 0;
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t len = n - b < BLOCK ? n - b : BLOCK;
        int64_t *restrict xb = x + b;
        int64_t j0 = j;
        for (; j < npos && pos[j] < b + len; j++) { /* the block's entries, before it is overwritten */
            int64_t v = xb[pos[j] - b];
            odd[j - j0] = neighbour(v, &g, 1);
            near[j - j0] = nearest(v, &g);
        }
#if SIEVE
        if (sv.useful) {
            int64_t counts[2] = {0, 0};
            if (k0 <= NARROW_K0)
                with_band_sieved(xb, len, &g, &sv, counts, 1);
            else
                with_band_sieved(xb, len, &g, &sv, counts, 0);
            corrections += counts[0];
        } else
#endif
        {
            int64_t counts = 0; /* one sum for both counts (free << 32 | corrections): GCC 12 does not
                                   vectorise a loop with two sums; a block's counts fit in 32 bits */
            for (int64_t i = 0; i < len; i++) {
                int64_t v = xb[i];
                int64_t r = nearest(v, &g);
                /* in_band at widths 1 and 16, sharing the band and the distance */
                int64_t off = (v & (g.step - 1)) != 0 ? 1 : 0;
                int64_t band = band_of(v & ABS_MASK, &g), d = dist_of(v, &g);
                int64_t out = (off & (d <= band)) ? neighbour(v, &g, 0) : r;
                counts += ((off & (d <= (band << 4)) ? (int64_t)1 : 0) << 32) + (out != r ? 1 : 0);
                xb[i] = out;
            }
            free += counts >> 32;
            corrections += counts & 0xffffffffLL;
        }
        for (int64_t k = j0; k < j; k++) { /* listed lanes go to the odd neighbour instead */
            int64_t i = pos[k] - b;
            corrections += (odd[k - j0] != near[k - j0]) - (xb[i] != near[k - j0]);
            xb[i] = odd[k - j0];
        }
    }
    stats[0] = corrections;
    stats[1] = count_free ? free : -1;
    return 0;
}

/* Packed log, trainer, in place (rounding.round_and_log): round x to nearest (ties to even) and
 * write a trit per lane: the value's direction, 0 (down) or 2 (up), when its distance to the chosen
 * grid point exceeds the threshold (floor(tau * step), so |r - half| < half - threshold), else 1.
 * Returns 0, or -1 when a lane is rare (then nothing is written). */
VECTOR_CLONES int64_t vg_round_and_trits(int64_t *restrict x, int64_t n, int64_t k0, int64_t max_finite,
                                         int64_t threshold, uint8_t *restrict trits) {
    grid_t g;
    init(&g, k0, max_finite, -60, -60, 0);
    if (scan(x, n, &g) < 0) return -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = x[i];
        int64_t r = v & (g.step - 1);
        int64_t up = (r + (int64_t)(((uint64_t)v >> k0) & 1)) > g.half ? 1 : 0;
        int64_t d = r - g.half;
        d = d < 0 ? -d : d;
        int64_t logged = d < g.half - threshold ? 1 : 0;
        int64_t value_up = up ^ (v < 0 ? 1 : 0);
        trits[i] = (uint8_t)(1 + logged * (2 * value_up - 1));
        x[i] = nearest(v, &g);
    }
    return 0;
}

/* Whether the trit asks a lane to move (rounding._changes): it is 0 or 2, the lane is off the grid,
 * and the asked side (bit 1 of the trit, xor the sign) is not where rounding to nearest went. */
static inline int64_t moved_by(int64_t v, uint8_t t, const grid_t *g, int64_t *up_out) {
    int64_t r = v & (g->step - 1);
    int64_t up = (r + (int64_t)(((uint64_t)v >> g->k0) & 1)) > g->half ? 1 : 0;
    int64_t logged = (t + 1) & 1;
    int64_t want_up = (int64_t)(t >> 1) ^ (v < 0 ? 1 : 0);
    *up_out = up;
    return logged & (r != 0 ? 1 : 0) & (want_up ^ up);
}

/* Packed log, auditor, in place (logtrits.round_with_log_changes, then bandcheck.check_corrections):
 * a lane the trainer's trit moves goes to the grid neighbour on the asked side, every other lane
 * to nearest. All checks come first and read only: -1 when a lane is rare or a trit is above 2, -2
 * with stats[0] = its position when a moved lane lies farther than 4 bands from a midpoint; nothing
 * is written then (the caller's torch kernel words the error). Else returns how many lanes moved. */
VECTOR_CLONES int64_t vg_round_with_trits(int64_t *restrict x, int64_t n, int64_t k0, int64_t max_finite,
                                          int64_t rel, int64_t abs_, const uint8_t *restrict trits,
                                          int64_t *stats) {
    grid_t g;
    init(&g, k0, max_finite, rel, abs_, 0);
    int64_t top = scan(x, n, &g);
    if (top < 0) return -1;
    init(&g, k0, max_finite, rel, abs_, top);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= trits[i] > 2;
    if (bad) return -1;
    int64_t flag[BLOCK + 4];
    int64_t moved = 0;
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t len = n - b < BLOCK ? n - b : BLOCK;
        const int64_t *xb = x + b;
        int64_t any = 0;
        for (int64_t i = 0; i < len; i++) {
            int64_t up;
            int64_t f = moved_by(xb[i], trits[b + i], &g, &up);
            flag[i] = f;
            any |= f;
        }
        if (!any) continue; /* most blocks move nothing */
        flag[len] = flag[len + 1] = flag[len + 2] = 0;
        for (int64_t i = 0; i < len; i += 4) {
            if (!(flag[i] | flag[i + 1] | flag[i + 2] | flag[i + 3])) continue;
            for (int64_t k = i; k < i + 4 && k < len; k++) {
                if (!flag[k]) continue;
                if (dist_of(xb[k], &g) > (band_of(xb[k] & ABS_MASK, &g) << 2)) {
                    stats[0] = b + k;
                    return -2;
                }
                moved++;
            }
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = x[i], up;
        int64_t change = moved_by(v, trits[i], &g, &up);
        x[i] = (v - (v & (g.step - 1))) + ((up ^ change) << k0);
    }
    return moved;
}

/* Round x in place to nearest, ties to even (rounding.round_). Returns 0, or -1 when a lane is
 * rare: then the lanes before it, or (with the vector extension) every lane but the rare ones, are
 * rounded already, which is harmless (rounding is idempotent) for the caller, who then rounds the
 * whole tensor with the torch kernel. With the vector extension it is one pass: each lane is
 * rounded unless rare, which it keeps. Without it, blocks of a read-only scan then a rounding
 * loop, each free of early exits so that it vectorises. */
VECTOR_CLONES int64_t vg_round_inplace(int64_t *x, int64_t n, int64_t k0, int64_t max_finite) {
    grid_t g;
    init(&g, k0, max_finite, -60, -60, 0);
#if SIEVE
    const uint64_t flip = (uint64_t)1 << 63;
    const int64_t low = (int64_t)((((uint64_t)MIN_NORMAL_BIASED << MANT) - 1) ^ flip);
    lanes_t rare = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        lanes_t v = load4(x + i), a = v & ABS_MASK;
        /* below_normal (one unsigned compare, as a signed one with the top bit flipped), or past the
         * largest finite value */
        lanes_t r = ((lanes_t)(((ulanes_t)a - 1) ^ flip) < low) | (a > g.max_finite);
        store4(x + i, (v & r) | (nearest4(v, &g) & ~r));
        rare |= r;
    }
    int64_t bad = (rare[0] | rare[1]) | (rare[2] | rare[3]);
    for (; i < n; i++) {
        int64_t a = x[i] & ABS_MASK;
        if (below_normal(a) | (a > g.max_finite)) {
            bad = 1;
            continue;
        }
        x[i] = nearest(x[i], &g);
    }
    return bad ? -1 : 0;
#else
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t len = n - b < BLOCK ? n - b : BLOCK;
        int64_t *xb = x + b;
        if (scan(xb, len, &g) < 0) return -1;
        for (int64_t i = 0; i < len; i++) xb[i] = nearest(xb[i], &g);
    }
    return 0;
#endif
}

/* LEB128 (7 bits a byte, high bit = more; shortest form) of n values into out, which has room for
 * 9 bytes a value. Returns the bytes written, or -1 at a negative value (the caller words it). */
int64_t vg_uvarint_encode(const int64_t *v, int64_t n, uint8_t *out) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 0) return -1;
        uint64_t u = (uint64_t)v[i];
        while (u >= 0x80) {
            out[k++] = (uint8_t)(u | 0x80);
            u >>= 7;
        }
        out[k++] = (uint8_t)u;
    }
    return k;
}

/* count LEB128 values from buf[0:len] into out. Returns the bytes read, or -1 when the bytes end
 * first, a value is longer than 9 bytes or not in its shortest form (the caller words which). */
int64_t vg_uvarint_decode(const uint8_t *buf, int64_t len, int64_t count, int64_t *out) {
    int64_t k = 0;
    for (int64_t i = 0; i < count; i++) {
        uint64_t u = 0;
        int shift = 0;
        for (;;) {
            if (k >= len || shift > 56) return -1;
            uint8_t b = buf[k++];
            u |= (uint64_t)(b & 0x7f) << shift;
            if (!(b & 0x80)) {
                if (b == 0 && shift > 0) return -1;
                break;
            }
            shift += 7;
        }
        out[i] = (int64_t)u;
    }
    return k;
}

static inline int64_t put_uvarint(uint64_t u, uint8_t *out) {
    int64_t k = 0;
    while (u >= 0x80) {
        out[k++] = (uint8_t)(u | 0x80);
        u >>= 7;
    }
    out[k++] = (uint8_t)u;
    return k;
}

/* What vg_sparse_rows reads, written (SparseStepLog.encode after its name table): n records of
 * four LEB128 values (op-index gap, name id, value count, entry count) from the (n x 4) table of
 * (op index, name id, value count, entry count), then every entry's position gap, record after
 * record (the first from -1). One call where numpy took a dozen.
 * Returns the bytes written (out has room for 9 * (4n + total)), or -1 when a value to write is
 * negative (op indices not increasing, positions not increasing within a record) or the entry
 * counts do not add up to total; the numpy code then words it. */
int64_t vg_sparse_body(const int64_t *table, int64_t n, const int64_t *positions, int64_t total, uint8_t *out) {
    int64_t k = 0, op = -1, sum = 0;
    for (int64_t r = 0; r < n; r++) {
        const int64_t *row = table + 4 * r;
        const int64_t head[4] = {row[0] - op - 1, row[1], row[2], row[3]};
        for (int i = 0; i < 4; i++) {
            if (head[i] < 0) return -1;
            k += put_uvarint((uint64_t)head[i], out + k);
        }
        op = row[0];
        if (row[3] > total - sum) return -1;
        sum += row[3];
    }
    if (sum != total) return -1;
    int64_t at = 0;
    for (int64_t r = 0; r < n; r++) {
        int64_t p = -1;
        for (int64_t j = 0; j < table[4 * r + 3]; j++, at++) {
            const int64_t g = positions[at] - p - 1;
            if (g < 0) return -1;
            k += put_uvarint((uint64_t)g, out + k);
            p = positions[at];
        }
    }
    return k;
}

/* A sparse chunk's records after its name table (log/sparse.py's _parse_payload): n records of four
 * LEB128 values (op-index gap, name id, value count, entry count), then every entry's position gap,
 * record after record. Writes the table (n x 4, the op indices in place of their gaps) and the
 * positions (room for at most `room`). Returns how many positions, or -1 when anything is off, and
 * the numpy code then words it: the bytes (truncated, overlong, left over), a name id past n_names,
 * an op index past uint32, gaps that add up to 2^62 or more over the chunk, a position at or past
 * its record's value count, more positions than room. It accepts exactly what the numpy code does. */
int64_t vg_sparse_rows(const uint8_t *buf, int64_t len, int64_t n, int64_t n_names, int64_t *table,
                       int64_t *positions, int64_t room) {
    const int64_t op_limit = (int64_t)1 << 32, sum_limit = (int64_t)1 << 62;
    int64_t k = n > 0 ? vg_uvarint_decode(buf, len, 4 * n, table) : 0;
    if (k < 0) return -1;
    int64_t op = -1, total = 0;
    for (int64_t r = 0; r < n; r++) {
        int64_t *row = table + 4 * r;
        if (row[0] >= op_limit) return -1;
        op += row[0] + 1;
        if (op >= op_limit || row[1] >= n_names || row[3] > room - total) return -1;
        row[0] = op;
        total += row[3];
    }
    int64_t m = total > 0 ? vg_uvarint_decode(buf + k, len - k, total, positions) : 0;
    if (m < 0 || k + m != len) return -1;
    int64_t sum = 0, at = 0;
    for (int64_t r = 0; r < n; r++) {
        const int64_t *row = table + 4 * r;
        int64_t p = -1;
        for (int64_t j = 0; j < row[3]; j++, at++) {
            int64_t g = positions[at];
            if (g >= sum_limit - sum - 1) return -1; /* the chunk's sum of (gap + 1) would reach 2^62 */
            sum += g + 1;
            p += g + 1;
            positions[at] = p;
        }
        if (row[3] > 0 && p >= row[2]) return -1;
    }
    return total;
}

/* float64 lanes to float32, for state tensors, which lie on the float32 grid: returns 0, or -1 when
 * a lane is not a float32 value (off the grid, or NaN; the caller words it). The conversion is
 * exact for every lane that passes, so the bytes do not depend on the machine. */
static inline int64_t to_float32(const double *restrict x, int64_t n, float *restrict out) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float f = (float)x[i];
        out[i] = f;
        bad |= (double)f != x[i] ? 1 : 0;
    }
    return bad ? -1 : 0;
}

/* to_float32 over k tensors (addresses and lengths), each into out at its byte offset: a state has
 * a hundred small tensors, and one call instead of a hundred saves most of the time. The offsets
 * are those of the canonical bytes, where a header precedes each tensor, so they need not be float
 * aligned: a block is converted into an aligned buffer, then copied into place (little-endian
 * machines only; the caller checks). */
VECTOR_CLONES int64_t vg_to_float32(const int64_t *addrs, const int64_t *counts, const int64_t *offsets, int64_t k,
                                    uint8_t *restrict out) {
    float block[BLOCK];
    for (int64_t j = 0; j < k; j++) {
        const double *x = (const double *)(intptr_t)addrs[j];
        for (int64_t b = 0; b < counts[j]; b += BLOCK) {
            int64_t len = counts[j] - b < BLOCK ? counts[j] - b : BLOCK;
            if (to_float32(x + b, len, block) != 0) return -1;
            memcpy(out + offsets[j] + 4 * b, block, (size_t)len * 4);
        }
    }
    return 0;
}

/* The RNG's stream (rng.stream): Philox4x32-10 (Salmon et al. 2011) with counter (step, id, block
 * mod 2^32, block >> 32) and key (k0, k1); word j of block b is stream position 4b + j. Writes
 * count words (as int64) per id, row after row; ids = NULL is one row of id 0. The torch code does
 * it in 242 tensor ops a draw (2.4 ms a gpt-shakespeare draw on CPU); this loop takes 4 ns a word
 * (an AVX2 version measured 3 ns, not worth a second copy). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void philox_block(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c[0], p1 = (uint64_t)PHILOX_M1 * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = (uint32_t)p1;
        c[2] = n2;
        c[3] = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
}

/* The four words at positions p .. p+3 (p a multiple of 4) of row id's stream, into c. */
static inline void philox_at(int64_t step, uint32_t id, int64_t p, int64_t k0, int64_t k1, uint32_t c[4]) {
    uint64_t b = (uint64_t)p / 4;
    c[0] = (uint32_t)step;
    c[1] = id;
    c[2] = (uint32_t)b;
    c[3] = (uint32_t)(b >> 32);
    philox_block(c, (uint32_t)k0, (uint32_t)k1);
}

void vg_philox_stream(int64_t step, const int64_t *ids, int64_t rows, int64_t count, int64_t k0, int64_t k1,
                      int64_t *restrict out) {
    for (int64_t e = 0; e < rows; e++) {
        uint32_t id = ids ? (uint32_t)ids[e] : 0, c[4];
        int64_t *restrict row = out + e * count;
        for (int64_t p = 0; p < count; p += 4) {
            philox_at(step, id, p, k0, k1, c);
            for (int j = 0; j < 4 && p + j < count; j++) row[p + j] = c[j];
        }
    }
}

/* Dropout's scaled keep mask (rng.scaled_keep): the stream's word at each position, as
 * vg_philox_stream draws it, compared with threshold (<= 2^32), value where below and +0 where not,
 * as float64. One pass: the words as int64, their compare and the float64 product were three
 * passes and two tensors more, some 0.1 ms of a gpt-shakespeare draw. */
void vg_philox_scaled_keep(int64_t step, const int64_t *ids, int64_t rows, int64_t count, int64_t k0, int64_t k1,
                           int64_t threshold, double value, double *restrict out) {
    for (int64_t e = 0; e < rows; e++) {
        uint32_t id = ids ? (uint32_t)ids[e] : 0, c[4];
        double *restrict row = out + e * count;
        for (int64_t p = 0; p < count; p += 4) {
            philox_at(step, id, p, k0, k1, c);
            for (int j = 0; j < 4 && p + j < count; j++) row[p + j] = (int64_t)c[j] < threshold ? value : 0.0;
        }
    }
}

/* The packed log's trit blocks (log/trits.py's pack_trits): 116 trits (four groups of 29, digit 0 least
 * significant) in 23 bytes, the little-endian 184-bit g0 + g1 2^46 + g2 2^92 + g3 2^138. The
 * caller has checked every trit is 0..2. Written byte by byte, so the layout is the same on any
 * machine. */
#define GROUP_TRITS 29
#define BLOCK_TRITS 116
#define BLOCK_BYTES 23
#define MAX_GROUP 68630377364882ULL /* 3^29 - 1 */

static inline void put_le(uint8_t *out, uint64_t w, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(w >> (8 * i));
}

static inline uint64_t get_le(const uint8_t *in, int bytes) {
    uint64_t w = 0;
    for (int i = 0; i < bytes; i++) w |= (uint64_t)in[i] << (8 * i);
    return w;
}

void vg_pack_trit_blocks(const uint8_t *restrict t, int64_t blocks, uint8_t *restrict out) {
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *d = t + b * BLOCK_TRITS;
        uint64_t g[4];
        for (int k = 0; k < 4; k++) {
            uint64_t acc = 0;
            for (int i = GROUP_TRITS - 1; i >= 0; i--) acc = acc * 3 + d[k * GROUP_TRITS + i];
            g[k] = acc;
        }
        uint8_t *o = out + b * BLOCK_BYTES;
        put_le(o, g[0] | (g[1] << 46), 8);
        put_le(o + 8, (g[1] >> 18) | (g[2] << 28), 8);
        put_le(o + 16, (g[2] >> 36) | (g[3] << 10), 7);
    }
}

/* Five trits for each byte value below 3^5 = 243, digit 0 first (vg_init fills it). */
static uint8_t trits_of[243][5];

/* Fill the tables; the loader calls it once, before any kernel runs. */
void vg_init(void) {
    for (int v = 0; v < 243; v++) {
        int x = v;
        for (int i = 0; i < 5; i++) {
            trits_of[v][i] = (uint8_t)(x % 3);
            x /= 3;
        }
    }
}

/* Inverse of vg_pack_trit_blocks. Returns 0, or -1 - i when group i is above 3^29 - 1 (not 29
 * trits); nothing is promised about t then. Why not 29 divisions by 3 a group: they are one chain
 * of dependent multiplies (the auditor's read of a packed gpt-shakespeare chunk, 1.85M trits, took
 * 2.2 ms). A group is cut at 3^15 into its low 15 trits and its high 14, each of those into three
 * base-243 digits, and a digit's five trits come from a table. */
int64_t vg_unpack_trit_blocks(const uint8_t *restrict in, int64_t blocks, uint8_t *restrict t) {
    const uint64_t m46 = (1ULL << 46) - 1, p15 = 14348907ULL; /* 3^15 */
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *p = in + b * BLOCK_BYTES;
        uint64_t w0 = get_le(p, 8), w1 = get_le(p + 8, 8), w2 = get_le(p + 16, 7);
        uint64_t g[4] = {w0 & m46, ((w0 >> 46) | (w1 << 18)) & m46, ((w1 >> 28) | (w2 << 36)) & m46, w2 >> 10};
        for (int k = 0; k < 4; k++)
            if (g[k] > MAX_GROUP) return -1 - (b * 4 + k);
        uint8_t *d = t + b * BLOCK_TRITS;
        for (int k = 0; k < 4; k++) {
            uint32_t lo = (uint32_t)(g[k] % p15), hi = (uint32_t)(g[k] / p15); /* hi < 3^14 */
            uint8_t *o = d + k * GROUP_TRITS;
            memcpy(o, trits_of[lo % 243], 5);
            memcpy(o + 5, trits_of[lo / 243 % 243], 5);
            memcpy(o + 10, trits_of[lo / 59049], 5); /* 243^2: lo / 243^2 < 243 */
            memcpy(o + 15, trits_of[hi % 243], 5);
            memcpy(o + 20, trits_of[hi / 243 % 243], 5);
            memcpy(o + 25, trits_of[hi / 59049], 4); /* below 81: four trits, the group's last */
        }
    }
    return 0;
}

/* One transcript step's files (game/training/transcript/), in the writer's order and with the
 * moves of game/fsio.py: the chunk written to its temporary name, fsynced and renamed, the log
 * directory fsynced; the chunk hash appended and fsynced; the checkpoint, when there is one, like
 * the chunk; the leaf appended and fsynced last, since it marks the step complete. Why in C: ctypes
 * lets go of the GIL for the whole call, where the same moves in Python were some twenty calls a
 * step, each a hand-over of the GIL that the trainer's thread then waited for (docs/benchmarks.md).
 * Returns 0, or the errno of the first failure with *failed set to the file it hit: 1 the chunk,
 * 2 the chunk hashes, 3 the checkpoint, 4 the leaves; then nothing after that file was written,
 * and a temporary file is removed. -1: not built for this platform (the caller writes in Python). */
#if defined(__unix__) || defined(__APPLE__)
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

static int write_all(int fd, const uint8_t *p, int64_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, (size_t)(n < (1 << 30) ? n : (1 << 30)));
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        p += k;
        n -= k;
    }
    return 0;
}

/* As fsio.fsync_dir: best effort (some file systems refuse to open or sync a directory). */
static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        (void)close(fd);
    }
}

/* Write, fsync and close fd; the first errno, or 0. */
static int finish_file(int fd, const uint8_t *data, int64_t n) {
    int err = write_all(fd, data, n);
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    return err;
}

static int put_file(const char *path, const char *tmp, const char *dir, const uint8_t *data, int64_t n) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return errno;
    int err = finish_file(fd, data, n);
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        (void)unlink(tmp);
        return err;
    }
    sync_dir(dir);
    return 0;
}

static int append_file(const char *path, const uint8_t *data, int64_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) return errno;
    return finish_file(fd, data, n);
}

int64_t vg_write_step(const char *chunk_path, const char *chunk_tmp, const char *log_dir, const uint8_t *chunk,
                      int64_t chunk_len, const char *hashes_path, const uint8_t *chunk_hash, const char *ckpt_path,
                      const char *ckpt_tmp, const char *ckpt_dir, const uint8_t *ckpt, int64_t ckpt_len,
                      const char *leaves_path, const uint8_t *leaf, int64_t *failed) {
    int err;
    *failed = 1;
    if ((err = put_file(chunk_path, chunk_tmp, log_dir, chunk, chunk_len))) return err;
    *failed = 2;
    if ((err = append_file(hashes_path, chunk_hash, 32))) return err;
    *failed = 3;
    if (ckpt_path && (err = put_file(ckpt_path, ckpt_tmp, ckpt_dir, ckpt, ckpt_len))) return err;
    *failed = 4;
    if ((err = append_file(leaves_path, leaf, 32))) return err;
    *failed = 0;
    return 0;
}
#else
int64_t vg_write_step(const char *chunk_path, const char *chunk_tmp, const char *log_dir, const uint8_t *chunk,
                      int64_t chunk_len, const char *hashes_path, const uint8_t *chunk_hash, const char *ckpt_path,
                      const char *ckpt_tmp, const char *ckpt_dir, const uint8_t *ckpt, int64_t ckpt_len,
                      const char *leaves_path, const uint8_t *leaf, int64_t *failed) {
    *failed = 0;
    return -1;
}
#endif
