/* launcher/sdfile.h — a Prometheus file_sd target file for the job's collector.
 *
 * With --metrics-sd-file PATH bmlaunch writes, once its collector listens,
 *   [{"targets": ["HOST:PORT"], "labels": {"job_id": "JOB"}}]
 * (with "__scheme__": "https" among the labels when the collector serves
 * HTTPS) to PATH (a temporary file in the same directory renamed to it, so a
 * Prometheus watching the directory never reads half a file) and removes it
 * when bmlaunch exits, so Prometheus finds each job's collector by itself
 * (file_sd_configs) and drops it when the job is gone. PATH is the job's own:
 * one that exists (another job's) is refused, never replaced. Layer: launcher
 * only.
 */
#ifndef BMT_LAUNCHER_SDFILE_H
#define BMT_LAUNCHER_SDFILE_H

#include <stdbool.h>
#include <stddef.h>

#include "bmt/error.h"

/* Render the target file's text for host (an IPv6 address is bracketed),
 * port, job_id (JSON-escaped) and https (the __scheme__ label) into buf,
 * ending with a newline. Pure.
 * Returns the length written, or -1 when it does not fit in len (buf is then
 * an empty string) or port is outside 1..65535. */
int sdfile_render(const char *host, int port, const char *job_id, bool https, char *buf,
                  size_t len);

/* Is addr a numeric address of every interface, in any spelling (0.0.0.0,
 * ::, ::0, 0:0::0)? Such a bind serves other hosts under this host's name. */
bool sdfile_unspecified(const char *addr);

/* Write the target file to path atomically: a temporary file beside it
 * (path.tmp.PID, created new: a file or link already at that name is refused,
 * never written through), written whole, then renamed to path where nothing
 * is yet.
 * A wildcard host (0.0.0.0, ::, in any spelling) is written as this host's
 * name. Returns 0, or -1 with err naming the path and the cause (a name
 * file_sd does not read: not ending in .json, .yml or .yaml; no such
 * directory; a directory; a file that exists; no permission); on failure
 * nothing is left behind and path is unchanged. */
int sdfile_write(const char *path, const char *host, int port, const char *job_id, bool https,
                 bmt_error_t *err);

/* Where the collector's certificate goes beside the target file path, for
 * Prometheus's tls_config ca_file: path without a .json, .yml or .yaml ending,
 * plus ".ca.pem" (a name file_sd's *.json pattern does not take). Pure.
 * Returns 0, or -1 when it does not fit in len. */
int sdfile_ca_path(const char *path, char *buf, size_t len);

/* Write text to path atomically as sdfile_write does; what names the file in
 * err. what SDFILE_WHAT marks a file of --metrics-sd-file, which belongs to
 * this job: one that exists at path is refused (EEXIST), as in sdfile_write.
 * Any other what (the copy in --log-dir) replaces what is at path. Returns 0
 * or -1 with err. */
#define SDFILE_WHAT "--metrics-sd-file"
int sdfile_write_text(const char *path, const char *what, const char *text, size_t n,
                      bmt_error_t *err);

/* Remove the target file (NULL: no-op; a file already gone is not an error). */
void sdfile_remove(const char *path);

#endif
