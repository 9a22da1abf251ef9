"""bmt.metrics — a PyTorch program's steps on bmlaunch's collector, as libbmt's are.

report_step computes the figures of one step the way libbmt's monitor does
(runtime/monitor.c: monitor_fill), with the field names of bmt/plugin.h's
bmt_step_metrics_t (plugins/common/metrics_json.h), and hands them to a
thread that POSTs them to bmlaunch's collector with the job's token, in the
push plugin's document (plugins/push/push.c):

    {"version": 2, "job": ..., "rank": r, "run": {"restart": BMT_RESTART,
     "start": unix seconds, "id": 16 hex digits}, "host": ..., "device_name": ...,
     "peak_flops": ..., "dropped": n, "steps": [...], "events": [...]}

"run" is made once per Monitor (per process): the collector tells this
process's pushes from a late push of an earlier run of the job, or of an
earlier process of the rank, and refuses those (409) instead of merging them.

Why the push API and not libbmt through ctypes: libbmt's monitor lives in a
bmt_ctx_t, which bmt_init builds by joining the job through PMIx and building
communicators; a torch.distributed program has its own. The push API is the
collector's public, validated interface; this module is its second client.

The sender never slows or stops training: report_step only appends to a
bounded queue (BMT_METRICS_QUEUE items; when full the oldest is dropped and
counted, "dropped" in the next document); a collector that cannot be reached,
or answers 5xx, 429 or 408, gets the same items again with backoff from 0.1 s
to 5 s, said once on stderr and once when it answers again; any other 4xx drops
those items and says why, once per status. At exit what is queued is sent
within BMT_PLUGIN_FLUSH_TIMEOUT seconds. Without BMT_METRICS_URL (not under
bmlaunch, or --metrics-port 0) nothing is sent and report_step only computes.
"""

import atexit
import collections
import json
import math
import operator
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request

from .layout import layout_from_env

__all__ = ["report_step", "report_event", "step_begin", "peak_flops_of", "step_figures",
           "Monitor", "EVENT_KINDS"]

EVENT_KINDS = ("checkpoint_saved", "restart", "note")  # "abort" is libbmt's bmt_abort only
SCALAR_NAME_MAX = 48  # bmt/plugin.h: BMT_SCALAR_NAME_MAX
SCALARS_MAX = 32  # BMT_SCALARS_MAX: distinct names per process (and per job, in the collector)
_SCALAR_NAME = re.compile(r"[a-z][a-z0-9_]{0,%d}" % (SCALAR_NAME_MAX - 1))
BATCH = 256
PROTOCOL_VERSION = 2  # plugins/common/metrics_json.h: METRICS_PROTOCOL_VERSION
DROPPED_MAX = 2 ** 53  # METRICS_DROPPED_MAX: the most "dropped" a push says
# What a step's integers may be on the wire (METRICS_FIELDS: I64, and I32 for
# skipped and microbatches): beyond, the collector refuses the whole push
INT64_MAX, INT32_MAX = 2 ** 63 - 1, 2 ** 31 - 1

_T0 = time.monotonic()  # the start of the first step, unless step_begin says otherwise

# Dense bf16 tensor-core peaks (TFLOP/s), runtime/monitor.c's table in its order:
# whole-word matches of the CUDA device name, most specific first.
PEAKS = (("H200 NVL", 835), ("H100 NVL", 835), ("H100 PCIe", 756), ("GH200", 989),
         ("H200", 989), ("H100", 989), ("H800", 989), ("H20", 148),
         ("GB200", 2500), ("B200", 2250), ("B100", 1750), ("A100", 312),
         ("A800", 312), ("L40S", 362), ("L40", 181), ("L4", 121),
         ("A10", 125))


def _alnum(c):  # C's isalnum in the C locale
    return ("0" <= c <= "9") or ("a" <= c <= "z") or ("A" <= c <= "Z")


def peak_flops_of(name):
    """Peak dense bf16 FLOP/s of a GPU by its CUDA device name; 0 when unknown."""
    if not name:
        return 0.0
    for word, tflops in PEAKS:
        p = name.find(word)
        while p >= 0:
            end = p + len(word)
            if (p == 0 or not _alnum(name[p - 1])) and (end == len(name) or not _alnum(name[end])):
                return tflops * 1e12
            p = name.find(word, p + 1)
    return 0.0


