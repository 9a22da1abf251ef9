#!/bin/bash
# make install: binaries, headers, libraries, bmt.pc, templates, man page, the
# Python package (importable from the prefix under the installed bmlaunch); a
# program built against the installed tree with pkg-config runs under the
# installed bmlaunch; the shared library exports the public API only. make
# install runs with the knobs $BUILDDIR was built with ($BUILDDIR/.knobs), so
# it rebuilds nothing: an ASAN=1 tree stays sanitized for the tests after this.
. "$(dirname "$0")/lib.sh"
KNOBS=$(cat "$BUILDDIR/.knobs" 2>/dev/null)
# A program linked with a sanitized libbmt must carry the same runtime.
case " $KNOBS " in
*" ASAN=1 "*) SANCC="-fsanitize=address,undefined" ;;
*" TSAN=1 "*) SANCC="-fsanitize=thread" ;;
*) SANCC="" ;;
esac
export SANCC

test_expect_success "make install in the same BUILDDIR with its own knobs keeps its flags; PREFIX recompiles monitor.c only" '
    test -f "$BUILDDIR/.knobs" && cp "$BUILDDIR/.flags" flags.before &&
    make -C "$SRC" install $KNOBS BUILDDIR="$BUILDDIR" PREFIX="$PWD/prefix" >log 2>&1 &&
    cmp flags.before "$BUILDDIR/.flags" &&
    { grep -E "^  (CC|NVCC) " log || true; } >compiled &&
    { ! test -s compiled || test "$(cat compiled)" = "  CC      runtime/monitor.c"; } &&
    make -C "$SRC" install $KNOBS BUILDDIR="$BUILDDIR" PREFIX="$PWD/prefix" >log 2>&1 &&
    ! grep -qE "^  (CC|NVCC|LD) " log
'

# One installed tree for the tests below (each make install to a new PREFIX
# recompiles monitor.c and relinks: ~10 s a test on a 2-core machine).
P=$TMP/prefix
make -s -C "$SRC" install $KNOBS BUILDDIR="$BUILDDIR" PREFIX="$P" >"$TMP/install.log" 2>&1
install_rc=$?
export P install_rc

test_expect_success "make install PREFIX=... installs every part" '
    { test $install_rc -eq 0 || { tail -20 "$TMP/install.log"; false; }; } &&
    ln -s "$P" prefix &&
    test -x prefix/bin/bmlaunch &&
    test -f prefix/include/bmt/bmt.h && test -f prefix/include/bmt/layout.h &&
    test -f prefix/include/bmt/error.h &&
    test -f prefix/lib/libbmt.a && test -f prefix/lib/libbmt.so.0 && test -L prefix/lib/libbmt.so &&
    test -f prefix/lib/pkgconfig/bmt.pc &&
    test -f prefix/share/bmt/templates/bmt.sbatch &&
    for f in bmt-alerts.yml bmt-alerts.test.yml grafana-bmt.json; do
        cmp "$SRC/monitoring/$f" prefix/share/bmt/monitoring/$f || exit 1
    done &&
    test -f prefix/share/man/man1/bmlaunch.1 &&
    test -f prefix/include/bmt/plugin.h && test -f prefix/include/bmt/monitor.h &&
    test -x prefix/lib/bmt/plugins/push.so && test -x prefix/lib/bmt/plugins/jsonl.so
'

test_expect_success "the installed bmlaunch renders its own installed template, BMT_TEMPLATE_DIR one in place of it, and refuses a BMT_TEMPLATE_DIR without one" '
    test $install_rc -eq 0 && ln -s "$P" prefix &&
    cp -r prefix/share/bmt/templates mine && echo "# the installed copy" >>prefix/share/bmt/templates/bmt.sbatch &&
    prefix/bin/bmlaunch --sbatch -N 1 -- true >out && grep -qx "# the installed copy" out &&
    echo "# my copy" >>mine/bmt.sbatch &&
    BMT_TEMPLATE_DIR=$PWD/mine prefix/bin/bmlaunch --sbatch -N 1 -- true >out &&
    grep -qx "# my copy" out && ! grep -q "# the installed copy" out &&
    mkdir empty && { BMT_TEMPLATE_DIR=$PWD/empty prefix/bin/bmlaunch --sbatch -N 1 -- true >out 2>err; rc=$?; } &&
    test $rc -eq 2 && test ! -s out && grep -q "BMT_TEMPLATE_DIR=$PWD/empty: .*bmt.sbatch: No such file" err
'

test_expect_success "the Python package installs under PREFIX/lib/python3/dist-packages and imports from there under the installed bmlaunch" '
    test $install_rc -eq 0 && ln -s "$P" prefix &&
    test -f prefix/lib/python3/dist-packages/bmt/__init__.py &&
    test -f prefix/lib/python3/dist-packages/bmt/torch.py &&
    test -f prefix/share/bmt/examples/torch/train.py &&
    PYTHONPATH=$P/lib/python3/dist-packages prefix/bin/bmlaunch --metrics-port 0 -g 2 -n 1 -- \
        /usr/bin/python3 -c "import bmt, sys; l = bmt.layout(); assert \"torch\" not in sys.modules
print(l.rank, l.groups, l.group, l.replica, bmt.__file__)" >out 2>err &&
    grep -qx "0: 0 2 0 0 $P/lib/python3/dist-packages/bmt/__init__.py" out &&
    grep -qx "1: 1 2 1 0 $P/lib/python3/dist-packages/bmt/__init__.py" out
'

