#!/bin/bash
# The documents against the code, so that they cannot drift apart unnoticed:
# docs/env.md lists every BMT_ variable of `bmlaunch --help-env` with the same
# default and meaning; the man page documents every option of `bmlaunch --help`
# (and no other) and renders without warnings; the option tables of
# docs/gpt2.md, docs/llama.md and docs/generate.md hold the options of their
# programs' --help, and no other, with the same numeric defaults; the plan
# quoted in the user guide is what --plan prints; the example program of
# docs/runtime.md builds and prints what the page shows; README.md and
# docs/*.md name only paths that exist; the
# packages docs/building.md lists are scripts/deps.sh's; the demo command that
# README.md and docs/building.md quote is the one `make demo` runs (and `make
# demo-llama`'s in docs/building.md and docs/llama.md); README's GPU
# figures are in the newest 2-GPU results file, which README names.
. "$(dirname "$0")/lib.sh"

# Examples link the build tree's libbmt.so; an ASAN=1 build needs them built with
# the sanitizers too (the ASan runtime must come first).
SANFLAGS=$(grep -qo -- "-fsanitize=[a-z,]*" "$BUILDDIR/.flags" 2>/dev/null &&
    grep -o -- "-fsanitize=[a-z,]*" "$BUILDDIR/.flags" | head -1)
export SANFLAGS

