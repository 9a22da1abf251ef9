#!/usr/bin/python3
"""tests/tools/hf_gpt2_load.py — what transformers' GPT2LMHeadModel.from_pretrained(DIR)
does with a directory, without transformers, as the CPU tests' reader of HF-style
directories and of the trainer's checkpoints (tests/integration/test_gpt2_hf.sh).

    hf_gpt2_load.py check DIR [--data SHARD -b B -t T] [--loss X] [--bound R]
        Read DIR/config.json as GPT2Config does (absent keys take its
        defaults); resolve DIR/model.safetensors, else
        DIR/model.safetensors.index.json (from_pretrained's order); read every shard with the parser below (8-byte
        little-endian header length, JSON header, data; offsets, sizes and the
        "format": "pt" metadata checked); check that every tensor
        GPT2LMHeadModel needs is there with the shape the config implies
        (names with or without "transformer.", as from_pretrained accepts both)
        and that nothing else is, beyond the attention-mask buffers (attn.bias,
        attn.masked_bias) and lm_head.weight (tied: it must equal wte). With
        --data, build the model the config describes (its activation, epsilon,
        heads, inner size, attention scaling, tied or untied head) in float64
        and print the mean cross-entropy of the first micro-batch of rank 0
        (tokens [0, B T + 1) of the llm.c shard, the trainer's first batch):
        "loss X". When the config is the model tests/tools/gpt2_oracle.py
        computes (GELU tanh, eps 1e-5, tied, scaled by 1/sqrt(head size) only),
        the logits are also checked against gpt2_oracle.gpt2 (1e-12).
        --loss X: that loss must equal X within --bound (relative, default 1e-5).
        Prints "ok"/"FAIL" lines; exit 1 on any failure.

    hf_gpt2_load.py make SRC.safetensors DIR [--heads H] [--shards N] [--prefix P]
                         [--set KEY=JSON ...] [--unset KEY ...] [--config-text TEXT]
                         [--extra NAME] [--drop NAME] [--no-metadata] [--no-config]
        Write an HF-style directory from the tensors of SRC (any float dtype;
        written as F32): DIR/model.safetensors, or N shards
        model-0000i-of-0000N.safetensors and model.safetensors.index.json as HF
        writes them; names get the prefix P ("transformer." or "", default: as
        in SRC); and DIR/config.json, the config.json of openai-community/gpt2
        with SRC's sizes and n_head H (default C/64), then --set KEY=JSON
        (e.g. activation_function='"relu"', tie_word_embeddings=false) and
        --unset KEY, or TEXT verbatim with --config-text. --extra NAME adds a
        tensor nobody expects, --drop NAME removes one, --no-metadata leaves
        out "format": "pt" (for the reader's own failure cases).
"""
import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_write  # noqa: E402

# torch (and the oracle, which imports it) only where a loss is computed: the
# `make` command runs in every case of tests/integration/test_gpt2_hf.sh, and
# importing torch costs a second each time.
torch = F = gpt2_oracle = None


def need_torch():
    global torch, F, gpt2_oracle
    if torch is None:
        import torch as t
        import torch.nn.functional as f
        import gpt2_oracle as g
        torch, F, gpt2_oracle = t, f, g

# GPT2Config's defaults (transformers' configuration_gpt2.py and PretrainedConfig).
DEFAULTS = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
    "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
    "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "add_cross_attention": False,
}
ALIASES = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
           "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}
SQRT_2_PI = math.sqrt(2.0 / math.pi)
# transformers' ACT2FN, as functions of float64 tensors (written out, not torch's)
ACT = {
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(SQRT_2_PI * (x + 0.044715 * x ** 3))),
    "gelu_pytorch_tanh": lambda x: 0.5 * x * (1.0 + torch.tanh(SQRT_2_PI * (x + 0.044715 * x ** 3))),
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "gelu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "relu": lambda x: torch.relu(x),
    "silu": lambda x: x * torch.sigmoid(x),
    "swish": lambda x: x * torch.sigmoid(x),
    "tanh": lambda x: torch.tanh(x),
}
LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
         "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
         "mlp.c_proj.weight", "mlp.c_proj.bias"]
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1}

