/* common/data.h — the trainers' token data: llm.c token shards, a
 * data-parallel reader that reads only this rank's slice of every batch, and a
 * byte-level tokenizer that writes such shards (GPT-2's and Llama's trainers
 * share it; it lived in examples/gpt2 until the Llama trainer came).
 *
 * Shard format (llm.c dev/data/data_common.py write_datafile), two kinds:
 *   bytes [0, 1024)           header: 256 int32, little-endian
 *                               [0] = 20240520 (DATA_SHARD_MAGIC, model "gpt-2")
 *                                  or 20240801 (DATA_SHARD_MAGIC_U32, model "llama-3")
 *                               [1] = 1 (DATA_SHARD_VERSION) for the first,
 *                                     7 (DATA_SHARD_VERSION_U32) for the second
 *                               [2] = n, the number of tokens (0 <= n < 2^31)
 *                               [3..255] = 0 (written as 0, not checked on read)
 *   bytes [1024, 1024 + w n)  the n tokens, little-endian: uint16 (w = 2) in a
 *                             "gpt-2" shard, uint32 (w = 4) in a "llama-3" one,
 *                             for vocabularies past 65,536 (Llama 3's 128,256)
 * The file size must be exactly 1024 + w n bytes. The reader takes both kinds,
 * shard by shard (a pattern may match both); a 4-byte token of 2^31 or more does
 * not fit the int32 batches and is refused with its shard and offset.
 *
 * Batches (exactly llm.c's DataLoader(B, T, process_rank, num_processes) with
 * shuffling off, llmc/dataloader.h): the shards are the files matching a glob
 * pattern, in glob(3)'s sorted order. The world is data parallel: one global
 * batch is G = world*B*T consecutive tokens of one shard. The loader's position
 * (shard s, pos p), the same on every rank, is the token offset in shard s of
 * the next global batch. data_loader_next() does:
 *   if p + G + 1 > n_s:  s = (s + 1) % nshards, p = 0   (after the last shard:
 *                                                         the first = next epoch)
 *   rank r reads the B*T+1 tokens [p + r*B*T, p + r*B*T + B*T + 1) of shard s:
 *     inputs[i] = tok[i], targets[i] = tok[i + 1]         (i in [0, B*T), row-major (B, T))
 *   p += G
 * (with accum micro-batches a global batch, data_loader_set_accum, the first
 * line is taken for accum*G tokens at a step's first micro-batch, and micro-batch
 * m reads at p + m*G + r*B*T; p += accum*G after the last)
 * so the ranks' inputs of one step tile G consecutive tokens without overlap,
 * each target row is its input row shifted by one token, and each shard serves
 * k_s = floor((n_s - 1)/G) global batches: its last n_s - 1 - k_s*G tokens are
 * never read (llm.c drops them too). Every shard must hold at least G + 1 tokens
 * (llm.c asserts the same), so k_s >= 1. The tiling holds only where every
 * rank's pattern matches the same shards; the loader has no communicator to
 * check that, so its caller compares the ranks' data_loader_digest (the
 * trainers do, before the first step).
 * llm.c's resume state (current_shard_idx, current_sample_idx: the next sample,
 * as train_gpt2.cu saves it) is the position (current_shard_idx,
 * current_sample_idx * G) here; both switch shards lazily, at the next call.
 *
 * Byte-level tokenizer: the vocabulary is the 256 byte values, token = byte
 * (0..255), no merges and no special tokens; any file, text or not, round-trips.
 *
 * Errors: functions return 0 (or a pointer) on success and -1 (or NULL) on
 * failure, fill err (when not NULL) with one line naming the file and what is
 * wrong with it, and have no other effect on failure.
 */
#ifndef COMMON_DATA_H
#define COMMON_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "bmt/bmt.h"

#define DATA_SHARD_MAGIC 20240520
#define DATA_SHARD_VERSION 1
#define DATA_SHARD_MAGIC_U32 20240801
#define DATA_SHARD_VERSION_U32 7
#define DATA_SHARD_HEADER_INTS 256
#define DATA_SHARD_HEADER_BYTES (DATA_SHARD_HEADER_INTS * 4) /* 1024 */
#define DATA_SHARD_MAX_TOKENS 2147483647LL                   /* the count is an int32 */
#define DATA_BYTE_VOCAB 256 /* vocabulary of the byte-level tokenizer */

/* ---------------------------------------------------------------- shard header */

