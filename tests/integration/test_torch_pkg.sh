#!/bin/bash
# The Python package (python/bmt) and the PyTorch example (examples/torch):
# the layout from bmlaunch's and torchrun's variables; the step figures against
# libbmt's on the same numbers; pushes from Python accepted by bmlaunch's real
# collector, and push failures (unreachable, 401, TLS with the job's
# certificate) said once without stopping the program; bmt.Preemption on its
# own; then, under `bmlaunch -g 2 -n 2 --device cpu`, the example trains with
# gloo (loss falls, the group and replica process groups all-reduce right),
# its tokens/s on /metrics (promtool) and on the live page (headless
# Chromium); and SIGUSR1 to one rank makes every rank save at the same step and
# exit 0, and --resume goes on from that checkpoint. Importing torch takes
# seconds on this machine: three torch jobs in all; the other tests run Python
# without torch.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
export PYTHONPATH=$SRC/python
TRAIN=$SRC/examples/torch/train.py
export BMT_TIMEOUT=120

# Wait until /api/status says $1 (a Python expression of s, the status);
# over HTTPS with CACERT set to the job's certificate.
wait_status() { # 5 minutes at most: torch starts slowly on a loaded 2-core machine
    local end=$((SECONDS + 300))
    while [ $SECONDS -lt $end ]; do
        curl -sf ${CACERT:+--cacert "$CACERT"} "$URL/api/status" >status.json 2>/dev/null &&
            $PY -c 'import json,sys; s=json.load(open("status.json")); sys.exit(0 if eval(sys.argv[1]) else 1)' "$1" &&
            return 0
        sleep 0.1
    done
    echo "status never came to $1; last status:" >&2
    head -c 2000 status.json >&2
    tail -20 job.out job.err >&2
    return 1
}

chromium_dom() { # url out
    timeout 90 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --user-data-dir=$PWD/chrome --virtual-time-budget=5000 --dump-dom "$1" >"$2" 2>chrome.err
}

# ------------------------------------------------------------ no torch