FAILED = []


def report(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg, flush=True)
    if not ok:
        FAILED.append(msg)
    return ok


class Refused(Exception):
    """What from_pretrained would refuse (or silently get wrong) about a directory."""


# ---------------------------------------------------------------- safetensors, by the spec

def read_st(path):
    """{name: (dtype, shape, raw bytes)} and the metadata of one safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise Refused("%s: %d bytes: shorter than the 8-byte header length" % (path, len(raw)))
    n = struct.unpack("<Q", raw[:8])[0]
    if 8 + n > len(raw):
        raise Refused("%s: the header length %d runs past the end of the file (%d bytes)"
                      % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Refused("%s: the header is not JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise Refused("%s: the header is not a JSON object" % path)
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    out, spans = {}, []
    for name, h in header.items():
        dt, shape, offs = h.get("dtype"), h.get("shape"), h.get("data_offsets")
        if dt not in ITEMSIZE or not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2:
            raise Refused("%s: tensor %r: bad entry %r" % (path, name, h))
        b, e = offs
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= b <= e <= len(data)) or e - b != numel * ITEMSIZE[dt]:
            raise Refused("%s: tensor %r: data_offsets [%d, %d] do not hold %s %s in %d bytes of data"
                          % (path, name, b, e, dt, shape, len(data)))
        spans.append((b, e, name))
        out[name] = (dt, tuple(shape), data[b:e])
    spans.sort()
    pos = 0
    for b, e, name in spans:  # the spec: back to back, no holes, no overlaps
        if b != pos:
            raise Refused("%s: tensor %r starts at %d, not %d (a hole or an overlap)" % (path, name, b, pos))
        pos = e
    if pos != len(data):
        raise Refused("%s: %d bytes of data after the last tensor" % (path, len(data) - pos))
    return out, meta


def to_f64(dt, shape, raw):
    if dt == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dt == "F64":
        a = np.frombuffer(raw, dtype="<f8")
    elif dt == "F16":
        a = np.frombuffer(raw, dtype="<f2")
    elif dt == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        raise Refused("dtype %s is not a float type" % dt)
    return a.astype(np.float64).reshape(shape)


# ---------------------------------------------------------------- from_pretrained

def read_config(d):
    path = os.path.join(d, "config.json")
    if not os.path.exists(path):
        raise Refused("%s: missing: from_pretrained needs the config (no config.json)" % path)
    try:
        raw = json.load(open(path))
    except ValueError as e:
        raise Refused("%s: not JSON: %s" % (path, e))
    if not isinstance(raw, dict):
        raise Refused("%s: not a JSON object" % path)
    if raw.get("model_type", "gpt2") != "gpt2":
        raise Refused("%s: model_type %r: not a GPT-2 (AutoConfig would build another model)"
                      % (path, raw["model_type"]))
    cfg = dict(DEFAULTS)
    for k, v in raw.items():
        cfg[ALIASES.get(k, k)] = v
    for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        if not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or cfg[k] < 1:
            raise Refused("%s: %s is %r: a positive integer is needed" % (path, k, cfg[k]))
    if cfg["n_embd"] % cfg["n_head"]:
        raise Refused("%s: n_head %d does not divide n_embd %d" % (path, cfg["n_head"], cfg["n_embd"]))
    if cfg["activation_function"] not in ACT:
        raise Refused("%s: activation_function %r: not one this reader knows" % (path, cfg["activation_function"]))
    if cfg["add_cross_attention"]:
        raise Refused("%s: add_cross_attention: a GPT-2 with cross-attention needs an encoder" % path)
    return cfg, raw


def read_weights(d):
    """{name: (dtype, shape, raw)} over the files from_pretrained would read, and their names."""
    # model.safetensors first: from_pretrained checks SAFE_WEIGHTS_NAME (with
    # os.path.isfile) before SAFE_WEIGHTS_INDEX_NAME, and never opens the index
    # of a directory that has both
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.isfile(os.path.join(d, "model.safetensors")):
        wm, files = None, ["model.safetensors"]
    elif os.path.isfile(index):
        idx = json.load(open(index))
        wm = idx.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise Refused("%s: no weight_map" % index)
        files = sorted(set(wm.values()))
    else:
        raise Refused("%s: neither model.safetensors.index.json nor model.safetensors" % d)
    tensors = {}
    for f in files:
        t, meta = read_st(os.path.join(d, f))
        if not isinstance(meta, dict) or meta.get("format") not in ("pt", "tf", "flax", "mlx"):
            raise Refused("%s: metadata %r has no \"format\": \"pt\" (from_pretrained refuses it)" % (f, meta))
        for name, v in t.items():
            if name in tensors:
                raise Refused("%s: tensor %r is in two files" % (f, name))
            if wm is not None and wm.get(name) != f:
                raise Refused("%s: tensor %r: the index says %r" % (f, name, wm.get(name)))
            tensors[name] = v
    if wm is not None:
        lost = sorted(set(wm) - set(tensors))
        if lost:
            raise Refused("the index names tensors no file holds: %s" % lost[:5])
    return tensors, files


def expected_shapes(cfg):
    """GPT2LMHeadModel's parameters (base-model names) and shapes for cfg."""
    C, V, T, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    I = cfg["n_inner"] if cfg["n_inner"] is not None else 4 * C
    shapes = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    per = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C),
           "attn.c_attn.bias": (3 * C,), "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
           "ln_2.weight": (C,), "ln_2.bias": (C,), "mlp.c_fc.weight": (C, I), "mlp.c_fc.bias": (I,),
           "mlp.c_proj.weight": (I, C), "mlp.c_proj.bias": (C,)}
    for l in range(L):
        for k in LAYER:
            shapes["h.%d.%s" % (l, k)] = per[k]
    return shapes


