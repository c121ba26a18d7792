/* The transcript writer's work for one step in one call that holds no GIL: a chunk's payload
 * compressed (zlib, lzma or stored, the smallest of those asked for), the chunk's hash, the state's
 * hash (the leaf, leafhash.py's definition), and the step's files through kernels.c's vg_write_step.
 *
 * Why: done in Python on the writer's thread, the same work is five calls that each let the GIL
 * go and take it back (zlib, lzma's two, the state's hash, the files), and each time the writer
 * takes it back the trainer's thread stops for it between two torch ops. On a step of a few
 * milliseconds those hand-overs cost more than the work (docs/benchmarks.md). Here the writer's
 * thread takes the GIL once a step, to pick the step up.
 *
 * It links zlib, liblzma and OpenSSL's libcrypto, the libraries Python's own zlib, lzma and hashlib
 * modules wrap; where their headers are missing it does not build and the writer stays in Python.
 * The Python side (stepwriter.py) compresses a probe with both before using it: where the two
 * would give other bytes (other library versions), it stays in Python too, so a chunk's bytes never
 * depend on which side wrote them. One call serves the reader: vg_inflate, a chunk's zlib payload
 * inflated without the GIL (log/inflate.py, which probes it against Python's zlib in the same way). */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <lzma.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Codec ids, as a chunk's codec byte names them (log/codec.py's CODECS). */
#define STORED 0
#define ZLIB 1
#define LZMA 2

/* kernels.c's vg_write_step, whose address the caller passes. */
typedef int64_t (*write_step_fn)(const char *, const char *, const char *, const uint8_t *, int64_t, const char *,
                                 const uint8_t *, const char *, const char *, const char *, const uint8_t *, int64_t,
                                 const char *, const uint8_t *, int64_t *);

/* One lzma encoder per thread, kept between calls: set up afresh, an encoder costs three times what
 * compressing a small chunk does (its match finder's tables). Freed when its thread ends. */
static pthread_key_t stream_key;
static pthread_once_t stream_once = PTHREAD_ONCE_INIT;
static int stream_key_ok = 0;

static void free_stream(void *p) {
    lzma_end((lzma_stream *)p);
    free(p);
}

static void make_key(void) { stream_key_ok = pthread_key_create(&stream_key, free_stream) == 0; }

