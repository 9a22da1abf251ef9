# bmt — top-level GNU Makefile.
#
#   make                 build bmlaunch, libbmt (static + shared), test programs, benchmarks
#   make deps            install the Debian packages the project needs (idempotent)
#   make check           run every test that needs no GPU; ends with "N passed, N failed"
#   make check-sanitize  the CPU suite under ASan+UBSan, the threaded parts under TSan
#   make demo            a 2x2 CPU job through bmlaunch
#   make demo-llama      the same with the tiny Llama (examples/llama)
#   make install PREFIX=/opt/bmt   (PYTHONDIR=DIR: where python/bmt goes, docs/python.md)
#
# Knobs: BUILDDIR=build DEBUG=1 ASAN=1 TSAN=1 WERROR=1 V=1 CUDA_HOME=/usr/local/cuda NO_CUDA=1
# Paths come from pkg-config and CPPFLAGS/LDFLAGS/PKG_CONFIG_PATH, so the same file
# builds on the GPU machine (docs/building.md).

BUILDDIR ?= build
PREFIX ?= /usr/local
# The Python package (python/bmt, pure Python): one directory for every python3
# version; /usr's is on Debian's path, another prefix's goes on PYTHONPATH
# (docs/python.md).
PYTHONDIR ?= $(PREFIX)/lib/python3/dist-packages
CUDA_HOME ?= /usr/local/cuda
CC ?= cc
PKG_CONFIG ?= pkg-config
# sm_90a: Hopper's arch-specific instructions (wgmma) for nn's flash
# attention; another CUDA_ARCH builds without them (NN_WGMMA undefined).
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a

comma := ,
ifeq ($(V),1)
Q :=
else
Q := @
endif

# ---------------------------------------------------------------- dependencies
PMIX_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags pmix 2>/dev/null)
PMIX_LIBS ?= $(shell $(PKG_CONFIG) --libs pmix 2>/dev/null || echo -lpmix)
JANSSON_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags jansson 2>/dev/null)
JANSSON_LIBS ?= $(shell $(PKG_CONFIG) --libs jansson 2>/dev/null || echo -ljansson)
CURL_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags libcurl 2>/dev/null)
CURL_LIBS ?= $(shell $(PKG_CONFIG) --libs libcurl 2>/dev/null || echo -lcurl)
MHD_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags libmicrohttpd 2>/dev/null)
MHD_LIBS ?= $(shell $(PKG_CONFIG) --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)
# GnuTLS: the metrics endpoint's certificate (launcher/tlscert.c); libmicrohttpd
# serves HTTPS through it.
GNUTLS_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags gnutls 2>/dev/null)
GNUTLS_LIBS ?= $(shell $(PKG_CONFIG) --libs gnutls 2>/dev/null || echo -lgnutls)

# CUDA and NCCL: built when nvcc and nccl.h are found (NO_CUDA=1 turns them off).
NVCC ?= $(CUDA_HOME)/bin/nvcc
ifneq ($(NO_CUDA),1)
HAVE_CUDA := $(if $(wildcard $(NVCC)),$(if $(wildcard $(CUDA_HOME)/include/cuda_runtime.h),1))
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h $(NCCL_HOME)/include/nccl.h))
HAVE_NCCL := $(if $(HAVE_CUDA),$(if $(NCCL_H),1))
endif
ifeq ($(HAVE_CUDA),1)
CUDA_CPPFLAGS := -DBMT_HAVE_CUDA -isystem $(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lstdc++
ifeq ($(HAVE_NCCL),1)
CUDA_CPPFLAGS += -DBMT_HAVE_NCCL $(if $(NCCL_HOME),-isystem $(NCCL_HOME)/include)
CUDA_LIBS += $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib -Wl$(comma)-rpath$(comma)$(NCCL_HOME)/lib) -lnccl
endif
endif

