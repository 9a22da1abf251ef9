/* runtime/checksum.h — the checksums of checkpoint bytes (internal).
 *
 * One hash everywhere: XXH3, 64 bits, seed 0, from xxHash (Debian's
 * libxxhash-dev; compiled in from its header, so libbmt needs no shared
 * library for it at run time). It runs at memory speed, so hashing what a rank
 * writes or reads costs little next to the I/O.
 *
 * A checkpoint records the hash of every byte range a rank writes, cut into
 * units of at most CK_UNIT bytes at multiples of CK_UNIT in the file, so that a
 * rank that reads part of a file verifies whole units only a little wider than
 * what it reads, whatever layout wrote the file (docs/checkpoints.md).
 */
#ifndef BMT_RUNTIME_CHECKSUM_H
#define BMT_RUNTIME_CHECKSUM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CK_ALGORITHM "xxh3_64"
#define CK_UNIT ((uint64_t)256 << 10) /* bytes: units end at multiples of it (or sooner) */

/* XXH3-64 of n bytes. */
uint64_t ck_hash(const void *p, size_t n);

/* Streaming: ck_begin, ck_update any number of times, ck_end gives the same
 * value as ck_hash over the concatenation. NULL from ck_begin: out of memory. */
typedef struct ck_stream ck_stream_t;
ck_stream_t *ck_begin(void);
void ck_update(ck_stream_t *s, const void *p, size_t n);
uint64_t ck_end(ck_stream_t *s); /* frees s */

/* "0123456789abcdef": 16 lowercase hex digits and a NUL. */
void ck_hex(uint64_t h, char out[17]);
/* The inverse; false unless s is exactly 16 hex digits. */
bool ck_parse_hex(const char *s, uint64_t *out);

#endif
