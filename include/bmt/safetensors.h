/* bmt/safetensors.h — reading safetensors checkpoints by byte range, and finding
 * the transformer blocks in them.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
 * header ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {str: str}}) and the data section, which the tensors cover
 * exactly (no holes, no overlap). A Hugging Face sharded checkpoint adds
 * model.safetensors.index.json, whose "weight_map" names the file of each tensor.
 *
 * bmt_st_open reads the headers only (8 + N bytes per file) and validates them
 * completely; bmt_st_read then reads exactly the bytes of the elements asked for,
 * with pread, converting them to f32, bf16 or f64 through a bounded buffer
 * (BMT_ST_CHUNK_BYTES). So a rank that loads its shard of every tensor needs
 * memory for its shard and the headers, never for a whole tensor or file.
 * bmt_st_discover groups the tensors into head, layers 0..L-1 and tail by their
 * names (docs/safetensors.md), with no list of names written by hand.
 *
 * Errors follow bmt/error.h (0/-1 or pointer/NULL, no side effects) and name the
 * file, the tensor and the cause, e.g.
 *   "model-00002-of-00003.safetensors: tensor 'h.3.attn.c_attn.weight':
 *    data_offsets [100, 90] are not increasing".
 * A handle may be read from several threads at once (pread has no file position).
 */
#ifndef BMT_SAFETENSORS_H
#define BMT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/bmt.h"
#include "bmt/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BMT_ST_MAX_DIMS 8              /* dimensions of a tensor bmt accepts */
#define BMT_ST_MAX_HEADER 100000000ull /* header bytes, the reference reader's cap */
#define BMT_ST_CHUNK_BYTES (4u << 20)  /* source bytes converted per pread */
#define BMT_ST_MAX_LAYERS 100000       /* layer numbers discovery accepts: 0..99999 */
#define BMT_ST_INDEX_NAME "model.safetensors.index.json"
#define BMT_ST_FILE_NAME "model.safetensors"

/* Element types of the safetensors format, in the reference library's order.
 * Every one can be listed; bmt_st_read converts F64, F32, F16 and BF16. */
typedef enum bmt_st_dtype {
    BMT_ST_BOOL = 0,
    BMT_ST_U8,
    BMT_ST_I8,
    BMT_ST_F8_E5M2,
    BMT_ST_F8_E4M3,
    BMT_ST_I16,
    BMT_ST_U16,
    BMT_ST_F16,
    BMT_ST_BF16,
    BMT_ST_I32,
    BMT_ST_U32,
    BMT_ST_F32,
    BMT_ST_F64,
    BMT_ST_I64,
    BMT_ST_U64,
    BMT_ST_DTYPE_COUNT
} bmt_st_dtype_t;

/* The format's name of a dtype ("F32", "BF16"; "invalid" out of range) and its
 * size in bytes (0 out of range). */
BMT_API const char *bmt_st_dtype_name(bmt_st_dtype_t dtype);
BMT_API size_t bmt_st_dtype_size(bmt_st_dtype_t dtype);

/* One tensor of an opened checkpoint. Strings belong to the handle. */
typedef struct bmt_st_tensor {
    const char *name;               /* full name, e.g. "transformer.h.3.ln_1.weight" */
    bmt_st_dtype_t dtype;           /* dtype in the file */
    int ndim;                       /* 0 (a scalar) .. BMT_ST_MAX_DIMS */
    int64_t shape[BMT_ST_MAX_DIMS]; /* (ndim), C order; unused entries 0 */
    int64_t numel;                  /* product of shape (1 for a scalar) */
    const char *file;               /* path of the file that holds it */
    int64_t offset;                 /* absolute byte offset of element 0 in that file */
    int64_t nbytes;                 /* numel * bmt_st_dtype_size(dtype) */
} bmt_st_tensor_t;

typedef struct bmt_st bmt_st_t;