def step_figures(tokens=0, samples=0, flops=0.0, step_time=1e-9, peak_flops=0.0):
    """tokens_per_s, samples_per_s, flops_per_s and mfu as libbmt computes them
    (monitor_fill): counts over the step time (at least 1e-9 s); FLOP/s NaN
    without FLOPs; MFU NaN without FLOPs or without a known peak."""
    if step_time < 1e-9:
        step_time = 1e-9
    fps = flops / step_time if flops > 0 else math.nan
    return {
        "step_time_s": step_time,
        "tokens_per_s": float(tokens) / step_time,
        "samples_per_s": float(samples) / step_time,
        "flops_per_s": fps,
        "mfu": fps / peak_flops if flops > 0 and peak_flops > 0 else math.nan,
    }


# What C's strtod and strtol read (ASCII digits only: \d would take other
# scripts' digits, which float() and int() accept and C does not).
# a plain decimal and a count, as libbmt and the plugins take them (no blanks,
# sign, hex or exponent)
_NUMBER = re.compile(r"[0-9]+\.?[0-9]*|\.[0-9]+")
_WHOLE = re.compile(r"[0-9]+")


def _positive(env, name, default, what, low, high, whole=False):
    """A number in (low, high] and finite, as the push plugin and libbmt read
    it (whole: an integer, as strtol)."""
    v = env.get(name, default)
    if (not (_WHOLE if whole else _NUMBER).fullmatch(v or "") or
            not (low < float(v) <= high) or not math.isfinite(float(v))):
        raise ValueError("%s='%.40s' must be %s" % (name, v, what))
    return float(v)


def _real(v):
    """A figure for JSON: None (null) for NaN and infinities, as metrics_real."""
    v = float(v)
    return v if math.isfinite(v) else None


def _utf8_cut(text, limit):
    """text as metrics_utf8_copy makes a C string of it: up to a NUL, what is
    not UTF-8 (a lone surrogate, as os.fsdecode makes of a file name's invalid
    byte) as '?', cut to at most limit bytes, never in the middle of a
    character. Sent as they are, a NUL or a surrogate would make the collector
    refuse the whole push (JSON it does not take), with the steps beside them."""
    b = text.split("\0", 1)[0].encode("utf-8", "replace")
    return b[:limit].decode("utf-8", "ignore")


def _device(env):
    """BMT_DEVICE: "cpu", "cuda", or None when unset; anything else is refused,
    as bmlaunch and libbmt's bmt_init refuse it."""
    v = env.get("BMT_DEVICE")
    if v is not None and v not in ("cpu", "cuda"):
        raise ValueError("BMT_DEVICE='%.40s' is not cpu or cuda (bmlaunch --device sets it)" % v)
    return v


def _device_name(device):
    if device == "cuda" and "torch" in sys.modules:
        torch = sys.modules["torch"]
        try:
            i = torch.cuda.current_device()
            return torch.cuda.get_device_name(i)
        except Exception:  # no usable CUDA: say which device it was meant to be
            return "cuda"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    v = line.split(":", 1)[1].strip()
                    if v:
                        return v
    except OSError:
        pass
    return "cpu"