test_expect_success "bmt.layout(): bmlaunch's variables, torchrun's, none; contradictions refused by name; import bmt imports no torch" '
    $PY - <<-EOF
	import sys
	import bmt
	assert "torch" not in sys.modules, "import bmt imported torch"
	L = bmt.layout_from_env
	l = L({"BMT_RANK": "5", "BMT_WORLD_SIZE": "8", "BMT_GROUPS": "2", "BMT_GPUS_PER_GROUP": "4",
	       "BMT_GPUS_PER_NODE": "2", "BMT_NODES": "4", "BMT_GROUP": "1", "BMT_GROUP_RANK": "1",
	       "BMT_NODE": "2", "BMT_LOCAL_RANK": "1", "BMT_RESTART": "3", "BMT_JOB_ID": "j"})
	assert (l.rank, l.world, l.groups, l.gpus_per_group, l.gpus_per_node, l.nodes) == (5, 8, 2, 4, 2, 4), l
	assert (l.group, l.group_rank, l.replica, l.replica_rank, l.node, l.local_rank) == (1, 1, 1, 1, 2, 1), l
	assert l.restart == 3 and l.job_id == "j"
	assert l.group_members() == [4, 5, 6, 7] and l.replica_members() == [1, 5], l
	assert l.group_members(0) == [0, 1, 2, 3] and l.replica_members(3) == [3, 7]
	# torchrun: one group of the whole world
	t = L({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
	       "GROUP_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2"})
	assert (t.groups, t.gpus_per_group, t.group, t.group_rank, t.node, t.local_rank, t.restart) == (1, 4, 0, 3, 1, 1, 2), t
	# bmlaunch exporting torchrun'"'"'s names too: they agree
	b = L({"BMT_RANK": "2", "BMT_GROUPS": "2", "BMT_GPUS_PER_GROUP": "2", "RANK": "2", "WORLD_SIZE": "4",
	       "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "0", "GROUP_RANK": "0"})
	assert (b.group, b.group_rank, b.replica) == (1, 0, 0), b
	assert L({}) == L({"RANK": "0", "WORLD_SIZE": "1"}) and L({}).world == 1
	bad = [({"BMT_RANK": "1", "RANK": "2", "WORLD_SIZE": "4"}, "BMT_RANK=1 but RANK=2"),
	       ({"BMT_RANK": "x", "BMT_WORLD_SIZE": "4"}, "BMT_RANK=.x. is not an integer"),
	       ({"BMT_RANK": "1_0", "BMT_WORLD_SIZE": "40"}, "BMT_RANK=.1_0. is not an integer"),
	       ({"RANK": "\u0661", "WORLD_SIZE": "4"}, "RANK=.\u0661. is not an integer"),
	       ({"BMT_GROUPS": "2"}, "^BMT_GROUPS is set but neither WORLD_SIZE nor both BMT_GROUPS and BMT_GPUS_PER_GROUP are"),
	       ({"BMT_RANK": "4", "BMT_GROUPS": "2", "BMT_GPUS_PER_GROUP": "2"}, "rank 4 is not in \\\\[0, 4\\\\)"),
	       ({"BMT_RANK": "0", "BMT_WORLD_SIZE": "6", "BMT_GROUPS": "4", "BMT_GPUS_PER_GROUP": "2"},
	        "the layout 4 x 2 = 8 ranks does not match the job.s 6 ranks"),
	       ({"BMT_RANK": "0", "WORLD_SIZE": "4", "BMT_GROUPS": "3"},
	        "BMT_GROUPS=3 does not divide the job.s 4 ranks; start it with bmlaunch"),
	       ({"BMT_RANK": "0", "BMT_WORLD_SIZE": "6", "BMT_GPUS_PER_GROUP": "4"},
	        "BMT_GPUS_PER_GROUP=4 does not divide the job.s 6 ranks"),
	       ({"BMT_RANK": "3", "BMT_GROUPS": "2", "BMT_GPUS_PER_GROUP": "2", "BMT_GROUP": "0"},
	        "BMT_GROUP=0, but the layout 2 x 2 with 4 ranks per node puts rank 3 at 1"),
	       ({"BMT_WORLD_SIZE": "4"}, "neither BMT_RANK nor RANK"),
	       ({"BMT_RANK": "0", "BMT_WORLD_SIZE": "6", "BMT_GPUS_PER_NODE": "4"}, "do not fill whole nodes of 4")]
	import re
	for env, msg in bad:
	    try:
	        L(env)
	    except bmt.LayoutError as e:
	        assert re.search(msg, str(e)), (env, str(e), msg)
	    else:
	        raise AssertionError("accepted %s" % env)
	print("ok")
	EOF
'

test_expect_success "bmt.layout() under bmlaunch -g 2 -n 3 --gpus-per-node 3: every rank where libbmt puts it" '
    $BMLAUNCH --metrics-port 0 -g 2 -n 3 --gpus-per-node 3 -- $PY -c "
import bmt; l = bmt.layout()
print(l.rank, l.world, l.groups, l.gpus_per_group, l.group, l.group_rank, l.replica, l.node, l.local_rank, l.nodes)" >out &&
    sort out >got &&
    for r in 0 1 2 3 4 5; do
        echo "$r: $r 6 2 3 $((r / 3)) $((r % 3)) $((r % 3)) $((r / 3)) $((r % 3)) 2"
    done >want &&
    diff -u want got
'

test_expect_success "tokens/s, samples/s, FLOP/s and MFU are libbmt's on the same numbers; the GPU peak table and BMT_PEAK_TFLOPS too" '
    BMT_PLUGINS=jsonl BMT_JSONL=$PWD/m-%r.jsonl BMT_PEAK_TFLOPS=0.25 \
        $BMLAUNCH --metrics-port 0 --backend none -n 2 -- $PROGS/steps --steps 4 --pace 5 >out 2>err &&
    $PY - "$BUILDDIR" <<-EOF
	import ctypes, glob, json, math, os, sys
	import bmt
	rows = [json.loads(l) for f in sorted(glob.glob("m-*.jsonl")) for l in open(f)]
	assert len(rows) == 8, rows
	for s in rows:
	    f = bmt.step_figures(tokens=s["tokens"], samples=s["samples"], flops=s["flops"],
	                         step_time=s["step_time_s"], peak_flops=0.25e12)
	    for k in ("tokens_per_s", "samples_per_s", "flops_per_s", "mfu"):
	        assert f[k] == s[k], (k, f[k], s[k])   # the same divisions: bit for bit
	# NaN where libbmt has NaN: no FLOPs, no peak
	assert math.isnan(bmt.step_figures(tokens=1, flops=0, step_time=1)["flops_per_s"])
	assert math.isnan(bmt.step_figures(tokens=1, flops=1, step_time=1, peak_flops=0)["mfu"])
	assert bmt.step_figures(tokens=5, step_time=0)["tokens_per_s"] == 5 / 1e-9
	# a Monitor with the same peak reports the same MFU
	m = bmt.Monitor({"BMT_PEAK_TFLOPS": "0.25"}).report_step(tokens=1000, flops=1e9, step_time=0.5, samples=1)
	assert m["mfu"] == 1e9 / 0.5 / 0.25e12 and m["tokens_per_s"] == 2000, m
	try:
	    bmt.Monitor({"BMT_PEAK_TFLOPS": "lots"})
	except ValueError as e:
	    assert "BMT_PEAK_TFLOPS=\x27lots\x27 is not a positive number (peak TFLOP/s of one rank)" in str(e), e
	else:
	    raise AssertionError("BMT_PEAK_TFLOPS=lots accepted")
	names = ["NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
	         "NVIDIA GH200 480GB", "NVIDIA H20", "NVIDIA H800", "NVIDIA B200", "NVIDIA B100", "NVIDIA GB200",
	         "NVIDIA A100-SXM4-80GB", "NVIDIA A800 80GB PCIe", "NVIDIA L40S", "NVIDIA L40", "NVIDIA L4",
	         "NVIDIA A10", "NVIDIA A10G", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090", "", "H2000"]
	knobs = open(os.path.join(sys.argv[1], ".knobs")).read()
	if "SAN=1" in knobs:   # a sanitized libbmt cannot be loaded into python
	    print("# the peak table not compared with libbmt (sanitized build)")
	else:
	    lib = ctypes.CDLL(os.path.join(sys.argv[1], "lib", "libbmt.so"))
	    lib.bmt_peak_flops_of.restype = ctypes.c_double
	    lib.bmt_peak_flops_of.argtypes = [ctypes.c_char_p]
	    for n in names:
	        assert bmt.peak_flops_of(n) == lib.bmt_peak_flops_of(n.encode()), (n, bmt.peak_flops_of(n))
	assert bmt.peak_flops_of("NVIDIA H200") == 989e12 and bmt.peak_flops_of("NVIDIA H20") == 148e12
	assert bmt.peak_flops_of("NVIDIA A10G") == 0
	print("ok")
	EOF
'

# A rank program without torch: 6 steps of known figures, three events and
# scalars (val_loss, bleu, then 30 more names: the 32 allowed; bad names and a
# 33rd refused), then prints what report_step returned for its last step.
cat >"$TMP/ranks.py" <<'EOF'
import json, sys, time
import bmt
lay = bmt.layout()
for step in range(1, 7):
    m = bmt.report_step(tokens=1000 + lay.rank, samples=2, loss=None if step == 3 else 1.0 / step,
                        step_time=0.25, flops=1e9, step=step, params=123, lr=0.01, grad_norm=0.5)
    if step == 2:
        bmt.report_event("checkpoint_saved", "ckpt/step-2")
    time.sleep(0.05)
    if step % 3 == 0:  # val_loss at steps 3 and 6, 1/step + rank/100; a figure of its own
        bmt.report_scalar("val_loss", 1.0 / step + lay.rank / 100)
        bmt.report_scalar("bleu", 10 * step + lay.rank)
bmt.report_event("note", "hello from rank %d" % lay.rank)
bmt.report_event("restart", "")
# a file name's invalid byte (os.fsdecode: a lone surrogate) and a NUL: sent as
# C strings carry them ("?", the end), not as JSON the collector refuses whole
bmt.report_event("checkpoint_saved", "ck/\udcff-%d\0junk" % lay.rank)
for bad in ("Val", "9x", "a" * 49, 7):
    try:
        bmt.report_scalar(bad, 1)
        raise SystemExit("report_scalar took the name %r" % (bad,))
    except ValueError as e:
        assert "must be a lower-case letter" in str(e), e
for i in range(bmt.SCALARS_MAX - 2):
    bmt.report_scalar("s%d" % i, i)
try:
    bmt.report_scalar("one_more", 1)
    raise SystemExit("report_scalar took a 33rd name")
except ValueError as e:
    assert "'one_more' would be one name too many" in str(e), e
print(json.dumps(m))
EOF

test_expect_success "a Python rank's pushes reach bmlaunch's collector: /metrics (promtool), /api/status, the rank's figures, events and scalars" '
    BMT_PEAK_TFLOPS=0.001 start_job --metrics-port $(free_port) --metrics-linger 60 -g 2 -n 1 -- $PY $TMP/ranks.py &&
    wait_status "s[\"state\"] == \"ended\"" &&
    curl -sf "$URL/metrics" >m.txt && curl -sf "$URL/api/status?ranks=1" >s.json &&
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    test $rc -eq 0 && ! grep -q "push:" job.err &&
    promtool check metrics <m.txt &&
    grep -q "^bmt_tokens_total{job_id=\"[^\"]*\"} 12006$" m.txt &&
    grep -q "^bmt_step{job_id=\"[^\"]*\"} 6$" m.txt &&
    grep -q "^bmt_tokens_per_second{job_id=\"[^\"]*\"} 8004$" m.txt &&
    grep -q "^bmt_mfu_ratio{job_id=\"[^\"]*\"} 4$" m.txt &&
    grep -q "^bmt_collector_pushes_total{job_id=\"[^\"]*\",code=\"200\"} [1-9]" m.txt &&
    grep -q "^bmt_collector_pushes_total{job_id=\"[^\"]*\",code=\"400\"} 0$" m.txt &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"checkpoint_saved\"} 4$" m.txt &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"restart\"} 2$" m.txt &&
    grep -q "^bmt_val_loss{job_id=\"[^\"]*\"} 0.17166666666666" m.txt &&
    grep -q "^bmt_val_loss_step{job_id=\"[^\"]*\"} 6$" m.txt &&
    grep -q "^bmt_scalar{job_id=\"[^\"]*\",name=\"bleu\"} 60.5$" m.txt &&
    grep -q "^bmt_scalar{job_id=\"[^\"]*\",name=\"s29\"} 29$" m.txt &&
    $PY - <<-EOF
	import json
	s = json.load(open("s.json"))
	assert s["step"] == 6 and s["ranks_seen"] == 2, s
	assert [p["step"] for p in s["val_history"]] == [3, 6], s["val_history"]
	assert abs(s["val_history"][0]["val_loss"] - (1 / 3 + 0.005)) < 1e-12, s["val_history"]
	assert [p["step"] for p in s["history"]] == [1, 2, 3, 4, 5, 6], s["history"]
	mine = {int(l.split(":", 1)[0]): json.loads(l.split(":", 1)[1]) for l in open("job.out")}
	for m in s["ranks"]:
	    want = mine[m["rank"]]
	    for k in ("step", "tokens", "tokens_total", "tokens_per_s", "samples_per_s", "flops_per_s",
	              "mfu", "loss", "lr", "grad_norm", "params", "step_time_s"):
	        assert m[k] == want[k], (r["rank"], k, m[k], want[k])
	    assert m["tokens_per_s"] == (1000 + m["rank"]) / 0.25 and m["mfu"] == 4.0, m
	ev = [(e["rank"], e["kind"], e["step"], e["detail"]) for e in s["events"]]
	for rank in (0, 1):
	    assert (rank, "checkpoint_saved", 2, "ckpt/step-2") in ev, ev
	    assert (rank, "note", 6, "hello from rank %d" % rank) in ev, ev
	    assert (rank, "restart", 6, "") in ev, ev
	    assert (rank, "checkpoint_saved", 6, "ck/?-%d" % rank) in ev, ev
	print("ok")
	EOF
'

test_expect_success "a Python rank pushes over HTTPS to bmlaunch --metrics-tls on, pinned to the job's certificate" '
    start_job --metrics-tls on --log-dir logs --metrics-port $(free_port) --metrics-linger 60 -g 2 -n 1 -- \
        $PY $TMP/ranks.py &&
    case $URL in https://127.0.0.1:*) ;; *) echo "not https: $URL"; false ;; esac &&
    CACERT=logs/metrics-ca.pem wait_status "s[\"state\"] == \"ended\"" &&
    curl -sf --cacert logs/metrics-ca.pem "$URL/metrics" >m.txt || fail=1
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    cat job.err
    test -z "${fail:-}" && test $rc -eq 0 && ! grep -q "push:" job.err &&
    grep -q "^bmt_tokens_total{job_id=\"[^\"]*\"} 12006$" m.txt &&
    grep -q "^bmt_events_total{job_id=\"[^\"]*\",kind=\"checkpoint_saved\"} 4$" m.txt &&
    grep -q "^bmt_collector_pushes_total{job_id=\"[^\"]*\",code=\"400\"} 0$" m.txt
'

# Pushes against a collector stand-in in the same process: unreachable at
# first, then listening (plain HTTP, or HTTPS with a certificate), answering
# $CODE. Prints what it received as JSON lines in got.jsonl.
cat >"$TMP/sink.py" <<'EOF'
import http.server, json, os, ssl, sys, threading, time
port, code, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
listen_after = int(os.environ.get("LISTEN_AFTER", "0"))
got = []
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        got.append({"auth": self.headers["Authorization"], "body": body})
        self.send_response(code); self.end_headers(); self.wfile.write(b"nope: bad token" if code != 200 else b"{}")
    def log_message(self, *a): pass
def serve():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    if os.environ.get("CERT"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.environ["CERT"], os.environ["KEY"])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
import bmt
t0 = time.monotonic()
for step in range(1, steps + 1):
    if step == listen_after + 1:
        serve()
    bmt.report_step(tokens=10, step=step, step_time=0.01)
    time.sleep(0.02)
took = time.monotonic() - t0
bmt.metrics._monitor().close()   # flush as at exit
with open("got.jsonl", "w") as f:
    for g in got:
        f.write(json.dumps(g) + "\n")
print("steps took %.2f s" % took)
EOF

test_expect_success "push: an unreachable collector is said once, and once when it answers; training never waits; steps held back arrive" '
    port=$(free_port) &&
    LISTEN_AFTER=10 BMT_METRICS_URL=http://127.0.0.1:$port/api/push BMT_METRICS_TOKEN=tok BMT_JOB_ID=j BMT_RANK=0 \
        BMT_WORLD_SIZE=1 $PY $TMP/sink.py $port 200 60 >out 2>err &&
    cat err &&
    test "$(grep -c "bmt: rank 0: push: cannot reach the collector, will retry and drop the oldest items when the queue is full: POST http://127.0.0.1:$port/api/push: .*Connection refused" err)" -eq 1 &&
    test "$(grep -c "bmt: rank 0: push: the collector answers again after [0-9.]* s (0 items dropped so far)" err)" -eq 1 &&
    test $(wc -l <err) -eq 2 &&
    $PY - <<-EOF
	import json, time
	rows = [json.loads(l) for l in open("got.jsonl")]
	assert all(r["auth"] == "Bearer tok" for r in rows)
	b = [r["body"] for r in rows]
	assert all(x["version"] == 2 and x["job"] == "j" and x["rank"] == 0 and x["dropped"] == 0 for x in b), b[0]
	# one run for the process, in every push: BMT_RESTART (unset: 0), its start, 64 random bits
	run = b[0]["run"]
	assert all(x["run"] == run for x in b) and run["restart"] == 0, run
	assert abs(run["start"] - time.time()) < 120 and len(run["id"]) == 16 and int(run["id"], 16) >= 0, run
	steps = sorted(s["step"] for x in b for s in x["steps"])
	assert steps == list(range(1, 61)), steps
	took = float(open("out").read().split()[2])
	assert took < 60 * 0.02 + 3.0, took   # 60 steps of 20 ms: no wait for the network
	print("ok")
	EOF
'

test_expect_success "push never stalls training on a collector that accepts but never answers; the exit waits BMT_PLUGIN_FLUSH_TIMEOUT at most" '
    start=$(date +%s.%N) &&
    BMT_METRICS_URL=http://127.0.0.1:1/api/push BMT_METRICS_TOKEN=x BMT_METRICS_TIMEOUT=30 \
        BMT_PLUGIN_FLUSH_TIMEOUT=1 $PY - >out 2>err <<-EOF &&
	import os, socket, time
	s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)   # never accepts, never answers
	os.environ["BMT_METRICS_URL"] = "http://127.0.0.1:%d/api/push" % s.getsockname()[1]
	import bmt
	worst = 0
	for step in range(1, 31):
	    t = time.monotonic()
	    bmt.report_step(tokens=10, step=step, step_time=0.01)
	    worst = max(worst, time.monotonic() - t)
	    time.sleep(0.01)
	assert worst < 0.05, worst
	print("slowest report_step %.4f s" % worst)
	EOF
    end=$(date +%s.%N) && cat out err &&
    awk -v a=$start -v b=$end "BEGIN { exit !(b - a < 8) }" &&
    grep -q "push: [0-9]* metrics items were dropped in all" err
'

test_expect_success "push: a refusal (401) drops those items, is said once with the hint, and the program goes on to exit 0" '
    port=$(free_port) &&
    BMT_METRICS_URL=http://127.0.0.1:$port/api/push BMT_METRICS_TOKEN=wrong BMT_JOB_ID=j \
        $PY $TMP/sink.py $port 401 20 >out 2>err &&
    cat err &&
    test "$(grep -c "bmt: rank 0: push: the collector refused [0-9]* items: POST http://127.0.0.1:$port/api/push: HTTP 401 nope: bad token (check BMT_METRICS_TOKEN)" err)" -eq 1 &&
    grep -q "bmt: rank 0: push: [0-9]* metrics items were dropped in all" err &&
    test $(wc -l <err) -eq 2
'

test_expect_success "push: a 409 (a newer run of the rank pushes now) is said once with what it means; BMT_RESTART is the run sent, a bad one refused" '
    port=$(free_port) &&
    BMT_METRICS_URL=http://127.0.0.1:$port/api/push BMT_METRICS_TOKEN=t BMT_JOB_ID=j BMT_RESTART=3 \
        $PY $TMP/sink.py $port 409 20 >out 2>err &&
    cat err &&
    test "$(grep -c "bmt: rank 0: push: the collector refused [0-9]* items: POST http://127.0.0.1:$port/api/push: HTTP 409 nope: bad token (a newer run of this rank pushes now: this process.s metrics are no longer shown)" err)" -eq 1 &&
    $PY -c "import json; assert all(json.loads(l)[\"body\"][\"run\"][\"restart\"] == 3 for l in open(\"got.jsonl\"))" &&
    ! BMT_METRICS_URL=http://127.0.0.1:$port/api/push BMT_METRICS_TOKEN=t BMT_JOB_ID=j BMT_RESTART=x \
        $PY $TMP/sink.py $port 200 1 >out 2>err &&
    grep -q "BMT_RESTART=.x. is not an integer" err
'

test_expect_success "push over HTTPS: verified against BMT_METRICS_CA_PEM alone, host name not checked; another certificate is refused" '
    # as bmlaunch makes its own: ECDSA P-256, self-signed, CA:TRUE, a name that is not the host
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem -out cert.pem -days 2 \
        -subj "/CN=bmlaunch.invalid" -addext "basicConstraints=critical,CA:TRUE" 2>/dev/null &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout key2.pem -out other.pem -days 2 -subj "/CN=other" 2>/dev/null &&
    port=$(free_port) &&
    CERT=$PWD/cert.pem KEY=$PWD/key.pem BMT_METRICS_CA_PEM="$(cat cert.pem)" \
        BMT_METRICS_URL=https://127.0.0.1:$port/api/push BMT_METRICS_TOKEN=tok BMT_JOB_ID=j \
        $PY $TMP/sink.py $port 200 10 >out 2>err &&
    test ! -s err && test "$(cat got.jsonl | wc -l)" -ge 1 &&
    $PY -c "
import json
steps = sorted(s[\"step\"] for l in open(\"got.jsonl\") for s in json.loads(l)[\"body\"][\"steps\"])
assert steps == list(range(1, 11)), steps" &&
    port=$(free_port) &&
    CERT=$PWD/cert.pem KEY=$PWD/key.pem BMT_METRICS_CA_PEM="$(cat other.pem)" BMT_PLUGIN_FLUSH_TIMEOUT=1 \
        BMT_METRICS_URL=https://127.0.0.1:$port/api/push BMT_METRICS_TOKEN=tok BMT_JOB_ID=j \
        $PY $TMP/sink.py $port 200 10 >out 2>err &&
    cat err && test ! -s got.jsonl &&
    test "$(grep -c "push: cannot reach the collector, .*CERTIFICATE_VERIFY_FAILED" err)" -eq 1
'

test_expect_success "report_step refuses impossible values; without BMT_METRICS_URL it only computes" '
    env -u BMT_METRICS_URL $PY - <<-EOF
	import threading, bmt
	for kw in ({"tokens": -1}, {"tokens": 1.5}, {"flops": float("inf")}, {"step_time": 0}, {"step": -2},
	           {"lr": -1e-3}, {"grad_norm": -0.5}, {"lr": float("-inf")}):
	    try:
	        bmt.report_step(**kw)
	    except ValueError as e:
	        assert "report_step" in str(e), e
	    else:
	        raise AssertionError(kw)
	try:
	    bmt.report_event("abort")
	except ValueError as e:
	    assert "not checkpoint_saved, restart or note" in str(e)
	m = bmt.report_step(tokens=8, step_time=2.0)
	assert m["tokens_per_s"] == 4.0 and m["step"] == 1 and m["loss"] != m["loss"], m
	m = bmt.report_step(tokens=8, step_time=2.0, lr=float("nan"), grad_norm=0.0)
	assert m["step"] == 2 and m["lr"] != m["lr"] and m["grad_norm"] == 0.0, m
	# a value that is no number is refused before its name counts: 32 names still fit
	for i in range(bmt.SCALARS_MAX - 1):
	    bmt.report_scalar("s%d" % i, i)
	try:
	    bmt.report_scalar("late", "high")
	except ValueError:
	    pass
	else:
	    raise AssertionError("report_scalar took a value that is no number")
	assert bmt.report_scalar("last", float("inf"))["value"] == float("inf")
	assert not any(t.name == "bmt-push" for t in threading.enumerate())
	print("ok")
	EOF
'

test_expect_success "report_step: a refused value changes nothing (a loss float() does not take; a count or total past what a push carries, which would make the collector refuse the whole push): the next step is numbered as if it never came" '
    env -u BMT_METRICS_URL $PY - <<-EOF
	import bmt
	m = bmt.Monitor({})
	assert m.report_step(tokens=2 ** 62, samples=1, step_time=1.0)["step"] == 1
	for kw in ({"loss": "high"}, {"loss": [1.0, 2.0]}, {"microbatches": 2 ** 31}, {"tokens": 2 ** 63},
	           {"samples": 2 ** 63}, {"params": 2 ** 63}, {"step": 2 ** 63},
	           {"tokens": 2 ** 62}):  # tokens_total would pass 2^63 - 1
	    try:
	        m.report_step(step_time=1.0, **kw)
	    except (ValueError, TypeError) as e:
	        assert "report_step" in str(e) or "float" in str(e) or "convert" in str(e), (kw, e)
	    else:
	        raise AssertionError("%r accepted" % kw)
	r = m.report_step(tokens=1, samples=1, step_time=1.0, microbatches=2 ** 31 - 1,
	                  params=2 ** 63 - 1)
	assert (r["step"], r["tokens_total"], r["samples_total"]) == (2, 2 ** 62 + 1, 2), r
	print("ok")
	EOF
'

test_expect_success "without BMT_METRICS_URL (bmlaunch --metrics-port 0) too, a malformed BMT_PLUGIN_FLUSH_TIMEOUT is refused, as libbmt's bmt_init refuses it" '
    env -u BMT_METRICS_URL $PY - <<-EOF
	import bmt
	for v in ("x", "0", "1e3", ""):
	    try:
	        bmt.Monitor({"BMT_PLUGIN_FLUSH_TIMEOUT": v})
	    except ValueError as e:
	        assert str(e) == "BMT_PLUGIN_FLUSH_TIMEOUT=\x27%s\x27 must be a positive number of seconds" % v, e
	    else:
	        raise AssertionError("BMT_PLUGIN_FLUSH_TIMEOUT=%r accepted" % v)
	assert bmt.Monitor({"BMT_PLUGIN_FLUSH_TIMEOUT": "2.5"}).sender is None
	print("ok")
	EOF
    ! BMT_PLUGIN_FLUSH_TIMEOUT=x $PROGS/hello 2>err && grep -q "BMT_PLUGIN_FLUSH_TIMEOUT=.x. is not a positive number" err
'

test_expect_success "the push settings are refused as the C push plugin refuses them: a whole BMT_METRICS_QUEUE, a finite BMT_PLUGIN_FLUSH_TIMEOUT, plain decimals only; a long flush time is no crash at exit" '
    $PY - >out 2>err <<-EOF &&
	import bmt
	base = {"BMT_METRICS_URL": "http://127.0.0.1:1/api/push", "BMT_METRICS_TOKEN": "t"}
	for name, value, want in (("BMT_METRICS_QUEUE", "1e3", "BMT_METRICS_QUEUE=.1e3. must be a count"),
	                          ("BMT_METRICS_QUEUE", "10.0", "BMT_METRICS_QUEUE=.10.0. must be a count"),
	                          ("BMT_METRICS_QUEUE", "\u0661", "BMT_METRICS_QUEUE=.\u0661. must be a count"),
	                          ("BMT_PLUGIN_FLUSH_TIMEOUT", "1e999", "BMT_PLUGIN_FLUSH_TIMEOUT=.1e999. must be"),
	                          ("BMT_METRICS_TIMEOUT", "\u0661", "BMT_METRICS_TIMEOUT=.\u0661. must be")):
	    try:
	        bmt.Monitor(dict(base, **{name: value}))
	    except ValueError as e:
	        import re
	        assert re.search(want, str(e)), (name, value, str(e))
	    else:
	        raise AssertionError("%s=%s accepted" % (name, value))
	for name, value in (("BMT_METRICS_QUEUE", " 7"), ("BMT_METRICS_QUEUE", "+7"),
	                    ("BMT_METRICS_TIMEOUT", "1e1"), ("BMT_PLUGIN_FLUSH_TIMEOUT", "0x10")):
	    try:
	        bmt.Monitor(dict(base, **{name: value}))
	    except ValueError as e:
	        assert str(e).startswith("%s=%r must be" % (name, value)), str(e)
	    else:
	        raise AssertionError("%s=%r accepted" % (name, value))
	# a certificate that is none is refused naming the variable, as the push plugin does
	for pem in ("garbage", "-----BEGIN CERTIFICATE-----\\nAAAA\\n-----END CERTIFICATE-----\\n"):
	    try:
	        bmt.Monitor(dict(base, BMT_METRICS_URL="https://127.0.0.1:1/api/push", BMT_METRICS_CA_PEM=pem))
	    except ValueError as e:
	        assert str(e).startswith("rank 0: BMT_METRICS_CA_PEM holds no PEM certificate ("), str(e)
	    else:
	        raise AssertionError("BMT_METRICS_CA_PEM=%r accepted" % pem)
	# a long flush time (1e10 s) is taken, and the exit does not wait for it:
	# nothing is queued
	m = bmt.Monitor(dict(base, BMT_PLUGIN_FLUSH_TIMEOUT="10000000000", BMT_METRICS_QUEUE="7"))
	assert m.sender.cap == 7
	m.close()
	print("ok")
	EOF
    grep -qx ok out && ! grep -q "Error\|Traceback" err
'

test_expect_success "without BMT_METRICS_URL (bmlaunch --metrics-port 0) too: BMT_PLUGINS=jsonl and BMT_PUSHGATEWAY_URL are said once to be left out; a BMT_DEVICE other than cpu or cuda is refused" '
    env -u BMT_METRICS_URL BMT_PLUGINS=jsonl,push BMT_PUSHGATEWAY_URL=http://127.0.0.1:1 $PY - >out 2>err <<-EOF &&
	import bmt
	for step in range(3):
	    bmt.report_step(tokens=1, step_time=1.0)
	print("ok")
	EOF
    cat err && grep -qx ok out &&
    test "$(grep -c "^bmt: rank 0: BMT_PLUGINS names jsonl: a Python program sends its metrics to the collector itself and loads no plugin; it is left out$" err)" -eq 1 &&
    test "$(grep -c "^bmt: rank 0: BMT_PUSHGATEWAY_URL is set, but a Python program sends its metrics only to bmlaunch.s collector: it is not used$" err)" -eq 1 &&
    test $(wc -l <err) -eq 2 &&
    $PY - <<-EOF
	import bmt
	for v in ("gpu", "CUDA", ""):
	    try:
	        bmt.Monitor({"BMT_DEVICE": v})
	    except ValueError as e:
	        assert str(e) == "BMT_DEVICE=\x27%s\x27 is not cpu or cuda (bmlaunch --device sets it)" % v, e
	    else:
	        raise AssertionError("BMT_DEVICE=%r accepted" % v)
	assert bmt.Monitor({"BMT_DEVICE": "cuda", "BMT_PEAK_TFLOPS": "2"}).device == "cuda"
	assert bmt.Monitor({"BMT_DEVICE": "cpu"}).device == "cpu"
	print("ok")
	EOF
'

test_expect_success "bmt.Preemption without torch.distributed: the signal becomes save(step) at the next boundary, then exit 0; the old handler comes back" '
    $PY - <<-EOF
	import os, signal, sys
	import bmt
	saved = []
	before = signal.getsignal(signal.SIGUSR1)
	with bmt.Preemption(save=lambda step: saved.append(step) or "ck/%d" % step, exit=False) as pre:
	    assert pre.step_boundary(1) is False and saved == []
	    os.kill(os.getpid(), signal.SIGUSR1)
	    assert pre.requested and pre.step_boundary(2) is True and saved == [2] and pre.stopped_at == 2
	assert signal.getsignal(signal.SIGUSR1) == before, "the handler was not put back"
	# a malformed BMT_PENDING_SIGNALS is refused before the handler goes in
	os.environ["BMT_PENDING_SIGNALS"] = "USR3"
	try:
	    bmt.Preemption()
	except ValueError as e:
	    assert "BMT_PENDING_SIGNALS=\x27USR3\x27 is not USR1, USR2 or USR1,USR2" in str(e), e
	else:
	    raise AssertionError("BMT_PENDING_SIGNALS=USR3 accepted")
	assert signal.getsignal(signal.SIGUSR1) == before, "a refused Preemption left its handler"
	del os.environ["BMT_PENDING_SIGNALS"]
	try:
	    with bmt.Preemption(save=saved.append) as pre:
	        os.kill(os.getpid(), signal.SIGUSR1)
	        pre.step_boundary(7)
	    raise AssertionError("no exit")
	except SystemExit as e:
	    assert e.code == 0 and saved == [2, 7], (e.code, saved)
	print("ok")
	EOF
'

# ------------------------------------------------------------ torch

test_expect_success "bmt.torch.process_groups refuses a torch.distributed whose rank is not the layout's (its groups would not hold this process); device_type refuses a BMT_DEVICE other than cpu or cuda" '
    BMT_RANK=0 BMT_GROUPS=2 BMT_GPUS_PER_GROUP=1 $PY - <<-EOF
	import os
	import torch.distributed as dist
	import bmt.torch
	# as after init_process_group(rank=1, world_size=2) in a process the layout calls rank 0
	dist.is_initialized = lambda: True
	dist.get_world_size = lambda group=None: 2
	dist.get_rank = lambda group=None: 1
	for f in (bmt.torch.process_groups,):
	    try:
	        f()
	    except RuntimeError as e:
	        assert "torch.distributed has rank 1 of 2, the bmt layout 2 x 1 rank 0 of 2" in str(e), e
	    else:
	        raise AssertionError("accepted")
	# a run on cpu with gloo is no answer to BMT_DEVICE=gpu: bmlaunch and libbmt refuse it too
	for v, want in (("cpu", "cpu"), ("cuda", "cuda"), (None, "cpu"), ("gpu", None)):
	    os.environ.pop("BMT_DEVICE", None)
	    if v is not None:
	        os.environ["BMT_DEVICE"] = v
	    try:
	        got = bmt.torch.device_type()
	    except ValueError as e:
	        assert want is None and "BMT_DEVICE=\x27gpu\x27 is not cpu or cuda" in str(e), e
	    else:
	        assert got == want, (v, got)
	print("ok")
	EOF
'

# Every rank's line of check_groups in examples/torch/train.py, for -g 2 -n 2.
groups_ok() {
    local r g i
    for r in 0 1 2 3; do
        g=$((r / 2)) i=$((r % 2))
        grep -qx "$r: train.py: rank $r: process groups ok: group $g \[$((2 * g)), $((2 * g + 1))\], replica $i \[$i, $((i + 2))\]" job.out ||
            { echo "rank $r: no 'process groups ok' line"; return 1; }
    done
}

test_expect_success "the example trains under bmlaunch -g 2 -n 2 --device cpu (gloo): process groups right, loss falls, tokens/s on /metrics (promtool) and the page (Chromium)" '
    start_job --metrics-port $(free_port) --metrics-linger 120 \
        -g 2 -n 2 --device cpu -- $PY $TRAIN --steps 40 &&
    wait_status "s[\"state\"] == \"ended\"" &&
    curl -sf "$URL/metrics" >m.txt &&
    { ! command -v chromium >/dev/null || chromium_dom "$URL/" dom.html; } || fail=1
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    cat job.err; grep -v "^0: step" job.out
    test -z "${fail:-}" && test $rc -eq 0 && groups_ok &&
    ver=$(sed -n "s/^0: train.py: torch \([0-9]*\.[0-9]*\).*/\1/p" job.out) && test -n "$ver" &&
    case $ver in
    1.* | 2.0 | 2.1)
        grep -q "^0: train.py: bmt.torch.device_mesh needs torch >= 2.2 (DeviceMesh with named dims, for fully_shard.s HSDP); this is torch $ver[0-9.a-z+]*: use bmt.torch.process_groups()" job.out ;;
    *) grep -q "^0: train.py: DeviceMesh(.cpu., \[\[0, 1\], \[2, 3\]\], mesh_dim_names=(.replicate., .shard.))" job.out ;;
    esac &&
    grep -q "^0: train.py: .* layout 2 x 2 = 4 ranks | hierarchical data parallel" job.out &&
    promtool check metrics <m.txt &&
    grep -q "^bmt_step{job_id=\"[^\"]*\"} 40$" m.txt &&
    grep -q "^bmt_tokens_total{job_id=\"[^\"]*\"} 81920$" m.txt &&
    grep -qE "^bmt_tokens_per_second\{job_id=\"[^\"]*\"\} [0-9.e+]+$" m.txt &&
    grep -q "^bmt_collector_pushes_total{job_id=\"[^\"]*\",code=\"400\"} 0$" m.txt &&
    $PY - <<-EOF &&
	import re
	loss = [float(x) for x in re.findall(r"^0: step +\d+/40 \| loss ([0-9.]+)", open("job.out").read(), re.M)]
	assert len(loss) == 40, loss
	first, last = sum(loss[:3]) / 3, sum(loss[-5:]) / 5
	assert first > 5.0 and last < first - 1.5, (first, last)
	m = open("m.txt").read()
	tps = float(re.search(r"^bmt_tokens_per_second\{[^}]*\} (\S+)$", m, re.M).group(1))
	assert tps > 0, tps
	print("loss %.3f -> %.3f; %.0f tokens/s on /metrics" % (first, last, tps))
	EOF
    { ! command -v chromium >/dev/null || $PY - <<-EOF
	import re
	d = open("dom.html").read()
	assert "<span id=\"state\" class=\"succeeded\">succeeded (exit status 0)</span>" in d, "state"
	card = lambda k: re.search(r"<div class=\"v\" id=\"v-%s\">([^<]*)</div>" % k, d).group(1)
	assert card("step") == "40", card("step")
	assert re.fullmatch(r"[0-9.]+k?", card("tps")) and float(card("tps").rstrip("k")) > 0, card("tps")
	assert re.fullmatch(r"[0-9.]+", card("loss")), card("loss")
	m = re.search(r"<svg id=\"chart-tokens\" data-points=\"(\d+)\"", d)
	assert m and int(m.group(1)) >= 30, m and m.group(1)
	assert "2 groups × 2 ranks = 4 ranks" in d
	print("page: tokens/s", card("tps"), "loss", card("loss"))
	EOF
    }
'

test_expect_success "SIGUSR1 to one rank: every rank saves at the same step, a checkpoint_saved event each, exit 0; --resume goes on from it" '
    start_job --metrics-port $(free_port) --metrics-linger 120 \
        -g 2 -n 2 --device cpu -- $PY $TRAIN --steps 1000 --save-dir ck &&
    wait_status "s[\"step\"] >= 3" &&
    victim=$(pgrep -P $JOB_PID | sed -n 3p) && test -n "$victim" &&
    kill -USR1 $victim &&
    wait_status "s[\"state\"] == \"ended\"" || fail=1
    kill -INT $JOB_PID; rc=0; wait $JOB_PID || rc=$?
    cat job.err; grep -v "^0: step" job.out
    test -z "${fail:-}" && test $rc -eq 0 &&
    test "$(grep -c "^[0-3]: train.py: rank [0-3]: saved step [0-9]* in ck/step-" job.out)" -eq 4 &&
    n=$(sed -n "s/^0: train.py: rank 0: saved step \([0-9]*\) in .*/\1/p" job.out) &&
    test "$n" -ge 3 && test "$n" -lt 1000 &&
    test "$(grep -c "^[0-3]: train.py: rank [0-3]: saved step $n in ck/step-$(printf %08d $n)$" job.out)" -eq 4 &&
    test "$(cat ck/latest)" = "step-$(printf %08d $n)" && test -s ck/step-$(printf %08d $n)/state.pt &&
    grep -qE "^0: step +$n/1000 " job.out && ! grep -qE "^0: step +$((n + 1))/" job.out &&
    $PY - "$n" <<-EOF &&
	import json, sys
	n = int(sys.argv[1])
	s = json.load(open("status.json"))
	assert s["exit_status"] == 0, s["exit_status"]
	saved = sorted((e["rank"], e["step"]) for e in s["events"] if e["kind"] == "checkpoint_saved")
	assert saved == [(r, n) for r in range(4)], saved
	notes = [e for e in s["events"] if e["kind"] == "note"]
	assert len(notes) == 4 and all(e["detail"] == "SIGUSR1: stopped after step %d" % n for e in notes), notes
	print("all ranks saved step", n)
	EOF
    $BMLAUNCH --metrics-port 0 -g 2 -n 2 --device cpu -- $PY $TRAIN --steps $((n + 3)) --save-dir ck --resume \
        >resume.out 2>resume.err &&
    grep -qx "0: train.py: resumed from ck/latest at step $((n + 1))" resume.out &&
    test "$(grep -cE "^0: step +[0-9]+/$((n + 3)) " resume.out)" -eq 3 &&
    test "$(cat ck/latest)" = "step-$(printf %08d $((n + 3)))" &&
    first=$(sed -nE "s/^0: step +1\/1000 \| loss ([0-9.]+) .*/\1/p" job.out) &&
    again=$(sed -nE "s/^0: step +$((n + 1))\/$((n + 3)) \| loss ([0-9.]+) .*/\1/p" resume.out) &&
    echo "loss at step 1 $first, at step $((n + 1)) after the resume $again" &&
    awk -v a="$first" -v b="$again" "BEGIN { exit !(b < a - 0.2) }"
'

test_expect_success "the example resumed from a checkpoint at or past --steps trains and saves nothing and says so (it wrote step 3's model as step-00000002 and pointed latest at it)" '
    $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $PY $TRAIN --steps 3 --save-dir ck >run.out 2>run.err &&
    test "$(cat ck/latest)" = step-00000003 && cp ck/step-00000003/state.pt saved.pt &&
    for steps in 2 3; do
        $BMLAUNCH --metrics-port 0 -n 1 --device cpu -- $PY $TRAIN --steps $steps --save-dir ck --resume \
            >resume.out 2>resume.err || { cat resume.err; exit 1; }
        grep -qx "0: train.py: the checkpoint is at step 3 and --steps is $steps: nothing left to train (raise --steps to go on)" resume.out ||
            { cat resume.out; exit 1; }
        ! grep -qE "^0: step |saved step" resume.out || { cat resume.out; exit 1; }
        test "$(cat ck/latest)" = step-00000003 || { echo "latest: $(cat ck/latest)"; exit 1; }
    done &&
    test "$(ls ck)" = "latest
step-00000003" && cmp saved.pt ck/step-00000003/state.pt
'

test_done