/* Open a checkpoint and read and check its headers (no tensor data is read).
 *   path: a .safetensors file; a model.safetensors.index.json (any name ending
 *         in ".json" is read as an index; its files are relative to its
 *         directory); or a directory holding model.safetensors or, when it has
 *         none, model.safetensors.index.json. A directory holding both is read
 *         through model.safetensors alone, its index unread, as transformers'
 *         from_pretrained reads it (SAFE_WEIGHTS_NAME before
 *         SAFE_WEIGHTS_INDEX_NAME); a model.safetensors that is no regular
 *         file is refused, not passed over. bmt's own checkpoints have no
 *         model.safetensors (bmt_ckpt_save refuses a block named "model"), so
 *         a step directory opens through its index.
 * The files stay open until bmt_st_close. Returns the handle, or NULL with err
 * naming the file, the tensor and the cause (every check: docs/safetensors.md). */
BMT_API bmt_st_t *bmt_st_open(const char *path, bmt_error_t *err);

/* The same checks on a header already in memory, with no file behind it (pure;
 * for tests and tools). header: the N JSON bytes (not NUL-terminated);
 * data_len: bytes of the data section; file: the name errors and tensors use.
 * Listing and discovery work on the result; bmt_st_read fails. */
BMT_API bmt_st_t *bmt_st_parse(const char *header, size_t len, uint64_t data_len, const char *file,
                               bmt_error_t *err);

/* One file of an index, in memory, for bmt_st_parse_index. */
typedef struct bmt_st_shard {
    const char *file;   /* its name in the weight_map: "model-00001-of-00002.safetensors" */
    const char *header; /* (len) its JSON header, not NUL-terminated */
    size_t len;
    uint64_t data_len; /* bytes of its data section */
} bmt_st_shard_t;

/* The same checks as bmt_st_open on an index, with the headers of its files
 * already in memory (pure; for tests and fuzzing; bmt_st_open's index path runs
 * the same code). json: the index's len bytes (not NUL-terminated); path: where
 * the index would be (NULL: BMT_ST_INDEX_NAME): errors use its last component,
 * and a tensor's file is its directory + the weight_map's name. shards: nshards
 * files, found by that name; a named file with no shard fails as a missing file
 * does ("...: cannot open: No such file or directory"), a shard no one names is
 * ignored. Borrowed: nothing is kept after the call. Listing, metadata and
 * discovery work on the result; bmt_st_read fails. NULL with err on an error. */
BMT_API bmt_st_t *bmt_st_parse_index(const char *json, size_t len, const char *path,
                                     const bmt_st_shard_t *shards, int nshards, bmt_error_t *err);

/* Close the files and free everything (tensor views and names included).
 * NULL is a no-op. */
BMT_API void bmt_st_close(bmt_st_t *st);

/* Tensors are listed sorted by name (strcmp), over all files of an index.
 * bmt_st_find: the index of name (binary search), or -1.
 * bmt_st_tensor: tensor i in [0, bmt_st_count), NULL out of range. */
BMT_API int bmt_st_count(const bmt_st_t *st);
BMT_API int bmt_st_find(const bmt_st_t *st, const char *name);
BMT_API const bmt_st_tensor_t *bmt_st_tensor(const bmt_st_t *st, int i);

/* A value of the header's "__metadata__" (for an index: its "metadata" object,
 * strings and integers, then the files' "__metadata__"; the first one wins), or
 * NULL when absent. Owned by the handle. */
BMT_API const char *bmt_st_metadata(const bmt_st_t *st, const char *key);

/* Read elements [first, first + count) of tensor i (flat index, C order) into
 * dst: count elements of dst_dtype (BMT_F32, BMT_BF16 or BMT_F64). The source
 * must be F64, F32, F16 or BF16; conversion rounds to nearest even (f64 -> bf16
 * rounds once, not through f32), NaN stays NaN, and f16 subnormals are exact.
 * Reads exactly those count * itemsize bytes with pread: into dst when the
 * dtypes match, else through one buffer of at most BMT_ST_CHUNK_BYTES.
 * count 0 of a tensor of those dtypes reads nothing and succeeds (any other
 * dtype is refused whatever the count).
 * Errors (-1): a bad index, range or dtype, a file shorter than its header says
 * (truncated after open), an I/O error; each names the file and the tensor.
 * On an I/O error dst may hold part of the result. */
BMT_API int bmt_st_read(bmt_st_t *st, int i, int64_t first, int64_t count, void *dst,
                        bmt_dtype_t dst_dtype, bmt_error_t *err);

