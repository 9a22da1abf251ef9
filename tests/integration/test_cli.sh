#!/bin/bash
# bmlaunch's command line through the binary: bad input exits 2 with a message
# that says what is wrong and starts nothing; --plan prints the layout.
. "$(dirname "$0")/lib.sh"

# A template with a typo, for the --template case below.
printf '#!/bin/bash\n#SBATCH --nodes={{NODES}}\n#SBATCH --time={{TIEM}}\n' >"$TMP/bad.sbatch"

# Each line: expected message fragment | arguments
while IFS='|' read -r want args; do
    [ -n "$want" ] || continue
    test_expect_success "bad input exits 2: $args" "
        mkdir pids; export BEHAVE_PIDDIR=\$PWD/pids
        { \$BMLAUNCH $args >out 2>err; rc=\$?; } &&
        test \$rc -eq 2 && grep -qF -- \"$want\" err &&
        grep -q \"Try 'bmlaunch --help'\" err && test ! -s out &&
        test -z \"\$(ls pids)\" && test ! -e newlogs
    "
done <<'CASES'
--groups must be at least 1|--groups 0 --log-dir newlogs -- $PROGS/behave env
--gpus-per-group needs a positive whole number, got 'four'|--gpus-per-group four -- $PROGS/behave env
--groups needs a positive whole number, got '-3'|--groups -3 -- $PROGS/behave env
--nodes: '12345678901' is too large|--nodes 12345678901 -- $PROGS/behave env
--gpus-per-node needs a value|--gpus-per-node
unknown option '--gpux'|--gpux 2 -- $PROGS/behave env
no program to run|--groups 2 --gpus-per-group 2
no program to run|--groups 2 --
program 'no-such-program-xyz' not found in PATH|-n 2 --log-dir newlogs -- no-such-program-xyz
cannot run './not-here'|./not-here
do not fill whole nodes of 8 GPUs; make the world a multiple of 8|--groups 3 --gpus-per-group 3 --gpus-per-node 8 --log-dir newlogs -- $PROGS/behave env
do not fit 2 nodes x 4 GPUs = 8 slots|--groups 4 --gpus-per-group 4 --gpus-per-node 4 --nodes 2 -- $PROGS/behave env
leave 8 of 16 GPUs idle|--groups 1 --gpus-per-group 8 --gpus-per-node 8 --nodes 2 -- $PROGS/behave env
--device must be cpu or cuda, got 'gpu'|--device gpu -- $PROGS/behave env
--backend nccl needs --device cuda|--backend nccl -- $PROGS/behave env
--timeout needs a positive number of seconds, got '0'|--timeout 0 -- $PROGS/behave env
--grace needs a non-negative number of seconds, got 'later'|--grace later -- $PROGS/behave env
--grace needs a non-negative number of seconds, got '0x10' (plain decimal|--grace 0x10 -- $PROGS/behave env
--timeout needs a positive number of seconds, got '0x10' (plain decimal|--timeout 0x10 -- $PROGS/behave env
--grace needs a non-negative number of seconds, got '1e3'|--grace 1e3 -- $PROGS/behave env
--timeout needs a positive number of seconds, got '+30'|--timeout +30 -- $PROGS/behave env
--grace needs a non-negative number of seconds, got 'infinity'|--grace infinity -- $PROGS/behave env
--metrics-linger needs a non-negative number of seconds, got '0x1p3'|--metrics-linger 0x1p3 -- $PROGS/behave env
--metrics-per-rank is for the metrics collector, but --metrics-port 0 turns metrics off|--metrics-port 0 --metrics-per-rank -- $PROGS/behave env
--metrics-linger is for the metrics collector, but --metrics-port 0 turns metrics off|--metrics-linger 30 --metrics-port 0 -- $PROGS/behave env
--metrics-stale is for the metrics collector, but --metrics-port 0 turns metrics off|--metrics-port 0 --metrics-stale 20 -- $PROGS/behave env
--metrics-bind is for the metrics collector, but --metrics-port 0 turns metrics off|--metrics-port 0 --metrics-bind 0.0.0.0 -- $PROGS/behave env
--json goes with --plan|--json -- $PROGS/behave env
--plan runs nothing|--plan -- $PROGS/behave env
local mode runs every rank on this machine|--device cuda -g 2 -n 2 --gpus-per-node 2 -- $PROGS/behave env
--model: '7x' is neither a parameter count|--plan --model 7x
--model goes with --plan|--model 7b -- $PROGS/behave env
go with --model|--plan --zero 2
go with --model|--plan --micro-batch 4 --gpu h100
--layers goes with a parameter count; d48 is a preset of 48 layers|--plan --model d48 --layers 4
--layers must be 1 to 4096, got 99999|--plan --model 70B --layers 99999
--gpu must be h200, h100, a100 or b200, got 'v100'|--plan --model d48 --gpu v100
--mfu needs a fraction of the peak in (0, 1] such as 0.45, got '45'|--plan --model d48 --mfu 45
--ckpt must be 0 or 1, got 'yes'|--plan --model d48 --ckpt yes
--seq-len must be at least 1, got '0'|--plan --model d48 --seq-len 0
--nic-busbw needs a positive number of GB/s, got 'x'|--plan --model d48 --nic-busbw=x
--call-us needs a non-negative number of microseconds, got '-1'|--plan --model d48 --call-us -1
--gpu-mem needs a positive number of GiB, got '0'|--plan --model d48 --gpu-mem 0
--sbatch needs --gpus-per-node|--sbatch -g 2 -n 2 -- $PROGS/behave env
3 ranks (1 x 3) leave 1 of 4 GPUs idle on 2 nodes; make the world 4 or ask for fewer nodes|--sbatch -n 3 -N 2 --device cuda -- $PROGS/behave env
--time, --partition, --account, --job-name, --output and --template go with --sbatch|--time 01:00:00 -- $PROGS/behave env
--sbatch prints a batch script; it goes with neither --plan nor --local|--sbatch --plan -g 2
no spaces, quotes|--sbatch --gpus-per-node 2 --job-name "x'y" -- $PROGS/behave env
--partition 'a b': no spaces, quotes|--sbatch --gpus-per-node 2 --partition "a b" -- $PROGS/behave env
--time '99:99:99x' is not a Slurm time limit|--sbatch --gpus-per-node 2 --time 99:99:99x -- $PROGS/behave env
shm backend, which needs every rank on one node, but this layout spans 2 nodes|--sbatch -g 2 -n 2 --gpus-per-node 2 --device cpu -- $PROGS/behave env
unknown field {{TIEM}}|--sbatch -g 2 --gpus-per-node 2 --template $TMP/bad.sbatch -- $PROGS/behave env
CASES

test_expect_success "seconds in plain decimal are taken (2.5, .5); --metrics-port 0 alone runs" '
    $BMLAUNCH --grace 2.5 --timeout .5 --metrics-port 0 -n 1 -- $PROGS/behave env >out 2>err &&
    grep -qx "0: BMT_TIMEOUT=0.5" out && ! grep -q "metrics on" err
'

test_expect_success "--help prints the usage and exits 0" '
    $BMLAUNCH --help >out && grep -q "^Usage: bmlaunch \[OPTIONS\] \[--\] PROGRAM" out &&
    grep -q -- "--gpus-per-group N" out
'

test_expect_success "--version" '
    $BMLAUNCH --version >out && grep -qE "^bmlaunch \(bmt\) [0-9]+\.[0-9]+\.[0-9]+$" out
'

test_expect_success "--plan 20x50 on 8-GPU nodes: summary, elided tables, verdict, alternatives" '
    $BMLAUNCH --groups 20 --gpus-per-group 50 --gpus-per-node 8 --plan >out &&
    grep -q "^bmt plan: 20 groups x 50 GPUs = 1000 ranks on 125 nodes x 8 GPUs" out &&
    grep -q "(14 more groups)" out && grep -q "(119 more nodes)" out &&
    grep -qE "^  19 +950-999 +118-124 +yes" out &&
    grep -q "rail alignment: NOT aligned" out && grep -q "20 of 20 groups straddle" out &&
    grep -q -- "--groups 20 --gpus-per-group 48: 960 ranks on 120 nodes (same groups)" out &&
    grep -q -- "--groups 20 --gpus-per-group 56: 1120 ranks on 140 nodes (same groups)" out &&
    grep -q -- "--groups 20 --gpus-per-group 64: 1280 ranks on 160 nodes" out &&
    grep -q -- "--groups 25 --gpus-per-group 40: 1000 ranks on 125 nodes (same world)" out &&
    test $(wc -l <out) -lt 60
'

test_expect_success "--plan of an aligned layout says so and offers nothing" '
    $BMLAUNCH --groups 2 --gpus-per-group 16 --gpus-per-node 8 --plan >out &&
    grep -q "rail alignment: aligned (16 GPUs per group is a multiple of 8" out &&
    ! grep -q "alternatives" out
'

test_expect_success "--plan --json: valid JSON with per-rank detail (checked by python)" '
    $BMLAUNCH --groups 20 --gpus-per-group 50 --gpus-per-node 8 --plan --json >plan.json &&
    /usr/bin/python3 - plan.json <<-PY
	import json, sys
	p = json.load(open(sys.argv[1]))
	assert (p["groups"], p["gpus_per_group"], p["gpus_per_node"], p["nodes"], p["world"]) == (20, 50, 8, 125, 1000)
	assert p["rail_aligned"] is False and p["straddling_groups"] == 20
	assert len(p["ranks"]) == 1000
	for r in p["ranks"]:
	    k = r["rank"]
	    assert (r["node"], r["local_rank"], r["group"], r["group_rank"]) == (k // 8, k % 8, k // 50, k % 50), r
	assert len(p["group_comms"]) == 20 and p["group_comms"][19]["first_rank"] == 950
	assert len(p["replica_comms"]) == 50
	assert p["replica_comms"][3]["ranks"] == [3 + 50 * g for g in range(20)]
	sizes = [a["gpus_per_group"] for a in p["alternatives"]]
	assert sizes[:3] == [48, 56, 64], sizes
	PY
'

test_expect_success "--plan --model: the cost model follows the plan (tests/integration/test_planner.sh has the rest)" '
    $BMLAUNCH --plan --model 70B -g 20 -n 50 --gpus-per-node 8 >out &&
    grep -q "^bmt plan: 20 groups x 50 GPUs = 1000 ranks on 125 nodes x 8 GPUs" out &&
    grep -q "^  cost model: 70,000,000,000 parameters: 71 layers" out &&
    grep -q "^  recommendation: --groups " out
'

# The program and arguments with a space and a quote, rendered into a script.
render_sbatch() {
    "$BMLAUNCH" --sbatch -g 2 -n 4 --gpus-per-node 4 --device cuda --time 00:30:00 \
        --partition gpu --job-name train -- "/opt/my prog" "it's"
}
cat >"$TMP/want-sbatch" <<'WANT'
-- '/opt/my prog' 'it'\''s' &
WANT

test_expect_success "--sbatch renders the template: layout, optional lines, quoting" '
    render_sbatch >job.sbatch &&
    grep -qx "#SBATCH --nodes=2" job.sbatch && grep -qx "#SBATCH --ntasks-per-node=4" job.sbatch &&
    grep -qx "#SBATCH --gpus-per-node=4" job.sbatch && grep -qx "#SBATCH --partition=gpu" job.sbatch &&
    grep -qx "#SBATCH --time=00:30:00" job.sbatch && grep -qx "#SBATCH --job-name=train" job.sbatch &&
    grep -qx "#SBATCH --signal=B:USR1@120" job.sbatch && ! grep -q "^#SBATCH --account" job.sbatch &&
    ! grep -q "{{" job.sbatch && bash -n job.sbatch &&
    grep -q -- "--groups 2 --gpus-per-group 4 --gpus-per-node 4 --device cuda" job.sbatch &&
    grep -qF -f "$TMP/want-sbatch" job.sbatch &&
    $BMLAUNCH --sbatch -g 2 -n 2 --gpus-per-node 4 -- hostname >cpu.sbatch &&
    ! grep -q "^#SBATCH --gpus-per-node" cpu.sbatch && grep -qx "#SBATCH --nodes=1" cpu.sbatch &&
    $BMLAUNCH --sbatch -n 6 -N 2 --device cuda -- hostname >n.sbatch &&
    grep -qx "#SBATCH --nodes=2" n.sbatch && grep -qx "#SBATCH --ntasks-per-node=3" n.sbatch
'

test_expect_success "--plan handles 100k ranks quickly" '
    with_timeout 20 $BMLAUNCH --groups 2000 --gpus-per-group 50 --gpus-per-node 8 --plan >out &&
    grep -q "= 100000 ranks on 12500 nodes" out
'

test_done