def load(d):
    """(cfg, raw config, {base name: float64 array}, lm_head or None, files): what
    from_pretrained builds, or Refused."""
    cfg, raw = read_config(d)
    tensors, files = read_weights(d)
    prefixed = any(k.startswith("transformer.") for k in tensors)
    base = {}
    lm_head = None
    unexpected = []
    for name, v in tensors.items():
        if name == "lm_head.weight":
            lm_head = v
            continue
        if prefixed and not name.startswith("transformer."):
            unexpected.append(name)
            continue
        b = name[len("transformer."):] if prefixed else name
        base[b] = v
    want = expected_shapes(cfg)
    ignored = [k for k in base if k.endswith((".attn.bias", ".attn.masked_bias")) and k not in want]
    for k in ignored:
        del base[k]
    unexpected += sorted(k for k in base if k not in want)
    if unexpected:
        raise Refused("unexpected tensors (GPT2LMHeadModel has no such parameter): %s" % unexpected[:5])
    missing = sorted(k for k in want if k not in base)
    if missing:
        raise Refused("missing tensors (from_pretrained would initialize them at random): %s" % missing[:5])
    params = {}
    for k, shape in want.items():
        dt, got, raw_bytes = base[k]
        if got != shape:
            raise Refused("tensor %s is %s; the config implies %s (size mismatch)" % (k, list(got), list(shape)))
        params[k] = to_f64(dt, got, raw_bytes)
    head = None
    if cfg["tie_word_embeddings"]:
        if lm_head is not None and not np.array_equal(to_f64(*lm_head), params["wte.weight"]):
            raise Refused("lm_head.weight differs from wte.weight, but the config ties them")
    else:
        if lm_head is None:
            raise Refused("tie_word_embeddings is false and there is no lm_head.weight")
        if lm_head[1] != want["wte.weight"]:
            raise Refused("lm_head.weight is %s; the config implies %s" % (list(lm_head[1]), list(want["wte.weight"])))
        head = to_f64(*lm_head)
    return cfg, raw, params, head, files