test_expect_success "docs/env.md lists every BMT_ variable of --help-env with its default and meaning" '
    $BMLAUNCH --help-env >help &&
    sed -nE "s/^  (BMT_[A-Z0-9_]+) +([^ ]+) +(.*[^ ]) *\$/\1\t\2\t\3/p" help | sort >knobs &&
    test "$(wc -l <knobs)" -eq "$(grep -c "^  BMT_" help)" && test "$(wc -l <knobs)" -ge 10 &&
    awk -F"|" "/^\\| *\`BMT_/ {
        for (i = 2; i <= 4; i++) { gsub(/\`/, \"\", \$i); gsub(/^ +| +\$/, \"\", \$i) }
        print \$2 \"\t\" \$3 \"\t\" \$4
    }" "$SRC/docs/env.md" | sort >rows &&
    bad="" &&
    while IFS="	" read -r name deflt doc; do
        row=$(grep "^$name	" rows || true)
        if [ -z "$row" ]; then
            echo "$name is missing from docs/env.md"; bad=1
        elif [ "$(echo "$row" | cut -f2)" != "$deflt" ]; then
            echo "$name: docs/env.md says default $(echo "$row" | cut -f2), --help-env says $deflt"; bad=1
        elif [ "$(echo "$row" | cut -f3)" != "$doc" ]; then
            echo "$name: docs/env.md says \"$(echo "$row" | cut -f3)\", --help-env says \"$doc\""; bad=1
        fi
    done <knobs &&
    for name in $(cut -f1 rows); do
        grep -q "^$name	" knobs || { echo "docs/env.md lists $name, which --help-env does not print"; bad=1; }
    done &&
    test -z "$bad"
'

# The man page as plain text: font changes dropped, \- as -, \e as \.
man_text() {
    sed -e 's/\\f[BIRP]//g' -e 's/\\f([A-Z][A-Z]//g' -e 's/\\-/-/g' -e 's/\\e/\\/g' "$SRC/docs/bmlaunch.1"
}
export -f man_text

test_expect_success "every long option of --help is in the man page's OPTIONS, and no other" '
    $BMLAUNCH --help >help &&
    grep -oE -- "--[a-z][a-z-]*" help | sort -u >opts &&
    test "$(wc -l <opts)" -ge 15 &&
    man_text >page.txt &&
    sed -n "/^\.SH OPTIONS/,/^\.SH /p" page.txt >options.txt && test -s options.txt &&
    bad="" &&
    for o in $(cat opts); do
        grep -qE -- "(^|[^a-z-])$o([^a-z-]|\$)" options.txt || { echo "$o is not in OPTIONS of docs/bmlaunch.1"; bad=1; }
    done &&
    for o in $(grep -oE -- "--[a-z][a-z-]*" options.txt | sort -u); do
        grep -qx -- "$o" opts || { echo "docs/bmlaunch.1 documents $o, which --help does not print"; bad=1; }
    done &&
    test -z "$bad"
'

test_expect_success "every long option of --help is in docs/user-guide.md or docs/bmlaunch.1" '
    $BMLAUNCH --help | grep -oE -- "--[a-z][a-z-]*" | sort -u >opts &&
    { man_text; cat "$SRC/docs/user-guide.md"; } >both.txt &&
    bad="" &&
    for o in $(cat opts); do
        grep -qE -- "(^|[^a-z-])$o([^a-z-]|\$)" both.txt || { echo "$o is documented nowhere"; bad=1; }
    done &&
    test -z "$bad"
'

if command -v man >/dev/null 2>&1; then
    test_expect_success "docs/bmlaunch.1 renders without warnings (man --warnings)" '
        MANWIDTH=80 man --warnings -l "$SRC/docs/bmlaunch.1" >page 2>warnings &&
        { test ! -s warnings || { cat warnings; false; }; } &&
        grep -q "^BMLAUNCH(1)" page && grep -q "^EXIT STATUS" page && grep -q "^OPTIONS" page
    '
else
    echo "# skipped: man is not installed, docs/bmlaunch.1 was not rendered (apt-get install man-db groff-base)"
fi

test_expect_success "gpt2, llama and generate: every option of --help is in the page's table and the reverse, with the same numeric defaults" '
    for p in gpt2 llama generate; do $BUILDDIR/bin/$p --help >$p.help || exit 1; done &&
    /usr/bin/python3 - "$SRC" <<-PY
	import re, sys
	src = sys.argv[1]
	def opts(text):
	    return set(re.findall(r"--[a-z][a-z0-9-]*", text))
	def table(page, start, end):
	    # the options of the first column of the table between two headings, and
	    # the default column of the rows that name one option
	    t = open(src + "/docs/" + page).read()
	    t = t[t.index(start):]
	    t = t[:t.index(end)]
	    names, defaults = set(), {}
	    for line in t.splitlines():
	        if not line.startswith("| \`"):
	            continue
	        cells = line.split(" | ")
	        o = opts(cells[0])
	        names |= o
	        if len(o) == 1 and len(cells) > 2:
	            defaults[o.pop()] = cells[1]
	    return names, defaults
	def help_defaults(text):
	    # each option and the N of its "(default N" in --help
	    d, cur = {}, None
	    for line in text.splitlines():
	        m = re.match(r"\s+(?:-\w, )?(--[a-z0-9-]+)", line)
	        if m:
	            cur = m.group(1)
	        m = re.search(r"default:? ([0-9][0-9.e-]*)", line)
	        if m and cur and cur not in d:
	            d[cur] = m.group(1)
	    return d
	gpt2, gd = table("gpt2.md", "## Options", "## Output")
	llama, ld = table("llama.md", "The model comes from a preset", "### HF")
	gen, nd = table("generate.md", "## Options", "## Reading the model")
	gpt2_page = open(src + "/docs/gpt2.md").read()
	bad = []
	# gpt2: the table, and the size and data options the page describes in its text
	h = opts(open("gpt2.help").read())
	bad += ["gpt2 --help prints %s, which docs/gpt2.md does not describe" % o
	        for o in sorted(h) if o not in gpt2 and "\`" + o not in gpt2_page]
	bad += ["the table of docs/gpt2.md has %s, which gpt2 --help does not print" % o
	        for o in sorted(gpt2 - h)]
	# llama: its own table, and the trainer options in the table of gpt2.md
	h = opts(open("llama.help").read())
	bad += ["llama --help prints %s, in neither the table of docs/llama.md nor docs/gpt2.md" % o
	        for o in sorted(h) if o not in llama | gpt2 and "\`" + o not in gpt2_page]
	bad += ["the table of docs/llama.md has %s, which llama --help does not print" % o
	        for o in sorted(llama - h)]
	# generate: the table (its options: what begins a line of --help, which also
	# names the trainers --save-dir); --no-cache and --dump-logits are for the
	# tests, in the text
	h = set(re.findall(r"^ +(?:-\w, )?(--[a-z][a-z0-9-]*)", open("generate.help").read(), re.M))
	bad += ["generate --help prints %s, which the table of docs/generate.md does not have" % o
	        for o in sorted(h - gen)]
	bad += ["the table of docs/generate.md has %s, which generate --help does not print" % o
	        for o in sorted(gen - h)]
	for prog, page, doc in (("gpt2", "gpt2.md", gd), ("generate", "generate.md", nd)):
	    for o, v in sorted(help_defaults(open(prog + ".help").read()).items()):
	        cell = doc.get(o, "")
	        m = re.match(r"[0-9][0-9.e-]*", cell)
	        if o in doc and (m is None or float(m.group(0)) != float(v)):
	            bad.append("%s --help says %s defaults to %s, docs/%s: %r" % (prog, o, v, page, cell))
	print("\n".join(bad))
	sys.exit(1 if bad else 0)
	PY
'

test_expect_success "the 20x50 plan in docs/user-guide.md is what --plan prints" '
    quoted_after "$SRC/docs/user-guide.md" "build/bin/bmlaunch --groups 20 --gpus-per-group 50 --gpus-per-node 8 --plan" >quoted &&
    test -s quoted &&
    $BMLAUNCH --groups 20 --gpus-per-group 50 --gpus-per-node 8 --plan >actual &&
    diff -u quoted actual
'

test_expect_success "the example of docs/runtime.md builds warning-free and prints what the page shows" '
    awk "/^## A minimal program/ { sec = 1 } sec && /^\`\`\`c\$/ { on = 1; next } on && /^\`\`\`/ { exit } on" \
        "$SRC/docs/runtime.md" >example.c &&
    grep -q "bmt_init" example.c &&
    cc -std=c11 $SANFLAGS -Wall -Wextra -Werror -I"$SRC/include" example.c -o example \
        -L"$BUILDDIR/lib" -Wl,-rpath,"$BUILDDIR/lib" -lbmt &&
    with_timeout 60 $BMLAUNCH -g 2 -n 2 -- ./example >out &&
    # the output block: between the third and fourth bare fence of the section
    awk "/^## A minimal program/ { sec = 1 } sec && /^\`\`\`\$/ { n++; next } n == 3 { print } n == 4 { exit }" \
        "$SRC/docs/runtime.md" | sort >documented &&
    sort out >actual && test -s documented && diff -u documented actual
'

test_expect_success "the worked example of docs/engine.md builds, trains and prints what the page shows" '
    awk "/^## A worked example/ { sec = 1 } sec && /^\`\`\`c\$/ { on = 1; next } on && /^\`\`\`/ { exit } on" \
        "$SRC/docs/engine.md" >example.c &&
    grep -q "bmt_blocklist_forward" example.c &&
    cc -std=c11 $SANFLAGS -Wall -Wextra -Wno-unused-parameter -Werror -I"$SRC/include" example.c -o example \
        -L"$BUILDDIR/lib" -Wl,-rpath,"$BUILDDIR/lib" -lbmt &&
    with_timeout 60 $BMLAUNCH --groups 2 --gpus-per-group 2 -- ./example >out &&
    awk "/^## A worked example/ { sec = 1 } sec && /^\`\`\`\$/ { n++; next } n == 3 { print } n == 4 { exit }" \
        "$SRC/docs/engine.md" | sort >documented &&
    sort out >actual && test -s documented && diff -u documented actual
'

test_expect_success "every docs/... and bench/... path named in README.md exists" '
    grep -oE "(^|[^A-Za-z0-9_./-])(docs|bench)/[A-Za-z0-9_./-]*" "$SRC/README.md" |
        sed -E "s/^[^db]//; s/[.]+\$//" | sort -u >paths &&
    test "$(wc -l <paths)" -ge 2 &&
    bad="" &&
    for p in $(cat paths); do
        test -e "$SRC/$p" || { echo "README.md names $p, which does not exist"; bad=1; }
    done &&
    test -z "$bad"
'

test_expect_success "relative links in docs/*.md point at files and headings that exist" '
    /usr/bin/python3 - "$SRC" <<-PY
	import os, re, sys
	src = sys.argv[1]
	def slug(title):
	    s = re.sub(r"[^a-z0-9 _-]", "", title.strip().lower())
	    return s.replace(" ", "-")
	def anchors(path):
	    out, fence = set(), False
	    for line in open(path, encoding="utf-8"):
	        if line.startswith("\`\`\`"):
	            fence = not fence
	        elif not fence and line.startswith("#"):
	            out.add(slug(line.lstrip("#")))
	    return out
	bad = 0
	docs = os.path.join(src, "docs")
	for name in sorted(os.listdir(docs)):
	    if not name.endswith(".md"):
	        continue
	    path = os.path.join(docs, name)
	    text = re.sub(r"\`\`\`.*?\`\`\`", "", open(path, encoding="utf-8").read(), flags=re.S)
	    for target in re.findall(r"\]\(([^)\s]+)\)", text):
	        if re.match(r"[a-z]+:", target):
	            continue
	        file, _, frag = target.partition("#")
	        dest = os.path.normpath(os.path.join(docs, file)) if file else path
	        if not os.path.exists(dest):
	            print(f"{name}: link {target}: no such file"); bad = 1
	        elif frag and dest.endswith(".md") and frag not in anchors(dest):
	            print(f"{name}: link {target}: no such heading"); bad = 1
	sys.exit(bad)
	PY
'

test_expect_success "docs/building.md lists exactly the packages scripts/deps.sh installs, and their number" '
    sed -n "/^PACKAGES=\"/,/^\"/p" "$SRC/scripts/deps.sh" | grep -v "\"" | sort -u >want &&
    test "$(wc -l <want)" -ge 20 &&
    sed -n "/^## Dependencies/,/^## /p" "$SRC/docs/building.md" >deps.md &&
    grep -oE "\`[a-z0-9][a-z0-9.+-]*\`" deps.md | tr -d "\`" | sort -u >got &&
    diff -u want got &&
    grep -q "installs what is missing of these $(wc -l <want) Debian" deps.md
'

test_expect_success "the demo command in README.md and docs/building.md is the one make demo runs" '
    make -s -n -C "$SRC" demo BUILDDIR=build 2>/dev/null | sed -n "s/^echo .\$ \(bmlaunch .*\).\$/\1/p" >cmd &&
    test "$(wc -l <cmd)" -eq 1 && grep -q -- "-- build/bin/gpt2 --data" cmd &&
    grep -qxF "\$ $(cat cmd)" "$SRC/README.md" &&
    grep -F "| \`make demo\` |" "$SRC/docs/building.md" | grep -qF "\`$(cat cmd)\`"
'

test_expect_success "the command docs/building.md and docs/llama.md quote for make demo-llama is the one it runs" '
    make -s -n -C "$SRC" demo-llama BUILDDIR=build 2>/dev/null | sed -n "s/^echo .\$ \(bmlaunch .*\).\$/\1/p" >cmd &&
    test "$(wc -l <cmd)" -eq 1 && grep -q -- "-- build/bin/llama --data" cmd &&
    grep -F "| \`make demo-llama\` |" "$SRC/docs/building.md" | grep -qF "\`$(cat cmd)\`" &&
    grep -qxF "\$ $(cat cmd)" "$SRC/docs/llama.md"
'

test_expect_success "README.md quotes GPU figures from the newest 2-GPU results file, and names it" '
    /usr/bin/python3 - "$SRC" <<-PY
	import glob, os, re, sys
	src = sys.argv[1]
	readme = open(os.path.join(src, "README.md")).read()
	para = re.search(r"\*\*the GPT-2 trainer on GPUs\*\*.*?(?:\n\n|\Z)", readme, re.S).group(0)
	para = " ".join(para.split())
	named = re.findall(r"bench/results/[A-Za-z0-9_.-]+\.txt", para)
	assert len(named) == 1, ("README names no single results file", named)
	newest = sorted(glob.glob(os.path.join(src, "bench/results/*-2xH200-*.txt")))[-1]
	assert os.path.basename(newest) == os.path.basename(named[0]), \
	    ("README quotes %s; the newest 2-GPU results are %s" % (named[0], os.path.basename(newest)))
	res = open(newest).read()
	bad, n = [], 0
	for k in re.findall(r"([0-9]+)K tokens/s", para):
	    n += 1
	    if not re.search(r"ours +[0-9.]+ ms +%s[0-9]{3} tok/s" % k, res):
	        bad.append(k + "K tokens/s")
	for x in re.findall(r"([0-9]+\.[0-9]+)x", para):
	    n += 1
	    if "x" + x not in res:
	        bad.append(x + "x")
	for ms in re.findall(r"([0-9]+\.[0-9]) ms", para):
	    n += 1
	    if not re.search(r"(ours|fsdp2) +%s ms" % re.escape(ms), res):
	        bad.append(ms + " ms")
	for a, b in re.findall(r"([0-9.]+) against ([0-9.]+) GiB", para):
	    n += 1
	    if not re.search(r"mem +%s GiB.*mem +%s GiB" % (re.escape(a), re.escape(b)), res):
	        bad.append(a + " against " + b + " GiB")
	assert n >= 5, ("too few figures found in README", n)
	assert not bad, ("README figures not in %s: %s" % (newest, bad))
	print("%d README figures found in %s" % (n, os.path.basename(newest)))
	PY
'

test_done