static lzma_stream *thread_stream(void) {
    (void)pthread_once(&stream_once, make_key);
    if (!stream_key_ok) return NULL;
    lzma_stream *s = pthread_getspecific(stream_key);
    if (s == NULL) {
        s = malloc(sizeof *s);
        if (s == NULL) return NULL;
        lzma_stream init = LZMA_STREAM_INIT;
        *s = init;
        if (pthread_setspecific(stream_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    return s;
}

/* One block as codec.py's zlib_blocks deflates it: raw deflate (no header), 15 window bits, memory
 * level 8, the input in with Z_NO_FLUSH, then Z_SYNC_FLUSH (Z_FINISH for the last block), as Python's
 * compressobj feeds it. Returns its length, or -1. */
static int64_t deflate_block(const uint8_t *in, int64_t n, int level, int last, uint8_t *out, int64_t cap) {
    z_stream s;
    memset(&s, 0, sizeof s);
    if (deflateInit2(&s, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) return -1;
    s.next_in = (Bytef *)in;
    s.avail_in = (uInt)n;
    s.next_out = out;
    s.avail_out = (uInt)cap;
    int ok = deflate(&s, Z_NO_FLUSH) == Z_OK && s.avail_in == 0;
    if (ok) {
        int r = deflate(&s, last ? Z_FINISH : Z_SYNC_FLUSH);
        ok = last ? r == Z_STREAM_END : r == Z_OK && s.avail_out > 0;
    }
    int64_t len = ok ? cap - (int64_t)s.avail_out : -1;
    deflateEnd(&s);
    return len;
}

typedef struct {
    const uint8_t *in;
    int64_t n, block, blocks, cap, level;
    uint8_t *scratch; /* block i's output at i * cap */
    int64_t *lens;
    int64_t next; /* the next block to take, by any thread */
} blocks_job;

static void *deflate_blocks(void *arg) {
    blocks_job *b = arg;
    for (;;) {
        int64_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (i >= b->blocks) return NULL;
        int64_t start = i * b->block, k = b->n - start < b->block ? b->n - start : b->block;
        uint8_t *out = b->scratch + i * b->cap;
        b->lens[i] = deflate_block(b->in + start, k, (int)b->level, i == b->blocks - 1, out, b->cap);
    }
}

/* codec.py's zlib_blocks: zlib's header, the blocks deflated apart on up to ``threads`` threads (this
 * one among them; the number changes the time, never the bytes), then the whole payload's Adler-32. */
static int64_t with_zlib_blocks(const uint8_t *in, int64_t n, int64_t level, int64_t block, int64_t threads,
                                uint8_t *out, int64_t cap) {
    int64_t blocks = n > 0 ? (n + block - 1) / block : 1;
    blocks_job b = {in, n, block, blocks, block + block / 8 + 1024, level, NULL, NULL, 0};
    int64_t len = -1, started = 0;
    if (threads > blocks) threads = blocks;
    if (threads > 64) threads = 64;
    pthread_t helpers[64];
    b.scratch = malloc((size_t)(blocks * b.cap));
    b.lens = malloc((size_t)blocks * sizeof *b.lens);
    if (b.scratch == NULL || b.lens == NULL) goto done;
    while (started < threads - 1 && pthread_create(&helpers[started], NULL, deflate_blocks, &b) == 0) started++;
    deflate_blocks(&b);
    for (int64_t t = 0; t < started; t++) pthread_join(helpers[t], NULL);
    int flevel = level < 2 ? 0 : level < 6 ? 1 : level == 6 ? 2 : 3;
    int flg = flevel << 6;
    flg += 31 - (0x78 * 256 + flg) % 31;
    if (cap < 6) goto done;
    out[0] = 0x78;
    out[1] = (uint8_t)flg;
    len = 2;
    for (int64_t i = 0; i < blocks; i++) {
        if (b.lens[i] < 0 || len + b.lens[i] + 4 > cap) {
            len = -1;
            goto done;
        }
        memcpy(out + len, b.scratch + i * b.cap, (size_t)b.lens[i]);
        len += b.lens[i];
    }
    uLong sum = adler32(0L, Z_NULL, 0);
    for (int64_t at = 0; at < n; at += block) sum = adler32(sum, in + at, (uInt)(n - at < block ? n - at : block));
    for (int k = 3; k >= 0; k--) out[len++] = (uint8_t)(sum >> (8 * k));
done:
    free(b.scratch);
    free(b.lens);
    return len;
}

/* As codec.py's compress_with for zlib: zlib.compress(payload, level) (deflate's defaults, 15 window
 * bits, memory level 8) when ``block`` is 0, else zlib_blocks(payload, level, block, threads). */
static int64_t with_zlib(const uint8_t *in, int64_t n, int64_t level, int64_t block, int64_t threads, uint8_t *out,
                         int64_t cap) {
    if (block > 0) return with_zlib_blocks(in, n, level, block, threads, out, cap);
    uLongf len = (uLongf)cap;
    if (compress2(out, &len, in, (uLong)n, (int)level) != Z_OK) return -1;
    return (int64_t)len;
}

/* As lzma.compress(payload, format=FORMAT_XZ, check=CHECK_NONE, filters=[LZMA2, preset 6,
 * dict_size]): the input in with LZMA_RUN, then LZMA_FINISH, as Python's compressor feeds it. */
static int64_t with_lzma(const uint8_t *in, int64_t n, int64_t dict_size, uint8_t *out, int64_t cap) {
    lzma_stream *s = thread_stream();
    lzma_options_lzma opt;
    if (s == NULL || lzma_lzma_preset(&opt, 6)) return -1;
    opt.dict_size = (uint32_t)dict_size;
    lzma_filter filters[2] = {{LZMA_FILTER_LZMA2, &opt}, {LZMA_VLI_UNKNOWN, NULL}};
    if (lzma_stream_encoder(s, filters, LZMA_CHECK_NONE) != LZMA_OK) return -1;
    s->next_in = in;
    s->avail_in = (size_t)n;
    s->next_out = out;
    s->avail_out = (size_t)cap;
    while (s->avail_in > 0)
        if (lzma_code(s, LZMA_RUN) != LZMA_OK || s->avail_out == 0) return -1;
    for (;;) {
        lzma_ret r = lzma_code(s, LZMA_FINISH);
        if (r == LZMA_STREAM_END) break;
        if (r != LZMA_OK || s->avail_out == 0) return -1;
    }
    return cap - (int64_t)s->avail_out;
}

/* ``in`` compressed with codec ZLIB (at ``level``, in blocks of ``block`` bytes on ``threads`` threads
 * unless it is 0) or LZMA (with ``dict_size``) into out; the length, or -1 (out too small, or the
 * library failed). */
int64_t vg_compress(int64_t codec, const uint8_t *in, int64_t n, int64_t level, int64_t block, int64_t threads,
                    int64_t dict_size, uint8_t *out, int64_t cap) {
    if (codec == ZLIB) return with_zlib(in, n, level, block, threads, out, cap);
    if (codec == LZMA) return with_lzma(in, n, dict_size, out, cap);
    return -1;
}

/* As log/inflate.py's Python inflate (zlib's decompressobj().decompress(in, cap), then its eof and
 * unused data), in one call that holds no GIL: Python's lets the GIL go and takes it back once for
 * every block of output it grows, some eight times for a GPT-2-shape chunk. Inflates the zlib stream
 * ``in`` (n bytes) into out, at most ``cap`` bytes. Returns the bytes written once the stream ended
 * with nothing after it; else -1: it did not end within ``in`` and ``cap`` bytes (truncated, or
 * longer than that); -2: bytes after its end (how many in *detail); -3: zlib refused it (its code in
 * *detail, its message in msg, which has room for 256 bytes: the stream's, else the one CPython's
 * zlib module gives that code, else empty); -4: the library failed, or a size past zlib's 32-bit
 * counts (Python's way then). */
int64_t vg_inflate(const uint8_t *in, int64_t n, uint8_t *out, int64_t cap, int64_t *detail, char *msg) {
    msg[0] = 0;
    if (n < 0 || cap < 0 || (uint64_t)n > UINT_MAX || (uint64_t)cap > UINT_MAX) return -4;
    z_stream s;
    memset(&s, 0, sizeof s);
    if (inflateInit(&s) != Z_OK) return -4;
    s.next_in = (Bytef *)in;
    s.avail_in = (uInt)n;
    s.next_out = out;
    s.avail_out = (uInt)cap;
    int r;
    do { /* one call takes it all; again only while one made progress and both sides have room */
        uInt before_in = s.avail_in, before_out = s.avail_out;
        r = inflate(&s, Z_SYNC_FLUSH);
        if (r != Z_OK || (s.avail_in == before_in && s.avail_out == before_out)) break;
    } while (s.avail_in > 0 && s.avail_out > 0);
    int64_t got;
    if (r == Z_STREAM_END) {
        *detail = (int64_t)s.avail_in;
        got = s.avail_in > 0 ? -2 : cap - (int64_t)s.avail_out;
    } else if (r == Z_OK || r == Z_BUF_ERROR) {
        got = -1;
    } else if (r == Z_MEM_ERROR) {
        got = -4;
    } else {
        const char *m = s.msg;
        if (m == NULL) m = r == Z_STREAM_ERROR ? "inconsistent stream state" : r == Z_DATA_ERROR ? "invalid input data" : "";
        snprintf(msg, 256, "%.200s", m);
        *detail = r;
        got = -3;
    }
    inflateEnd(&s);
    return got;
}

/* SHA-256 of ``in`` into out (32 bytes); 0, or -1 when the library failed. */
int64_t vg_sha256(const uint8_t *in, int64_t n, uint8_t *out) {
    unsigned int len = 0;
    return EVP_Digest(in, (size_t)n, out, &len, EVP_sha256(), NULL) == 1 && len == 32 ? 0 : -1;
}

/* A log chunk's leaf in the log tree (game/chunkleaf.py, the contract's provideData): the project's
 * Merkle tree (game/merkle.py) over the SHA-256 of each PIECE_BYTES-byte piece of ``in`` (the last may
 * be shorter; an empty chunk is one empty piece), then SHA-256 of n as uint64 big-endian and that
 * root, into out (32 bytes). Level by level the tree pairs nodes left to right and promotes a lone
 * last node, which is RFC 6962's shape. 0, or -1 (no memory, or the library failed). */
#define PIECE_BYTES 122880
int64_t vg_chunk_leaf(const uint8_t *in, int64_t n, uint8_t *out) {
    if (n < 0) return -1;
    int64_t count = n == 0 ? 1 : (n + PIECE_BYTES - 1) / PIECE_BYTES, err = -1;
    uint8_t *nodes = malloc((size_t)(32 * count)), buf[65], sized[40];
    if (nodes == NULL) return -1;
    for (int64_t k = 0; k < count; k++) {
        int64_t at = k * PIECE_BYTES, take = n - at < PIECE_BYTES ? n - at : PIECE_BYTES;
        buf[0] = 0x00; /* the leaf node: sha256(0x00 || sha256(piece)) */
        if (vg_sha256(in + at, take, buf + 1) != 0 || vg_sha256(buf, 33, nodes + 32 * k) != 0) goto done;
    }
    for (int64_t width = count; width > 1; width = (width + 1) / 2) {
        for (int64_t i = 0; i + 1 < width; i += 2) {
            buf[0] = 0x01;
            memcpy(buf + 1, nodes + 32 * i, 32);
            memcpy(buf + 33, nodes + 32 * (i + 1), 32);
            if (vg_sha256(buf, 65, nodes + 32 * (i / 2)) != 0) goto done;
        }
        if (width % 2 == 1) memmove(nodes + 32 * (width / 2), nodes + 32 * (width - 1), 32);
    }
    for (int i = 0; i < 8; i++) sized[i] = (uint8_t)((uint64_t)n >> (8 * (7 - i)));
    memcpy(sized + 8, nodes, 32);
    err = vg_sha256(sized, 40, out);
done:
    free(nodes);
    return err;
}

/* The leaf (leafhash.py, format vgame-leaf-v2): as LEAF_FORMAT, CHUNK and DIGEST there. */
static const uint8_t LEAF_FORMAT[] = "vgame-leaf-v2"; /* with its NUL: 14 bytes, as Python's tag */
#define LEAF_CHUNK 4096
#define LEAF_DIGEST 32

/* SHA-256 of each LEAF_CHUNK-byte chunk of ``in`` (the last may be shorter), one after the other into
 * out; the bytes written, or -1. ``out`` may be ``in``: digest i lands before chunk i + 1 starts.
 * Each chunk's context is a copy of ``fresh`` (initialised once): initialising it afresh costs a
 * fifth more than the hashing of a 4 KiB chunk with OpenSSL 3. */
static int64_t leaf_level(EVP_MD_CTX *ctx, const EVP_MD_CTX *fresh, const uint8_t *in, int64_t n, uint8_t *out) {
    int64_t w = 0;
    for (int64_t at = 0; at < n; at += LEAF_CHUNK, w += LEAF_DIGEST) {
        uint8_t digest[LEAF_DIGEST];
        size_t take = (size_t)(n - at < LEAF_CHUNK ? n - at : LEAF_CHUNK);
        if (EVP_MD_CTX_copy_ex(ctx, fresh) != 1 || EVP_DigestUpdate(ctx, in + at, take) != 1 ||
            EVP_DigestFinal_ex(ctx, digest, NULL) != 1)
            return -1;
        memcpy(out + w, digest, LEAF_DIGEST);
    }
    return w;
}

/* The leaf of the canonical bytes ``in`` into out (32 bytes): chunk digests level by level until at
 * most LEAF_CHUNK bytes remain, then SHA-256 of LEAF_FORMAT, n as uint64 LE and that last level.
 * 0, or -1 (no memory, or the library failed). */
int64_t vg_leaf(const uint8_t *in, int64_t n, uint8_t *out) {
    if (n < 0) return -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new(), *fresh = EVP_MD_CTX_new();
    uint8_t *level = NULL;
    const uint8_t *last = in;
    int64_t len = n, err = -1;
    uint8_t total[8];
    unsigned int got = 0;
    if (ctx == NULL || fresh == NULL || EVP_DigestInit_ex(fresh, EVP_sha256(), NULL) != 1) goto done;
    if (n > LEAF_CHUNK) {
        level = malloc((size_t)(LEAF_DIGEST * ((n + LEAF_CHUNK - 1) / LEAF_CHUNK)));
        if (level == NULL || (len = leaf_level(ctx, fresh, in, n, level)) < 0) goto done;
        while (len > LEAF_CHUNK)
            if ((len = leaf_level(ctx, fresh, level, len, level)) < 0) goto done;
        last = level;
    }
    for (int i = 0; i < 8; i++) total[i] = (uint8_t)((uint64_t)n >> (8 * i));
    if (EVP_MD_CTX_copy_ex(ctx, fresh) == 1 && EVP_DigestUpdate(ctx, LEAF_FORMAT, sizeof LEAF_FORMAT) == 1 &&
        EVP_DigestUpdate(ctx, total, sizeof total) == 1 && EVP_DigestUpdate(ctx, last, (size_t)len) == 1 &&
        EVP_DigestFinal_ex(ctx, out, &got) == 1 && got == LEAF_DIGEST)
        err = 0;
done:
    free(level);
    EVP_MD_CTX_free(ctx);
    EVP_MD_CTX_free(fresh);
    return err;
}

/* Room for any codec's output: zlib's bound, and xz's container around LZMA2's chunks (a few
 * bytes in 64 KiB) with room to spare. */
static int64_t room(int64_t n) { return n + n / 8 + 1024; }

/* A step of the transcript: the chunk is ``head`` (codec byte at ``codec_at``, overwritten) and the
 * payload compressed with the smallest of the codecs whose bits are set in ``tries`` (1 << id; a
 * tie goes to the first of zlib, lzma, stored, as log/codec.py's compress picks; zlib at ``level``
 * in blocks of ``block`` bytes on ``threads`` threads, or in one piece when it is 0); the leaf is
 * vg_leaf of ``state``, written to leaf_out; ``state`` is the checkpoint too when ``checkpoint``.
 * Then the files as vg_write_step writes them. Returns vg_write_step's errno and ``failed`` (the
 * file), 0 when done, or -1 with nothing written (no memory, a codec or the hash failed): the
 * caller writes the step its own way. */
int64_t vg_finish_step(const uint8_t *head, int64_t head_len, int64_t codec_at, const uint8_t *payload, int64_t n,
                       int64_t tries, int64_t level, int64_t block, int64_t threads, int64_t dict_size,
                       const uint8_t *state, int64_t state_len, int64_t checkpoint, const char *chunk_path,
                       const char *chunk_tmp, const char *log_dir, const char *hashes_path, const char *ckpt_path,
                       const char *ckpt_tmp, const char *ckpt_dir, const char *leaves_path, uint8_t *leaf_out,
                       int64_t *failed, void *write_step) {
    *failed = 0;
    if (codec_at < 0 || codec_at >= head_len || (tries & 7) == 0 || write_step == NULL) return -1;
    int64_t cap = room(n);
    uint8_t *chunk = malloc((size_t)(head_len + cap));
    uint8_t *spare = malloc((size_t)cap);
    int64_t err = -1;
    if (chunk == NULL || spare == NULL) goto done;
    uint8_t *body = chunk + head_len;
    int64_t len = -1;
    int codec = STORED;
    if (tries & (1 << ZLIB)) {
        if ((len = with_zlib(payload, n, level, block, threads, body, cap)) < 0) goto done;
        codec = ZLIB;
    }
    if (tries & (1 << LZMA)) {
        int64_t k = with_lzma(payload, n, dict_size, len < 0 ? body : spare, cap);
        if (k < 0) goto done;
        if (len < 0 || k < len) {
            if (len >= 0) memcpy(body, spare, (size_t)k);
            len = k;
            codec = LZMA;
        }
    }
    if ((tries & (1 << STORED)) && (len < 0 || n < len)) {
        memcpy(body, payload, (size_t)n);
        len = n;
        codec = STORED;
    }
    memcpy(chunk, head, (size_t)head_len);
    chunk[codec_at] = (uint8_t)codec;
    uint8_t chunk_hash[32];
    if (vg_chunk_leaf(chunk, head_len + len, chunk_hash) != 0 || vg_leaf(state, state_len, leaf_out) != 0) goto done;
    err = ((write_step_fn)write_step)(chunk_path, chunk_tmp, log_dir, chunk, head_len + len, hashes_path, chunk_hash,
                                      checkpoint ? ckpt_path : NULL, ckpt_tmp, ckpt_dir, checkpoint ? state : NULL,
                                      checkpoint ? state_len : 0, leaves_path, leaf_out, failed);
done:
    free(chunk);
    free(spare);
    return err;
}

/* The writer's own thread (a ring of steps): the trainer's thread hands a step over with one call
 * that keeps the GIL (vg_ring_push, loaded through ctypes.PyDLL), and a thread of this library's
 * finishes the steps in order with vg_finish_step, with no Python at all. Why: a Python writer's
 * thread takes the GIL to pick each step up and again when the C call returns, and on two vCPUs
 * each of those hand-overs stops the trainer's thread between two torch ops (docs/benchmarks.md).
 *
 * The caller keeps every pointer it pushes alive until the step is done (vg_ring_done). After a step
 * that fails (vg_finish_step's errno, or -1: it could not compress or hash), the steps after it are
 * not written (-2): a later leaf must never land after a missing one. A step's result stays readable
 * until RING_CAP more steps are pushed; the caller keeps fewer than that in flight. */
#define RING_CAP 16

typedef struct {
    const uint8_t *head, *payload, *state;
    int64_t head_len, codec_at, n, tries, level, block, threads, dict_size, state_len, checkpoint;
    const char *paths[8]; /* chunk, its temporary name, log dir, hashes, checkpoint, its temporary name, its dir,
                             leaves */
    uint8_t leaf[32];
    int64_t failed, err;
} ring_job;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done_cv;
    pthread_t thread;
    void *write_step;
    int64_t pushed, done, stopping, sleeping, broken;
    ring_job jobs[RING_CAP];
} ring_t;

static void *ring_main(void *arg) {
    ring_t *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->done == r->pushed && !r->stopping) {
            r->sleeping = 1;
            pthread_cond_wait(&r->work, &r->mu);
            r->sleeping = 0;
        }
        if (r->done == r->pushed) break; /* stopping, and every step done */
        ring_job *j = &r->jobs[r->done % RING_CAP];
        int64_t broken = r->broken;
        pthread_mutex_unlock(&r->mu);
        if (broken)
            j->err = -2;
        else
            j->err = vg_finish_step(j->head, j->head_len, j->codec_at, j->payload, j->n, j->tries, j->level,
                                    j->block, j->threads, j->dict_size, j->state, j->state_len, j->checkpoint,
                                    j->paths[0], j->paths[1], j->paths[2], j->paths[3], j->paths[4], j->paths[5],
                                    j->paths[6], j->paths[7], j->leaf, &j->failed, r->write_step);
        pthread_mutex_lock(&r->mu);
        if (j->err != 0) r->broken = 1;
        r->done++;
        pthread_cond_broadcast(&r->done_cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* A ring whose thread runs; NULL when it could not be started. */
void *vg_ring_new(void *write_step) {
    ring_t *r = calloc(1, sizeof *r);
    if (r == NULL || write_step == NULL) goto fail;
    r->write_step = write_step;
    if (pthread_mutex_init(&r->mu, NULL) != 0) goto fail;
    if (pthread_cond_init(&r->work, NULL) != 0 || pthread_cond_init(&r->done_cv, NULL) != 0) goto fail;
    if (pthread_create(&r->thread, NULL, ring_main, r) != 0) goto fail;
    return r;
fail:
    free(r);
    return NULL;
}

/* Queue a step (vg_finish_step's arguments, the paths in its order); returns its index, or -1 when
 * RING_CAP steps are in flight (nothing queued). Never waits for the thread's work. */
int64_t vg_ring_push(void *ring, const uint8_t *head, int64_t head_len, int64_t codec_at, const uint8_t *payload,
                     int64_t n, int64_t tries, int64_t level, int64_t block, int64_t threads, int64_t dict_size,
                     const uint8_t *state, int64_t state_len, int64_t checkpoint, const char *chunk_path,
                     const char *chunk_tmp, const char *log_dir, const char *hashes_path, const char *ckpt_path,
                     const char *ckpt_tmp, const char *ckpt_dir, const char *leaves_path) {
    ring_t *r = ring;
    pthread_mutex_lock(&r->mu);
    if (r->pushed - r->done >= RING_CAP) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    ring_job *j = &r->jobs[r->pushed % RING_CAP];
    j->head = head;
    j->head_len = head_len;
    j->codec_at = codec_at;
    j->payload = payload;
    j->n = n;
    j->tries = tries;
    j->level = level;
    j->block = block;
    j->threads = threads;
    j->dict_size = dict_size;
    j->state = state;
    j->state_len = state_len;
    j->checkpoint = checkpoint;
    const char *paths[8] = {chunk_path, chunk_tmp, log_dir, hashes_path, ckpt_path, ckpt_tmp, ckpt_dir, leaves_path};
    memcpy(j->paths, paths, sizeof paths);
    j->failed = 0;
    j->err = 0;
    int64_t index = r->pushed++;
    int64_t wake = r->sleeping;
    pthread_mutex_unlock(&r->mu);
    if (wake) pthread_cond_signal(&r->work);
    return index;
}

static int64_t locked_read(ring_t *r, const int64_t *field) {
    pthread_mutex_lock(&r->mu);
    int64_t n = *field;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Steps pushed, and steps done, so far. */
int64_t vg_ring_pushed(void *ring) { return locked_read(ring, &((ring_t *)ring)->pushed); }

int64_t vg_ring_done(void *ring) { return locked_read(ring, &((ring_t *)ring)->done); }

/* Wait (called without the GIL) until ``upto`` steps are done, or every step pushed is; returns
 * how many are done. */
int64_t vg_ring_wait(void *ring, int64_t upto) {
    ring_t *r = ring;
    pthread_mutex_lock(&r->mu);
    if (upto > r->pushed) upto = r->pushed;
    while (r->done < upto) pthread_cond_wait(&r->done_cv, &r->mu);
    int64_t n = r->done;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Step ``index``'s result (once done): vg_finish_step's return (or -2: not tried, an earlier step
 * failed), its leaf into leaf_out and the file that failed into failed_out. */
int64_t vg_ring_result(void *ring, int64_t index, uint8_t *leaf_out, int64_t *failed_out) {
    ring_t *r = ring;
    pthread_mutex_lock(&r->mu);
    int64_t err = -3; /* not done, or no longer kept */
    if (index >= 0 && index < r->done && index >= r->pushed - RING_CAP) {
        ring_job *j = &r->jobs[index % RING_CAP];
        memcpy(leaf_out, j->leaf, 32);
        *failed_out = j->failed;
        err = j->err;
    }
    pthread_mutex_unlock(&r->mu);
    return err;
}

/* Finish every step pushed, stop the thread and free the ring (called without the GIL). */
void vg_ring_free(void *ring) {
    ring_t *r = ring;
    if (r == NULL) return;
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    pthread_mutex_unlock(&r->mu);
    pthread_cond_signal(&r->work);
    pthread_join(r->thread, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->work);
    pthread_cond_destroy(&r->done_cv);
    free(r);
}
