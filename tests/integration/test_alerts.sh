#!/bin/bash
# What an SRE gets in monitoring/: the alert rules (promtool check rules, and
# promtool test rules on input series: each alert fires when it should and not
# when it should not), the Grafana dashboard (every PromQL expression checked by
# promtool, and evaluated against a real Prometheus that scraped a real job),
# bmlaunch's --metrics-sd-file (a real Prometheus finds the job through
# file_sd_configs), and a rank-failed alert fired end to end: a real job whose
# rank dies, a real Prometheus with the rules, a real Alertmanager, a webhook
# receiver written here. Everything runs on free ports under timeouts (the
# servers and the job in the background under timeout(1) directly, so that the
# test holds their pids) and is killed at the end; without promtool, prometheus or alertmanager the tests that
# need them are skipped with a "# skipped:" line.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
MON=$SRC/monitoring
EC=$PROGS/engine_check
export BMT_TIMEOUT=60

# The dashboard's PromQL, one line per query: the job_id variable's query
# (label_values(M, L) as `group by (L) (M)`) and every panel target's expr,
# with Grafana's variables replaced ($job_id by $1, $__rate_interval by 1m,
# $__range by 1h). Fails on an unknown variable or a panel without a query.
cat >"$TMP/dash_exprs.py" <<'EOF'
import json, re, sys
dash, job = json.load(open(sys.argv[1])), sys.argv[2]
subst = {"job_id": job, "__rate_interval": "1m", "__range": "1h", "__interval": "15s"}
def expand(e):
    out = re.sub(r"\$\{?(\w+)\}?", lambda m: subst[m.group(1)], e)  # KeyError: unknown variable
    assert "$" not in out, e
    return out
var = [v for v in dash["templating"]["list"] if v["name"] == "job_id"][0]
m = re.fullmatch(r"label_values\((\w+), *(\w+)\)", var["query"]["query"])
assert m and m.group(2) == "job_id", var["query"]
print("group by (%s) (%s)" % (m.group(2), m.group(1)))
for p in dash["panels"]:
    assert p.get("targets"), "panel %r has no query" % p["title"]
    for t in p["targets"]:
        print(expand(t["expr"]))
EOF

if ! command -v promtool >/dev/null 2>&1; then
    echo "# skipped: promtool is not installed (apt-get install prometheus): the rules and the dashboard were not checked"
else

test_expect_success "monitoring/bmt-alerts.yml: promtool check rules is clean, with the four alerts" '
    promtool check rules "$MON/bmt-alerts.yml" >out 2>&1 && cat out &&
    grep -q "SUCCESS: 4 rules found" out &&
    for a in BmtJobStalled BmtRankFailed BmtThroughputDropped BmtLossNonFinite; do
        grep -q "^      - alert: $a$" "$MON/bmt-alerts.yml" || { echo "no alert $a"; false; }
    done
'

test_expect_success "promtool test rules: each alert fires when it should, not before its for, not for healthy or ended jobs" '
    promtool test rules "$MON/bmt-alerts.test.yml" >out 2>&1 || { cat out; false; } &&
    grep -q SUCCESS out &&
    # every alert has a test that expects it to fire, and one that expects nothing
    for a in BmtJobStalled BmtRankFailed BmtThroughputDropped BmtLossNonFinite; do
        grep -A2 "alertname: $a$" "$MON/bmt-alerts.test.yml" | grep -q "exp_alerts: \[\]" &&
        grep -A3 "alertname: $a$" "$MON/bmt-alerts.test.yml" | grep -q "job_id:" ||
        { echo "$a: no test that it fires and one that it does not"; false; }
    done
'

test_expect_success "promtool test rules fails when an alert is broken (the unit tests test something)" '
    cp "$MON/bmt-alerts.yml" "$MON/bmt-alerts.test.yml" . &&
    sed -i "s/^          and on (job_id) max_over_time(bmt_loss\[1h\]) > -Inf$//" bmt-alerts.yml &&
    ! cmp -s bmt-alerts.yml "$MON/bmt-alerts.yml" &&
    test_must_fail promtool test rules bmt-alerts.test.yml >out 2>&1 &&
    grep -q "alertname: BmtLossNonFinite" out