def forward(cfg, p, head, idx):
    need_torch()
    """Logits (B,T,V) float64 of the GPT-2 that cfg describes (HF's GPT2LMHeadModel math)."""
    B, T = idx.shape
    C, NH, eps = cfg["n_embd"], cfg["n_head"], float(cfg["layer_norm_epsilon"])
    act = ACT[cfg["activation_function"]]
    hs = C // NH
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(cfg["n_layer"]):
        q = lambda n: p["h.%d.%s" % (l, n)]  # noqa: E731
        h = F.layer_norm(x, (C,), q("ln_1.weight"), q("ln_1.bias"), eps)
        qkv = h @ q("attn.c_attn.weight") + q("attn.c_attn.bias")
        qq, kk, vv = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = qq @ kk.transpose(-2, -1)
        if cfg["scale_attn_weights"]:
            att = att / math.sqrt(hs)
        if cfg["scale_attn_by_inverse_layer_idx"]:
            att = att / float(l + 1)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, C)
        x = x + y @ q("attn.c_proj.weight") + q("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), q("ln_2.weight"), q("ln_2.bias"), eps)
        h = act(h @ q("mlp.c_fc.weight") + q("mlp.c_fc.bias"))
        x = x + h @ q("mlp.c_proj.weight") + q("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ (p["wte.weight"] if head is None else head).T


def is_oracle_model(cfg):
    return (cfg["activation_function"] in ("gelu_new", "gelu_pytorch_tanh")
            and abs(cfg["layer_norm_epsilon"] - 1e-5) <= 1e-14 and cfg["tie_word_embeddings"]
            and cfg["scale_attn_weights"] and not cfg["scale_attn_by_inverse_layer_idx"]
            and cfg["n_inner"] in (None, 4 * cfg["n_embd"]))


def first_batch(shard, B, T):
    need_torch()
    raw = open(shard, "rb").read()
    hdr = np.frombuffer(raw[:1024], dtype="<i4")
    if hdr[0] != 20240520:
        raise SystemExit("%s: not an llm.c shard (magic %d)" % (shard, hdr[0]))
    tokens = np.frombuffer(raw[1024:], dtype="<u2")[: B * T + 1].astype(np.int64)
    return torch.tensor(tokens[:-1]).view(B, T), torch.tensor(tokens[1:]).view(B, T)


def cmd_check(a):
    need_torch()
    torch.set_default_dtype(torch.float64)
    try:
        cfg, raw, p, head, files = load(a.dir)
    except Refused as e:
        report(False, "from_pretrained(%s): %s" % (a.dir, e))
        return 1
    n = sum(v.size for v in p.values())
    report(True, "from_pretrained(%s): config (L %d, H %d, C %d, V %d, maxT %d, %s, eps %g, %s), "
           "%d files, %d parameters (%d numbers), all of GPT2LMHeadModel's, nothing unexpected"
           % (a.dir, cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"],
              cfg["activation_function"], cfg["layer_norm_epsilon"],
              "tied" if head is None else "untied", len(files), len(p), n))
    print("config %s" % json.dumps({k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size",
                                                         "n_positions")}, sort_keys=True))
    if a.data:
        t = {k: torch.tensor(v) for k, v in p.items()}
        hd = torch.tensor(head) if head is not None else None
        x, y = first_batch(a.data, a.B, a.T)
        logits = forward(cfg, t, hd, x)
        loss = F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), y.reshape(-1)).item()
        print("loss %.10g" % loss)
        if is_oracle_model(cfg):
            o = gpt2_oracle
            o.V, o.C, o.NH, o.L = cfg["vocab_size"], cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
            ref = o.gpt2(t, x)
            e = float((logits - ref).abs().max() / ref.abs().max())
            report(e <= 1e-12, "the same logits as gpt2_oracle.gpt2: max error %.2e of the largest (bound 1e-12)" % e)
        if a.loss is not None:
            e = abs(loss - a.loss) / abs(a.loss)
            report(e <= a.bound, "loss of the first batch: ours %.9f, the trainer's %.9f: relative error "
                   "%.2e (bound %g)" % (loss, a.loss, e, a.bound))
    return 1 if FAILED else 0