class _Sender:
    """The thread that POSTs queued items to the collector (push.c's run)."""

    def __init__(self, url, token, head, cap, timeout, flush_s, cadata, rank):
        self.url, self.head, self.cap, self.timeout, self.flush_s = url, head, cap, timeout, flush_s
        self.rank = rank
        self.headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
        handlers = [urllib.request.ProxyHandler({})]  # the collector is never behind a proxy
        if url.startswith("https://"):
            if cadata:
                # bmlaunch's per-job certificate: exactly that one, whatever the host name
                try:
                    ctx = ssl.create_default_context(cadata=cadata)
                except (ssl.SSLError, ValueError) as e:  # ssl's words do not name the variable
                    raise ValueError("rank %d: BMT_METRICS_CA_PEM holds no PEM certificate (%s); "
                                     "bmlaunch sets it to its collector's" % (rank, e)) from None
                ctx.check_hostname = False
                # Python >= 3.13 adds RFC 5280 strictness by default, which refuses
                # many self-signed certificates; pinned to one certificate, it adds nothing.
                ctx.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
            else:
                ctx = ssl.create_default_context()
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        self.opener = urllib.request.build_opener(*handlers)
        self.q = collections.deque()
        self.cv = threading.Condition()
        self.dropped = 0
        self.closing = False
        self.deadline = None  # monotonic seconds, set at close
        self.failing = False
        self.fail_since = 0.0
        self.refused_code = None
        self.code = None  # the status of the last refusal
        self.inflight = 0  # items in the request being made
        self.thread = threading.Thread(target=self._run, name="bmt-push", daemon=True)
        self.thread.start()

    def say(self, msg):
        print("bmt: rank %d: push: %s" % (self.rank, msg), file=sys.stderr, flush=True)

    def put(self, item):
        with self.cv:
            if len(self.q) >= self.cap:
                self.q.popleft()
                self.dropped += 1
            self.q.append(item)
            self.cv.notify()

    def _take(self, wait):
        with self.cv:
            if not self.q and not self.closing:
                self.cv.wait(wait)
            n = min(BATCH, len(self.q))
            return [self.q.popleft() for _ in range(n)]

    def _unpop(self, items):
        """Put items back at the front; the oldest go when that overfills the queue."""
        with self.cv:
            self.q.extendleft(reversed(items))
            while len(self.q) > self.cap:
                self.q.popleft()
                self.dropped += 1

    def _request_timeout(self):
        if self.deadline is None:
            return self.timeout
        return min(self.timeout, self.deadline - time.monotonic())

    def _post(self, items):
        """'sent', 'retry' or 'refused', and a message naming the request."""
        doc = dict(self.head)
        with self.cv:
            doc["dropped"] = min(self.dropped, DROPPED_MAX)
        doc["steps"] = [x for kind, x in items if kind == "step"]
        doc["events"] = [x for kind, x in items if kind == "event"]
        doc["scalars"] = [x for kind, x in items if kind == "scalar"]
        body = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
        t = self._request_timeout()
        if t <= 0.001:
            return "retry", "no time left to flush"
        req = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with self.opener.open(req, timeout=t) as r:
                r.read()
                return "sent", "POST %s: HTTP %d" % (self.url, r.status)
        except urllib.error.HTTPError as e:
            try:
                answer = e.read(200).decode("utf-8", "replace").splitlines()[0]
            except Exception:
                answer = ""
            msg = "POST %s: HTTP %d %s" % (self.url, e.code, answer)
            if e.code >= 500 or e.code in (429, 408):
                return "retry", msg
            self.code = e.code
            return "refused", msg
        except Exception as e:  # unreachable, reset, timeout, TLS: all worth another try
            reason = getattr(e, "reason", e)
            return "retry", "POST %s: %s" % (self.url, reason)

    def _send(self, items):
        self.inflight = len(items)
        rc, msg = self._post(items)
        self.inflight = 0
        if rc == "sent":
            if self.failing:
                self.say("the collector answers again after %.1f s (%d items dropped so far)"
                         % (time.monotonic() - self.fail_since, self.dropped))
            self.failing = False
        elif rc == "refused":
            if self.code != self.refused_code:
                hint = {401: " (check BMT_METRICS_TOKEN)",
                        409: " (a newer run of this rank pushes now: this process's metrics "
                             "are no longer shown)"}.get(self.code, "")
                self.say("the collector refused %d items: %s%s" % (len(items), msg, hint))
            self.refused_code = self.code
            with self.cv:
                self.dropped += len(items)
        else:
            if not self.failing:
                self.say("cannot reach the collector, will retry and drop the oldest items "
                         "when the queue is full: %s" % msg)
                self.fail_since = time.monotonic()
            self.failing = True
            if self.deadline is not None:  # finalizing: no second chance
                with self.cv:
                    self.dropped += len(items)
            else:
                self._unpop(items)

    def _run(self):
        backoff = 0.0
        while True:
            closing = self.closing
            items = self._take(0 if closing else 1.0)
            if not items:
                if closing:
                    break
                continue
            self._send(items)
            if self.failing and self.deadline is None:
                backoff = 0.1 if backoff == 0 else min(5.0, backoff * 2)
                with self.cv:
                    self.cv.wait_for(lambda: self.closing, backoff)
            else:
                backoff = 0.0
            if self.deadline is not None and time.monotonic() >= self.deadline:
                with self.cv:
                    self.dropped += len(self.q)
                    self.q.clear()
                break

    def close(self):
        """Send what is queued within flush_s seconds, then stop the thread."""
        with self.cv:
            if self.closing:
                return
            self.deadline = time.monotonic() + self.flush_s
            self.closing = True
            self.cv.notify_all()
        # join takes at most threading.TIMEOUT_MAX (about 292 years)
        self.thread.join(min(self.flush_s + 1, threading.TIMEOUT_MAX))
        if self.thread.is_alive():  # a request that outlives the flush time is abandoned
            with self.cv:
                self.dropped += len(self.q) + self.inflight
                self.q.clear()
        if self.dropped:
            self.say("%d metrics items were dropped in all (collector down or too slow)"
                     % self.dropped)


