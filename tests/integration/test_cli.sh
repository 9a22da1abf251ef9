#!/bin/bash
# bmlaunch's command line through the binary: bad input exits 2 with a message
# that says what is wrong and starts nothing; --plan prints the layout.
. "$(dirname "$0")/lib.sh"

# A template with a typo, for the --template case below.
printf '#!/bin/bash\n#SBATCH --nodes={{NODES}}\n#SBATCH --time={{TIEM}}\n' >"$TMP/bad.sbatch"
# Templates whose script would run nothing and exit 0: a NUL byte (the text
# ended there, the exec line lost), no {{PROGRAM}}, the exec line left out for
# an empty field on it.
printf '#!/bin/bash\n\0\nexec {{BMLAUNCH}} {{BMLAUNCH_ARGS}} -- {{PROGRAM}}\n' >"$TMP/nul.sbatch"
printf '#!/bin/bash\nexec {{BMLAUNCH}} {{BMLAUNCH_ARGS}}\n' >"$TMP/noprog.sbatch"
printf '#!/bin/bash\n#SBATCH --nodes={{NODES}}\nexec {{BMLAUNCH}} {{BMLAUNCH_ARGS}} -- {{PROGRAM}} # {{ACCOUNT}}\n' >"$TMP/drop.sbatch"

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
--mfu needs a fraction of the peak in [0.01, 1] such as 0.45, got '45'|--plan --model d48 --mfu 45
--mfu needs a fraction of the peak in [0.01, 1] such as 0.45, got '1e-320'|--plan --model d48 --mfu 1e-320
--mfu needs a fraction of the peak in [0.01, 1] such as 0.45, got '1e-320'|--plan --json --model d48 --mfu 1e-320
--nvlink-busbw: '1e-320' is too small (at least 0.001 GB/s)|--plan --model d48 --nvlink-busbw 1e-320
--nvlink-busbw: '1e-320' is too small (at least 0.001 GB/s)|--plan --json --model d48 --nvlink-busbw 1e-320
--nic-busbw: '1e-320' is too small (at least 0.001 GB/s)|--plan --model d48 --nic-busbw 1e-320
--fp8-speedup needs a speed-up factor in [0.1, 4] such as 1.3, got '1e-320'|--plan --model d48 --fp8 1 --fp8-speedup 1e-320
--gpu-mem 1 leaves nothing usable: 2 GiB of every GPU are held back|--plan --model d48 --gpu-mem 1
--gpu-mem 2 leaves nothing usable: 2 GiB of every GPU are held back|--plan --json --model d48 --gpu-mem 2
--keep-attention chooses what checkpointing's recomputation skips: it needs --ckpt 1|--plan --model d48 --ckpt 0 --keep-attention 0
--keep-attention chooses what checkpointing's recomputation skips: it needs --ckpt 1|--plan --model d48 --ckpt 0 --keep-attention 1
--seq-len 70000: d12 learns its positions, and the trainer's --max-seq makes at most 65536 of them|--plan --model d12 --seq-len 70000
--ckpt must be 0 or 1, got 'yes'|--plan --model d48 --ckpt yes
--seq-len must be at least 1, got '0'|--plan --model d48 --seq-len 0
--nic-busbw needs a positive number of GB/s, got 'x'|--plan --model d48 --nic-busbw=x
--call-us needs a non-negative number of microseconds, got '-1'|--plan --model d48 --call-us -1
--gpu-mem needs a positive number of GiB, got '0'|--plan --model d48 --gpu-mem 0
--sbatch needs --gpus-per-node|--sbatch -g 2 -n 2 -- $PROGS/behave env
3 ranks (1 x 3) leave 1 of 4 GPUs idle on 2 nodes; make the world 4 or ask for fewer nodes|--sbatch -n 3 -N 2 --device cuda -- $PROGS/behave env
--time, --partition, --account, --job-name, --output, --signal-lead and --template go with --sbatch|--time 01:00:00 -- $PROGS/behave env
--signal-lead and --template go with --sbatch|--signal-lead 60 --log-dir newlogs -- $PROGS/behave env
--sbatch prints a batch script; it goes with neither --plan nor --local|--sbatch --plan -g 2
--max-restarts is for a run, and --plan runs nothing (it prints the layout and, with --model, the cost model's ranking): drop --max-restarts or drop --plan|--plan -g 2 --max-restarts 1
--device is for a run, and --plan runs nothing|--device cuda -g 2 -n 4 --plan
--metrics-port is for a run, and --plan runs nothing|--plan --model d48 --metrics-port 0
--local is for a run, and --plan runs nothing|--local --grace 3 --plan
no spaces, quotes|--sbatch --gpus-per-node 2 --job-name "x'y" -- $PROGS/behave env
--partition 'a b': no spaces, quotes|--sbatch --gpus-per-node 2 --partition "a b" -- $PROGS/behave env
--time '99:99:99x' is not a Slurm time limit|--sbatch --gpus-per-node 2 --time 99:99:99x -- $PROGS/behave env
shm backend, which needs every rank on one node, but this layout spans 2 nodes|--sbatch -g 2 -n 2 --gpus-per-node 2 --device cpu -- $PROGS/behave env
--signal-lead 100000: Slurm takes at most 65535 seconds|--sbatch --gpus-per-node 2 --time UNLIMITED --signal-lead 100000 -- $PROGS/behave env
--signal-lead 300 is not less than the time limit 5 (300 s)|--sbatch --gpus-per-node 2 --time 5 --signal-lead 300 -- $PROGS/behave env
--signal-lead 30 is not less than the time limit 0:30 (30 s)|--sbatch --gpus-per-node 2 --time 0:30 --signal-lead 30 -- $PROGS/behave env
--signal-lead 3600 is not less than the time limit 01:00:00 (3600 s, the default --time)|--sbatch --gpus-per-node 2 --signal-lead 3600 -- $PROGS/behave env
--signal-lead 50 and the time limit 1 (60 s): Slurm sends the signal up to 60 s early, so USR1 could come at the job's start; give a longer --time|--sbatch --gpus-per-node 2 --time 1 --signal-lead 50 -- $PROGS/behave env
--signal-lead 120 and the time limit 3 (180 s): Slurm sends the signal up to 60 s early, so USR1 could come at the job's start; give a --signal-lead of at most 119 or a longer --time|--sbatch --gpus-per-node 2 --time 3 -- $PROGS/behave env
--signal-lead 3541 and the time limit 01:00:00 (3600 s, the default --time): Slurm sends|--sbatch --gpus-per-node 2 --signal-lead 3541 -- $PROGS/behave env
--submit goes with --sbatch|--submit --gpus-per-node 2 -- $PROGS/behave env
unknown field {{TIEM}}|--sbatch -g 2 --gpus-per-node 2 --template $TMP/bad.sbatch -- $PROGS/behave env
--output 'o#%j.out': no spaces, quotes|--sbatch --gpus-per-node 2 --output "o#%j.out" -- $PROGS/behave env
--job-name 'a#b': no spaces, quotes|--sbatch --gpus-per-node 2 --job-name "a#b" -- $PROGS/behave env
--partition 'gpu#2': no spaces, quotes|--sbatch --gpus-per-node 2 --partition "gpu#2" -- $PROGS/behave env
backslashes or '#' (sbatch would cut or refuse the #SBATCH line there)|--sbatch --gpus-per-node 2 --account $'a\vb' -- $PROGS/behave env
nul.sbatch holds a NUL byte at offset 12: not a text file|--sbatch -g 2 --gpus-per-node 2 --template $TMP/nul.sbatch -- $PROGS/behave env
noprog.sbatch: the template has no {{PROGRAM}}: the script would not run the program given|--sbatch -g 2 --gpus-per-node 2 --template $TMP/noprog.sbatch -- $PROGS/behave env
drop.sbatch: template line 3: {{ACCOUNT}} is empty here, which leaves the line out, and with it {{BMLAUNCH}}|--sbatch -g 2 --gpus-per-node 2 --template $TMP/drop.sbatch -- $PROGS/behave env
--metrics-cert /nonexistent/cert.pem: No such file or directory|-n 1 --log-dir newlogs --metrics-cert /nonexistent/cert.pem --metrics-key /nonexistent/key.pem -- $PROGS/behave env
cannot serve metrics on 203.0.113.5 port|-n 1 --log-dir newlogs/run1 --metrics-bind 203.0.113.5 -- $PROGS/behave env
CASES

# Bad input found once --log-dir was made (the metrics options are checked as
# the collector starts), or a --log-dir of which only the parents could be
# made, left the directories behind: what bmlaunch made goes, nothing else.
test_expect_success "bad input after --log-dir was made: the directories it made go, one that was there stays" '
    mkdir -p there/old && touch there/old/rank-0.log &&
    { $BMLAUNCH -n 1 --log-dir there/new/run1 --metrics-bind 203.0.113.5 -- $PROGS/behave env >out 2>err; rc=$?; } &&
    test $rc -eq 2 && test ! -e there/new && test -f there/old/rank-0.log &&
    { $BMLAUNCH -n 1 --log-dir there/old --metrics-bind 203.0.113.5 -- $PROGS/behave env >out 2>err; rc=$?; } &&
    test $rc -eq 2 && test -f there/old/rank-0.log &&
    long=$(printf "x%.0s" $(seq 300)) &&
    { $BMLAUNCH -n 1 --log-dir there/new/run1/$long -- $PROGS/behave env >out 2>err; rc=$?; } &&
    test $rc -eq 2 && grep -q "^bmlaunch: cannot create --log-dir there/new/run1/xxx.*: File name too long" err &&
    test ! -e there/new
'

test_expect_success "seconds in plain decimal are taken (2.5, .5); --metrics-port 0 alone runs" '
    $BMLAUNCH --grace 2.5 --timeout .5 --metrics-port 0 -n 1 -- $PROGS/behave env >out 2>err &&
    grep -qx "0: BMT_TIMEOUT=0.5" out && ! grep -q "metrics on" err &&
    $BMLAUNCH --timeout 1234567 --metrics-port 0 -n 1 -- $PROGS/behave env >out 2>err &&
    grep -qx "0: BMT_TIMEOUT=1234567" out
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
-- '/opt/my prog' 'it'\''s'
WANT

test_expect_success "--sbatch renders the template: layout, optional lines, quoting" '
    render_sbatch >job.sbatch &&
    grep -qx "#SBATCH --nodes=2" job.sbatch && grep -qx "#SBATCH --ntasks-per-node=4" job.sbatch &&
    grep -qx "#SBATCH --gpus-per-node=4" job.sbatch && grep -qx "#SBATCH --partition=gpu" job.sbatch &&
    grep -qx "#SBATCH --time=00:30:00" job.sbatch && grep -qx "#SBATCH --job-name=train" job.sbatch &&
    grep -qx "#SBATCH --signal=B:USR1@120" job.sbatch && ! grep -q "^#SBATCH --account" job.sbatch &&
    ! grep -q "{{" job.sbatch && bash -n job.sbatch &&
    grep -q -- "--groups 2 --gpus-per-group 4 --gpus-per-node 4 --device cuda" job.sbatch &&
    tail -n 1 job.sbatch >last && grep -q "^exec '"'"'$BMLAUNCH'"'"' --groups 2 " last &&
    grep -qF -f "$TMP/want-sbatch" last && ! grep -q "&" last &&
    $BMLAUNCH --sbatch -g 2 -n 2 --gpus-per-node 4 -- hostname >cpu.sbatch &&
    ! grep -q "^#SBATCH --gpus-per-node" cpu.sbatch && grep -qx "#SBATCH --nodes=1" cpu.sbatch &&
    $BMLAUNCH --sbatch -n 6 -N 2 --device cuda -- hostname >n.sbatch &&
    grep -qx "#SBATCH --nodes=2" n.sbatch && grep -qx "#SBATCH --ntasks-per-node=3" n.sbatch
'

# Every #SBATCH line comes before the script's first command: sbatch stops
# reading directives at the first line that is not a comment.
sbatch_directives_first() { # file
    awk '/^#SBATCH/ { if (cmd) { print "after a command: " $0; bad = 1 } next }
         /^#/ || /^[[:space:]]*$/ { next }
         { cmd = 1 } END { exit bad }' "$1"
}

test_expect_success "--sbatch: the default job name keeps [A-Za-z0-9._-] of the program's base name" '
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 --time 00:10:00 -- "$(printf "x\ntouch PWNED")" >nl.sbatch &&
    bash -n nl.sbatch && sbatch_directives_first nl.sbatch &&
    grep -qx "#SBATCH --job-name=x_touch_PWNED" nl.sbatch &&
    grep -qx "#SBATCH --time=00:10:00" nl.sbatch && grep -qx "#SBATCH --ntasks=2" nl.sbatch &&
    grep -qx "#SBATCH --signal=B:USR1@120" nl.sbatch &&
    ! grep -qx "touch PWNED" nl.sbatch &&
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 -- "./my prog" >sp.sbatch &&
    bash -n sp.sbatch && sbatch_directives_first sp.sbatch &&
    grep -qx "#SBATCH --job-name=my_prog" sp.sbatch &&
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 -- ./foo/ >empty.sbatch &&
    bash -n empty.sbatch && sbatch_directives_first empty.sbatch &&
    grep -qx "#SBATCH --job-name=bmt" empty.sbatch &&
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 -- "/opt/a\$b/train-v1.2_x" >ok.sbatch &&
    grep -qx "#SBATCH --job-name=train-v1.2_x" ok.sbatch
'

test_expect_success "--sbatch: durations are plain decimals the job's bmlaunch takes back" '
    $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 --timeout 1000000 --grace 0.00001 \
        --metrics-linger 0.000001 --metrics-stale 9999999.5 -- $PROGS/behave env >d.sbatch &&
    grep -q -- " --timeout 1000000 --grace 0.00001 " d.sbatch &&
    grep -q -- " --metrics-linger 0.000001 --metrics-stale 9999999.5 " d.sbatch &&
    ! grep -q "e[+-][0-9]" d.sbatch &&
    # the bmlaunch line itself, run here: it parses and the ranks get the timeout
    sed -n "s/^exec //p" d.sbatch >line && test $(wc -l <line) = 1 &&
    with_timeout 60 bash line >out 2>err &&
    awk -F= "/^0: BMT_TIMEOUT=/ { found = 1; t = \$2 } END { exit !(found && t == 1000000) }" out
'

# The rendered script, run by bash, runs exactly the program and arguments given
# and the --log-dir given, whatever they hold.
test_expect_success "--sbatch: the script runs the very argv and --log-dir given (quotes, \$, newlines, globs, empty, long)" '
    printf "%s\n" "import sys" "open(\"argv.bin\", \"wb\").write(b\"\".join(a.encode(\"utf-8\", \"surrogateescape\") + b\"\\0\" for a in sys.argv[1:]))" >argv.py &&
    set -- "a b" "it'"'"'s" "d\"q" "\$HOME" "\`id\`" "\$(id)" "b\\s" "$(printf "n\nl\tt")" "héllo→" -x "*" "?" "[a" "a;b" "" "%j" "{{PROGRAM}}" "$(head -c 70000 /dev/zero | tr "\\0" x)" &&
    printf "%s\0" "$@" >want.bin &&
    ld="$(printf -- "-l g'"'"'\"\$x\`\\\n*?[é;")" &&
    $BMLAUNCH --sbatch -n 1 --gpus-per-node 1 --metrics-port 0 --log-dir "$ld" -- /usr/bin/python3 argv.py "$@" >a.sbatch &&
    (unset SLURM_JOB_ID; with_timeout 60 bash a.sbatch >out 2>err) &&
    cmp want.bin argv.bin && test -f "./$ld/rank-0.log"
'

# The batch script run here by bash (outside an allocation its bmlaunch runs the
# ranks locally): its exit status must be bmlaunch's, also while signals arrive.
# A script that ran bmlaunch in the background and passed USR1 on with a trap
# could return 128+10 (an interrupted wait) for a job whose rank exited 3.
test_expect_success "--sbatch: the batch script execs bmlaunch: USR1 reaches the rank, the exit status is that of bmlaunch" '
    $BMLAUNCH --sbatch --metrics-port 0 -n 1 --gpus-per-node 1 -- sh -c \
        "trap \"echo USR1 >>usr1\" USR1; touch ready; while [ ! -e go ]; do sleep 0.05; done; exit 3" >job.sbatch &&
    grep -q "^exec " job.sbatch &&
    { (unset SLURM_JOB_ID; exec bash job.sbatch >out 2>err) & } && script=$! &&
    for i in $(seq 200); do test -e ready && break; sleep 0.05; done && test -e ready &&
    { (while kill -USR1 $script 2>/dev/null; do :; done) & } && flood=$! &&
    sleep 0.3 && touch go &&
    { wait $script; rc=$?; } && { kill $flood 2>/dev/null; wait $flood || :; } &&
    echo "exit $rc, $(wc -l <usr1) USR1 caught" && tail -3 err &&
    test $rc -eq 3 && test -s usr1 &&
    grep -q "^bmlaunch: job failed: rank 0 (pid [0-9]* on .*) exited with code 3\$" err
'

test_expect_success "--plan and --sbatch: a write error on stdout exits 1 with a message" '
    { $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 -- p >/dev/full 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the batch script to stdout: No space left on device" err &&
    { $BMLAUNCH --plan -g 2 -n 2 >/dev/full 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the plan: No space left on device" err &&
    { $BMLAUNCH --plan --json -g 2 -n 2 >/dev/full 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the plan: No space left on device" err &&
    { $BMLAUNCH --plan --json --model d12 -g 2 -n 2 >/dev/full 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the plan" err &&
    { (trap "" XFSZ; ulimit -f 1; $BMLAUNCH --plan --json -g 20 -n 50 --gpus-per-node 8 >big.json) 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the plan: File too large" err
'

# As the docs say, with the signals' default actions too: SIGXFSZ and SIGPIPE
# once killed bmlaunch without a word (exit 153, 141) where it had to say it.
test_expect_success "--plan and --sbatch: a file-size limit or a closed pipe exits 1 with a message, not a signal" '
    { (trap - XFSZ; ulimit -f 1; exec $BMLAUNCH --plan --json -g 20 -n 50 --gpus-per-node 8 >big.json) 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the plan: File too large" err &&
    big=$(head -c 100000 /dev/zero | tr "\\0" a) &&
    { (trap - XFSZ; ulimit -f 1; exec $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 -- p "$big" >job.sbatch) 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the batch script to stdout: File too large" err &&
    # more than a pipe holds, so the write meets the closed pipe whatever the timing
    { (trap - PIPE; $BMLAUNCH --plan --json -g 20 -n 50 --gpus-per-node 8 2>err | head -c 1 >/dev/null; exit ${PIPESTATUS[0]}); rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the plan: Broken pipe" err &&
    { (trap - PIPE; $BMLAUNCH --sbatch -n 2 --gpus-per-node 2 -- p "$big" 2>err | head -c 1 >/dev/null; exit ${PIPESTATUS[0]}); rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: cannot write the batch script to stdout: Broken pipe" err
'

# A stand-in for sbatch: what it reads, and its exit status.
fake_sbatch() { # dir status read(1|0)
    mkdir -p "$1" && {
        echo "#!/bin/sh"
        [ "$3" = 1 ] && echo "cat >\"$PWD/$1/script\"; echo \"Submitted batch job 42\""
        echo "exit $2"
    } >"$1/sbatch" && chmod +x "$1/sbatch"
}

test_expect_success "--submit: sbatch's exit status; an sbatch that reads nothing is said, not a SIGPIPE" '
    fake_sbatch ok 0 1 && PATH=$PWD/ok:$PATH $BMLAUNCH --sbatch --submit -n 2 --gpus-per-node 2 -- p >out &&
    grep -qx "Submitted batch job 42" out && grep -qx "#SBATCH --nodes=1" ok/script && bash -n ok/script &&
    fake_sbatch five 5 1 && { PATH=$PWD/five:$PATH $BMLAUNCH --sbatch --submit -n 2 --gpus-per-node 2 -- p >out 2>err; rc=$?; } &&
    test $rc -eq 5 && test ! -s err &&
    # more than a pipe holds, so the write meets the closed pipe whatever the timing
    big=$(head -c 100000 /dev/zero | tr "\\0" a) &&
    fake_sbatch deaf 0 0 && { PATH=$PWD/deaf:$PATH $BMLAUNCH --sbatch --submit -n 2 --gpus-per-node 2 -- p "$big" >out 2>err; rc=$?; } &&
    test $rc -eq 1 && grep -q "^bmlaunch: sbatch did not read the whole batch script (Broken pipe) and exited with status 0" err &&
    fake_sbatch deaf3 3 0 && { PATH=$PWD/deaf3:$PATH $BMLAUNCH --sbatch --submit -n 2 --gpus-per-node 2 -- p "$big" >out 2>err; rc=$?; } &&
    test $rc -eq 3 && grep -q "^bmlaunch: sbatch did not read the whole batch script (Broken pipe) and exited with status 3" err
'

test_expect_success "--plan handles 100k ranks quickly" '
    with_timeout 20 $BMLAUNCH --groups 2000 --gpus-per-group 50 --gpus-per-node 8 --plan >out &&
    grep -q "= 100000 ranks on 12500 nodes" out
'

# bmlaunch --rank-exec (what each srun task runs) refuses a layout it cannot
# make or a rank outside it, exit 2, naming which (the second message once
# read the world of a layout that was never made).
test_expect_success "--rank-exec: a layout that cannot be made, or a rank outside it, exits 2 saying which" '
    { SLURM_PROCID=0 BMT_GROUPS=1 BMT_GPUS_PER_GROUP=3 BMT_GPUS_PER_NODE=2 $BMLAUNCH --rank-exec -- true 2>err; rc=$?; } &&
    test $rc -eq 2 && grep -q "^bmlaunch --rank-exec: rank 0: layout: 3 ranks (1 x 3) do not fill whole nodes of 2 GPUs" err &&
    { SLURM_PROCID=5 BMT_GROUPS=1 BMT_GPUS_PER_GROUP=2 BMT_GPUS_PER_NODE=2 $BMLAUNCH --rank-exec -- true 2>err; rc=$?; } &&
    test $rc -eq 2 && grep -qx "bmlaunch --rank-exec: rank 5: layout: rank outside the world of 2" err
'

test_done
