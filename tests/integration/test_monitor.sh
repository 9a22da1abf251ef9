#!/bin/bash
# Monitoring end to end: plugins loaded by libbmt (jsonl, push, a probe plugin
# and its broken builds), bmlaunch's collector over HTTPS (--metrics-tls: the
# job's pinned certificate, an operator's, a wrong one) and over HTTP (bad
# requests, promtool, a real Prometheus scraping it, headless Chromium rendering
# the live page),
# the push plugin against a collector that goes away and comes back, and a real
# Pushgateway, and 1000 ranks pushing to one collector. The training runs are
# engine_check on cpu (a real model, real optimizer steps), paced with --pace so
# that the scrapers see a running job; the scale test runs tests/progs/steps
# (reports only, --backend none). The Slurm two-node case is in
# tests/slurm/test_bmlaunch.sh.
. "$(dirname "$0")/lib.sh"

EC=$PROGS/engine_check
PY=/usr/bin/python3
PLUG=$BUILDDIR/tests/plugins
export BMT_TIMEOUT=60
# Runs of 100 steps and more: engine_check still checks its training against
# the fp64 reference, with a bound for f32 drift over that many AdamW steps
# (its default, 1e-5, is meant for the engine tests' 20 steps).
LONG="--bound 1e-3"

# Wait until the job has pushed step $1 on every rank (bmt_step >= $1).
# CACERT: the certificate to trust when URL is https.
wait_step() {
    local i
    for i in $(seq 300); do
        curl -sf ${CACERT:+--cacert "$CACERT"} "$URL/api/status" >status.json 2>/dev/null &&
            $PY -c 'import json,sys; sys.exit(0 if json.load(open("status.json"))["step"] >= int(sys.argv[1]) else 1)' "$1" &&
            return 0
        sleep 0.1
    done
    echo "step $1 never came; last status:" >&2
    cat status.json >&2
    return 1
}

# ------------------------------------------------------------ plugins in the runtime

test_expect_success "jsonl: one line per step and event per rank, figures consistent" '
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/m-%r-%%.jsonl BMT_PEAK_TFLOPS=0.000001 \
        $BMLAUNCH --metrics-port 0 -g 2 -n 1 -- $EC --steps 5 --event-every 2 >out 2>err &&
    test -s m-0-%.jsonl && test -s m-1-%.jsonl &&
    $PY - <<-EOF
	import json, math
	for r in (0, 1):
	    lines = [json.loads(l) for l in open("m-%d-%%.jsonl" % r)]
	    steps = [l for l in lines if l["type"] == "step"]
	    events = [l for l in lines if l["type"] == "event"]
	    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5], steps
	    assert all(l["rank"] == r for l in lines)
	    assert len({l["job"] for l in lines}) == 1
	    assert [e["kind"] for e in events] == ["note", "checkpoint_saved", "checkpoint_saved"], events
	    assert [e["detail"] for e in events[1:]] == ["ckpt/step-2", "ckpt/step-4"]
	    for i, s in enumerate(steps):
	        assert s["tokens"] == 6 and s["tokens_total"] == 6 * (i + 1), s
	        assert math.isclose(s["tokens_per_s"] * s["step_time_s"], 6, rel_tol=1e-9)
	        assert math.isclose(s["mfu"], s["flops_per_s"] / 1e6, rel_tol=1e-9), s
	        assert 0 <= s["comm_wait_s"] <= s["step_time_s"]
	        assert s["memory"]["param"]["current"] > 0 and s["microbatches"] == 2
	        # the peak of all kinds at once (it was left out of the lines)
	        peaks = [k["peak"] for k in s["memory"].values()]
	        assert max(peaks) <= s["mem_peak_all"] <= sum(peaks), s
	        assert s["grad_norm"] > 0 and s["lr"] == 0.01 and s["params"] == 2648
	print("ok")
	EOF
'

test_expect_success "jsonl: ranks sharing one file write whole lines" '
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/all.jsonl \
        $BMLAUNCH --metrics-port 0 -n 4 -- $EC --steps 10 >out 2>err &&
    $PY -c "