test_expect_success "the installed torch example trains on its default data, the corpus installed beside it (it was not installed: FileNotFoundError)" '
    test $install_rc -eq 0 && ln -s "$P" prefix &&
    cmp "$SRC/examples/gpt2/data/corpus.txt" prefix/share/bmt/examples/gpt2/data/corpus.txt &&
    if ! /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
        echo "# skipped the run: /usr/bin/python3 has no torch"
    else
        PYTHONPATH=$P/lib/python3/dist-packages prefix/bin/bmlaunch --metrics-port 0 -n 1 -- \
            /usr/bin/python3 prefix/share/bmt/examples/torch/train.py --steps 2 --batch 2 --seq 16 \
            >out 2>err || { cat err; exit 1; }
        grep -qE "^0: step +2/2 \| loss [0-9.]+ " out
    fi
'

test_expect_success "the installed bmlaunch finds the installed plugins; a plugin built with pkg-config loads" '
    test $install_rc -eq 0 && ln -s "$P" prefix &&
    export PKG_CONFIG_PATH=$P/lib/pkgconfig &&
    cat >mine.c <<-EOF &&
	#include <stdio.h>
	#include <bmt/plugin.h>
	static FILE *f;
	static int init(const bmt_job_info_t *job, void **state, char *err, size_t len) {
	    (void)err; (void)len; char p[64]; snprintf(p, sizeof p, "mine-%d.txt", job->rank);
	    f = fopen(p, "w"); *state = f; return f ? 0 : -1;
	}
	static void on_step(void *s, const bmt_step_metrics_t *m) {
	    fprintf(s, "step %lld tokens %lld\\n", (long long)m->step, (long long)m->tokens);
	}
	static void finalize(void *s) { fclose(s); }
	BMT_PLUGIN_EXPORT const bmt_monitor_plugin_v1_t bmt_monitor_plugin_v1 = {
	    sizeof(bmt_monitor_plugin_v1_t), BMT_PLUGIN_ABI_VERSION, "mine", init, on_step, NULL, finalize,
	};
	EOF
    cat >user.c <<-EOF &&
	#include <stdio.h>
	#include <bmt/monitor.h>
	int main(void) {
	    bmt_ctx_t *ctx; bmt_error_t err;
	    if (bmt_init(&ctx, NULL, &err) < 0) { fprintf(stderr, "%s\\n", err.text); return 1; }
	    for (int s = 0; s < 3; s++) {
	        bmt_step_report_t r = BMT_STEP_REPORT_INITIALIZER;
	        r.tokens = 100; r.samples = 1;
	        if (bmt_report_step(ctx, &r, NULL, &err) < 0) { fprintf(stderr, "%s\\n", err.text); return 1; }
	    }
	    printf("plugins %d: %s %s\\n", bmt_plugin_count(ctx), bmt_plugin_name(ctx, 0), bmt_plugin_name(ctx, 1));
	    bmt_finalize(ctx); return 0;
	}
	EOF
    cc -std=c11 $SANCC -shared -fPIC mine.c -o mine.so $(pkg-config --cflags bmt) &&
    cc -std=c11 $SANCC user.c -o user $(pkg-config --cflags --libs bmt) &&
    BMT_PLUGINS=jsonl,$PWD/mine.so BMT_JSONL=$PWD/m-%r.jsonl \
        prefix/bin/bmlaunch --metrics-port 0 -n 2 -- ./user >out 2>err &&
    grep -qx "0: plugins 2: jsonl $PWD/mine.so" out &&
    test "$(cat mine-1.txt)" = "$(printf "step 1 tokens 100\\nstep 2 tokens 100\\nstep 3 tokens 100")" &&
    test "$(grep -c "\"type\":\"step\"" m-0.jsonl)" -eq 3
'

test_expect_success "a program built with pkg-config against the installed bmt runs under bmlaunch" '
    test $install_rc -eq 0 && ln -s "$P" prefix &&
    export PKG_CONFIG_PATH=$P/lib/pkgconfig &&
    test "$(pkg-config --modversion bmt)" = "$(sed -n "s/^#define BMT_VERSION_STRING \"\(.*\)\"/\1/p" "$SRC/include/bmt/bmt.h")" &&
    cat >user.c <<-EOF &&
	#include <stdio.h>
	#include <bmt/bmt.h>
	int main(void) {
	    bmt_ctx_t *ctx; bmt_error_t err;
	    if (bmt_init(&ctx, NULL, &err) < 0) { fprintf(stderr, "%s\n", err.text); return 1; }
	    float x = (float)bmt_rank(ctx) + 1, *d = bmt_mem_alloc(ctx, sizeof x, &err);
	    if (!d || bmt_mem_upload(ctx, d, &x, sizeof x, &err) ||
	        bmt_all_reduce(bmt_comm_world(ctx), d, d, 1, BMT_F32, BMT_SUM, &err) ||
	        bmt_mem_download(ctx, &x, d, sizeof x, &err)) { fprintf(stderr, "%s\n", err.text); return 1; }
	    printf("user program: rank %d sum %.0f\n", bmt_rank(ctx), x);
	    bmt_mem_free(ctx, d); bmt_finalize(ctx); return 0;
	}
	EOF
    cc -std=c11 $SANCC user.c -o user $(pkg-config --cflags --libs bmt) &&
    ldd ./user | grep -q "libbmt.so.0 => $P/lib/libbmt.so.0" &&
    prefix/bin/bmlaunch -n 3 -- ./user >out &&
    grep -qx "2: user program: rank 2 sum 6" out
'

test_expect_success "libbmt.so exports the bmt_ API and nothing else" '
    nm -D --defined-only "$BUILDDIR/lib/libbmt.so" | awk "\$2 != \"A\" {print \$3}" | grep -v "^bmt_" >extra || true
    test ! -s extra || { cat extra; false; }
    nm -D --defined-only "$BUILDDIR/lib/libbmt.so" | grep -q " T bmt_init@@BMT_0$"
'

test_done