/* Check a shard header, with no I/O.
 *   head: the first head_len bytes of the file (at most DATA_SHARD_HEADER_BYTES
 *         are looked at); file_size: the file's size in bytes.
 * Returns 0 and the token count in *ntok (untouched on failure), or -1 and err
 * says which check failed: a truncated header (head_len or file_size below
 * 1024), the magic, the version, a negative count, or a count that does not match
 * the file size (both sizes are printed). The message does not name the file:
 * the caller prefixes it. */
int data_shard_check_header(const uint8_t *head, size_t head_len, int64_t file_size, int64_t *ntok,
                            bmt_error_t *err);

/* The same, saying which kind: *token_bytes = 2 or 4 (untouched on failure;
 * may be NULL). data_shard_check_header accepts both kinds too. */
int data_shard_header(const uint8_t *head, size_t head_len, int64_t file_size, int64_t *ntok,
                      int *token_bytes, bmt_error_t *err);

/* Fill out[1024] with the header of a shard of n tokens (n in [0, 2^31)) of
 * token_bytes 2 ("gpt-2") or 4 ("llama-3"); data_shard_make_header: 2. */
void data_shard_make_header(uint8_t out[DATA_SHARD_HEADER_BYTES], int64_t n);
void data_shard_make_header_w(uint8_t out[DATA_SHARD_HEADER_BYTES], int64_t n, int token_bytes);

/* Write a shard of n tokens to path, atomically: the bytes go to a temporary file
 * in path's directory, are fsync'ed, and the file is renamed over path. On
 * failure path is untouched (absent, or its previous content) and no temporary
 * file is left. tokens may be NULL when n is 0. Errors: n >= 2^31, and any
 * open/write/fsync/rename failure (err names the file and the errno text). */
int data_write_shard(const char *path, const uint16_t *tokens, size_t n, bmt_error_t *err);

/* The same for a "llama-3" shard of 4-byte tokens (llm.c's model_desc "llama-3"). */
int data_write_shard_u32(const char *path, const uint32_t *tokens, size_t n, bmt_error_t *err);

/* ---------------------------------------------------------------- reader */

typedef struct data_loader data_loader_t;

/* Open the shards matching pattern (a path or a glob(3) pattern) for rank `rank`
 * of `world` data-parallel ranks, batches of B rows of T tokens.
 * Every shard's header is validated here (data_shard_check_header against the
 * file's real size) and each must hold at least world*B*T + 1 tokens; only the
 * header is read. Holds at most one file open and one buffer of B*T+1 tokens.
 * Returns the loader at position (0, 0), or NULL and err: B, T or world < 1,
 * rank outside [0, world), B*T >= 2^31, a missing file, a pattern that matches
 * nothing, an unreadable file or directory, a folder the pattern reaches into
 * that cannot be listed (glob(3) alone would skip it and the shards in it), a
 * bad header, a too-short shard. */
data_loader_t *data_loader_open(const char *pattern, int B, int T, int rank, int world,
                                bmt_error_t *err);

/* Close the file and free the loader. NULL: no-op. */
void data_loader_destroy(data_loader_t *loader);

/* Read this rank's next batch (semantics at the top of this file).
 *   inputs, targets: (B, T) int32 each, row-major, full (not a shard), caller's.
 * Reads exactly B*T+1 tokens with pread (plus the 1024-byte header, checked
 * again, when it moves to another shard). Returns 0, or -1 when the file cannot
 * be opened or read or has changed since open (err names it); then the outputs
 * are untouched and the position has not moved. */
int data_loader_next(data_loader_t *loader, int32_t *inputs, int32_t *targets, bmt_error_t *err);

/* Make one global batch `accum` micro-batches (default 1), as a trainer with
 * gradient accumulation reads it: the accum calls of data_loader_next of one
 * step read the consecutive micro-batches [p + m*G, p + (m+1)*G) (G =
 * world*B*T, m = 0..accum-1) of one shard, and whether the step moves on to
 * the next shard is decided once, at its first micro-batch, for all accum*G
 * tokens: so B x accum x world sequences read the same tokens in every split
 * (1x1 -b 8 and 1x1 -b 2 -a 4 and 2x2 -b 2 alike), shard ends and epochs
 * included. (llm.c decides it per micro-batch, so its micro-batches of one
 * step can straddle two shards; with accum 1 the two are the same.) The
 * position (data_loader_position) is then the next step's; set it between
 * steps. Returns 0, or -1 and err naming the first shard that holds fewer than
 * accum*world*B*T+1 tokens (loader unchanged) or accum < 1. */
int data_loader_set_accum(data_loader_t *loader, int accum, bmt_error_t *err);