'

test_expect_success "BmtRankFailed fires for a failure that bmlaunch answered with a restart (the old max_over_time(bmt_ranks_failed) rule does not)" '
    grep -q "job_id=\"restarted\"" "$MON/bmt-alerts.test.yml" &&
    grep -q "bmt_ranks_failed_total" "$MON/bmt-alerts.yml" &&
    cp "$MON/bmt-alerts.yml" "$MON/bmt-alerts.test.yml" . &&
    $PY - <<-EOF &&
	import re
	s = open("bmt-alerts.yml").read()
	old = "        expr: max_over_time(bmt_ranks_failed[10m]) > 0\n"
	s2 = re.sub(r"(- alert: BmtRankFailed\n)        expr: >-\n(          .*\n)+?(?=        labels:)", r"\g<1>" + old, s)
	assert s2 != s
	open("bmt-alerts.yml", "w").write(s2)
	EOF
    test_must_fail promtool test rules bmt-alerts.test.yml >out 2>&1 &&
    grep -q "alertname: BmtRankFailed, time: 12m" out && grep -q "job_id=\"restarted\"" out
'

test_expect_success "BmtLossNonFinite stays quiet for a hung job (the collector keeps its last loss), and its test says so" '
    grep -q "job_id=\"hung\"" "$MON/bmt-alerts.test.yml" &&
    cp "$MON/bmt-alerts.yml" . &&
    cat >hang.test.yml <<-EOF &&
	rule_files: [bmt-alerts.yml]
	evaluation_interval: 1m
	tests:
	  # every rank hung at 10m, stale from then on: bmt_loss keeps the last
	  # finite loss (the collector), the step stops
	  - interval: 1m
	    input_series:
	      - series: "bmt_job_running{job_id=\"j\"}"
	        values: "1x30"
	      - series: "bmt_loss{job_id=\"j\"}"
	        values: "2.5x30"
	      - series: "bmt_step{job_id=\"j\"}"
	        values: "1+1x9 10x20"
	    alert_rule_test:
	      - eval_time: 12m
	        alertname: BmtLossNonFinite
	        exp_alerts: []
	      - eval_time: 30m
	        alertname: BmtLossNonFinite
	        exp_alerts: []
	      - eval_time: 30m
	        alertname: BmtJobStalled
	        exp_alerts:
	          - exp_labels: {severity: critical, job_id: j}
	            exp_annotations:
	              summary: "bmt job j makes no progress"
	              description: "Job j is running but its step (the last one every rank reported) has not changed for at least 15 minutes (10 minutes when it never took one)."
	EOF
    promtool test rules hang.test.yml >out 2>&1 || { cat out; false; }
'

test_expect_success "the Grafana dashboard: its panels, a job_id variable, and promtool check rules on every expression" '
    $PY - "$MON/grafana-bmt.json" <<-EOF &&
	import json, sys
	d = json.load(open(sys.argv[1]))
	names = [v["name"] for v in d["templating"]["list"]]
	assert "job_id" in names and "datasource" in names, names
	titles = [p["title"] for p in d["panels"]]
	for want in ("Throughput (tokens/s)", "MFU", "Loss", "Step time and communication wait",
	             "Communication wait, share of the step", "Device memory by kind", "Ranks",
	             "Ranks reporting", "Events", "Failed ranks", "State"):
	    assert want in titles, (want, titles)
	ids = [p["id"] for p in d["panels"]]
	assert len(set(ids)) == len(ids), ids
	# failures that bmlaunch answered with a restart: bmt_ranks_failed (this run)
	# is reset before a scrape sees it, so the stat showed 0 failed ranks
	failed = [t["expr"] for p in d["panels"] if p["title"] == "Ranks failed" for t in p["targets"]]
	assert any(e.startswith("bmt_ranks_failed_total{") for e in failed), failed
	for p in d["panels"]:
	    for t in p["targets"]:
	        # every query keeps to the chosen jobs
	        assert "job_id=~\"\$job_id\"" in t["expr"], (p["title"], t["expr"])
	EOF
    $PY $TMP/dash_exprs.py "$MON/grafana-bmt.json" "job-1" >exprs &&
    test "$(wc -l <exprs)" -ge 20 &&
    $PY - <<-EOF &&
	import json
	rules = [{"record": "bmt_dashboard:q%d" % i, "expr": e.strip()} for i, e in enumerate(open("exprs"))]
	json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open("rules.yml", "w"), indent=1)
	EOF
    promtool check rules rules.yml >out 2>&1 || { cat out; false; } &&
    grep -q "SUCCESS: $(wc -l <exprs) rules found" out &&
    # and the check fails on a broken expression
    sed "s/bmt_loss{/bmt_loss{{/" "$MON/grafana-bmt.json" >broken.json &&
    $PY $TMP/dash_exprs.py broken.json "job-1" >bad &&
    $PY -c "