# ---------------------------------------------------------------- flags
WARN := -Wall -Wextra -Wshadow -Wvla -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
OPT := $(if $(filter 1,$(DEBUG)),-O0 -g3,-O2 -g)
SAN := $(if $(filter 1,$(ASAN)),-fsanitize=address$(comma)undefined -fno-omit-frame-pointer)
SAN += $(if $(filter 1,$(TSAN)),-fsanitize=thread -fno-omit-frame-pointer)
ifeq ($(ASAN)$(TSAN),11)
$(error ASAN=1 and TSAN=1 do not mix: build them in two BUILDDIRs)
endif
BMT_CFLAGS := -std=c11 -pthread -D_GNU_SOURCE $(WARN) $(OPT) $(SAN) $(if $(filter 1,$(WERROR)),-Werror) \
	-fPIC -fvisibility=hidden -MMD -MP -Iinclude -Iruntime
BMT_LDFLAGS := $(SAN)
NVCC_FLAGS := -std=c++17 -O2 -g $(CUDA_ARCH) $(if $(findstring sm_90a,$(CUDA_ARCH)),-DNN_WGMMA) \
	-Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Iruntime -Iexamples -I.

# ---------------------------------------------------------------- sources
RUNTIME_SRC := $(filter-out runtime/comm_nccl.c,$(wildcard runtime/*.c))
ifeq ($(HAVE_NCCL),1)
RUNTIME_SRC += runtime/comm_nccl.c
endif
RUNTIME_CU := $(if $(HAVE_CUDA),$(wildcard runtime/cuda/*.cu))
RUNTIME_OBJ := $(RUNTIME_SRC:%.c=$(BUILDDIR)/%.o) $(RUNTIME_CU:%.cu=$(BUILDDIR)/%.o)
LIB_LIBS := $(PMIX_LIBS) $(JANSSON_LIBS) $(CUDA_LIBS) -ldl -lpthread -lrt -lm

LAUNCHER_SRC := $(filter-out launcher/main.c,$(wildcard launcher/*.c))
LAUNCHER_OBJ := $(LAUNCHER_SRC:%.c=$(BUILDDIR)/%.o) $(BUILDDIR)/launcher/web_page.o
LAUNCHER_A := $(BUILDDIR)/launcher/liblauncher.a

# Monitor plugins: plugins/<name>/*.c -> lib/bmt/plugins/<name>.so, each with the
# shared pieces of plugins/common (queue, JSON form of the metrics, Prometheus
# text), which bmlaunch's collector links too.
PLUGIN_COMMON_OBJ := $(patsubst %.c,$(BUILDDIR)/%.o,$(wildcard plugins/common/*.c))
PLUGIN_COMMON_A := $(BUILDDIR)/plugins/common/libplugcommon.a
PLUGINS := $(filter-out common,$(notdir $(patsubst %/,%,$(wildcard plugins/*/))))
PLUGIN_DIR := $(BUILDDIR)/lib/bmt/plugins
PLUGIN_SO := $(PLUGINS:%=$(PLUGIN_DIR)/%.so)
PLUGIN_LIBS_push := $(CURL_LIBS)
PROBE_SO := $(addprefix $(BUILDDIR)/tests/plugins/,probe.so probe_v2.so probe_nosym.so probe_small.so probe_48.so)
# An LD_PRELOAD library that fails chosen calls (tests/plugins/failio.c): built
# without sanitizers, which replace malloc themselves.
FAILIO_SO := $(BUILDDIR)/tests/plugins/failio.so

