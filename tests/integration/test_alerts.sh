#!/bin/bash
# What an SRE gets in monitoring/: the alert rules (promtool check rules, and
# promtool test rules on input series: each alert fires when it should and not
# when it should not), the Grafana dashboard (every PromQL expression checked by
# promtool, and evaluated against a real Prometheus that scraped a real job),
# bmlaunch's --metrics-sd-file (a real Prometheus finds the job through
# file_sd_configs), and a rank-failed alert fired end to end: a real job whose
# rank dies, a real Prometheus with the rules, a real Alertmanager, a webhook
# receiver written here. Everything runs on free ports under timeouts and is
# killed at the end; without promtool, prometheus or alertmanager the tests that
# need them are skipped with a "# skipped:" line.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
MON=$SRC/monitoring
EC=$PROGS/engine_check
export BMT_TIMEOUT=60

free_port() {
    $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

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

test_done