import json
rows = [json.loads(l) for l in open(\"all.jsonl\")]
assert len(rows) == 40 and sorted({r[\"rank\"] for r in rows}) == [0, 1, 2, 3], len(rows)"
'

test_expect_success "a probe plugin sees init, every step, events, the abort and finalize" '
    BMT_PLUGINS=$PLUG/probe.so BMT_PROBE_LOG=$PWD/probe.log \
        $BMLAUNCH --metrics-port 0 -n 2 -- $EC --steps 4 --event-every 2 --abort-at 4 >out 2>err ||
        rc=$? &&
    test "${rc:-0}" -eq 3 &&
    grep -q "^0 init world 2 job bmlaunch\..* size 152 knob fail$" probe.log &&
    test $(grep -c "^0 step" probe.log) -eq 4 && test $(grep -c "^1 step" probe.log) -ge 3 &&
    grep -qx "0 event checkpoint_saved status 0 step 2 detail ckpt/step-2" probe.log &&
    grep -qx "0 event abort status 3 step 4 detail engine_check --abort-at 4" probe.log &&
    test "$(grep "^0 " probe.log | tail -2 | head -1)" = "0 event abort status 3 step 4 detail engine_check --abort-at 4" &&
    test "$(grep "^0 " probe.log | tail -1)" = "0 finalize"
'

test_expect_success "a plugin path of 150 bytes named twice is refused as such (names were compared cut at 63 bytes)" '
    long=$PWD/$(printf "d%.0s" $(seq 120)) && mkdir -p "$long" && ln -sf "$PLUG/probe.so" "$long/probe.so" &&
    { BMT_PLUGINS=$long/probe.so,$long/probe.so BMT_PROBE_LOG=$PWD/twice.log \
        $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 1 >out 2>err; rc=$?; } &&
    test $rc -ne 0 && grep -qF "plugin $long/probe.so is named twice in BMT_PLUGINS" err &&
    BMT_PLUGINS=$long/probe.so BMT_PROBE_LOG=$PWD/once.log \
        $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 1 >out 2>err && grep -q "^0 step" once.log
'

test_expect_success "a checkpoint_saved event names a 1.6 KiB checkpoint path whole (it was cut at 1023 bytes)" '
    d=$PWD && for i in 1 2 3 4 5 6 7 8; do d=$d/$(printf "c%.0s" $(seq 200)); done && mkdir -p "$d" &&
    BMT_PLUGINS=$PLUG/probe.so BMT_PROBE_LOG=$PWD/ev.log \
        $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 3 --ckpt-dir "$d/ck" --ckpt-at 2 >out 2>err &&
    grep -qxF "0 event checkpoint_saved status 0 step 2 detail $d/ck/ec" ev.log
'

test_expect_success "scalars reach plugins with on_scalar, never one of the old size (48 bytes)" '
    BMT_PLUGINS=$PLUG/probe.so BMT_PROBE_LOG=$PWD/new.log BMT_JSONL=$PWD/m-%r.jsonl \
        $BMLAUNCH --metrics-port 0 -n 2 -- $PROGS/steps --steps 3 --scalars 1 >out 2>err &&
    BMT_PLUGINS=$PLUG/probe_48.so BMT_PROBE_LOG=$PWD/old.log \
        $BMLAUNCH --metrics-port 0 -n 2 -- $PROGS/steps --steps 3 --scalars 1 >out 2>err &&
    grep -qx "1 scalar val_loss 1.01 step 2" new.log && grep -qx "0 scalar custom_0 0 step 3" new.log &&
    test $(grep -c " scalar " new.log) -eq 12 &&
    test $(grep -c " step " old.log) -eq 6 && ! grep -q " scalar " old.log
'

test_expect_success "a scalar name one too many fails the rank and says why" '
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/m-%r.jsonl \
        $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 2 --scalars 31 >out 2>err &&
    test $(grep -c "\"type\":\"scalar\"" m-0.jsonl) -eq 64 &&
    { $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 2 --scalars 32 >out 2>err; rc=$?; } &&
    test $rc -eq 1 &&
    grep -q "bmt_report_scalar: .custom_31. would be one name too many: a process reports at most 32 names" err
'

test_expect_success "time spent in a plugin is measured: plugin_s shows a 30 ms on_step" '
    BMT_PLUGINS=$PLUG/probe.so,jsonl BMT_PROBE_LOG=$PWD/probe.log BMT_PROBE_SLEEP_MS=30 \
        BMT_JSONL=$PWD/m.jsonl $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 3 >out 2>err &&
    $PY -c "
import json
s = [json.loads(l) for l in open(\"m.jsonl\") if \"\\\"step\\\"\" in l]
assert s[0][\"plugin_s\"] < 0.02 and all(x[\"plugin_s\"] >= 0.03 for x in s[1:]), s"
'

test_expect_success "comm_wait_s: ranks waiting in a collective for a late rank show the wait, it does not" '
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/m-%r.jsonl \
        $BMLAUNCH --metrics-port 0 -n 3 -- $PROGS/steps --steps 6 --late 150 >out 2>err &&
    $PY - <<-EOF
	import json
	w = {r: [json.loads(l) for l in open("m-%d.jsonl" % r)] for r in (0, 1, 2)}
	assert all(len(w[r]) == 6 for r in w)
	for r in (0, 1):  # they wait 150 ms for rank 2 in every step
	    assert all(0.12 <= s["comm_wait_s"] <= s["step_time_s"] for s in w[r]), w[r]
	assert all(s["comm_wait_s"] < 0.075 and s["step_time_s"] >= 0.15 for s in w[2]), w[2]
	print("ok")
	EOF
'

for bad in "v2:has ABI version 2, this libbmt [0-9.]* speaks version 1: rebuild the plugin" \
           "nosym:has no symbol bmt_monitor_plugin_v1: not a bmt monitor plugin" \
           "small:its bmt_monitor_plugin_v1 is incomplete (size 16, need 48"; do
    kind=${bad%%:*} msg=${bad#*:}
    test_expect_success "a plugin built wrong ($kind) is refused: $msg" "
        { BMT_PLUGINS=$PLUG/probe_$kind.so \$BMLAUNCH --metrics-port 0 -n 2 -- \$EC --steps 2 \
            >out 2>&1; rc=\$?; } &&
        test \$rc -eq 1 && grep -q \"bmt: rank [01]: plugin $PLUG/probe_$kind.so:\\? $msg\" out &&
        ! grep -q \"checks passed\" out
    "
done

test_expect_success "a missing plugin fails bmt_init; BMT_PLUGIN_ERRORS=warn runs without it" '
    { BMT_PLUGINS=nosuch $BMLAUNCH --metrics-port 0 -n 2 -- $EC --steps 2 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 &&
    grep -q "plugin nosuch: cannot load it: .*/nosuch.so: cannot open shared object file.*check BMT_PLUGINS and BMT_PLUGIN_DIR" out &&
    BMT_PLUGIN_ERRORS=warn BMT_PLUGINS=nosuch,$PLUG/probe.so BMT_PROBE_LOG=$PWD/p.log \
        $BMLAUNCH --metrics-port 0 -n 2 -- $EC --steps 2 >out 2>&1 &&
    grep -q "warning: plugin nosuch: cannot load it.*running without it" out &&
    test $(grep -c " step " p.log) -eq 4
'

test_expect_success "a plugin whose init fails, and bad knobs, are refused with their reason" '
    { BMT_PLUGINS=$PLUG/probe.so BMT_PROBE_FAIL="no disk today" \
        $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && grep -q "plugin .*probe.so: init failed: no disk today" out &&
    { BMT_PLUGIN_ERRORS=maybe $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && grep -q "BMT_PLUGIN_ERRORS=.maybe.: use fail or warn" out &&
    { BMT_PEAK_TFLOPS=lots $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && grep -q "BMT_PEAK_TFLOPS=.lots. is not a positive number" out &&
    { BMT_PLUGINS=jsonl BMT_JSONL=m-%x $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && grep -q "unknown %x (use %r, %j or %%)" out &&
    { BMT_PLUGINS=jsonl BMT_JSONL=/nonexistent/dir/m.jsonl $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && grep -q "cannot open /nonexistent/dir/m.jsonl for appending: No such file" out &&
    { BMT_PLUGINS=push $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && grep -q "push: init failed: neither BMT_METRICS_URL" out &&
    { BMT_PLUGINS=push BMT_PUSHGATEWAY_URL=ftp://x $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>&1; rc=$?; } &&
    test $rc -eq 1 && grep -q "BMT_PUSHGATEWAY_URL=.ftp://x. is not an http:// or https:// URL" out
'

test_expect_success "a BMT_PLUGINS too long to pass on with push added is refused by bmlaunch (it was cut short)" '
    long=jsonl,$(printf "/x%.0s" $(seq 600)) &&
    { BMT_PLUGINS=$long $BMLAUNCH -n 1 -- true >out 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "^bmlaunch: BMT_PLUGINS is 1206 bytes, more than the 1018 that bmlaunch passes on" err
'

test_expect_success "BMT_PLUGINS: blanks around entries go; \"jsonl push\" is refused (push was left out silently); one plugin named by name and by path is refused (each line was written twice)" '
    BMT_PLUGINS=" jsonl ,, " BMT_JSONL=$PWD/a.jsonl \
        $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 2 >out 2>err &&
    test $(wc -l <a.jsonl) -eq 2 &&
    { BMT_PLUGINS="jsonl push" BMT_JSONL=$PWD/b.jsonl \
        $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 2 >out 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "plugin .jsonl push. in BMT_PLUGINS: .*separate plugins with .,." err &&
    ! grep -q "steps reported" out &&
    { BMT_PLUGINS="jsonl,$BUILDDIR/lib/bmt/plugins/jsonl.so" BMT_JSONL=$PWD/c.jsonl \
        $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 2 >out 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "plugin .*/jsonl.so is plugin .jsonl. again, which BMT_PLUGINS named before as jsonl: name each plugin once" err &&
    ln -s "$PLUG/probe.so" other.so &&
    { BMT_PLUGINS="$PLUG/probe.so,$PWD/other.so" BMT_PROBE_LOG=$PWD/p.log \
        $BMLAUNCH --metrics-port 0 -n 1 -- $PROGS/steps --steps 2 >out 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "other.so is plugin .probe. again" err
'

# Every line of a jsonl file must parse: a line cut by a full disk was left in
# it, the job exited 0, and past ulimit -f the next write killed the rank (SIGXFSZ).
cat >"$TMP/whole.py" <<'EOF'
import json, sys
n = 0
for i, l in enumerate(open(sys.argv[1], "rb")):
    assert l.endswith(b"\n"), "line %d is cut: %r" % (i + 1, l[-40:])
    json.loads(l)
    n += 1
assert n >= int(sys.argv[2]), n
EOF

test_expect_success "jsonl: a file that cannot take a whole line fails the rank at its next report, says why, and holds whole lines only; warn runs on" '
    { BMT_PLUGINS=jsonl BMT_JSONL=$PWD/f.jsonl $BMLAUNCH --metrics-port 0 -n 1 -- \
        bash -c "ulimit -f 16; exec $PROGS/steps --steps 200 --pace 5" >out 2>err; rc=$?; } &&
    test $rc -eq 1 && $PY $TMP/whole.py f.jsonl 5 &&
    grep -q "jsonl: writing $PWD/f.jsonl failed: only [0-9]* of [0-9]* bytes of a line written (disk full, or the file size limit" err &&
    grep -q "bmt_report_step: a monitor plugin failed: jsonl: writing $PWD/f.jsonl failed" err &&
    grep -q "jsonl: [0-9]* lines are not in $PWD/f.jsonl" err &&
    { BMT_PLUGINS=jsonl BMT_JSONL=/dev/full $BMLAUNCH --metrics-port 0 -n 2 -- \
        $PROGS/steps --steps 200 --pace 5 >out 2>err; rc=$?; } &&
    test $rc -eq 1 &&
    grep -q "a monitor plugin failed: jsonl: writing /dev/full failed: No space left on device" err &&
    BMT_PLUGIN_ERRORS=warn BMT_PLUGINS=jsonl BMT_JSONL=$PWD/w.jsonl $BMLAUNCH --metrics-port 0 -n 1 -- \
        bash -c "ulimit -f 16; exec $PROGS/steps --steps 100 --pace 2" >out 2>err &&
    $PY $TMP/whole.py w.jsonl 5 && grep -q "jsonl: [0-9]* lines are not in $PWD/w.jsonl" err &&
    grep -q "steps: 100 steps reported" out
'

test_expect_success "jsonl: a FIFO that nothing reads fails bmt_init at once (it blocked bmt_init for ever)" '
    mkfifo fifo &&
    { BMT_PLUGINS=jsonl BMT_JSONL=$PWD/fifo with_timeout 20 $BMLAUNCH --metrics-port 0 -n 1 -- \
        $PROGS/steps --steps 2 >out 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "jsonl: init failed: cannot open $PWD/fifo for appending: .*a FIFO that nothing reads" err
'

if grep -q "SAN=1" "$BUILDDIR/.knobs" 2>/dev/null; then
    echo "# skipped: jsonl fsync failure through failio.so (a sanitizer build)"
else
    test_expect_success "jsonl: a failing fsync at the end fails the rank through bmt_finalize, which says why (the job exited 0); warn runs on" '
        { BMT_PLUGINS=jsonl BMT_JSONL=$PWD/g.jsonl $BMLAUNCH --metrics-port 0 -n 1 -- \
            env LD_PRELOAD=$BUILDDIR/tests/plugins/failio.so BMT_TEST_FAIL_FSYNC=g.jsonl \
            $PROGS/steps --steps 3 >out 2>err; rc=$?; } &&
        test $rc -eq 1 &&
        grep -q "jsonl: writing $PWD/g.jsonl failed: fsync: Input/output error" err &&
        grep -q "rank 0: bmt_finalize: a monitor plugin failed: jsonl: writing $PWD/g.jsonl failed: fsync" err &&
        BMT_PLUGIN_ERRORS=warn BMT_PLUGINS=jsonl BMT_JSONL=$PWD/h.jsonl $BMLAUNCH --metrics-port 0 -n 1 -- \
            env LD_PRELOAD=$BUILDDIR/tests/plugins/failio.so BMT_TEST_FAIL_FSYNC=h.jsonl \
            $PROGS/steps --steps 3 >out 2>err &&
        grep -q "jsonl: writing $PWD/h.jsonl failed: fsync: Input/output error" err &&
        ! grep -q "bmt_finalize" err
    '
fi

# ------------------------------------------------------------ HTTPS (--metrics-tls)

test_expect_success "HTTPS: pushes pinned to the job's certificate reach /metrics; curl needs that certificate; plain HTTP fails; a wrong one fails the push, which says so; Prometheus scrapes it as docs/metrics.md says" '
    mkdir sd && pport=$(free_port) &&
    cat >prom.yml <<-EOF &&
	global:
	  scrape_interval: 1s
	scrape_configs:
	  - job_name: bmt
	    honor_labels: true
	    tls_config:
	      ca_file: $PWD/sd/job.ca.pem
	    file_sd_configs:
	      - files: ["$PWD/sd/*.json"]
	EOF
    start_job --metrics-tls on --metrics-port $(free_port) --log-dir logs --metrics-sd-file sd/job.json \
        -n 2 -- $EC --steps 400 --pace 20 $LONG &&
    case $URL in https://127.0.0.1:*) ;; *) echo "not https: $URL"; false ;; esac &&
    test -s logs/metrics-ca.pem && cmp logs/metrics-ca.pem sd/job.ca.pem &&
    grep -q "\"__scheme__\": \"https\"" sd/job.json &&
    { prometheus --config.file=prom.yml --storage.tsdb.path=$PWD/tsdb \
        --web.listen-address=127.0.0.1:$pport >prom.log 2>&1 & }
    ppid=$!
    trap "kill $ppid $JOB_PID 2>/dev/null" EXIT
    CACERT=logs/metrics-ca.pem wait_step 3 &&
    rank=$(pgrep -P $JOB_PID | head -1) &&
    $PY -c "
import ssl, sys, urllib.request
env = dict(v.split(b\"=\", 1) for v in open(\"/proc/$rank/environ\", \"rb\").read().split(b\"\\0\") if b\"=\" in v)
url, pem = env[b\"BMT_METRICS_URL\"].decode(), env[b\"BMT_METRICS_CA_PEM\"].decode()
assert url.startswith(\"https://127.0.0.1:\") and url.endswith(\"/api/push\"), url
assert pem == open(\"logs/metrics-ca.pem\").read() and pem.startswith(\"-----BEGIN CERTIFICATE-----\"), pem
open(\"token\", \"w\").write(env[b\"BMT_METRICS_TOKEN\"].decode())
# the contract of docs/metrics.md for a Python client
ctx = ssl.create_default_context(cadata=pem)
ctx.check_hostname = False
assert urllib.request.urlopen(\"$URL/api/status\", context=ctx).status == 200
" &&
    curl -sf --cacert logs/metrics-ca.pem "$URL/metrics" >metrics.txt &&
    promtool check metrics <metrics.txt &&
    grep -q "^bmt_ranks_reporting{job_id=\"[^\"]*\"} 2$" metrics.txt &&
    grep -q "^bmt_tokens_total{job_id=\"[^\"]*\"} [1-9]" metrics.txt &&
    curl -sf --cacert logs/metrics-ca.pem "$URL/" | grep -qi "<html" &&
    { curl -s "$URL/metrics" >/dev/null; rc=$?; } && test $rc -eq 60 &&
    ! curl -s --max-time 5 "http://${URL#https://}/metrics" >plain.txt && ! grep -q bmt_ plain.txt &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=other \
        -days 1 -keyout other.key -out other.pem 2>/dev/null &&
    { BMT_PLUGINS=push BMT_METRICS_URL=$URL/api/push BMT_METRICS_TOKEN=$(cat token) \
        BMT_METRICS_CA_PEM="$(cat other.pem)" BMT_PLUGIN_FLUSH_TIMEOUT=0.5 \
        $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 2 >out 2>err; rc=$?; } &&
    test $rc -eq 0 &&
    grep -q "push: cannot reach the collector.*SSL peer certificate.*not the one BMT_METRICS_CA_PEM pins" err &&
    { BMT_PLUGINS=push BMT_METRICS_URL=$URL/api/push BMT_METRICS_TOKEN=x BMT_METRICS_CA_PEM=junk \
        $BMLAUNCH --metrics-port 0 -n 1 -- $EC --steps 1 >out 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "BMT_METRICS_CA_PEM holds no PEM certificate" err &&
    for i in $(seq 120); do
        curl -sf "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=bmt_step > 0" >q.json &&
            grep -q "\"value\"" q.json && break
        sleep 0.25
    done &&
    curl -sf "http://127.0.0.1:$pport/api/v1/targets" >t.json &&
    grep -q "\"scrapeUrl\":\"https://127.0.0.1:[0-9]*/metrics\"" t.json && grep -q "\"health\":\"up\"" t.json &&
    grep -q "\"value\"" q.json &&
    { kill -INT $JOB_PID; wait $JOB_PID || true; } &&
    test ! -e sd/job.json && test ! -e sd/job.ca.pem && test -s logs/metrics-ca.pem
'

test_expect_success "HTTPS with the operator's --metrics-cert/--metrics-key; bad files are refused before anything runs" '
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=op \
        -addext subjectAltName=IP:127.0.0.1 -days 1 -keyout op.key -out op.pem 2>/dev/null &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=op2 \
        -days 1 -keyout op2.key -out op2.pem 2>/dev/null &&
    for bad in "nope.pem op.key:nope.pem" "op.key op.key:holds no certificate" \
               "op.pem op2.key:does not belong to the certificate"; do
        files=${bad%%:*} want=${bad#*:} &&
        { $BMLAUNCH --metrics-cert ${files% *} --metrics-key ${files#* } -n 1 -- touch started 2>err; rc=$?; } &&
        test $rc -eq 2 && grep -q "$want" err && test ! -e started || exit 1
    done &&
    start_job --metrics-cert op.pem --metrics-key op.key --metrics-port $(free_port) --metrics-linger 5 \
        -n 2 -- $EC --steps 4 &&
    case $URL in https://127.0.0.1:*) ;; *) false ;; esac &&
    CACERT=op.pem wait_step 4 &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; }
'

# ------------------------------------------------------------ the collector over HTTP

test_expect_success "bad --metrics-* options are refused before anything runs" '
    { $BMLAUNCH --metrics-port 70000 -n 1 -- true 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "metrics-port needs a port from 0 (off) to 65535" err &&
    { $BMLAUNCH --metrics-bind localhost -n 1 -- true 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "metrics-bind needs a numeric IPv4 or IPv6 address" err &&
    { $BMLAUNCH --metrics-bind 192.0.2.1 -n 1 -- true 2>err; rc=$?; } && test $rc -eq 2 &&
    grep -q "cannot serve metrics on 192.0.2.1" err &&
    port=$(free_port) && $PY -c "
import socket, subprocess, sys
s = socket.socket(); s.bind((\"127.0.0.1\", $port)); s.listen()
r = subprocess.run([\"$BMLAUNCH\", \"--metrics-port\", \"$port\", \"-n\", \"1\", \"--\", \"true\"], capture_output=True, text=True)
assert r.returncode == 2 and \"cannot serve metrics on 127.0.0.1 port $port\" in r.stderr, r.stderr" &&
    { $BMLAUNCH --metrics-linger -1 -n 1 -- true 2>err; rc=$?; } && test $rc -eq 2
'

test_expect_success "the default port taken: bmlaunch serves on a free one and says so" '
    $PY -c "
import socket, subprocess
s = socket.socket()
try:
    s.bind((\"127.0.0.1\", 9477)); s.listen()
except OSError:
    pass  # someone has it already: the same situation
r = subprocess.run([\"$BMLAUNCH\", \"-n\", \"1\", \"--\", \"true\"], capture_output=True, text=True)
assert r.returncode == 0, r.stderr
assert \"metrics port 9477 is taken; using a free one instead\" in r.stderr, r.stderr
assert \"metrics on http://127.0.0.1:\" in r.stderr and \":9477/\" not in r.stderr, r.stderr"
'

test_expect_success "/metrics: content type, promtool clean, job and group figures of a live job" '
    start_job --metrics-port $(free_port) --metrics-linger 30 -g 2 -n 2 -- $EC --steps 400 --pace 20 $LONG &&
    wait_step 5 &&
    curl -sfD hdr "$URL/metrics" >metrics.txt &&
    grep -qi "^content-type: text/plain; version=0.0.4; charset=utf-8" hdr &&
    promtool check metrics <metrics.txt &&
    grep -q "^bmt_job_info{job_id=\"bmlaunch\.[^\"]*\",groups=\"2\",gpus_per_group=\"2\",gpus_per_node=\"4\",nodes=\"1\",world=\"4\",device=\"cpu\"} 1$" metrics.txt &&
    grep -q "^bmt_ranks_reporting{job_id=\"[^\"]*\"} 4$" metrics.txt &&
    grep -q "^bmt_group_tokens_per_second{job_id=\"[^\"]*\",group=\"1\"} [0-9]" metrics.txt &&
    grep -q "^bmt_memory_bytes{job_id=\"[^\"]*\",kind=\"param\"} [1-9]" metrics.txt &&
    ! grep -q "^bmt_rank_" metrics.txt &&
    curl -sf "$URL/api/status" >s.json &&
    $PY -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"layout\"] == {\"groups\": 2, \"gpus_per_group\": 2, \"gpus_per_node\": 4, \"nodes\": 1, \"world\": 4, \"device\": \"cpu\"}, s[\"layout\"]
assert s[\"state\"] == \"running\" and s[\"ranks_alive\"] == 4 and s[\"ranks_reporting\"] == 4
assert len(s[\"groups\"]) == 2 and s[\"step\"] >= 5 and s[\"tokens_per_second\"] > 0
assert len(s[\"history\"]) >= 4 and all(p[\"ranks\"] == 4 for p in s[\"history\"][:-1])
" &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; }
'

test_expect_success "bad requests are refused (401, 400, 413, 405, 404) and the endpoint keeps serving" '
    start_job --metrics-port $(free_port) -n 2 -- $EC --steps 400 --pace 20 $LONG &&
    wait_step 2 &&
    job=$($PY -c "import json; print(json.load(open(\"status.json\"))[\"job\"])") &&
    code() { curl -s -o body -w "%{http_code}" "$@"; } &&
    test "$(code -X POST -d "{}" $URL/api/push)" = 401 &&
    test "$(code -X POST -H "Authorization: Bearer nope" -d "{}" $URL/api/push)" = 401 &&
    token=$(tr "\0" "\n" </proc/$(pgrep -P $JOB_PID | head -1)/environ | sed -n "s/^BMT_METRICS_TOKEN=//p") &&
    test ${#token} -eq 64 &&
    test "$(code -X POST -H "Authorization: Bearer $token" -d "{broken" $URL/api/push)" = 400 &&
    grep -q "malformed JSON" body &&
    test "$(code -X POST -H "Authorization: Bearer $token  " -d "{broken" $URL/api/push)" = 400 &&
    grep -q "malformed JSON" body &&
    test "$(code -X POST -H "Authorization: Bearer $token" -d "{\"version\":2,\"job\":\"$job\",\"rank\":9}" $URL/api/push)" = 400 &&
    grep -q "rank. must be an integer in \[0, 2)" body &&
    head -c 5000000 /dev/zero | tr "\0" " " >big &&
    test "$(code -X POST -H "Authorization: Bearer $token" --data-binary @big $URL/api/push)" = 413 &&
    test "$(code -X POST -H "Authorization: Bearer $token" -H "Transfer-Encoding: chunked" --data-binary @big $URL/api/push)" = 413 &&
    test "$(code -D hdr $URL/api/push)" = 405 && grep -qi "^allow: POST" hdr &&
    test "$(code -X DELETE $URL/metrics)" = 405 &&
    test "$(code $URL/nope)" = 404 &&
    test "$(code "$URL/api/status?ranks=true")" = 400 && grep -q "ranks=true: ranks must be 1" body &&
    test "$(code "$URL/api/status?rank=1")" = 400 && grep -q "no query argument .rank.: its only one is ranks=1" body &&
    test "$(code "$URL/api/status?ranks=0")" = 200 && ! grep -q "\"ranks\":\[" body &&
    test "$(code "$URL/api/status?ranks=1")" = 200 && grep -q "\"ranks\":\[" body &&
    rawreq() { printf "$1" | timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/${URL##*:}; cat >&3; cat <&3"; } &&
    rawreq "GARBAGE /\r\n\r\n" >raw && grep -q "^HTTP/1.1 400 " raw &&
    rawreq "GET /metrics HTTP/1.1\r\nno colon\r\n\r\n" >raw && grep -q "^HTTP/1.1 400 " raw &&
    # a request line of one word: libmicrohttpd closes the connection at once, unanswered
    rawreq "GARBAGE\r\n\r\n" >raw && test ! -s raw &&
    test "$(code $URL/metrics)" = 200 && promtool check metrics <body &&
    grep -q "code=\"401\"} 2$" body && grep -q "code=\"400\"} 3$" body &&
    grep -q "code=\"413\"} 2$" body && grep -q "code=\"405\"} 1$" body &&
    grep -q "code=\"200\"} [1-9]" body &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; }
'

test_expect_success "pushes with impossible values or far steps get 400 and change nothing; the history goes on" '
    start_job --metrics-port $(free_port) -n 2 -- $EC --steps 400 --pace 20 $LONG &&
    wait_step 3 &&
    job=$($PY -c "import json; print(json.load(open(\"status.json\"))[\"job\"])") &&
    token=$(tr "\0" "\n" </proc/$(pgrep -P $JOB_PID | head -1)/environ | sed -n "s/^BMT_METRICS_TOKEN=//p") &&
    code() { curl -s -o body -w "%{http_code}" -X POST "$@" $URL/api/push; } &&
    curl -sf "$URL/api/status?ranks=1" >r.json &&
    run0=$($PY -c "import json; print(json.dumps(json.load(open(\"r.json\"))[\"ranks\"][0][\"run\"]))") &&
    run=$($PY -c "import json; print(json.dumps(json.load(open(\"r.json\"))[\"ranks\"][1][\"run\"]))") &&
    doc() { echo "{\"version\":2,\"job\":\"$job\",\"rank\":0,\"run\":$run0,\"steps\":[$1]}"; } &&
    test "$(code -H "Authorization: Bearer $token" -d "$(doc "{\"step\":1000000}")")" = 400 &&
    grep -q "steps\[0\]: step 1000000 is far from the job.s (its highest step so far is [0-9]*; a push may be at most" body &&
    test "$(code -H "Authorization: Bearer $token" -d "$(doc "{\"step\":5,\"tokens_per_s\":null}")")" = 400 &&
    grep -q "field \"tokens_per_s\" must be a finite number: null (NaN or infinity)" body &&
    test "$(code -H "Authorization: Bearer $token" -d "$(doc "{\"step\":5,\"tokens_total\":-1}")")" = 400 &&
    grep -q "field \"tokens_total\" is a count and must not be negative (-1)" body &&
    test "$(code -H "Authorization: Bearer $token" -d "$(doc "{\"step\":5,\"tokens_per_s\":-1e300}")")" = 400 &&
    grep -q "field \"tokens_per_s\" must not be negative (-1e+300)" body &&
    test "$(code -H "Authorization: bearer $token" -d "{\"version\":2,\"job\":\"$job\",\"rank\":1,\"run\":$run}")" = 200 &&
    test "$(code -H "Authorization: BEARER $token" -d "{\"version\":2,\"job\":\"$job\",\"rank\":1,\"run\":$run}")" = 200 &&
    curl -sf "$URL/api/status" >s1.json && sleep 1.5 && curl -sf "$URL/api/status" >s2.json &&
    curl -sf "$URL/metrics" >m.txt &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; } &&
    grep -q "^bmt_collector_pushes_total{job_id=\"[^\"]*\",code=\"400\"} 4$" m.txt &&
    $PY - <<-EOF
	import json
	a, b = json.load(open("s1.json")), json.load(open("s2.json"))
	ha, hb = [p["step"] for p in a["history"]], [p["step"] for p in b["history"]]
	# the history keeps growing after the refused pushes, and holds no step of theirs
	assert hb[-1] > ha[-1] and max(hb) < 1000 and hb == sorted(hb), (ha[-3:], hb[-3:])
	assert all(p["ranks"] == 2 for p in b["history"][:-1]), b["history"][-5:]
	assert b["step"] > a["step"], (a["step"], b["step"])
	print("history", ha[-1], "->", hb[-1])
	EOF
'

# A client that holds $3 connections open and idle (from source address $2)
# while it times /metrics from 127.0.0.1; prints what it saw as JSON.
cat >"$TMP/idle.py" <<'EOF'
import json, resource, socket, sys, time, urllib.request
port, src, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 512), hard))
socks, refused = [], 0
for i in range(n):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.bind((src, 0)); s.connect(("127.0.0.1", port)); socks.append(s)
    except OSError:
        refused += 1; s.close()
time.sleep(1)
closed = 0  # connections the server closed at once (the per-address limit)
for s in socks:
    s.setblocking(False)
    try:
        closed += s.recv(1) == b""
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
def get(path):
    t = time.monotonic()
    body = urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10).read()
    return time.monotonic() - t, body
dt, body = get("/metrics")
step0 = json.loads(get("/api/status")[1])["step"]
time.sleep(1.5)
step1 = json.loads(get("/api/status")[1])["step"]
for s in socks:
    s.close()
print(json.dumps({"opened": len(socks), "refused": refused, "closed": closed, "metrics_s": dt,
                  "metrics_ok": b"bmt_job_running" in body, "steps": [step0, step1]}))
EOF

test_expect_success "/metrics answers within a second while thousands of idle connections are held; the ranks still push" '
    port=$(free_port) &&
    # a soft fd limit of 1024 (a common default) under a hard one of 4096:
    # bmlaunch takes the hard one and derives its connection limits from it
    { (ulimit -Sn 1024 && ulimit -Hn 4096 && exec $BMLAUNCH -v --metrics-port $port -n 2 -- \
        $EC --steps 3000 --pace 20 $LONG >job.out 2>job.err) & }
    JOB_PID=$!
    URL=http://127.0.0.1:$port &&
    wait_step 2 &&
    grep -q "bmlaunch: metrics: at most 3958 connections, 1979 from one address, idle ones closed after 15 s (open files limit 4096)" job.err &&
    timeout 60 $PY $TMP/idle.py $port 127.0.0.1 1800 >same.json &&
    timeout 60 $PY $TMP/idle.py $port 127.0.0.2 2600 >other.json &&
    curl -sf $URL/metrics >m.txt &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; } &&
    cat same.json other.json &&
    $PY - <<-EOF
	import json
	a, b = json.load(open("same.json")), json.load(open("other.json"))
	# 1800 idle connections from the ranks own address: all kept, and still
	assert a["opened"] == 1800 and a["closed"] == 0, a
	for x in (a, b):
	    assert x["metrics_ok"] and x["metrics_s"] < 1.0, x   # /metrics answers at once
	    assert x["steps"][1] > x["steps"][0], x              # the ranks pushes get through
	# 2600 from one other address: the server keeps 1979 and closes the rest at once
	assert b["opened"] + b["refused"] == 2600 and b["opened"] - b["closed"] <= 1979, b
	assert b["closed"] + b["refused"] >= 2600 - 1979, b
	EOF
'

test_expect_success "an idle connection is closed after 15 s" '
    start_job --metrics-port $(free_port) -n 1 -- $EC --steps 2000 --pace 20 $LONG &&
    port=${URL##*:} &&
    $PY -c "
import socket, time
s = socket.create_connection((\"127.0.0.1\", $port)); s.settimeout(30)
t = time.monotonic(); got = s.recv(1); dt = time.monotonic() - t
assert got == b\"\" and 13 <= dt <= 20, (got, dt)
print(\"closed after\", round(dt, 1), \"s\")" &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; }
'

test_expect_success "per-rank series on request; events and the end of the job reach the status" '
    start_job --metrics-port $(free_port) --metrics-per-rank --metrics-linger 20 -g 2 -n 1 -- \
        $EC --steps 6 --event-every 3 --abort-at 6 &&
    for i in $(seq 200); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    curl -sf "$URL/metrics" >m.txt && promtool check metrics <m.txt &&
    grep -q "^bmt_rank_step{job_id=\"[^\"]*\",group=\"1\",rank=\"1\"} [0-9]" m.txt &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"abort\"} 1$" m.txt &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"checkpoint_saved\"} [1-4]$" m.txt &&
    grep -q "^bmt_job_running{job_id=\"[^\"]*\"} 0$" m.txt &&
    $PY -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"state\"] == \"ended\" and s[\"exit_status\"] == 3 and s[\"ranks_alive\"] == 0, s
kinds = [e[\"kind\"] for e in s[\"events\"]]
assert \"abort\" in kinds and \"note\" in kinds and \"checkpoint_saved\" in kinds, kinds
ab = [e for e in s[\"events\"] if e[\"kind\"] == \"abort\"][0]
assert ab[\"rank\"] == 0 and ab[\"status\"] == 3 and ab[\"detail\"] == \"engine_check --abort-at 6\", ab
" &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; }
'

test_expect_success "a real Prometheus scrapes the endpoint during a run and sees tokens/s" '
    command -v prometheus >/dev/null &&
    mport=$(free_port) && pport=$(free_port) &&
    cat >prom.yml <<-EOF &&
	global:
	  scrape_interval: 1s
	scrape_configs:
	  - job_name: bmt
	    static_configs:
	      - targets: ["127.0.0.1:$mport"]
	EOF
    { prometheus --config.file=prom.yml --storage.tsdb.path=$PWD/tsdb \
        --web.listen-address=127.0.0.1:$pport >prom.log 2>&1 & }
    ppid=$!
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/m-%r.jsonl start_job --metrics-port $mport -g 2 -n 2 -- \
        $EC --steps 120 --pace 100 $LONG &&
    q() { curl -sf "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; } &&
    ok=0 &&
    for i in $(seq 240); do
        if q "bmt_tokens_per_second > 0" >q.json && grep -q "\"value\"" q.json &&
           q "count_over_time(bmt_tokens_per_second[1m]) >= 3" >c.json && grep -q "\"value\"" c.json; then
            ok=1; break
        fi
        sleep 0.25
    done &&
    test $ok = 1 &&
    q "up{job=\"bmt\"}" >up.json && grep -q "\"1\"\]" up.json &&
    q "bmt_group_tokens_per_second" >g.json &&
    rc=0; wait $JOB_PID || rc=$?
    kill $ppid; wait $ppid 2>/dev/null || true
    test $rc -eq 0 &&
    $PY - <<-EOF
	import json, glob
	v = float(json.load(open("q.json"))["data"]["result"][0]["value"][1])
	g = json.load(open("g.json"))["data"]["result"]
	assert len(g) == 2, g
	# the ranks own figures: 6 tokens per step, steps of at least 100 ms
	rates = [json.loads(l)["tokens_per_s"] for f in glob.glob("m-*.jsonl") for l in open(f)]
	per_rank = sorted(rates)[len(rates) // 2]
	assert 0 < v <= 4 * 60, v
	assert 0.5 * 4 * per_rank <= v <= 2 * 4 * per_rank, (v, per_rank)
	print("prometheus saw", v, "tokens/s; the ranks median", per_rank)
	EOF
'

test_expect_success "two jobs scraped by one Prometheus stay apart by job_id; after their end it has their last loss and state" '
    command -v prometheus >/dev/null &&
    m1=$(free_port) && m2=$(free_port) && pport=$(free_port) &&
    cat >prom.yml <<-EOF &&
	global:
	  scrape_interval: 1s
	scrape_configs:
	  - job_name: bmt
	    static_configs:
	      - targets: ["127.0.0.1:$m1", "127.0.0.1:$m2"]
	EOF
    { prometheus --config.file=prom.yml --storage.tsdb.path=$PWD/tsdb \
        --web.listen-address=127.0.0.1:$pport >prom.log 2>&1 & }
    ppid=$!
    # scraping has begun (up == 0: nothing listens yet) before the jobs start
    for i in $(seq 300); do
        curl -sf "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=up" >up.json &&
            test $(grep -o "\"instance\"" up.json | wc -l) -eq 2 && break
        sleep 0.1
    done
    # the default --metrics-linger: each bmlaunch serves until one scrape after its end
    { BMT_PLUGINS=jsonl BMT_JSONL=$PWD/a-%r.jsonl timeout 120 $BMLAUNCH --metrics-port $m1 -g 2 -n 1 -- \
        $EC --steps 60 --pace 80 --verbose $LONG >a.out 2>a.err & }
    a=$!
    { BMT_PLUGINS=jsonl BMT_JSONL=$PWD/b-%r.jsonl timeout 120 $BMLAUNCH --metrics-port $m2 -n 1 -- \
        $EC --steps 50 --pace 80 --verbose $LONG >b.out 2>b.err & }
    b=$!
    ra=0; wait $a || ra=$?; rb=0; wait $b || rb=$?
    q() { curl -sf "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; } &&
    for i in $(seq 50); do
        q "last_over_time(bmt_job_running[5m]) == 0" >end.json &&
            test $(grep -o "\"job_id\"" end.json | wc -l) -eq 2 && break
        sleep 0.2
    done
    q "last_over_time(bmt_loss[5m])" >loss.json &&
    q "sum by (job_id) (last_over_time(bmt_tokens_total[5m]))" >tok.json &&
    q "last_over_time(bmt_job_state{state=\"succeeded\"}[5m])" >state.json &&
    q "last_over_time(bmt_job_exit_code[5m])" >code.json
    rc=$?; kill $ppid; wait $ppid 2>/dev/null || true
    test $rc -eq 0 && test $ra -eq 0 && test $rb -eq 0 &&
    grep -q "bmlaunch: serving metrics until the next scrape of /metrics, at most [0-9.]* s more" a.err &&
    grep -q "bmlaunch: serving metrics until the next scrape of /metrics" b.err &&
    $PY - <<-EOF
	import glob, json, math, re
	def res(f):
	    return {r["metric"]["job_id"]: r for r in json.load(open(f))["data"]["result"]}
	jobs = {}
	for name in ("a", "b"):
	    rows = [json.loads(l) for f in sorted(glob.glob(name + "-*.jsonl")) for l in open(f)]
	    jobs[rows[0]["job"]] = (name, rows)
	assert len(jobs) == 2, jobs.keys()
	end, loss, tok = res("end.json"), res("loss.json"), res("tok.json")
	state, code = res("state.json"), res("code.json")
	assert set(end) == set(loss) == set(tok) == set(state) == set(code) == set(jobs), (end, loss)
	for job, (name, rows) in jobs.items():
	    # the target label stays Prometheus own; bmt names its job job_id
	    assert loss[job]["metric"].get("job") == "bmt" and "exported_job" not in loss[job]["metric"], loss[job]
	    # the trainer last loss line ("# step N: loss X ...") is what Prometheus kept
	    last = [l for l in open(name + ".out") if re.search(r"# step +\d+: loss ", l)][-1]
	    want = re.search(r"loss (\S+)", last).group(1)
	    got = float(loss[job]["value"][1])
	    assert "%.9g" % got == want, (name, got, last)
	    # tokens: each job its own, by job_id (the ranks totals after their last step)
	    total = sum(max(r["tokens_total"] for r in rows if r["rank"] == k) for k in {r["rank"] for r in rows})
	    assert float(tok[job]["value"][1]) == total, (name, tok[job], total)
	    assert float(state[job]["value"][1]) == 1 and float(code[job]["value"][1]) == 0
	    print(name, job, "last loss", got, "tokens", total)
	EOF
'

test_expect_success "a stuck rank (SIGSTOP) is named stale on /metrics and in /api/status, with its process state" '
    start_job --metrics-port $(free_port) --metrics-stale 1 --grace 1 -n 3 -- $PROGS/steps --steps 100000 --pace 20 --stop 5 &&
    for i in $(seq 150); do
        curl -sf "$URL/metrics" >m.txt && grep -q "^bmt_ranks_stale{job_id=\"[^\"]*\"} 1$" m.txt && break; sleep 0.1
    done &&
    curl -sf "$URL/api/status" >s.json &&
    kill -TERM $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    host=$(hostname) && promtool check metrics <m.txt &&
    grep -q "^bmt_stale_window_seconds{job_id=\"[^\"]*\"} 1$" m.txt &&
    grep -q "^bmt_rank_stale_seconds{job_id=\"[^\"]*\",rank=\"2\",host=\"$host\",state=\"T (stopped)\"} [0-9.e+-]*$" m.txt &&
    grep -q "^bmt_ranks_reporting{job_id=\"[^\"]*\"} 2$" m.txt &&
    $PY -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"ranks_stale\"] == 1 and s[\"stale_window_seconds\"] == 1, s
r = s[\"stale_ranks\"][0]
assert r[\"rank\"] == 2 and r[\"state\"].startswith(\"T \") and r[\"seconds\"] > 1, r
" && grep -q "^2: steps: rank 2 stops after step 5$" job.out
'

test_expect_success "headless Chromium: the page names a stale rank with its process state" '
    command -v chromium >/dev/null &&
    start_job --metrics-port $(free_port) --metrics-stale 1 --grace 1 -n 2 -- $PROGS/steps --steps 100000 --pace 20 --stop 3 &&
    for i in $(seq 150); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"ranks_stale\":1" s.json && break; sleep 0.1
    done &&
    timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --user-data-dir=$PWD/chrome --virtual-time-budget=5000 --dump-dom "$URL/" >dom.html 2>chrome.err &&
    kill -TERM $JOB_PID; { wait $JOB_PID || true; } &&
    grep -q "<li class=\"stale\">rank 1 on $(hostname) is stale: no push for [0-9.]* s (window 1.0 s), process T (stopped)</li>" dom.html
'

test_expect_success "a rank killed by SIGKILL is a rank_failed event (rank, host, cause) on /metrics and in /api/status" '
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 3 -- $PROGS/behave --rank 2 signal 9 &&
    for i in $(seq 100); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    curl -sf "$URL/metrics" >m.txt &&
    { ! command -v chromium >/dev/null ||
      timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --user-data-dir=$PWD/chrome --virtual-time-budget=5000 --dump-dom "$URL/" >dom.html 2>chrome.err; } &&
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    test $rc -eq 137 && host=$(hostname) &&
    { ! command -v chromium >/dev/null || {
      grep -q "<li class=\"failed\">rank 2 on $host failed: killed by signal 9</li>" dom.html &&
      grep -q "<span id=\"state\" class=\"failed\">failed (exit status 137)</span>" dom.html; }; } &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"rank_failed\"} [1-9]" m.txt &&
    $PY -c "
import json, sys
s = json.load(open(\"s.json\"))
ev = [e for e in s[\"events\"] if e[\"kind\"] == \"rank_failed\"]
want = \"rank 2 (on %s) was killed by signal 9 (SIGKILL)\" % sys.argv[1]
assert ev and ev[0][\"rank\"] == 2 and ev[0][\"detail\"] == want, ev
" "$host"
'

test_expect_success "a failed rank is named on /metrics with its exit code; the ranks bmlaunch then ended are not failures; the job state is failed" '
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 3 -- $PROGS/behave --rank 1 exit 7 &&
    for i in $(seq 100); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    curl -sf "$URL/metrics" >m.txt &&
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    test $rc -eq 7 && host=$(hostname) && promtool check metrics <m.txt &&
    grep -q "^bmt_rank_exit_code{job_id=\"[^\"]*\",rank=\"1\",host=\"$host\"} 7$" m.txt &&
    ! grep -q "^bmt_rank_exit_signal" m.txt &&
    grep -q "^bmt_ranks_failed{job_id=\"[^\"]*\"} 1$" m.txt &&
    grep -q "^bmt_job_state{job_id=\"[^\"]*\",state=\"failed\"} 1$" m.txt &&
    grep -q "^bmt_job_exit_code{job_id=\"[^\"]*\"} 7$" m.txt &&
    grep -q "\"failed_ranks\":\[{\"rank\":1,\"host\":\"$host\",\"exit_code\":7}" s.json
'

test_expect_success "headless Chromium renders the live page with data points, units and the ranks table" '
    command -v chromium >/dev/null &&
    BMT_PEAK_TFLOPS=0.000001 start_job --metrics-port $(free_port) -g 2 -n 1 -- $EC --steps 2000 --pace 20 $LONG &&
    wait_step 5 &&
    # every host but 127.0.0.1 unresolvable: the page must need nothing from outside
    timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --user-data-dir=$PWD/chrome --virtual-time-budget=5000 --dump-dom "$URL/" >dom.html 2>chrome.err &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; } &&
    $PY - <<-EOF
	import re
	d = open("dom.html").read()
	# four charts, each with its points, its y axis in its unit and "step" on x
	for chart, unit in (("chart-tokens", "tokens/s"), ("chart-loss", "loss"), ("chart-mfu", "%"),
	                    ("chart-steptime", "s")):
	    m = re.search(r"<svg id=\"%s\" data-points=\"(\d+)\"[^>]*>(.*?)</svg>" % chart, d)
	    assert m and int(m.group(1)) >= 3, (chart, m and m.group(1))
	    assert re.search(r"<text [^>]*class=\"unit ylabel\"[^>]*>%s</text>" % re.escape(unit), m.group(2)), chart
	    assert re.search(r"<text [^>]*class=\"unit xlabel\"[^>]*>step</text>", m.group(2)), chart
	assert d.count("<polyline") == 4 and "<circle" in d
	assert "<span id=\"state\" class=\"running\">running</span>" in d
	# 2 ranks (at most 64): the per-rank table from ?ranks=1, a row per rank
	t = re.search(r"<table id=\"ranks\">(.*?)</table>", d)
	assert t, "the ranks table is missing or hidden"
	head = re.findall(r"<th>([^<]*)</th>", t.group(1))
	assert head == ["rank", "host", "step", "tokens/s", "step time", "last push"], head
	rows = re.findall(r"<tr[^>]*><td>(\d+)</td><td>([^<]+)</td><td>(\d+)</td><td>[0-9.]+k?</td><td>[0-9.]+ m?s</td><td>[0-9.]+ s ago</td></tr>", t.group(1))
	assert [r[0] for r in rows] == ["0", "1"] and all(int(r[2]) >= 5 for r in rows), t.group(1)
	assert not re.search(r"(src|href)=\"(https?:)?//", d), "the page loads something from outside"
	assert re.search(r"<span id=\"job\">bmlaunch\.[^<]+</span>", d)
	assert "2 groups × 1 ranks = 2 ranks" in d
	assert re.search(r"<td>1</td><td>1</td><td>\d+</td>", d), "the groups table"
	print("ok")
	EOF
'

test_expect_success "headless Chromium: a clean end reads succeeded in green and keeps the final figures" '
    command -v chromium >/dev/null &&
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 2 -- $EC --steps 12 --pace 20 &&
    for i in $(seq 200); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --user-data-dir=$PWD/chrome --virtual-time-budget=5000 --dump-dom "$URL/" >dom.html 2>chrome.err &&
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    test $rc -eq 0 &&
    $PY - <<-EOF
	import re
	d = open("dom.html").read()
	assert "<span id=\"state\" class=\"succeeded\">succeeded (exit status 0)</span>" in d, "state"
	assert "#state.succeeded { color: #1a7f37; }" in d
	card = lambda k: re.search(r"<div class=\"v\" id=\"v-%s\">([^<]*)</div>" % k, d).group(1)
	assert card("step") == "12", card("step")
	for k in ("tps", "loss", "steptime"):
	    assert re.fullmatch(r"[0-9.]+(k| m?s)?", card(k)), (k, card(k))
	m = re.search(r"<svg id=\"chart-steptime\" data-points=\"(\d+)\"", d)
	assert m and int(m.group(1)) >= 10, m and m.group(1)
	print("ok")
	EOF
'

test_expect_success "val_loss and custom scalars: /metrics (promtool), /api/status and the page after the end" '
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 2 -- $PROGS/steps --steps 6 --pace 20 --scalars 2 &&
    for i in $(seq 200); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    curl -sf "$URL/metrics" >m.txt &&
    { ! command -v chromium >/dev/null ||
      timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --user-data-dir=$PWD/chrome --virtual-time-budget=5000 --dump-dom "$URL/" >dom.html 2>chrome.err; } &&
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    test $rc -eq 0 && promtool check metrics <m.txt &&
    $PY - <<-EOF
	import json, os, re
	m = open("m.txt").read()
	def sc(name, fam="bmt_scalar"):
	    return float(re.search(r"^%s\{job_id=\"[^\"]*\",name=\"%s\"\} (\S+)$" % (fam, name), m, re.M).group(1))
	# steps: val_loss = 2/step + rank/100, custom_k = k + rank; 2 ranks, 6 steps
	v = float(re.search(r"^bmt_val_loss\{job_id=\"[^\"]*\"\} (\S+)$", m, re.M).group(1))
	assert abs(v - (2 / 6 + 0.005)) < 1e-12, v
	assert re.search(r"^bmt_val_loss_step\{job_id=\"[^\"]*\"\} 6$", m, re.M)
	assert sc("custom_0") == 0.5 and sc("custom_1") == 1.5 and sc("custom_1", "bmt_scalar_step") == 6
	s = json.load(open("s.json"))
	vh = s["val_history"]
	assert [p["step"] for p in vh] == [1, 2, 3, 4, 5, 6], vh
	assert all(abs(p["val_loss"] - (2 / p["step"] + 0.005)) < 1e-12 for p in vh), vh
	assert s["scalars"]["custom_1"] == {"value": 1.5, "step": 6}, s["scalars"]
	if os.path.exists("dom.html"):
	    d = open("dom.html").read()
	    c = re.search(r"<svg id=\"chart-loss\" data-points=\"(\d+)\"[^>]*data-points2=\"(\d+)\"[^>]*>(.*?)</svg>", d)
	    assert c and int(c.group(2)) == 6 and ">- - val loss</text>" in c.group(3), c and c.groups()[:2]
	    assert re.search(r"<div class=\"v\" id=\"v-val\">0\.33\d*</div><div class=\"k\" id=\"k-val\">val loss \(step 6\)</div>", d)
	print("ok")
	EOF
'

# ------------------------------------------------------------ the collector's figures, pushed by hand

# A rank program that pushes what a test says: rank 0 runs the python
# statements in $1 with push(doc, rank=0, run=None) (run: that rank's process
# in this run of the job, RUNS[rank], unless given), step(n, **fields),
# scrape() (the /metrics samples as {"name{labels}": value}, and the text),
# status() (the /api/status document) and raw(bytes) (a request as given); the
# other ranks wait for rank 0 (they never push). Prints what the statements
# print.
cat >"$TMP/pushc.py" <<'EOF'
import json, math, os, re, socket, sys, time, urllib.error, urllib.request
url, tok, job = os.environ["BMT_METRICS_URL"], os.environ["BMT_METRICS_TOKEN"], os.environ["BMT_JOB_ID"]
rank, base = int(os.environ["BMT_RANK"]), os.environ["BMT_METRICS_URL"].rsplit("/api/push", 1)[0]
if rank != 0:
    while not os.path.exists("done"):
        time.sleep(0.05)
    sys.exit(0)
RUNS = {}
def run_of(rank):
    return RUNS.setdefault(rank, {"restart": int(os.environ["BMT_RESTART"]), "start": time.time(),
                                  "id": os.urandom(8).hex()})
def push(doc, rank=0, run=None):
    doc = dict(doc, version=2, job=job, rank=rank, run=run or run_of(rank))
    req = urllib.request.Request(url, data=json.dumps(doc, allow_nan=False).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + tok})
    try:
        return urllib.request.urlopen(req).status
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
def step(n, **kw):
    s = {"step": n, "time": time.time(), "step_time_s": 0.1, "tokens": 100, "tokens_total": 100 * n,
         "samples": 1, "samples_total": n, "tokens_per_s": 1000.0, "samples_per_s": 10.0,
         "loss": 2.0, "comm_wait_s": 0.01, "flops_per_s": 5.0,
         "memory": {"param": {"current": 4096, "peak": 4096}}}
    s.update(kw)
    return s
def scrape():
    t = urllib.request.urlopen(base + "/metrics").read().decode()
    d = {}
    for l in t.splitlines():
        if l and not l.startswith("#"):
            k, v = l.rsplit(" ", 1)
            d[re.sub(r'job_id="[^"]*",?', "", k).replace("{}", "")] = float(v)
    return d, t
def status():
    return json.load(urllib.request.urlopen(base + "/api/status"))
def raw(data):
    host, port = base.split("//")[1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(data)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    return got
try:
    exec(open(sys.argv[1]).read())
finally:
    open("done", "w").close()
print("pushc: ok")
EOF

test_expect_success "any finite figure is accepted (a diverging loss of 1e31, a val_loss of 1e31); a refused push counts its items as dropped at once" '
    cat >t.py <<-EOF &&
	assert push({"steps": [step(1, loss=1e31, tokens_per_s=1e300)],
	             "scalars": [{"name": "val_loss", "value": 1e31, "step": 1, "time": time.time()}]}) == 200
	assert push({"steps": [step(1, loss=-1e308)]}, rank=1) == 200
	d, t = scrape()
	assert d["bmt_loss"] == (1e31 - 1e308) / 2 and d["bmt_val_loss"] == 1e31, t
	assert d["bmt_tokens_per_second"] == 1e300 + 1000, t
	# refused (a negative count): its 3 items are lost, and counted now
	code, why = push({"steps": [step(2), step(3, tokens_total=-1)], "events": [{"kind": "note"}]})
	assert code == 400 and "must not be negative" in why, why
	d, t = scrape()
	assert d["bmt_push_dropped_total"] == 3 and d["bmt_collector_pushes_total{code=\"400\"}"] == 1, t
	# the plugin says so too in its next push: not counted twice
	assert push({"steps": [step(4)], "dropped": 3}) == 200
	assert scrape()[0]["bmt_push_dropped_total"] == 3
	EOF
    with_timeout 30 $BMLAUNCH --metrics-port $(free_port) -n 2 -- $PY $TMP/pushc.py $PWD/t.py >out 2>err &&
    grep -q "pushc: ok" out
'

# The page in headless Chromium at $1 into dom.html; its console (with
# --enable-logging) into chrome.err, where a script error, an SVG attribute the
# browser refused (NaN, Infinity) or what the page's Content-Security-Policy
# blocked shows as CONSOLE ... "Error: ..." or "... violates ...": fails then.
page_dom() {
    timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" --enable-logging=stderr --v=0 \
        --user-data-dir=$PWD/chrome --virtual-time-budget=5000 --dump-dom "$1" >dom.html 2>chrome.err &&
    { ! grep "CONSOLE.*\"\(Uncaught\|Error\|Refused\|.* violates\)" chrome.err || { echo "the page logged errors"; false; }; }
}

# The page of a one-rank job that pushes what the python file $1 says
# (pushc.py), rendered after the job ended (dom.html, s.json the last
# status); the job is ended either way.
ended_page() {
    local rc=0
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 1 -- $PY $TMP/pushc.py "$1" || return 1
    for i in $(seq 100); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done
    page_dom "$URL/" || rc=$?
    kill -INT $JOB_PID; { wait $JOB_PID || true; }
    [ $rc -eq 0 ] && grep -q "pushc: ok" job.out
}

# Checks dom.html: every chart's coordinates are finite numbers inside the
# 400 x 170 box, and each "name=value" argument (a card id=text, or
# chart-ID=points[/points2]) holds.
cat >"$TMP/pagecheck.py" <<'EOF'
import re, sys
d = open("dom.html").read()
for svg in re.findall(r"<svg id=\"chart-[^\"]*\".*?</svg>", d):
    for name, v in re.findall(r" (x1|x2|y1|y2|x|y|cx|cy|points)=\"([^\"]*)\"", svg):
        for n in re.split(r"[ ,]", v):
            assert re.fullmatch(r"-?[0-9.]+", n) and -1 <= float(n) <= 401, (name, v, svg[:80])
for a in sys.argv[1:]:
    k, want = a.split("=", 1)
    if k.startswith("chart-"):
        m = re.search(r"<svg id=\"%s\" data-points=\"(\d+)\"([^>]*)>(.*?)</svg>" % k, d)
        p2 = re.search(r"data-points2=\"(\d+)\"", m.group(2))
        got = m.group(1) + ("/" + p2.group(1) if p2 else "")
        assert got == want, (k, got, want)
        assert m.group(3).count("<polyline") == len(want.split("/")) - want.split("/").count("0"), (k, m.group(3))
    else:
        got = re.search(r"<div class=\"v\" id=\"v-%s\">([^<]*)</div>" % k, d).group(1)
        assert got == want, (k, got, want)
print("pagecheck: ok")
EOF

test_expect_success "headless Chromium: huge and odd figures are drawn inside the charts, without errors; a val_loss with no training loss is drawn; an event without a time gets none" '
    command -v chromium >/dev/null &&
    cat >t.py <<-EOF &&
	assert push({"steps": [step(n, loss=None, tokens_per_s=1.7e308, step_time_s=0) for n in (1, 2, 3)],
	             "scalars": [{"name": "val_loss", "value": 2 - n / 10, "step": n, "time": time.time()} for n in (1, 2, 3)],
	             "events": [{"kind": "note", "step": 3, "detail": "no time"}]}) == 200
	EOF
    ended_page $PWD/t.py &&
    $PY $TMP/pagecheck.py chart-tokens=3 chart-loss=0/3 chart-steptime=3 tps=1.70e+308 loss=– val=1.7000 &&
    grep -q "<li>rank 0: note at step 3 (no time)</li>" dom.html &&
    ! grep -q "<svg id=\"chart-loss\".*no loss reported.*</svg>" dom.html &&
    ! grep -o "<svg id=\"chart-steptime\".*</svg>" dom.html | grep -q "class=\"lbl\"[^>]*>-"
'

test_expect_success "headless Chromium: a loss from -1e308 to 1e308 stays inside its chart; a NaN final loss is not shown as an earlier one after the end" '
    command -v chromium >/dev/null &&
    cat >t.py <<-EOF &&
	assert push({"steps": [step(1, loss=-1e308), step(2, loss=1e308), step(3, loss=2.0), step(4, loss=None)]}) == 200
	EOF
    ended_page $PWD/t.py &&
    grep -q "\"loss\":null" s.json &&
    $PY $TMP/pagecheck.py chart-loss=3 step=4 loss=– &&
    grep -o "<svg id=\"chart-loss\".*</svg>" dom.html | grep -q ">-1.00e+308</text>"
'

test_expect_success "the page is served with a Content-Security-Policy that runs only its own script and style (by SHA-256); under it the page draws and logs no violation" '
    command -v chromium >/dev/null &&
    cat >t.py <<-EOF &&
	assert push({"steps": [step(n) for n in (1, 2, 3)]}) == 200
	EOF
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 1 -- $PY $TMP/pushc.py $PWD/t.py &&
    for i in $(seq 100); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    curl -sfD hdr "$URL/" >page.html && curl -sfD jhdr "$URL/api/status" >/dev/null &&
    rc=0; page_dom "$URL/" || rc=$?
    kill -INT $JOB_PID; { wait $JOB_PID || true; }
    test $rc -eq 0 && $PY $TMP/pagecheck.py chart-tokens=3 step=3 &&
    $PY - <<-EOF
	import base64, hashlib, re
	h, j, d = open("hdr").read(), open("jhdr").read(), open("page.html", "rb").read()
	field = lambda text, name: re.search(r"^%s: (.*?)\r?$" % name, text, re.M | re.I).group(1)
	assert field(h, "content-type") == "text/html; charset=utf-8" and field(j, "content-type") == "application/json"
	for t in (h, j):
	    assert field(t, "x-content-type-options") == "nosniff" and field(t, "cache-control") == "no-store", t
	assert not re.search(r"^content-security-policy:", j, re.M | re.I), j
	def sha(tag):   # the element text, from the end of its opening line
	    body = re.search(rb"\n<%s>(\n.*?)</%s>" % (tag, tag), d, re.S).group(1)
	    return base64.b64encode(hashlib.sha256(body).digest()).decode()
	csp = field(h, "content-security-policy").replace(chr(39), "")
	want = ("default-src none; script-src sha256-%s; style-src sha256-%s; connect-src self; "
	        "base-uri none; form-action none; frame-ancestors none" % (sha(b"script"), sha(b"style")))
	assert csp == want, (csp, want)
	html = re.sub(rb"<!--.*?-->", b"", d, flags=re.S)   # no second script, no style attribute
	assert html.count(b"<script") == 1 and not re.search(rb"<[^>]* style=", html)
	print("ok")
	EOF
'

test_expect_success "bmt_step counts a rank that never reported as 0; an older step pushed late does not replace a newer one" '
    cat >t.py <<-EOF &&
	for n in (1, 2, 3, 5):
	    assert push({"steps": [step(n, loss=10.0 - n)]}) == 200
	d, t = scrape()
	# rank 1 never reported a step: the step every rank has reported is 0
	assert d["bmt_step"] == 0 and d["bmt_group_step{group=\"0\"}"] == 0, t
	assert status()["step"] == 0
	assert push({"steps": [step(4, loss=9.0)]}) == 200       # held back, comes late
	d, t = scrape()
	assert d["bmt_loss"] == 5.0 and d["bmt_tokens_total"] == 500, t
	assert push({"steps": [step(3)]}, rank=1) == 200
	d, t = scrape()
	assert d["bmt_step"] == 3 and d["bmt_tokens_total"] == 800, t
	EOF
    with_timeout 30 $BMLAUNCH --metrics-port $(free_port) -n 2 -- $PY $TMP/pushc.py $PWD/t.py >out 2>err &&
    grep -q "pushc: ok" out
'

test_expect_success "after a restart (--max-restarts) a late push of the old run, first and far ahead, gets 409 and is counted; the new run from step 1 is accepted (it was refused with 400 for good)" '
    cat >t.py <<-EOF &&
	if os.environ["BMT_RESTART"] == "0":
	    for r in (0, 1):
	        assert push({"steps": [step(n) for n in range(49996, 50001)]}, rank=r) == 200
	    json.dump(RUNS, open("runs0.json", "w"))
	    sys.exit(1)   # bmlaunch restarts the job
	old = {int(k): v for k, v in json.load(open("runs0.json")).items()}
	code, why = push({"steps": [step(50001)]}, rank=1, run=old[1])   # a late push of run 0
	assert code == 409 and "comes from run 0 of the job (BMT_RESTART=0), and bmlaunch has restarted the job since" in why, why
	for n in (1, 2, 3):
	    for r in (0, 1):
	        assert push({"steps": [step(n)]}, rank=r) == 200, n
	d, t = scrape()
	assert d["bmt_step"] == 3 and d["bmt_collector_pushes_total{code=\"409\"}"] == 1, t
	assert d["bmt_push_old_run_items_total"] == 1 and d["bmt_collector_pushes_total{code=\"400\"}"] == 0, t
	s = status()
	assert s["restart"] == 1 and [p["step"] for p in s["history"]][-3:] == [1, 2, 3], s["history"][-4:]
	EOF
    with_timeout 60 $BMLAUNCH --metrics-port $(free_port) --max-restarts 1 -n 2 -- $PY $TMP/pushc.py $PWD/t.py >out 2>err &&
    grep -q "restart 1 of 1 after rank 0" err &&
    grep -q "pushc: ok" out
'

test_expect_success "reporting and stale are one definition: a rank that pushes only scalars goes stale and leaves the rates; a hung job keeps its last loss, a NaN loss pushed shows" '
    cat >t.py <<-EOF &&
	assert push({"steps": [step(1)]}) == 200 and push({"steps": [step(1, loss=4.0)]}, rank=1) == 200
	d, t = scrape()
	assert d["bmt_ranks_reporting"] == 2 and d["bmt_ranks_stale"] == 0 and d["bmt_loss"] == 3.0, t
	for i in range(6):   # 1.8 s of scalars alone (the window is 1 s)
	    push({"scalars": [{"name": "bleu", "value": 1.0, "step": 1, "time": time.time()}]})
	    time.sleep(0.3)
	d, t = scrape()
	assert d["bmt_ranks_reporting"] == 0 and d["bmt_ranks_stale"] == 2, t
	assert d["bmt_tokens_per_second"] == 0, t
	# every rank stale (hung): the loss is the ranks last one, not NaN
	assert d["bmt_loss"] == 3.0 and d["bmt_group_loss{group=\"0\"}"] == 3.0, t
	s = status()
	assert s["ranks_reporting"] == 0 and s["ranks_stale"] == 2 and s["loss"] == 3.0, s
	# a NaN (null) loss that the ranks report does make it NaN
	assert push({"steps": [step(2, loss=None)]}) == 200 and push({"steps": [step(2, loss=None)]}, rank=1) == 200
	d, t = scrape()
	assert d["bmt_ranks_reporting"] == 2 and math.isnan(d["bmt_loss"]), t
	EOF
    with_timeout 30 $BMLAUNCH --metrics-port $(free_port) --metrics-stale 1 -n 2 -- $PY $TMP/pushc.py $PWD/t.py >out 2>err &&
    grep -q "pushc: ok" out
'

test_expect_success "an event detail over 511 bytes of multi-byte UTF-8 is cut at a character, never dropped (collector and push plugin)" '
    cat >t.py <<-EOF &&
	for pad in ("", "x"):  # the cut falls in the middle of a character one way or the other
	    assert push({"events": [{"kind": "note", "detail": pad + "é" * 300}]}) == 200
	ev = [e for e in status()["events"] if e["kind"] == "note"]
	assert [e["detail"] for e in ev] == ["é" * 255, "x" + "é" * 255], ev
	assert scrape()[0]["bmt_events_total{kind=\"note\"}"] == 2
	EOF
    with_timeout 30 $BMLAUNCH --metrics-port $(free_port) -n 1 -- $PY $TMP/pushc.py $PWD/t.py >out 2>err &&
    grep -q "pushc: ok" out &&
    # the push plugin copies a checkpoint path of 600 bytes of "é" into its queue
    e=$(printf "é%.0s" $(seq 100)) && d=$PWD/$e/$e/$e && mkdir -p "$d" &&
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 1 -- $EC --steps 3 --ckpt-dir "$d/ck" --ckpt-at 2 &&
    for i in $(seq 100); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    curl -sf "$URL/metrics" >m.txt &&
    kill -INT $JOB_PID; { wait $JOB_PID || true; } &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"checkpoint_saved\"} 1$" m.txt &&
    $PY - "$d/ck/ec" <<-EOF
	import json, sys
	ev = [e for e in json.load(open("s.json"))["events"] if e["kind"] == "checkpoint_saved"]
	want = sys.argv[1].encode("utf-8", "surrogateescape")
	got = ev[0]["detail"].encode() if ev else b""
	assert ev and 509 <= len(got) <= 511 and want.startswith(got), ev
	EOF
'

test_expect_success "a push with Content-Length: -1 gets libmicrohttpd 400 and is counted in bmt_collector_pushes_total" '
    cat >t.py <<-EOF &&
	got = raw(b"POST /api/push HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok.encode() +
	          b"\r\nContent-Length: -1\r\n\r\n{}")
	assert got.startswith(b"HTTP/1.1 400"), got[:100]
	for i in range(50):
	    d, t = scrape()
	    if d["bmt_collector_pushes_total{code=\"400\"}"] == 1:
	        break
	    time.sleep(0.05)
	assert d["bmt_collector_pushes_total{code=\"400\"}"] == 1, t
	EOF
    with_timeout 30 $BMLAUNCH --metrics-port $(free_port) -n 1 -- $PY $TMP/pushc.py $PWD/t.py >out 2>err &&
    grep -q "pushc: ok" out
'

test_expect_success "a Python job: unmeasured memory is absent, communication wait and FLOP/s NaN, not 0" '
    cat >t.py <<-EOF &&
	import sys, time, json, urllib.request, os
	sys.path.insert(0, os.environ["SRC"] + "/python")
	import bmt
	for s in range(3):
	    bmt.report_step(tokens=100, samples=1, loss=2.0, step_time=0.1)
	bmt.report_event("note", "é" * 300)
	base = os.environ["BMT_METRICS_URL"].rsplit("/api/push", 1)[0]
	for i in range(100):
	    t = urllib.request.urlopen(base + "/metrics").read().decode()
	    if "bmt_events_total{" in t and re.search(r"kind=\"note\"} 1", t) and re.search(r"^bmt_step\{.*\} 3$", t, re.M):
	        break
	    time.sleep(0.05)
	assert not re.search(r"^bmt_(group_)?memory(_peak)?_bytes", t, re.M), t
	for name in ("bmt_comm_wait_seconds", "bmt_model_flops_per_second", "bmt_mfu_ratio"):
	    assert re.search(r"^%s\{[^}]*\} NaN$" % name, t, re.M), name
	assert re.search(r"^bmt_tokens_per_second\{[^}]*\} 1000$", t, re.M), t
	ev = json.load(urllib.request.urlopen(base + "/api/status"))["events"]
	assert [e["detail"] for e in ev if e["kind"] == "note"] == ["é" * 255], ev
	print("pushc: ok")
	EOF
    with_timeout 30 $BMLAUNCH --metrics-port $(free_port) -n 1 -- $PY -c "import re; exec(open(\"t.py\").read())" >out 2>err &&
    grep -q "pushc: ok" out
'

# Scrapes $1/metrics every 50 ms until the collector goes away; exits 1 when a
# counter ever went down, and prints the last values as JSON.
cat >"$TMP/mono.py" <<'EOF'
import json, re, sys, time, urllib.request
url = sys.argv[1]
names = ("bmt_tokens_total", "bmt_samples_total", "bmt_skipped_steps_total", "bmt_push_dropped_total",
         "bmt_ranks_failed_total", "bmt_steps_total", "bmt_events_total")
last, n, bad, failed = {}, 0, [], set()
end = time.monotonic() + 60
while time.monotonic() < end:
    try:
        t = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    except Exception:
        if n:
            break
        time.sleep(0.05)
        continue
    n += 1
    for name, lab, v in re.findall(r"^(\w+)\{job_id=\"[^\"]*\"(,[^}]*)?\} (\S+)$", t, re.M):
        if name in names:
            k = name + lab
            if k in last and float(v) < last[k]:
                bad.append((k, last[k], float(v)))
            last[k] = float(v)
        if name == "bmt_ranks_failed":
            failed.add(float(v))
    time.sleep(0.05)
print(json.dumps({"scrapes": n, "decreased": bad, "last": last, "ranks_failed_seen": sorted(failed)}))
sys.exit(1 if bad or n < 10 else 0)
EOF

test_expect_success "counters never go down across a restart (--max-restarts), nor does bmt_ranks_failed_total, though the run's bmt_ranks_failed resets" '
    port=$(free_port) &&
    { with_timeout 60 $BMLAUNCH --device cpu -n 2 --max-restarts 1 --metrics-port $port --metrics-linger 1 -- \
        sh -c "if [ \$BMT_RESTART = 0 ]; then exec $EC --steps 16 --pace 50 --abort-at 8 --bound 1e-3; else exec $EC --steps 6 --pace 50 --bound 1e-3; fi" \
        >job.out 2>job.err & } &&
    job=$! &&
    $PY $TMP/mono.py http://127.0.0.1:$port >mono.json; rc=$?
    wait $job; jrc=$?
    cat mono.json && test $rc -eq 0 && test $jrc -eq 0 &&
    grep -q "restart 1 of 1 after rank 0 (pid [0-9]* on [^ ]*) called PMIx_Abort with status 3" job.err &&
    $PY - <<-EOF
	import json
	m = json.load(open("mono.json"))["last"]
	# 6 tokens a step and rank: 8 steps before the abort (rank 1 perhaps fewer), then 6
	assert 2 * 6 * 6 + 6 * 8 <= m["bmt_tokens_total"] <= 2 * 6 * 14, m
	assert m["bmt_ranks_failed_total"] == 1, m   # rank 0 aborted; rank 1, ended by bmlaunch, did not fail
	EOF
'

test_expect_success "a rank that calls PMIx_Abort is named first, with its status, not the SIGTERM that ended it (the page says it aborted)" '
    start_job --metrics-port $(free_port) --metrics-linger 30 -n 3 -- $PROGS/behave --rank 1 abort 42 "loss is NaN" &&
    for i in $(seq 100); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    curl -sf "$URL/metrics" >m.txt &&
    prc=0; { ! command -v chromium >/dev/null || page_dom "$URL/"; } || prc=$?
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    test $rc -eq 42 && test $prc -eq 0 && host=$(hostname) && promtool check metrics <m.txt &&
    { ! command -v chromium >/dev/null ||
      grep -q "<li class=\"failed\">rank 1 on $host failed: called PMIx_Abort with status 42</li>" dom.html; } &&
    grep -q "^bmt_rank_exit_code{job_id=\"[^\"]*\",rank=\"1\",host=\"$host\"} 42$" m.txt &&
    ! grep -q "^bmt_rank_exit_signal{job_id=\"[^\"]*\",rank=\"1\"" m.txt &&
    ! grep -q "^bmt_rank_exit_signal" m.txt &&
    grep -q "^bmt_ranks_failed{job_id=\"[^\"]*\"} 1$" m.txt &&
    grep -q "^bmt_ranks_failed_total{job_id=\"[^\"]*\"} 1$" m.txt &&
    $PY -c "
import json, sys
s = json.load(open(\"s.json\"))
f = s[\"failed_ranks\"]
assert f[0] == {\"rank\": 1, \"host\": sys.argv[1], \"exit_code\": 42, \"aborted\": True}, f
assert len(f) == 1, f
ev = [e[\"detail\"] for e in s[\"events\"] if e[\"kind\"] == \"rank_failed\"]
assert ev[0] == \"rank 1 (on %s) called PMIx_Abort with status 42: loss is NaN\" % sys.argv[1], ev
" "$host"
'

# ------------------------------------------------------------ the push plugin on its own

# A collector stand-in the test controls: records every body it accepts.
cat >"$TMP/sink.py" <<'EOF'
import http.server, sys, json
port, out = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        with open(out, "a") as f:
            f.write(json.dumps({"auth": self.headers.get("Authorization"), "body": json.loads(body)}) + "\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
EOF

test_expect_success "push survives its collector going down and coming back; drops are counted" '
    port=$(free_port) &&
    { $PY $TMP/sink.py $port got.jsonl & }
    sink=$!
    sleep 0.5
    { BMT_PLUGINS=push,jsonl BMT_JSONL=$PWD/m.jsonl BMT_METRICS_URL=http://127.0.0.1:$port/api/push \
        BMT_METRICS_TOKEN=sekrit BMT_METRICS_QUEUE=4 \
        $BMLAUNCH --metrics-port 0 -n 2 -- $EC --steps 100 --pace 40 $LONG >out 2>err & }
    job=$!
    # the outage begins once both ranks pushed (a sanitized build starts slowly)
    for i in $(seq 600); do
        grep -q "\"rank\": 0," got.jsonl 2>/dev/null && grep -q "\"rank\": 1," got.jsonl && break
        sleep 0.05
    done
    kill $sink; wait $sink 2>/dev/null || true; sleep 1.5
    { $PY $TMP/sink.py $port got.jsonl & }
    sink=$!
    rc=0; wait $job || rc=$?
    kill $sink; wait $sink 2>/dev/null || true;
    test $rc -eq 0 &&
    grep -q "push: cannot reach the collector, will retry" err &&
    grep -q "push: the collector answers again after" err &&
    $PY - <<-EOF
	import json, time
	rows = [json.loads(l) for l in open("got.jsonl")]
	assert all(r["auth"] == "Bearer sekrit" for r in rows)
	b = [r["body"] for r in rows]
	assert len({x["job"] for x in b}) == 1 and b[0]["job"].startswith("bmlaunch.")
	assert all(x["version"] == 2 for x in b)
	# one run per process: the same in all its pushes, another for each rank
	runs = {(x["rank"], json.dumps(x["run"], sort_keys=True)) for x in b}
	assert len(runs) == 2 and {r for r, _ in runs} == {0, 1}, runs
	for _, run in runs:
	    run = json.loads(run)
	    assert run["restart"] == 0 and abs(run["start"] - time.time()) < 120, run
	    assert len(run["id"]) == 16 and int(run["id"], 16) >= 0 and run["id"] == run["id"].lower()
	steps = {(x["rank"], s["step"]) for x in b for s in x["steps"]}
	for rank in (0, 1):
	    mine = sorted(s for r, s in steps if r == rank)
	    assert mine[0] <= 10 and mine[-1] == 100, mine[:3] + mine[-3:]
	    assert len(mine) < 100, "an outage of 1.5 s with a queue of 4 must lose steps"
	    assert max(x["dropped"] for x in b if x["rank"] == rank) > 0
	# the training never waited for the network
	ps = [json.loads(l)["plugin_s"] for l in open("m.jsonl") if "\"step\"" in l]
	assert max(ps) < 0.05, max(ps)
	print("ok")
	EOF
'

test_expect_success "push never stalls training on a collector that accepts but never answers" '
    port=$(free_port) &&
    { $PY -c "
import socket, time
s = socket.socket(); s.bind((\"127.0.0.1\", $port)); s.listen(64); time.sleep(60)" & }
    hole=$!
    start=$(date +%s.%N) &&
    BMT_PLUGINS=push,jsonl BMT_JSONL=$PWD/m.jsonl BMT_METRICS_URL=http://127.0.0.1:$port/api/push \
        BMT_METRICS_TOKEN=x BMT_METRICS_TIMEOUT=30 BMT_PLUGIN_FLUSH_TIMEOUT=1 \
        $BMLAUNCH --metrics-port 0 -n 2 -- $EC --steps 30 --pace 10 >out 2>err &&
    end=$(date +%s.%N)
    kill $hole; wait $hole 2>/dev/null || true;
    awk -v a=$start -v b=$end "BEGIN { exit !(b - a < 8) }" &&
    $PY -c "
import json
ps = [json.loads(l)[\"plugin_s\"] for l in open(\"m.jsonl\") if \"\\\"step\\\"\" in l]
assert len(ps) == 60 and max(ps) < 0.05, max(ps)"
'

# The Pushgateway keeps nothing on disk here (Debian's default persists to
# /var/lib/prometheus/pushgateway.data, which every earlier run's pushes
# would then answer for). A job id with a "/" (one set by hand, outside
# bmlaunch) goes base64-encoded: escaped, the Pushgateway refuses it (400).
test_expect_success "Pushgateway mode: each rank PUTs its latest step to a real Pushgateway (a job id with a / too)" '
    command -v prometheus-pushgateway >/dev/null &&
    gport=$(free_port) &&
    { prometheus-pushgateway --web.listen-address=127.0.0.1:$gport --persistence.file= >gw.log 2>&1 & }
    gw=$!
    rc=0
    { for i in $(seq 50); do curl -sf http://127.0.0.1:$gport/-/ready >/dev/null && break; sleep 0.1; done &&
      BMT_PLUGINS=push BMT_PUSHGATEWAY_URL=http://127.0.0.1:$gport \
          $BMLAUNCH --metrics-port 0 -n 2 -- $EC --steps 5 >out 2>err &&
      BMT_PLUGIN_DIR=$BUILDDIR/lib/bmt/plugins BMT_JOB_ID=team/run-7 BMT_PLUGINS=push \
          BMT_PUSHGATEWAY_URL=http://127.0.0.1:$gport/ $EC --steps 3 >out1 2>err1 &&
      curl -sf http://127.0.0.1:$gport/metrics >gw.txt; } || rc=$?
    kill $gw; wait $gw 2>/dev/null || true; test $rc -eq 0 &&
    test $(grep -c "^bmt_rank_step{" gw.txt) -eq 3 &&
    grep -q "^bmt_rank_step{instance=\"\",job=\"bmt\",job_id=\"bmlaunch\.[^\"]*\",rank=\"0\"} 5$" gw.txt &&
    grep -q "^bmt_rank_step{instance=\"\",job=\"bmt\",job_id=\"bmlaunch\.[^\"]*\",rank=\"1\"} 5$" gw.txt &&
    grep -q "^bmt_rank_tokens_total{instance=\"\",job=\"bmt\",job_id=\"bmlaunch\.[^\"]*\",rank=\"1\"} 30$" gw.txt &&
    grep -q "^bmt_rank_step{instance=\"\",job=\"bmt\",job_id=\"team/run-7\",rank=\"0\"} 3$" gw.txt &&
    ! grep -qi "push" err1
'

# ------------------------------------------------------------ scale

test_expect_success "1000 ranks (40 x 25) push to one collector: every token counted, series stay per job and group" '
    # a 2-core machine that others load too: no push may time out (every token counted)
    BMT_METRICS_TIMEOUT=60 BMT_PLUGIN_FLUSH_TIMEOUT=60 \
        start_job --metrics-port $(free_port) --metrics-linger 60 --backend none --timeout 120 -g 40 -n 25 -- \
        $PROGS/steps --steps 10 --pace 300 &&
    for i in $(seq 2400); do
        curl -sf "$URL/api/status" >s.json && grep -q "\"state\":\"ended\"" s.json && break; sleep 0.1
    done &&
    { grep -q "\"state\":\"ended\"" s.json || { echo "the job did not end in 240 s:"; head -c 600 s.json; tail -5 job.err; false; }; } &&
    curl -sf "$URL/metrics" >m.txt && promtool check metrics <m.txt &&
    kill -INT $JOB_PID && { wait $JOB_PID || true; } &&
    # rank r reports 1000 + r tokens in each of 10 steps
    want=$(( 10 * (1000 * 1000 + 999 * 1000 / 2) )) &&
    { { grep -q "^bmt_tokens_total{job_id=\"[^\"]*\"} $want$" m.txt &&
        grep -q "^bmt_step{job_id=\"[^\"]*\"} 10$" m.txt &&
        grep -q "^bmt_push_dropped_total{job_id=\"[^\"]*\"} 0$" m.txt; } ||
      { echo "want tokens $want, step 10, nothing dropped; the collector has:";
        grep -E "^bmt_(tokens_total|step|push_dropped_total|push_.*)\{" m.txt | head -20;
        head -c 400 s.json; echo; tail -5 job.err; false; }; } &&
    series=$(grep -vc "^#" m.txt) &&
    echo "$series series for 1000 ranks in 40 groups" &&
    test $series -lt 600 && test $(grep -c "^bmt_group_step{" m.txt) -eq 40 &&
    ! grep -q "rank=" m.txt &&
    $PY -c "
import json
s = json.load(open(\"s.json\"))
assert s[\"state\"] == \"ended\" and s[\"exit_status\"] == 0, s[\"state\"]
assert s[\"ranks_seen\"] == 1000 and s[\"step\"] == 10 and len(s[\"groups\"]) == 40
assert all(g[\"step\"] == 10 and g[\"ranks_seen\"] == 25 for g in s[\"groups\"])
assert [p[\"step\"] for p in s[\"history\"]] == list(range(1, 11)), s[\"history\"]
assert all(p[\"ranks\"] == 1000 for p in s[\"history\"])
"
'


# ------------------------------------------------------------ sd file and operator's certificate: refusals
# What would otherwise pass silently: a target file that takes over another
# job's (and removes it at exit), one that Prometheus never reads, a wildcard
# address as the target, and operator certificates that the ranks' TLS clients
# refuse (every push failing while the job exits 0), or a FIFO that hung
# bmlaunch with its signals blocked.

test_expect_success "--metrics-sd-file: another job's file is refused and kept; a name file_sd does not read is refused; a wildcard bind is named by the host" '
    mkdir sd &&
    echo "[{\"targets\": [\"other:1\"], \"labels\": {\"job_id\": \"other\"}}]" >sd/job.json &&
    cp sd/job.json keep.json &&
    for tls in on off; do
        { with_timeout 60 $BMLAUNCH --metrics-tls $tls --metrics-port $(free_port) \
            --metrics-sd-file sd/job.json -n 1 -- touch ran >out 2>err; rc=$?; } &&
        test $rc -eq 2 && grep -q -- "--metrics-sd-file sd/job.json exists: it is another job" err &&
        test ! -e ran && cmp sd/job.json keep.json && test "$(ls sd)" = job.json ||
            { echo "tls $tls: exit $rc"; cat err; ls sd; exit 1; }
    done &&
    echo other-ca >sd/b.ca.pem &&
    { with_timeout 60 $BMLAUNCH --metrics-tls on --metrics-port $(free_port) \
        --metrics-sd-file sd/b.json -n 1 -- touch ran >out 2>err; rc=$?; } &&
    test $rc -eq 2 && grep -q "sd/b.ca.pem exists" err && test ! -e ran &&
    test "$(cat sd/b.ca.pem)" = other-ca && test ! -e sd/b.json && rm sd/b.ca.pem &&
    { with_timeout 60 $BMLAUNCH --metrics-port $(free_port) --metrics-sd-file sd/job2 -n 1 -- \
        touch ran >out 2>err; rc=$?; } &&
    test $rc -eq 2 && grep -q "file_sd reads only files whose names end in .json, .yml or .yaml" err &&
    test ! -e ran && test "$(ls sd)" = job.json &&
    if [ -e /proc/net/if_inet6 ]; then
        with_timeout 60 $BMLAUNCH --metrics-tls off --metrics-bind 0:0:0:0:0:0:0:0 \
            --metrics-port $(free_port) --metrics-sd-file sd/w.json -n 1 -- cat sd/w.json >out 2>err &&
        $PY -c "
import json, socket
t = json.loads(open(\"out\").read().split(\": \", 1)[1])
host, port = t[0][\"targets\"][0].rsplit(\":\", 1)
assert host == socket.gethostname(), t" && test ! -e sd/w.json
    fi
'

test_expect_success "--metrics-cert/--metrics-key: a FIFO, a directory, a certificate the ranks would refuse are refused at once (exit 2)" '
    mkfifo fifo.pem && mkdir dir.pem &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=op \
        -days 1 -keyout op.key -out op.pem 2>/dev/null &&
    openssl req -x509 -key op.key -subj /CN=op -days 1 -addext extendedKeyUsage=clientAuth \
        -out client.pem 2>/dev/null &&
    openssl req -x509 -key op.key -subj /CN=op -days 1 -addext keyUsage=critical,keyEncipherment \
        -out ku.pem 2>/dev/null &&
    for bad in "fifo.pem op.key:--metrics-cert fifo.pem: not a regular file" \
               "op.pem fifo.pem:--metrics-key fifo.pem: not a regular file" \
               "dir.pem op.key:--metrics-cert dir.pem: is a directory" \
               "client.pem op.key:extended key usage lacks serverAuth" \
               "ku.pem op.key:key usage lacks digitalSignature"; do
        files=${bad%%:*} want=${bad#*:} &&
        { with_timeout 20 $BMLAUNCH --metrics-cert ${files% *} --metrics-key ${files#* } \
            --metrics-port $(free_port) -n 1 -- touch started >out 2>err; rc=$?; } &&
        test $rc -eq 2 && grep -q -- "$want" err && test ! -e started ||
            { echo "$files: exit $rc"; cat err; exit 1; }
    done &&
    if $PY -c "import cryptography" 2>/dev/null; then
        $PY - <<-EOF &&
	import datetime
	from cryptography import x509
	from cryptography.hazmat.primitives import hashes, serialization
	k = serialization.load_pem_private_key(open("op.key", "rb").read(), None)
	now = datetime.datetime.now(datetime.timezone.utc)
	n = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "op")])
	c = (x509.CertificateBuilder().subject_name(n).issuer_name(n).public_key(k.public_key())
	     .serial_number(7).not_valid_before(now + datetime.timedelta(days=1))
	     .not_valid_after(now + datetime.timedelta(days=2)).sign(k, hashes.SHA256()))
	open("future.pem", "wb").write(c.public_bytes(serialization.Encoding.PEM))
	EOF
        { with_timeout 20 $BMLAUNCH --metrics-cert future.pem --metrics-key op.key \
            --metrics-port $(free_port) -n 1 -- touch started >out 2>err; rc=$?; } &&
        test $rc -eq 2 && grep -q "the certificate is not valid before" err && test ! -e started
    fi
'

FAKETIME_LIB=$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null | head -1)
if grep -q "SAN=1" "$BUILDDIR/.knobs" 2>/dev/null; then
    # LD_PRELOAD ahead of the sanitizer's runtime stops the rank at its start
    echo "# skipped: a rank 40 days on through libfaketime (a sanitizer build)"
elif [ -n "$FAKETIME_LIB" ]; then
test_expect_success "HTTPS: a rank 40 days into its job still pushes to the job's certificate" '
    start_job --metrics-tls on --metrics-port $(free_port) --log-dir logs --metrics-linger 30 -n 1 -- \
        env LD_PRELOAD=$FAKETIME_LIB FAKETIME=+40d $EC --steps 3 &&
    for i in $(seq 600); do kill -0 $JOB_PID 2>/dev/null || break; grep -q "serving metrics" job.err && break; sleep 0.1; done &&
    curl -sf --cacert logs/metrics-ca.pem "$URL/metrics" >m.txt &&
    { kill -INT $JOB_PID; wait $JOB_PID || true; } &&
    ! grep -q "cannot reach the collector" job.err &&
    grep -q "^bmt_step{job_id=\"[^\"]*\"} 3$" m.txt ||
        { cat job.err; grep "^bmt_step" m.txt; false; }
'
else
    echo "# skipped: libfaketime is not installed (apt-get install faketime): no test of a job older than 30 days"
fi

test_expect_success "--metrics-bind ::0 (any spelling of the unspecified address) gives the ranks the address 0.0.0.0 gives them, not [::0]" '
    if [ -e /proc/net/if_inet6 ]; then
        with_timeout 60 $BMLAUNCH --metrics-tls off --metrics-bind ::0 --metrics-port $(free_port) \
            -n 1 -- sh -c "echo \$BMT_METRICS_URL" >out 2>err &&
        cat out && grep -q "^0: http://127.0.0.1:[0-9]*/api/push\$" out
    fi
'

test_done