# ---------------------------------------------------------------- writing HF-style directories

def gpt2_config_json(L, NH, C, V, T):
    """openai-community/gpt2's config.json with these sizes."""
    return {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": T, "n_embd": C, "n_head": NH,
        "n_layer": L, "n_positions": T, "resid_pdrop": 0.1, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": V,
    }


def cmd_make(a):
    src, _ = read_st(a.src)
    os.makedirs(a.dir, exist_ok=True)
    had = any(k.startswith("transformer.") for k in src)
    prefix = a.prefix if a.prefix is not None else ("transformer." if had else "")
    ts = []
    for name in src:  # the source's order
        base = name[len("transformer."):] if name.startswith("transformer.") else name
        if base in a.drop or name in a.drop:
            continue
        dt, shape, raw = src[name]
        x = to_f64(dt, shape, raw).astype("<f4")
        ts.append((prefix + base, "F32", shape, x.tobytes()))
    for name in a.extra:
        ts.append((name, "F32", (2,), np.zeros(2, dtype="<f4").tobytes()))
    meta = None if a.no_metadata else {"format": "pt"}
    if a.shards <= 1:
        st_write.write_st(os.path.join(a.dir, "model.safetensors"), ts, meta)
    else:
        per = -(-len(ts) // a.shards)
        wm, total = {}, 0
        for i in range(a.shards):
            f = "model-%05d-of-%05d.safetensors" % (i + 1, a.shards)
            part = ts[i * per:(i + 1) * per]
            st_write.write_st(os.path.join(a.dir, f), part, meta)
            for t in part:
                wm[t[0]] = f
                total += len(t[3])
        with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    if a.no_config:
        return 0
    path = os.path.join(a.dir, "config.json")
    if a.config_text is not None:
        open(path, "w").write(a.config_text)
        return 0
    wte = src.get("wte.weight") or src.get("transformer.wte.weight")
    wpe = src.get("wpe.weight") or src.get("transformer.wpe.weight")
    layers = {m.group(1) for m in (re.match(r"(?:transformer\.)?h\.(\d+)\.", k) for k in src) if m}
    V, C = wte[1]
    T = wpe[1][0]
    cfg = gpt2_config_json(len(layers), a.heads or C // 64, C, V, T)
    for kv in a.set:
        k, v = kv.split("=", 1)
        cfg[k] = json.loads(v)
    for k in a.unset:
        cfg.pop(k, None)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check")
    p.add_argument("dir")
    p.add_argument("--data")
    p.add_argument("-b", dest="B", type=int, default=2)
    p.add_argument("-t", dest="T", type=int, default=16)
    p.add_argument("--loss", type=float)
    p.add_argument("--bound", type=float, default=1e-5)
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("make")
    p.add_argument("src")
    p.add_argument("dir")
    p.add_argument("--heads", type=int, default=0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--prefix")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--unset", action="append", default=[])
    p.add_argument("--config-text")
    p.add_argument("--extra", action="append", default=[])
    p.add_argument("--drop", action="append", default=[])
    p.add_argument("--no-metadata", action="store_true")
    p.add_argument("--no-config", action="store_true")
    p.set_defaults(fn=cmd_make)
    a = ap.parse_args()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