# The GPT-2 example (examples/gpt2): everything but its main, train.c, is a
# library that the trainer, the unit tests and the test programs link.
GPT2_SRC := $(filter-out examples/gpt2/train.c,$(wildcard examples/gpt2/*.c))
GPT2_A := $(BUILDDIR)/examples/gpt2/libgpt2.a
GPT2_BIN := $(if $(wildcard examples/gpt2/train.c),$(BUILDDIR)/bin/gpt2)

# Model building blocks shared by every model (nn/, docs/nn.md), and the Llama
# example's library (examples/llama: everything but a train.c), linked as GPT-2's.
# nn's CUDA kernels (nn/*_cuda.cu) join libnn where CUDA is found, and
# whatever links it then links cuBLAS and cuBLASLt (as needed only).
NN_SRC := $(wildcard nn/*.c)
NN_CU := $(if $(HAVE_CUDA),$(wildcard nn/*_cuda.cu))
NN_LIBS := $(if $(HAVE_CUDA),-Wl$(comma)--push-state$(comma)--as-needed -lcublasLt -lcublas -Wl$(comma)--pop-state)
NN_A := $(BUILDDIR)/nn/libnn.a
LLAMA_SRC := $(filter-out examples/llama/train.c,$(wildcard examples/llama/*.c))
LLAMA_A := $(BUILDDIR)/examples/llama/libllama.a
LLAMA_BIN := $(if $(wildcard examples/llama/train.c),$(BUILDDIR)/bin/llama)

# The trainer the example binaries share (examples/common: options, schedule,
# loop, evaluation, checkpoints, metrics); each example's train.c is its main.
TRAINER_SRC := $(wildcard examples/common/*.c)
TRAINER_A := $(BUILDDIR)/examples/common/libtrainer.a
# What the unit tests and test programs link of the models (the trainer's
# archive first: its token loader is there).
MODEL_LIBS := $(TRAINER_A) $(GPT2_A) $(LLAMA_A) $(NN_A)

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:%.c=$(BUILDDIR)/%)
PROG_SRC := $(wildcard tests/progs/*.c tests/gpu/*.c)
PROG_BIN := $(PROG_SRC:%.c=$(BUILDDIR)/%)
# A program X.c may have CUDA parts in X_cuda.cu (built and linked with cuBLAS
# when CUDA is found; X.c sees BMT_HAVE_CUDA then).
PROG_CU := $(if $(HAVE_CUDA),$(wildcard tests/progs/*_cuda.cu tests/gpu/*_cuda.cu bench/*_cuda.cu))
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:%.c=$(BUILDDIR)/%)

LIBBMT_A := $(BUILDDIR)/lib/libbmt.a
LIBBMT_SO := $(BUILDDIR)/lib/libbmt.so.0
BMLAUNCH := $(BUILDDIR)/bin/bmlaunch
# bin/generate (examples/generate, docs/generate.md): sampling from a GPT-2 or
# Llama directory in one process, with the models' config parsers and nn/.
# It has the CPU decoders only and links no cuBLAS, whose libcublasLt runs
# initializers at every start (0.5-0.8 s, 220 MB); bin/generate-cuda is the
# same main (GEN_CUDA_MAIN) with the CUDA decoder, nn's CUDA layers and
# cuBLAS, which generate --device cuda runs (execv) from its own directory.
GEN_OBJ := $(patsubst %.c,$(BUILDDIR)/%.o,$(filter-out %/decode_cuda.c,$(wildcard examples/generate/*.c)))
GEN_BIN := $(if $(GEN_OBJ),$(BUILDDIR)/bin/generate)
GEN_CUDA_OBJ := $(filter-out %/generate.o,$(GEN_OBJ)) $(BUILDDIR)/examples/generate/generate-cuda-main.o \
    $(BUILDDIR)/examples/generate/decode_cuda.o
GEN_CUDA_BIN := $(if $(HAVE_CUDA),$(if $(GEN_OBJ),$(BUILDDIR)/bin/generate-cuda))
# The same with tests/mock/nn_cuda_mock.c (the CUDA runtime calls and nn's
# CUDA layers emulated on the CPU) for libcudart and nn's kernels: the CUDA
# decoder's host code in make check, on machines without a GPU.
GEN_MOCK_OBJ := $(BUILDDIR)/tests/mock/nn_cuda_mock.o
GEN_MOCK_BIN := $(if $(GEN_CUDA_BIN),$(BUILDDIR)/tests/mock/generate-cuda-mock)

ALL := $(LIBBMT_A) $(LIBBMT_SO) $(BMLAUNCH) $(PLUGIN_SO) $(PROBE_SO) $(FAILIO_SO) $(UNIT_BIN) $(PROG_BIN) $(BENCH_BIN) \
    $(GPT2_BIN) $(LLAMA_BIN) $(GEN_BIN) $(GEN_CUDA_BIN) $(GEN_MOCK_BIN)

# Objects depend on the flags they were built with: switching DEBUG, ASAN, NO_CUDA
# or CFLAGS in the same BUILDDIR rebuilds instead of mixing old and new objects.
FLAGS_STAMP := $(BUILDDIR)/.flags
FLAGS_NOW := $(CC) $(BMT_CFLAGS) $(PMIX_CFLAGS) $(JANSSON_CFLAGS) $(CURL_CFLAGS) $(MHD_CFLAGS) $(GNUTLS_CFLAGS) $(CUDA_CPPFLAGS) $(CPPFLAGS) $(CFLAGS) $(NVCC_FLAGS) $(LDFLAGS)
$(shell mkdir -p $(BUILDDIR) && (echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP)))
# PREFIX reaches one object only (runtime/monitor.c: the default plugin
# directory), so make install PREFIX=... recompiles that file, not the tree.
PREFIX_STAMP := $(BUILDDIR)/.prefix
$(shell echo '$(PREFIX)' | cmp -s - $(PREFIX_STAMP) || echo '$(PREFIX)' > $(PREFIX_STAMP))
# The knobs this BUILDDIR was built with, for whatever runs make again on it
# (tests/integration/test_install.sh): the same knobs, so nothing is rebuilt.
KNOBS_NOW := $(strip $(foreach k,ASAN TSAN DEBUG NO_CUDA WERROR,$(if $($(k)),$(k)=$($(k)))))
$(shell echo '$(KNOBS_NOW)' | cmp -s - $(BUILDDIR)/.knobs || echo '$(KNOBS_NOW)' > $(BUILDDIR)/.knobs)

.PHONY: all deps check check-unit check-integration check-gpu check-sanitize demo demo-llama install clean format notice
all: notice $(ALL)

# bench/gpu/trace.c: a CUPTI kernel timeline that the CUDA driver loads into
# any program (CUDA_INJECTION64_PATH, bench/gpu/timeline.sh); diagnostics for
# the GPU machine, not part of all.
$(BUILDDIR)/bench/libbmt_trace.so: bench/gpu/trace.c
	@mkdir -p $(@D)
	$(Q)$(CC) -O2 -shared -fPIC $(WARN) -isystem $(CUDA_HOME)/include $< -L$(CUDA_HOME)/lib64 \
	    -Wl,-rpath,$(CUDA_HOME)/lib64 -lcupti -o $@

# bench/gpu/side_update.cu: whether the optimizer's update can run on SMs of
# its own beside the products (bench/NOTES.md, thirtieth session); a
# diagnostic for the GPU machine, built for sm_90a (its bulk copies), not
# part of all.
# It times the engine's own AdamW (runtime/cuda/kernels.o) as main's grid.
$(BUILDDIR)/bench/side_update: bench/gpu/side_update.cu $(BUILDDIR)/runtime/cuda/kernels.o \
    $(BUILDDIR)/runtime/dtype.o
	@mkdir -p $(@D)
	$(Q)$(NVCC) -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Iruntime $< \
	    $(filter %.o,$^) -o $@ -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lcublasLt

notice:
ifneq ($(HAVE_CUDA),1)
	@echo "bmt: CUDA not found under $(CUDA_HOME) (or NO_CUDA=1): building the CPU parts only"
else ifneq ($(HAVE_NCCL),1)
	@echo "bmt: nccl.h not found: building without the nccl backend"
endif

deps:
	$(Q)scripts/deps.sh

# ---------------------------------------------------------------- rules
$(BUILDDIR)/runtime/monitor.o: $(PREFIX_STAMP)
$(BUILDDIR)/runtime/%.o: runtime/%.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  CC      $<")
	$(Q)$(CC) $(BMT_CFLAGS) -DBMT_BUILDING_LIBRARY -DBMT_DEFAULT_PLUGIN_DIR='"$(PREFIX)/lib/bmt/plugins"' $(PMIX_CFLAGS) $(JANSSON_CFLAGS) $(CUDA_CPPFLAGS) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILDDIR)/runtime/cuda/%.o: runtime/cuda/%.cu $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCC_FLAGS) -DBMT_BUILDING_LIBRARY $(CUDA_CPPFLAGS) $(CPPFLAGS) -MMD -MP -c $< -o $@

$(BUILDDIR)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  CC      $<")
	$(Q)$(CC) $(BMT_CFLAGS) -Ilauncher -Iplugins -Iexamples -I. $(PMIX_CFLAGS) $(JANSSON_CFLAGS) $(CURL_CFLAGS) $(MHD_CFLAGS) $(GNUTLS_CFLAGS) $(CUDA_CPPFLAGS) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The live page of the metrics endpoint, embedded with .incbin.
$(BUILDDIR)/launcher/web_page.o: launcher/web_page.S launcher/web/index.html
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AS      $<")
	$(Q)$(CC) -c $< -o $@

$(LIBBMT_A): $(RUNTIME_OBJ)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(LIBBMT_SO): $(RUNTIME_OBJ)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,libbmt.so.0 -Wl,--version-script=runtime/libbmt.map $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $(RUNTIME_OBJ) $(LIB_LIBS)
	$(Q)ln -sf libbmt.so.0 $(@D)/libbmt.so

# The launcher's modules form a static library so unit tests can link them.
$(LAUNCHER_A): $(LAUNCHER_OBJ)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(PLUGIN_COMMON_A): $(PLUGIN_COMMON_OBJ)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

define PLUGIN_RULE
$(PLUGIN_DIR)/$(1).so: $(patsubst %.c,$(BUILDDIR)/%.o,$(wildcard plugins/$(1)/*.c)) $(PLUGIN_COMMON_A)
	@mkdir -p $$(@D)
	$$(if $$(Q),@echo "  LD      $$@")
	$$(Q)$$(CC) -shared $$(BMT_LDFLAGS) $$(LDFLAGS) -o $$@ $$^ $$(PLUGIN_LIBS_$(1)) $$(JANSSON_LIBS) -lpthread
endef
$(foreach p,$(PLUGINS),$(eval $(call PLUGIN_RULE,$(p))))

# Test plugins (tests/plugins/probe.c): one source, built as a good plugin and
# as the three kinds of broken one that bmt_init must refuse, and as one of the
# size it had before on_scalar (loaded, never called for scalars).
PROBE_FLAGS_probe :=
PROBE_FLAGS_probe_v2 := -DPROBE_VERSION=2u
PROBE_FLAGS_probe_nosym := -DPROBE_NO_SYMBOL
PROBE_FLAGS_probe_small := -DPROBE_SIZE=16u
PROBE_FLAGS_probe_48 := -DPROBE_SIZE=48u
$(BUILDDIR)/tests/plugins/%.so: tests/plugins/probe.c include/bmt/plugin.h $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  CC      $@")
	$(Q)$(CC) $(BMT_CFLAGS) -shared $(PROBE_FLAGS_$*) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $<

$(FAILIO_SO): tests/plugins/failio.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  CC      $@")
	$(Q)$(CC) -std=c11 -O2 -Wall -Wextra -fPIC -shared -o $@ $<

LAUNCHER_LIBS := $(LAUNCHER_A) $(PLUGIN_COMMON_A) $(LIBBMT_A)

$(BMLAUNCH): $(BUILDDIR)/launcher/main.o $(LAUNCHER_A) $(PLUGIN_COMMON_A) $(LIBBMT_A)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $< $(LAUNCHER_LIBS) $(LIB_LIBS) $(MHD_LIBS) $(GNUTLS_LIBS) $(JANSSON_LIBS)

$(GPT2_A): $(GPT2_SRC:%.c=$(BUILDDIR)/%.o)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(NN_A): $(NN_SRC:%.c=$(BUILDDIR)/%.o) $(NN_CU:%.cu=$(BUILDDIR)/%.o)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(LLAMA_A): $(LLAMA_SRC:%.c=$(BUILDDIR)/%.o)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(TRAINER_A): $(TRAINER_SRC:%.c=$(BUILDDIR)/%.o)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(GPT2_BIN): $(BUILDDIR)/examples/gpt2/train.o $(TRAINER_A) $(GPT2_A) $(NN_A) $(PLUGIN_COMMON_A) $(LIBBMT_A)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $< $(TRAINER_A) $(GPT2_A) $(NN_A) $(LIBBMT_A) $(NN_LIBS) $(LIB_LIBS)

$(LLAMA_BIN): $(BUILDDIR)/examples/llama/train.o $(TRAINER_A) $(LLAMA_A) $(NN_A) $(LIBBMT_A)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $< $(TRAINER_A) $(LLAMA_A) $(NN_A) $(LIBBMT_A) $(NN_LIBS) $(LIB_LIBS)

# Without $(NN_LIBS): an object of bin/generate that came to need nn's CUDA
# layers (and so cuBLAS) fails to link instead of slowing every start.
$(GEN_BIN): $(GEN_OBJ) $(LLAMA_A) $(GPT2_A) $(NN_A) $(LIBBMT_A)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $(GEN_OBJ) $(LLAMA_A) $(GPT2_A) $(NN_A) $(LIBBMT_A) $(LIB_LIBS)

$(BUILDDIR)/examples/generate/generate-cuda-main.o: examples/generate/generate.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  CC      $< (GEN_CUDA_MAIN)")
	$(Q)$(CC) $(BMT_CFLAGS) -DGEN_CUDA_MAIN -Iexamples -I. $(JANSSON_CFLAGS) $(CUDA_CPPFLAGS) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(GEN_CUDA_BIN): $(GEN_CUDA_OBJ) $(LLAMA_A) $(GPT2_A) $(NN_A) $(LIBBMT_A)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $(GEN_CUDA_OBJ) $(LLAMA_A) $(GPT2_A) $(NN_A) $(LIBBMT_A) $(NN_LIBS) $(LIB_LIBS)

# No CUDA library: a call the mock does not emulate fails to link.
$(GEN_MOCK_BIN): $(GEN_CUDA_OBJ) $(GEN_MOCK_OBJ) $(LLAMA_A) $(GPT2_A) $(NN_A) $(LIBBMT_A)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $(GEN_CUDA_OBJ) $(GEN_MOCK_OBJ) $(LLAMA_A) $(GPT2_A) $(NN_A) $(LIBBMT_A) \
	    $(PMIX_LIBS) $(JANSSON_LIBS) -ldl -lpthread -lrt -lm

$(UNIT_BIN) $(PROG_BIN) $(BENCH_BIN): $(BUILDDIR)/%: $(BUILDDIR)/%.o $(LAUNCHER_A) $(PLUGIN_COMMON_A) $(LIBBMT_A) $(MODEL_LIBS)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(BMT_LDFLAGS) $(LDFLAGS) -o $@ $< $(filter $(@)_cuda.o,$(PROG_CU:%.cu=$(BUILDDIR)/%.o)) \
	    $(MODEL_LIBS) $(LAUNCHER_LIBS) $(if $(filter $(@)_cuda.o,$(PROG_CU:%.cu=$(BUILDDIR)/%.o)),-lcublas) \
	    $(NN_LIBS) $(LIB_LIBS) $(MHD_LIBS) $(GNUTLS_LIBS) $(JANSSON_LIBS)

# Each program depends on its CUDA part, when it has one.
$(foreach cu,$(PROG_CU),$(eval $(BUILDDIR)/$(cu:_cuda.cu=): $(BUILDDIR)/$(cu:.cu=.o)))

$(BUILDDIR)/%_cuda.o: %_cuda.cu $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCC_FLAGS) $(CUDA_CPPFLAGS) $(CPPFLAGS) -MMD -MP -c $< -o $@

BMT_VERSION := $(shell sed -n 's/^\#define BMT_VERSION_STRING "\(.*\)"/\1/p' include/bmt/bmt.h)

# ---------------------------------------------------------------- tests, demo, install
check: all
	$(Q)BUILDDIR=$(BUILDDIR) tests/run

check-unit: all
	$(Q)BUILDDIR=$(BUILDDIR) tests/run unit

check-integration: all
	$(Q)BUILDDIR=$(BUILDDIR) tests/run integration

check-gpu: all
	$(Q)BUILDDIR=$(BUILDDIR) tests/run gpu

# The CPU suite under ASan+UBSan and the threaded parts under TSan, in
# $(BUILDDIR)-asan and $(BUILDDIR)-tsan (scripts/check-sanitize.sh says which
# tests and why); ends with one "N passed, N failed" line.
check-sanitize:
	$(Q)BUILDDIR=$(BUILDDIR) MAKE="$(MAKE)" scripts/check-sanitize.sh

# The main job: the tiny GPT-2 trained on the shipped corpus by 2 groups of 2
# CPU ranks (ZeRO-3 in each group, data parallel across them).
DEMO_DATA := $(BUILDDIR)/data/corpus
DEMO_ARGS := --data $(DEMO_DATA)_train.bin --val $(DEMO_DATA)_val.bin --steps 60 --lr 3e-3 \
    --warmup 5 --lr-min-frac 0.1 --eval-every 20
$(DEMO_DATA)_train.bin: examples/gpt2/data/corpus.txt $(GPT2_BIN)
	@mkdir -p $(@D)
	$(Q)$(GPT2_BIN) --prepare $< --out $(DEMO_DATA)

demo: all $(DEMO_DATA)_train.bin
	$(Q)echo '$$ bmlaunch --groups 2 --gpus-per-group 2 --device cpu -- $(GPT2_BIN) $(DEMO_ARGS)'
	$(Q)$(BMLAUNCH) --groups 2 --gpus-per-group 2 --device cpu -- $(GPT2_BIN) $(DEMO_ARGS)

# The same job with the tiny Llama (GQA, RoPE, SwiGLU, RMSNorm; docs/llama.md).
demo-llama: all $(DEMO_DATA)_train.bin
	$(Q)echo '$$ bmlaunch --groups 2 --gpus-per-group 2 --device cpu -- $(LLAMA_BIN) $(DEMO_ARGS)'
	$(Q)$(BMLAUNCH) --groups 2 --gpus-per-group 2 --device cpu -- $(LLAMA_BIN) $(DEMO_ARGS)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/bmt \
	    $(DESTDIR)$(PREFIX)/share/bmt/templates $(DESTDIR)$(PREFIX)/share/bmt/monitoring \
	    $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 $(BMLAUNCH) $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/lib/bmt/plugins
	install -m 755 $(PLUGIN_SO) $(DESTDIR)$(PREFIX)/lib/bmt/plugins/
	install -m 644 $(LIBBMT_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIBBMT_SO) $(DESTDIR)$(PREFIX)/lib/libbmt.so.0
	ln -sf libbmt.so.0 $(DESTDIR)$(PREFIX)/lib/libbmt.so
	install -m 644 include/bmt/*.h $(DESTDIR)$(PREFIX)/include/bmt/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(BMT_VERSION)|g' -e 's|@LIBS_PRIVATE@|$(LIB_LIBS)|g' \
	    bmt.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/bmt.pc
	install -m 644 templates/* $(DESTDIR)$(PREFIX)/share/bmt/templates/
	install -m 644 monitoring/*.yml monitoring/*.json $(DESTDIR)$(PREFIX)/share/bmt/monitoring/
	install -m 644 docs/bmlaunch.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -d $(DESTDIR)$(PYTHONDIR)/bmt $(DESTDIR)$(PREFIX)/share/bmt/examples/torch \
	    $(DESTDIR)$(PREFIX)/share/bmt/examples/gpt2/data
	install -m 644 python/bmt/*.py $(DESTDIR)$(PYTHONDIR)/bmt/
	install -m 644 examples/torch/*.py $(DESTDIR)$(PREFIX)/share/bmt/examples/torch/
	# the torch example's default --data (../gpt2/data/corpus.txt from its folder)
	install -m 644 examples/gpt2/data/corpus.txt examples/gpt2/data/README.md \
	    $(DESTDIR)$(PREFIX)/share/bmt/examples/gpt2/data/

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILDDIR)

-include $(shell find $(BUILDDIR) -name '*.d' 2>/dev/null)