import json
json.dump({\"groups\": [{\"name\": \"d\", \"rules\": [{\"record\": \"r%d\" % i, \"expr\": e.strip()} for i, e in enumerate(open(\"bad\"))]}]}, open(\"bad.yml\", \"w\"))" &&
    test_must_fail promtool check rules bad.yml >/dev/null 2>&1
'

fi

# ------------------------------------------------------------ --metrics-sd-file

test_expect_success "--metrics-sd-file: the target file exists while the job runs, names its port and job_id, is gone after" '
    mkdir sd &&
    with_timeout 60 $BMLAUNCH --metrics-port $(free_port) --metrics-sd-file $PWD/sd/t.json -n 1 -- \
        sh -c "cat $PWD/sd/t.json; ls -A $PWD/sd" >out 2>err &&
    port=$(sed -n "s|^bmlaunch: metrics on http://127.0.0.1:\([0-9]*\)/ .*|\1|p" err) &&
    test -n "$port" && test ! -e sd/t.json && test -z "$(ls -A sd)" &&
    $PY - "$port" <<-EOF
	import json, sys
	lines = [l.split(": ", 1)[1] for l in open("out").read().splitlines()]  # "0: " rank labels
	t = json.loads(lines[0])
	job = t[0]["labels"]["job_id"]
	assert t == [{"targets": ["127.0.0.1:" + sys.argv[1]], "labels": {"job_id": job}}], t
	assert job.startswith("bmlaunch."), t
	assert lines[1:] == ["t.json"], lines  # no temporary file beside it
	EOF
'

test_expect_success "a bad --metrics-sd-file is refused with the reason, exit 2, before any rank starts" '
    for bad in /nonexistent/dir/t.json:"cannot create /nonexistent/dir/t.json.tmp.[0-9]*: No such file or directory" \
               .:"--metrics-sd-file . is a directory; name a file in it" \
               sd/:"--metrics-sd-file needs a file name, got .sd/." ; do
        path=${bad%%:*} msg=${bad#*:} &&
        { with_timeout 30 $BMLAUNCH --metrics-port $(free_port) --metrics-sd-file "$path" -n 2 -- \
            touch ran >out 2>err; rc=$?; } &&
        test $rc -eq 2 && grep -q -- "$msg" err && test ! -e ran &&
        ! grep -q "metrics on http" err || { echo "$path: exit $rc"; cat err; exit 1; }
    done &&
    { $BMLAUNCH --metrics-port 0 --metrics-sd-file t.json -n 1 -- touch ran 2>err; rc=$?; } &&
    test $rc -eq 2 && grep -q "metrics-port 0 turns the collector off" err && test ! -e ran && test ! -e t.json
'

# ------------------------------------------------------------ the whole chain, live

LIVE=$TMP/live
if ! command -v prometheus >/dev/null 2>&1 || ! command -v prometheus-alertmanager >/dev/null 2>&1 ||
    ! command -v promtool >/dev/null 2>&1; then
    echo "# skipped: prometheus, promtool or prometheus-alertmanager is not installed (apt-get install prometheus prometheus-alertmanager): no live test of file_sd, the dashboard and the alerts"
else

# A webhook receiver: each POST body (Alertmanager's JSON) as one line.
cat >"$TMP/hook.py" <<'EOF'
import http.server, sys
port, out = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(out, "ab") as f:
            f.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
EOF

# One real run for the tests below (their results land in $LIVE): a Prometheus
# that finds bmlaunch's collector through file_sd (the directory watched
# before the job starts), evaluates bmt-alerts.yml every second and sends to a
# real Alertmanager, which posts to the receiver above. The job trains until
# Prometheus holds 5 samples of it, then one rank is killed (SIGKILL, like the
# OOM killer), which fails the job.
test_expect_success "live: a job under --metrics-sd-file, found by Prometheus through file_sd, one rank killed; Alertmanager posts to the receiver" '
    mkdir -p $LIVE/sd && cd $LIVE &&
    pport=$(free_port) && aport=$(free_port) && wport=$(free_port) && mport=$(free_port) &&
    pids="" &&
    trap "kill \$pids 2>/dev/null; wait 2>/dev/null" EXIT &&
    cat >am.yml <<-EOF &&
	route:
	  receiver: hook
	  group_by: [alertname, job_id]
	  group_wait: 1s
	  group_interval: 1s
	  repeat_interval: 1h
	receivers:
	  - name: hook
	    webhook_configs:
	      - url: http://127.0.0.1:$wport/
	EOF
    cat >prom.yml <<-EOF &&
	global:
	  scrape_interval: 1s
	  evaluation_interval: 1s
	rule_files: ["$MON/bmt-alerts.yml"]
	alerting:
	  alertmanagers:
	    - static_configs:
	        - targets: ["127.0.0.1:$aport"]
	scrape_configs:
	  - job_name: bmt
	    honor_labels: true
	    file_sd_configs:
	      - files: ["$LIVE/sd/*.json"]
	        refresh_interval: 1s
	EOF
    { $PY $TMP/hook.py $wport hooks.jsonl & } && pids="$pids $!" &&
    { timeout -k 5 240 prometheus-alertmanager --config.file=am.yml --storage.path=$LIVE/am \
        --web.listen-address=127.0.0.1:$aport --cluster.listen-address= >am.log 2>&1 & } && pids="$pids $!" &&
    { timeout -k 5 240 prometheus --config.file=prom.yml --storage.tsdb.path=$LIVE/tsdb \
        --web.listen-address=127.0.0.1:$pport >prom.log 2>&1 & } && pids="$pids $!" &&
    for i in $(seq 300); do
        curl -sf http://127.0.0.1:$pport/-/ready >/dev/null && curl -sf http://127.0.0.1:$aport/-/ready >/dev/null && break
        sleep 0.1
    done &&
    curl -sf http://127.0.0.1:$pport/-/ready >/dev/null && curl -sf http://127.0.0.1:$aport/-/ready >/dev/null &&
    date +%s >t0 &&
    { BMT_PEAK_TFLOPS=0.000001 timeout -k 5 180 $BMLAUNCH --metrics-port $mport --metrics-sd-file $LIVE/sd/job.json \
        -g 2 -n 2 -- $EC --steps 5000 --pace 100 --event-every 5 --val-every 5 --bound 1e-3 >job.out 2>job.err & } &&
    tpid=$! && pids="$pids $tpid" &&
    for i in $(seq 100); do test -s sd/job.json && break; sleep 0.1; done &&
    cp sd/job.json sd-running.json &&
    job=$($PY -c "import json; print(json.load(open(\"sd-running.json\"))[0][\"labels\"][\"job_id\"])") &&
    echo "$job" >job_id &&
    q() { curl -sf "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; } &&
    for i in $(seq 600); do
        # 3 scrapes since step 5 (bmt_val_loss exists from the first val_loss, at step 5): a
        # loaded machine starts ranks late, and every panel needs the job in its steps
        q "count_over_time(bmt_val_loss{job_id=\"$job\"}[1m]) >= 3" >c.json && grep -q "\"value\"" c.json && break
        sleep 0.1
    done &&
    { grep -q "\"value\"" c.json || { echo "Prometheus never had 3 samples of the job after its step 5"; cat prom.log; false; }; } &&
    q "up{job_id=\"$job\"}" >up.json && q "bmt_step{job_id=\"$job\"}" >step.json &&
    bml=$(pgrep -P $tpid) && rank=$(pgrep -P $bml | head -1) && test -n "$rank" &&
    kill -KILL $rank &&
    { rc=0; wait $tpid || rc=$?; echo $rc >job.rc; } &&
    ls -A sd >sd-after &&
    for i in $(seq 600); do grep -q BmtRankFailed hooks.jsonl 2>/dev/null && break; sleep 0.1; done &&
    date +%s >t1 &&
    $PY $TMP/dash_exprs.py "$MON/grafana-bmt.json" "$job" >exprs &&
    mkdir dash && n=0 &&
    while IFS= read -r e; do
        curl -sf "http://127.0.0.1:$pport/api/v1/query_range" --data-urlencode "query=$e" \
            --data-urlencode "start=$(cat t0)" --data-urlencode "end=$(cat t1)" --data-urlencode "step=1" >dash/$n.json &&
        n=$((n + 1))
    done <exprs &&
    q "ALERTS{job_id=\"$job\"}" >alerts.json &&
    cat job.rc && test -s hooks.jsonl
'

test_expect_success "live: the file_sd file named the job's port and job_id while it ran, and was removed when bmlaunch exited" '
    $PY - <<-EOF &&
	import json, re
	t = json.load(open("$LIVE/sd-running.json"))
	port = re.search(r"metrics on http://127.0.0.1:(\d+)/", open("$LIVE/job.err").read()).group(1)
	assert t == [{"targets": ["127.0.0.1:" + port], "labels": {"job_id": open("$LIVE/job_id").read().strip()}}], t
	EOF
    test ! -s $LIVE/sd-after &&
    test "$(cat $LIVE/job.rc)" -eq 137
'

test_expect_success "live: Prometheus scraped the target it found through file_sd: up is 1 with its job_id, series keep job_id (honor_labels)" '
    $PY - <<-EOF
	import json
	job = open("$LIVE/job_id").read().strip()
	up = json.load(open("$LIVE/up.json"))["data"]["result"]
	assert len(up) == 1 and up[0]["value"][1] == "1", up
	assert up[0]["metric"]["job_id"] == job and up[0]["metric"]["job"] == "bmt", up
	step = json.load(open("$LIVE/step.json"))["data"]["result"]
	assert len(step) == 1 and step[0]["metric"]["job_id"] == job, step
	assert "exported_job_id" not in step[0]["metric"], step
	print("ok", up[0]["metric"])
	EOF
'

test_expect_success "live: every expression of the Grafana dashboard returns data from the real job" '
    n=$(wc -l <$LIVE/exprs) && test "$n" -ge 20 &&
    $PY - "$n" <<-EOF
	import json, math, sys
	exprs = open("$LIVE/exprs").read().splitlines()
	bad = 0
	for i, e in enumerate(exprs):
	    r = json.load(open("$LIVE/dash/%d.json" % i))["data"]["result"]
	    vals = [float(v[1]) for s in r for v in s["values"]]
	    if not any(math.isfinite(v) for v in vals):
	        print("no data:", e); bad = 1
	    else:
	        print("%4d series, %5d points: %s" % (len(r), len(vals), e[:100]))
	sys.exit(bad)
	EOF
'

test_expect_success "live: BmtRankFailed reached the webhook through Alertmanager with the job_id and the killed rank" '
    $PY - <<-EOF
	import json
	job = open("$LIVE/job_id").read().strip()
	posts = [json.loads(l) for l in open("$LIVE/hooks.jsonl")]
	alerts = [a for p in posts for a in p["alerts"] if a["labels"]["alertname"] == "BmtRankFailed"]
	assert alerts, posts
	a = alerts[0]
	assert a["status"] == "firing" and a["labels"]["job_id"] == job, a
	assert a["labels"]["severity"] == "critical", a
	d = a["annotations"]["description"]
	assert "was killed by signal 9." in d and job in d, d
	others = {a["labels"]["alertname"] for p in posts for a in p["alerts"]} - {"BmtRankFailed"}
	assert not others, others  # stalled, throughput, loss: none for a healthy short job
	print(d)
	EOF
'

fi

test_done