/* Back to the first batch of the first shard: position (0, 0). */
void data_loader_reset(data_loader_t *loader);

/* The position of the next global batch: shard index and token offset in that
 * shard (the same on every rank). Either pointer may be NULL. */
void data_loader_position(const data_loader_t *loader, int *shard, int64_t *pos);

/* Set the position, e.g. to resume from a checkpoint of data_loader_position.
 * shard in [0, nshards), pos in [0, n_shard]; any pos is accepted, and when no
 * global batch fits at pos the next call moves on to the following shard.
 * Returns 0, or -1 and err for a shard or pos out of range (position unchanged). */
int data_loader_seek(data_loader_t *loader, int shard, int64_t pos, bmt_error_t *err);

/* Tokens in all shards together. */
int64_t data_loader_tokens(const data_loader_t *loader);

/* The distinct global batches (of accum micro-batches: data_loader_set_accum)
 * of all shards together: what data_loader_next serves from position (0, 0)
 * before it starts again at the first. */
int64_t data_loader_batches(const data_loader_t *loader);

/* Number of shards, tokens in shard i and its token width in bytes (2 or 4);
 * -1 if i is out of range. */
int data_loader_num_shards(const data_loader_t *loader);
int64_t data_loader_shard_tokens(const data_loader_t *loader, int i);
int data_loader_token_bytes(const data_loader_t *loader, int i);

/* The path of shard i as the pattern matched it (owned by the loader, valid
 * until destroy), or NULL if i is out of range. */
const char *data_loader_shard_path(const data_loader_t *loader, int i);

/* XXH3-64 of the shards as the loader sees them, in order: each one's file
 * name (the last component of its path, not the folder), token count and
 * token width; the tokens themselves are not read (no I/O). Loaders of the
 * same shards in any folder on any host give the same value, which the
 * trainers compare across ranks; 0 for NULL. */
uint64_t data_loader_digest(const data_loader_t *loader);

/* XXH3-64 of shard i's token bytes [from, to) as stored (little-endian, the
 * shard's width), read through a file of its own: the loader's position and
 * open file are left alone. The shard's header is checked again first, as a
 * read does. 0 and *hash, or -1 and err (a range outside the shard, a shard
 * changed since open, a read error). */
int data_loader_shard_hash(const data_loader_t *loader, int i, int64_t from, int64_t to,
                           uint64_t *hash, bmt_error_t *err);

/* ---------------------------------------------------------------- byte-level tokenizer */

/* Tokenize the file text_path byte by byte (token = byte value) into the shards
 * <out_prefix>_train.bin (the first n - v bytes) and <out_prefix>_val.bin (the
 * last v = floor(val_fraction * n) bytes), where n is the file's size in bytes;
 * the split is at a byte boundary. Both files are written atomically as
 * data_write_shard does, and both are renamed into place only once both are
 * complete; if the second rename fails the first output is taken back (the
 * file it replaced, kept under a temporary name until then, is put back, or,
 * when there was none, it is removed), so on failure neither output has
 * changed and no temporary file is left. The folders of
 * out_prefix that do not exist are made first (and taken away again on a
 * failure).
 * Errors: val_fraction outside [0, 1), an unreadable or non-regular file, a text
 * of 2^31 bytes or more, an empty train part, an earlier <prefix>_train.bin
 * that cannot be kept to put back (a file system without hard links), any
 * write failure.
 * (val_fraction 0 writes a val shard of 0 tokens, which the reader refuses.) */
int data_tokenize_file(const char *text_path, const char *out_prefix, double val_fraction,
                       bmt_error_t *err);

/* Render byte-level tokens as text for printing samples, snprintf-style.
 * Bytes 0x20..0x7e, '\n' and '\t' are copied, as are well-formed UTF-8
 * sequences (RFC 3629: no overlong forms, surrogates or code points past
 * U+10FFFF); every other byte becomes "\xHH" (two lowercase hex digits) and a
 * token outside 0..255 becomes "<|N|>". So text that is valid UTF-8 with no
 * control characters but '\n' and '\t' decodes to itself.
 *   out: outlen bytes; when outlen > 0 it is always NUL-terminated, and cut only
 *        between whole characters (never inside an escape or a UTF-8 sequence).
 * Returns the length of the whole rendering (without the NUL, so a value >=
 * outlen means it was cut), or -1 for n < 0, tokens NULL with n > 0, out NULL
 * with outlen > 0, or a rendering longer than INT_MAX. */
int data_decode_bytes(const int32_t *tokens, int n, char *out, size_t outlen);

#endif