class Monitor:
    """One rank's step figures and, under bmlaunch, their sender.

    env: the environment to read (default os.environ); the module-level
    report_step and report_event use one Monitor of os.environ."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.layout = layout_from_env(env)
        self.rank = self.layout.rank
        self.device = _device(env) or (
            "cuda" if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()
            else "cpu")
        self.device_name = _device_name(self.device)
        peak = env.get("BMT_PEAK_TFLOPS")
        if peak is not None:
            if not _NUMBER.fullmatch(peak) or not (0 < float(peak) < math.inf):
                raise ValueError("rank %d: BMT_PEAK_TFLOPS='%.200s' is not a positive number "
                                 "(peak TFLOP/s of one rank)" % (self.rank, peak))
            self.peak_flops = float(peak) * 1e12
        else:
            self.peak_flops = peak_flops_of(self.device_name) if self.device == "cuda" else 0.0
        # read whether or not anything is sent, as libbmt's bmt_init reads it
        flush = _positive(env, "BMT_PLUGIN_FLUSH_TIMEOUT", "5", "a positive number of seconds",
                          0, math.inf)
        self.step_start = _T0
        self.reports = 0
        self.last_step = 0
        self.tokens_total = self.samples_total = self.skipped_total = 0
        self.scalar_names = set()
        self.plugin_acc = 0.0
        self.sender = None
        # said under bmlaunch --metrics-port 0 too: a jsonl file asked for and
        # never written must not go unsaid
        others = [p.strip() for p in env.get("BMT_PLUGINS", "").split(",")
                  if p.strip() and p.strip() != "push"]
        if others:
            print("bmt: rank %d: BMT_PLUGINS names %s: a Python program sends its metrics to "
                  "the collector itself and loads no plugin; %s left out"
                  % (self.rank, ", ".join(others), "it is" if len(others) == 1 else "they are"),
                  file=sys.stderr, flush=True)
        if env.get("BMT_PUSHGATEWAY_URL"):
            print("bmt: rank %d: BMT_PUSHGATEWAY_URL is set, but a Python program sends its "
                  "metrics only to bmlaunch's collector: it is not used" % self.rank,
                  file=sys.stderr, flush=True)
        url = env.get("BMT_METRICS_URL", "")
        if not url:
            return
        if not url.startswith(("http://", "https://")):
            raise ValueError("rank %d: BMT_METRICS_URL='%.100s' is not an http:// or https:// URL"
                             % (self.rank, url))
        token = env.get("BMT_METRICS_TOKEN", "")
        if not token:
            raise ValueError("rank %d: BMT_METRICS_URL is set but BMT_METRICS_TOKEN is not "
                             "(bmlaunch sets both)" % self.rank)
        cap = _positive(env, "BMT_METRICS_QUEUE", "1024", "a count from 1 to 1000000", 0, 1e6,
                        whole=True)
        timeout = _positive(env, "BMT_METRICS_TIMEOUT", "5", "seconds in (0, 3600]", 0, 3600)
        restart = env.get("BMT_RESTART") or "0"
        if not re.fullmatch(r"[0-9]{1,9}", restart):
            raise ValueError("rank %d: BMT_RESTART='%.40s' must be a count (bmlaunch sets it)"
                             % (self.rank, restart))
        self.run = {"restart": int(restart), "start": time.time(), "id": os.urandom(8).hex()}
        head = {"version": PROTOCOL_VERSION,
                "job": self.layout.job_id or env.get("BMT_JOB_ID", ""), "rank": self.rank,
                "run": self.run, "host": socket.gethostname().split(".")[0],
                "device_name": self.device_name, "peak_flops": _real(self.peak_flops)}
        self.sender = _Sender(url, token, head, int(cap), timeout, flush,
                              env.get("BMT_METRICS_CA_PEM") or None, self.rank)
        atexit.register(self.close)

    def step_begin(self):
        """Mark the start of a step (else a step runs from the previous report)."""
        self.step_start = time.monotonic()

    def _count(self, name, v, high=INT64_MAX):
        """v as an int in [0, high] (int, numpy or 0-d torch integers), else ValueError."""
        try:
            n = operator.index(v) if not isinstance(v, bool) else None
        except TypeError:
            n = None
        if n is None or n < 0:
            raise ValueError("rank %d: report_step: %s must be an integer >= 0, got %r"
                             % (self.rank, name, v))
        if n > high:
            raise ValueError("rank %d: report_step: %s=%d is more than a push carries (at most "
                             "%d)" % (self.rank, name, n, high))
        return n

    def report_step(self, tokens=0, loss=None, step_time=None, flops=0.0, samples=0, step=None,
                    params=0, grad_norm=None, lr=None, skipped=False, microbatches=0,
                    comm_wait=None):
        t0 = time.monotonic()
        tokens, samples, params = (
            self._count(n, v) for n, v in (("tokens", tokens), ("samples", samples),
                                           ("params", params)))
        microbatches = self._count("microbatches", microbatches, INT32_MAX)
        for name, total, n in (("tokens", self.tokens_total, tokens),
                               ("samples", self.samples_total, samples)):
            if total + n > INT64_MAX:
                raise ValueError("rank %d: report_step: %s_total would pass %d, more than a push "
                                 "carries" % (self.rank, name, INT64_MAX))
        flops = float(flops or 0)
        if not (flops >= 0) or math.isinf(flops):
            raise ValueError("rank %d: report_step: flops must be >= 0 and finite, got %r"
                             % (self.rank, flops))
        if step_time is not None and not (float(step_time) > 0 and math.isfinite(step_time)):
            raise ValueError("rank %d: report_step: step_time must be a positive number of "
                             "seconds, got %r" % (self.rank, step_time))
        if step is not None:
            step = self._count("step", step)
        if comm_wait is not None and not (0 <= float(comm_wait) < math.inf):
            raise ValueError("rank %d: report_step: comm_wait must be >= 0 seconds" % self.rank)
        # NaN (None) is "not known"; a negative one the collector refuses, and
        # with it every item of the same push
        grad_norm, lr = (math.nan if v is None else float(v) for v in (grad_norm, lr))
        for name, v in (("grad_norm", grad_norm), ("lr", lr)):
            if v < 0:
                raise ValueError("rank %d: report_step: %s must be >= 0 (or None), got %r"
                                 % (self.rank, name, v))
        # before anything counts: a loss float() does not take changes nothing
        loss = math.nan if loss is None else float(loss)
        self.reports += 1
        measured = t0 - self.step_start
        m = {"step": self.reports if step is None else step, "time": time.time()}
        fig = step_figures(tokens, samples, flops, measured if step_time is None else
                           float(step_time), self.peak_flops)
        self.tokens_total += tokens
        self.samples_total += samples
        self.skipped_total += 1 if skipped else 0
        m.update(step_time_s=fig["step_time_s"], tokens=tokens, samples=samples,
                 tokens_total=self.tokens_total, samples_total=self.samples_total,
                 loss=loss,
                 tokens_per_s=fig["tokens_per_s"], samples_per_s=fig["samples_per_s"],
                 flops=flops, flops_per_s=fig["flops_per_s"], mfu=fig["mfu"],
                 # not measured unless given: NaN (null), never a 0 that looks real
                 comm_wait_s=math.nan if comm_wait is None else float(comm_wait),
                 plugin_s=self.plugin_acc,
                 grad_norm=grad_norm, lr=lr, skipped=1 if skipped else 0,
                 microbatches=microbatches, skipped_total=self.skipped_total, params=params)
        self.last_step = m["step"]
        self.step_start = t0
        if self.sender:
            doc = {k: (_real(v) if isinstance(v, float) else v) for k, v in m.items()}
            doc["memory"] = {}
            self.sender.put(("step", doc))
        self.plugin_acc = time.monotonic() - t0
        return m

    def report_event(self, kind, detail=""):
        if kind not in EVENT_KINDS:
            raise ValueError("rank %d: report_event: kind %r is not checkpoint_saved, restart or "
                             "note" % (self.rank, kind))
        ev = {"kind": kind, "status": 0, "step": self.last_step, "time": time.time(),
              "detail": _utf8_cut(str(detail), 511)}
        if self.sender:
            self.sender.put(("event", ev))
        return ev

    def report_scalar(self, name, value):
        if not isinstance(name, str) or not _SCALAR_NAME.fullmatch(name):
            raise ValueError("rank %d: report_scalar: name %r must be a lower-case letter then "
                             "lower-case letters, digits and '_', at most %d bytes"
                             % (self.rank, name, SCALAR_NAME_MAX))
        value = float(value)  # before the name counts: a refused value changes nothing
        if name not in self.scalar_names:
            if len(self.scalar_names) == SCALARS_MAX:
                raise ValueError("rank %d: report_scalar: '%s' would be one name too many: a "
                                 "process reports at most %d names (each is a series per job: "
                                 "put what changes in the value, not in the name)"
                                 % (self.rank, name, SCALARS_MAX))
            self.scalar_names.add(name)
        sc = {"name": name, "value": value, "step": self.last_step, "time": time.time()}
        if self.sender:
            self.sender.put(("scalar", dict(sc, value=_real(sc["value"]))))
        return sc

    def close(self):
        """Flush and stop the sender (at exit by itself)."""
        if self.sender:
            self.sender.close()


_MON = None
_LOCK = threading.Lock()


def _monitor():
    global _MON
    with _LOCK:
        if _MON is None:
            _MON = Monitor()
        return _MON


def step_begin():
    """Mark the start of a step: its time runs from here to report_step (else
    from the previous report_step, or from when bmt was imported)."""
    _monitor().step_begin()


def report_step(tokens=0, loss=None, step_time=None, flops=0.0, **kw):
    """Report one optimizer step of this rank; returns its figures as a dict
    (the fields of docs/metrics.md: tokens_per_s, flops_per_s, mfu, ...).

    tokens, samples: this rank's counts in the step. loss: None for none.
    step_time: seconds (default: measured since the previous report or
    step_begin). flops: this rank's model FLOPs in the step (0: none).
    Also: step (default: reports so far), params, grad_norm, lr, skipped,
    microbatches, comm_wait. Raises ValueError for impossible values."""
    return _monitor().report_step(tokens=tokens, loss=loss, step_time=step_time, flops=flops,
                                  **kw)


def report_event(kind, detail=""):
    """Report an event: kind is "checkpoint_saved" (detail: the path), "restart"
    or "note"; it carries the last reported step."""
    return _monitor().report_event(kind, detail)


def report_scalar(name, value):
    """Report a named figure at the last reported step, as libbmt's
    bmt_report_scalar: "val_loss" (bmt_val_loss on /metrics, the page's loss
    chart) or a name of your own (bmt_scalar{name=...}). name is
    [a-z][a-z0-9_]*, at most 48 bytes; at most 32 distinct names per process
    (ValueError beyond). value may be NaN or infinite (sent as null)."""
    return _monitor().report_scalar(name, value)