/* Convert n elements (pure; what bmt_st_read applies to each chunk). src and dst
 * need no alignment. Returns 0, or -1 (nothing written) when the pair is not
 * supported: src F64, F32, F16 or BF16; dst BMT_F32, BMT_BF16 or BMT_F64. */
BMT_API int bmt_st_convert(const void *src, bmt_st_dtype_t src_dtype, void *dst,
                           bmt_dtype_t dst_dtype, size_t n);

/* ------------------------------------------------------------ checksums */

/* A checksummed unit of a file: bytes [offset, offset + len) of the file
 * (absolute offsets) and their XXH3-64 (xxHash, seed 0). */
typedef struct bmt_st_sum {
    uint64_t offset;
    uint64_t len;
    uint64_t xxh3;
} bmt_st_sum_t;

#define BMT_ST_SUM_MAX_UNIT (64ull << 20) /* bytes: the largest unit accepted */

/* XXH3-64 of n bytes: the hash of bmt_st_sum_t and of a file's header. */
BMT_API uint64_t bmt_st_checksum(const void *p, size_t n);

/* Attach the checksums of one file of st (file: its path as opened, or its name
 * without the directory). header_xxh3 is the hash of the file's first 8 + N
 * bytes (length and JSON header); it is compared with the bytes read at open
 * at once. The n units (any order; copied) must tile the file's data section
 * exactly, each 1 to BMT_ST_SUM_MAX_UNIT bytes. From then on bmt_st_read of a
 * tensor of that file reads the whole units that cover the elements asked for
 * (at most one unit more on each side), checks each one's hash, and fails on
 * a mismatch naming the file, the tensor and the byte range; the values come
 * from the bytes checked, never from a second read. -1 with err (nothing
 * attached): no such file, a header mismatch, units that do not tile the data
 * section (a file longer or shorter than when the sums were taken). */
BMT_API int bmt_st_set_checksums(bmt_st_t *st, const char *file, uint64_t header_xxh3,
                                 const bmt_st_sum_t *sums, size_t n, bmt_error_t *err);

/* Read every unit of every file of st and check its hash (*bytes: how many
 * were read, when not NULL). -1 with err naming the first file, tensor and
 * byte range that differs, or a file that has no checksums attached. */
BMT_API int bmt_st_verify(bmt_st_t *st, uint64_t *bytes, bmt_error_t *err);

/* ------------------------------------------------------------ block discovery */

typedef enum bmt_st_block_kind {
    BMT_ST_HEAD = 0, /* embeddings: names with wte, wpe, embed, tok_emb or pos_emb */
    BMT_ST_LAYER,    /* one transformer layer: "<prefix>.<h|layers|layer|blocks|block>.<N>." */
    BMT_ST_TAIL,     /* everything else: final norm, lm_head */
} bmt_st_block_kind_t;

typedef struct bmt_st_block {
    bmt_st_block_kind_t kind;
    const char *name;         /* "head", "tail", or the layer's prefix: "transformer.h.3" */
    int layer;                /* N for a layer, -1 for head and tail */
    int count;                /* tensors in the block (head and tail may have none) */
    const int *tensors;       /* (count) indices for bmt_st_tensor, sorted by name */
    const char *const *names; /* (count) names within the block: "ln_1.weight" for a
                                 layer, the full name for head and tail */
} bmt_st_block_t;

typedef struct bmt_st_plan {
    int nlayers;              /* L */
    int nblocks;              /* L + 2 */
    const char *layer_prefix; /* the stack's prefix, "transformer.h." ("" if L == 0) */
    bmt_st_block_t *blocks;   /* (nblocks) model order: [0] head, [1..L] layers 0..L-1,
                                 [L + 1] tail */
} bmt_st_plan_t;

/* Group the tensors of st into blocks (rules in docs/safetensors.md): layers must
 * be numbered 0..L-1 without gaps, belong to one stack, and have the same
 * relative names and shapes as layer 0. On success *plan is a new plan that
 * borrows st's names: free it (bmt_st_plan_free) before closing st. Errors (-1,
 * *plan untouched) name the layer and the tensor. */
BMT_API int bmt_st_discover(const bmt_st_t *st, bmt_st_plan_t **plan, bmt_error_t *err);
BMT_API void bmt_st_plan_free(bmt_st_plan_t *plan);

#ifdef __cplusplus
}
#endif
#endif
