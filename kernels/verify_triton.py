"""Fused batched verification (Triton): the twin of ``reference.verify_batch``, same signature.

Two launches, no host synchronisation:

1. ``_verify_rows_kernel``, one program per logits row, streams the row once (greedy, or sampling
   without top-k/top-p) and writes the token the step would emit if the walk stopped at this row:
   the argmax, the sample-and-match sample, or (rejection mode) the acceptance bit of the row's child
   plus the recovered token when that child is rejected and the bonus sample on the last row.
   top-k / top-p and rejection need more passes over the row (see below); the extra reads are of a
   row the program has just read, mostly from L2.
2. ``_walk_kernel``, one program per request, walks the tree in registers and writes the accepted
   path, its length and the next token. (A grid-wide dependency needs a second launch or a
   last-block-done atomic; the launch costs a few microseconds and is CUDA-graph friendly.)

Exactness. The kernels reproduce ``lookupspec.sampling`` bit for bit where the arithmetic allows:
the integer hash and noise streams exactly; the temperature as torch does it on the same device (a
float32 division on the CPU, a multiply by the float32 reciprocal on CUDA); Gumbel noise and
exponentials with ``libdevice`` ``logf`` on CUDA (torch's own) and with ``tl.log`` in the interpreter
(numpy's, which differs from torch's CPU ``log`` by an ulp on some inputs: a sampled token can then
differ only where the top two perturbed scores tie to within an ulp, about 1e-7 per row); fused
multiply-adds are disabled. top-p uses a sort-free threshold: token ``i`` is kept iff the mass of
tokens with a strictly larger score is below ``top_p`` (sampling.py's documented rule); the threshold
is found by a radix search over the order-preserving 32-bit keys of the scores (4 bits per pass
on the GPU: 8 passes), and top-k the same way with counts. Its sums run in another order than
torch's sorted cumsum, so the kept set can differ only where a mass is within rounding of top_p.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from lookupspec.sampling import GREEDY_EPS

from .variants import launch
from .verify_inputs import BatchVerifyOutput, VerifyMode, check_verify_inputs

__all__ = ["verify_batch"]

_GREEDY_EPS = tl.constexpr(GREEDY_EPS)
_INF = tl.constexpr(float("inf"))
_MODES = {VerifyMode.GREEDY: 0, VerifyMode.MATCH: 1, VerifyMode.REJECTION: 2}
_INTERPRET = bool(triton.knobs.runtime.interpret)

# (BLOCK_V, RADIX_BLOCK, RADIX_BITS, num_warps). On the GPU 4-bit radix digits keep the
# [16, RADIX_BLOCK] comparison tiles in registers; the interpreter pays per operation, not per element,
# so it takes wide blocks and 8-bit digits (half the passes). RADIX_BITS must divide 32.
GPU_CONFIG = (1024, 256, 4, 4)
INTERPRETER_CONFIG = (128, 128, 8, 1)
BLOCK_B = 64  # requests scanned per pass when a row looks for its request (fixed: no variant per batch)


def _device_fn(fn):
    """``triton.jit`` for the helpers the kernels call. Under TRITON_INTERPRET the interpreter
    re-patches ``triton.language`` on every call of a jitted helper (about a millisecond each), which
    makes the block loops crawl; there the helpers run as the plain Python the interpreter executes
    anyway (the kernels themselves stay jitted)."""
    return fn if _INTERPRET else triton.jit(fn)


# --- the noise streams of lookupspec/sampling.py ---------------------------------------------------


@_device_fn
def _hash32(x):  # lowbias32 on uint32 (wrapping products)
    x = x ^ (x >> 16)
    x = x * tl.full([], 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], 0x846CA68B, tl.uint32)
    x = x ^ (x >> 16)
    return x


@_device_fn
def _stream_key(seed, pos, STREAM: tl.constexpr):  # sampling.stream_keys; seed, pos: int64 scalars
    base = _hash32((seed ^ (seed >> 32)).to(tl.uint32) ^ tl.full([], 0x9E3779B9, tl.uint32))
    if STREAM != 0:
        base = _hash32(base ^ tl.full([], STREAM, tl.uint32))
    return _hash32(pos.to(tl.uint32) ^ base)


@_device_fn
def _token_bits(key, offs):  # bits(key, token) for a block of token ids
    return _hash32(key ^ (offs.to(tl.uint32) * tl.full([], 0x85EBCA6B, tl.uint32)))


@_device_fn
def _log(x, PRECISE: tl.constexpr):
    return libdevice.log(x) if PRECISE else tl.log(x)  # __nv_logf is what torch's CUDA log runs


@_device_fn
def _exp(x, PRECISE: tl.constexpr):
    return libdevice.exp(x) if PRECISE else tl.exp(x)


@_device_fn
def _gumbel(bits, PRECISE: tl.constexpr):
    # sampling.gumbel_noise: u = ((bits >> 9) + 0.5) / 2**23 in float32 (exact, < 1), g = -log(-log(u))
    return -_log(-_log(_uniform23(bits), PRECISE), PRECISE)


@_device_fn
def _uniform23(bits):  # sampling._uniform23: in (0, 1), exact
    return ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


# --- scores, keys, argmax ------------------------------------------------------------------------


@_device_fn
def _scale(x, s, RECIP: tl.constexpr):  # logits / temperature, as torch computes it on this device
    return x * s if RECIP else tl.math.div_rn(x, s)  # with RECIP, s = float32 1 / temperature


@_device_fn
def _order_key(v):
    """float32 -> uint32 whose unsigned order is the float order (-0 == +0), NaN above +inf: the
    order torch.argmax uses."""
    v = tl.where(v == 0.0, 0.0, v)
    b = v.to(tl.uint32, bitcast=True)
    k = tl.where((b >> 31) != 0, ~b, b | 0x80000000)
    return tl.where(v != v, tl.full([], 0xFFFFFFFF, tl.uint32), k)


@_device_fn
def _argmax_update(best_key, best_idx, key, offs):
    """Fold a block into a running (key, first index) maximum; masked lanes must carry key 0."""
    bk = tl.max(key, axis=0)
    bi = tl.min(tl.where(key == bk, offs, 2147483647), axis=0)
    better = bk > best_key  # strict: an earlier block wins ties
    return tl.where(better, bk, best_key), tl.where(better, bi, best_idx)


@_device_fn
def _argmax_raw(row_ptr, V, BLOCK: tl.constexpr):
    best_key = tl.full([], 0, tl.uint32)
    best_idx = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        x = tl.load(row_ptr + offs, mask=m, other=-_INF).to(tl.float32)
        key = _order_key(x)
        key = tl.where(m, key, tl.full([], 0, tl.uint32))
        best_key, best_idx = _argmax_update(best_key, best_idx, key, offs)
    return best_idx


@_device_fn
def _sample_row(row_ptr, V, s, key0, tau, RECIP: tl.constexpr, PRECISE: tl.constexpr,
                BLOCK: tl.constexpr):
    """argmax(processed + gumbel) with torch's inf/NaN semantics: a kept score plus +inf noise is
    +inf, a filtered (-inf) score plus +inf noise is NaN, and NaN wins the argmax."""
    best_key = tl.full([], 0, tl.uint32)
    best_idx = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        z = _scale(tl.load(row_ptr + offs, mask=m, other=-_INF).to(tl.float32), s, RECIP)
        z = tl.where(_order_key(z) >= tau, z, -_INF)
        g = _gumbel(_token_bits(key0, offs), PRECISE)
        g_inf = g == _INF
        key = _order_key(tl.where(g_inf, _INF, z + tl.where(g_inf, 0.0, g)))
        # torch: -inf + inf = NaN, and NaN wins torch.argmax
        key = tl.where(g_inf & (z == -_INF), tl.full([], 0xFFFFFFFF, tl.uint32), key)
        key = tl.where(m, key, tl.full([], 0, tl.uint32))
        best_key, best_idx = _argmax_update(best_key, best_idx, key, offs)
    return best_idx


# --- top-k / top-p thresholds and probabilities ------------------------------------------------------


@_device_fn
def _row_max(row_ptr, V, s, RECIP: tl.constexpr, BLOCK: tl.constexpr):
    mx = tl.full([], -_INF, tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = _scale(tl.load(row_ptr + offs, mask=offs < V, other=-_INF).to(tl.float32), s, RECIP)
        mx = tl.maximum(mx, tl.max(z, axis=0))
    return mx


@_device_fn
def _row_mass(row_ptr, V, s, mx, tau, RECIP: tl.constexpr, PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    """sum of exp(z - max) over the kept tokens (key >= tau): the softmax normaliser."""
    acc = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = _scale(tl.load(row_ptr + offs, mask=offs < V, other=-_INF).to(tl.float32), s, RECIP)
        e = tl.where(_order_key(z) >= tau, _exp(z - mx, PRECISE), 0.0)
        acc += tl.sum(e, axis=0)
    return acc


@_device_fn
def _radix_topk(row_ptr, V, s, k, RECIP: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Key of the k-th largest score: the largest key t with #(key >= t) >= k, BITS bits per pass."""
    kappa = tl.full([], 0, tl.uint32)
    digits = tl.arange(0, 1 << BITS).to(tl.uint32)
    for shift in tl.static_range(32 - BITS, -1, -BITS):
        cand = kappa + (digits << shift)  # [2**BITS] candidate thresholds
        cnt = tl.zeros([1 << BITS], dtype=tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < V
            z = _scale(tl.load(row_ptr + offs, mask=m, other=-_INF).to(tl.float32), s, RECIP)
            ge = (_order_key(z)[None, :] >= cand[:, None]) & m[None, :]
            cnt += tl.sum(ge.to(tl.int32), axis=1)
        ok = (cnt >= k) & (digits > 0)  # monotone in the digit: count how many hold
        kappa = kappa + (tl.sum(ok.to(tl.uint32), axis=0) << shift)
    return kappa


@_device_fn
def _radix_topp(row_ptr, V, s, tau_k, mx, denom, top_p, RECIP: tl.constexpr, PRECISE: tl.constexpr,
                BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Largest key t with mass(key >= t) >= top_p (probabilities over the top-k survivors). Token i
    is kept iff key_i >= t, i.e. iff the mass strictly above it is < top_p."""
    kappa = tl.full([], 0, tl.uint32)
    digits = tl.arange(0, 1 << BITS).to(tl.uint32)
    for shift in tl.static_range(32 - BITS, -1, -BITS):
        cand = kappa + (digits << shift)
        mass = tl.zeros([1 << BITS], dtype=tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = _scale(tl.load(row_ptr + offs, mask=offs < V, other=-_INF).to(tl.float32), s,
                       RECIP)
            key = _order_key(z)
            p = tl.where(key >= tau_k, tl.math.div_rn(_exp(z - mx, PRECISE), denom), 0.0)
            mass += tl.sum(tl.where(key[None, :] >= cand[:, None], p[None, :], 0.0), axis=1)
        ok = (mass >= top_p) & (digits > 0)
        kappa = kappa + (tl.sum(ok.to(tl.uint32), axis=0) << shift)
    return kappa


@_device_fn
def _threshold(row_ptr, V, s, k, top_p, RECIP: tl.constexpr, PRECISE: tl.constexpr,
               BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Order key of the smallest score that survives top-k then top-p (0 = keep all)."""
    tau = tl.full([], 0, tl.uint32)
    if (k > 0) & (k < V):
        tau = _radix_topk(row_ptr, V, s, k, RECIP, BITS, BLOCK)
    if top_p < 1.0:
        mx = _row_max(row_ptr, V, s, RECIP, BLOCK)
        denom = _row_mass(row_ptr, V, s, mx, tau, RECIP, PRECISE, BLOCK)
        tau = _radix_topp(row_ptr, V, s, tau, mx, denom, top_p, RECIP, PRECISE, BITS, BLOCK)
    return tau


@_device_fn
def _recover_row(row_ptr, q_ptr, V, s, tau, mx, denom, key_r, RECIP: tl.constexpr,
                 PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    """argmax(max(0, p - q) / E), or argmax(p / E) when that race is all zero."""
    best_r = tl.full([], 0, tl.uint32)
    idx_r = tl.full([], 0, tl.int32)
    best_p = tl.full([], 0, tl.uint32)
    idx_p = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        z = _scale(tl.load(row_ptr + offs, mask=m, other=-_INF).to(tl.float32), s, RECIP)
        p = tl.where(_order_key(z) >= tau, tl.math.div_rn(_exp(z - mx, PRECISE), denom), 0.0)
        q = tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.float32)
        e = -_log(_uniform23(_token_bits(key_r, offs)), PRECISE)
        kr = _order_key(tl.math.div_rn(tl.maximum(p - q, 0.0), e))
        kp = _order_key(tl.math.div_rn(p, e))
        best_r, idx_r = _argmax_update(best_r, idx_r, tl.where(m, kr, tl.full([], 0, tl.uint32)), offs)
        best_p, idx_p = _argmax_update(best_p, idx_p, tl.where(m, kp, tl.full([], 0, tl.uint32)), offs)
    return tl.where(best_r > 0x80000000, idx_r, idx_p)  # 0x80000000 = key of +0.0


# --- the kernels -------------------------------------------------------------------------------------


# Per-step sizes are not specialised on (Triton would compile a variant for B == 1, B % 16 == 0, ...):
# the compiled variants are the constexpr modes and block sizes only, which the warm-up runs.
@triton.jit(do_not_specialize=["B"])
def _verify_rows_kernel(
    logits_ptr, stride_l,  # [R, V]
    tokens_ptr, parents_ptr,  # [N] int32
    row_off_ptr,  # [B + 1] int32
    temp_ptr, topk_ptr, topp_ptr, seed_ptr, root_ptr,  # [B]
    q_ptr, stride_q,  # [N, V] draft probabilities (rejection)
    row_token_ptr,  # [R] int32 out
    accept_ptr,  # [N] int8 out (rejection)
    V, B,
    MODE: tl.constexpr, RECIP: tl.constexpr, PRECISE: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr, RADIX_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    r = tl.program_id(0)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_l
    if MODE == 0:
        tl.store(row_token_ptr + r, _argmax_raw(row_ptr, V, BLOCK_V))
    else:
        b = r * 0  # request of this row: the number of requests that end at or before it
        for start in range(0, B, BLOCK_B):
            ob = start + tl.arange(0, BLOCK_B)
            ends = tl.load(row_off_ptr + 1 + ob, mask=ob < B, other=2147483647)
            b += tl.sum((ends <= r).to(tl.int32), axis=0)
        r0 = tl.load(row_off_ptr + b)
        n = tl.load(row_off_ptr + b + 1) - r0 - 1
        lr = r - r0  # 0 = root row
        nbase = r0 - b  # first node of the request
        temp = tl.load(temp_ptr + b)
        k = tl.load(topk_ptr + b)
        if (temp < _GREEDY_EPS) | (k == 1):
            tok = _argmax_raw(row_ptr, V, BLOCK_V)
            tl.store(row_token_ptr + r, tok)
            if MODE == 2:  # noqa: SIM102 - a constexpr test and a runtime one do not combine in Triton
                if lr < n:
                    x = tl.load(tokens_ptr + nbase + lr)
                    tl.store(accept_ptr + nbase + lr, (x == tok).to(tl.int8))
        else:
            # what torch multiplies by (CUDA) or divides by (CPU) in process_logits
            s = tl.math.div_rn(1.0, tl.maximum(temp, _GREEDY_EPS)) if RECIP else temp
            top_p = tl.load(topp_ptr + b)
            seed = tl.load(seed_ptr + b)
            if MODE == 1:
                # depth of this row's node: climb the parents (a few cached scalar loads). At most n
                # steps, each to an earlier node, whatever the array holds: no hang on a cycle.
                depth = lr * 0
                cur = lr - 1
                while (cur >= 0) & (cur < n) & (depth < n):
                    depth += 1
                    nxt = tl.load(parents_ptr + nbase + cur)
                    cur = tl.where(nxt < cur, nxt, -1)
            else:
                depth = lr  # chains
            pos = tl.load(root_ptr + b) + depth + 1  # the position this row predicts
            key0 = _stream_key(seed, pos, 0)
            tau = tl.full([], 0, tl.uint32)
            if ((k > 0) & (k < V)) | (top_p < 1.0):
                tau = _threshold(row_ptr, V, s, k, top_p, RECIP, PRECISE, RADIX_BITS, RADIX_BLOCK)
            if MODE == 1:
                tl.store(row_token_ptr + r, _sample_row(row_ptr, V, s, key0, tau, RECIP, PRECISE, BLOCK_V))
            else:
                if lr < n:
                    mx = _row_max(row_ptr, V, s, RECIP, BLOCK_V)
                    denom = _row_mass(row_ptr, V, s, mx, tau, RECIP, PRECISE, BLOCK_V)
                    g = nbase + lr  # the node this row decides
                    x = tl.load(tokens_ptr + g)
                    zx = _scale(tl.load(row_ptr + x).to(tl.float32), s, RECIP)
                    px = tl.where(_order_key(zx) >= tau, tl.math.div_rn(_exp(zx - mx, PRECISE), denom), 0.0)
                    q_row = q_ptr + g.to(tl.int64) * stride_q
                    qx = tl.load(q_row + x).to(tl.float32)
                    u = _uniform23(_hash32(_stream_key(seed, pos, 1)))  # STREAM_ACCEPT
                    ok = (px > 0.0) & (u * qx <= px)
                    tl.store(accept_ptr + g, ok.to(tl.int8))
                    tok = tl.full([], -1, tl.int32)
                    if not ok:
                        key_r = _stream_key(seed, pos, 2)  # STREAM_RECOVER
                        tok = _recover_row(row_ptr, q_row, V, s, tau, mx, denom, key_r, RECIP, PRECISE,
                                           BLOCK_V)
                    tl.store(row_token_ptr + r, tok)
                else:  # last row: the bonus token is the plain seeded sample
                    tl.store(row_token_ptr + r,
                             _sample_row(row_ptr, V, s, key0, tau, RECIP, PRECISE, BLOCK_V))


@triton.jit(do_not_specialize=["max_nodes"])
def _walk_kernel(
    tokens_ptr, parents_ptr,  # [N] int32
    row_off_ptr,  # [B + 1] int32
    row_token_ptr,  # [R] int32
    accept_ptr,  # [N] int8 (rejection)
    path_ptr, num_ptr, next_ptr, rec_ptr,  # [B, max_nodes] int64, [B] int64, [B] int64, [B] int8
    max_nodes,
    MODE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    r0 = tl.load(row_off_ptr + b)
    n = tl.load(row_off_ptr + b + 1) - r0 - 1
    nbase = r0 - b
    idx = tl.arange(0, BLOCK_N)
    valid = idx < n
    par = tl.load(parents_ptr + nbase + idx, mask=valid, other=-2)
    par = tl.where((par >= -1) & (par < idx), par, -2)  # a malformed parent: the node hangs nowhere
    if MODE == 2:
        acc = valid & (tl.load(accept_ptr + nbase + idx, mask=valid, other=0) != 0)
    else:
        tok = tl.load(tokens_ptr + nbase + idx, mask=valid, other=-1)
        # the parent row's target
        want = tl.load(row_token_ptr + r0 + 1 + par, mask=valid & (par >= -1), other=-2)
        acc = valid & (tok == want)
    cur = n * 0 - 1
    count = n * 0
    done = n * 0
    path = tl.full([BLOCK_N], -1, tl.int32)
    for _step in range(0, n):
        first = tl.min(tl.where(acc & (par == cur), idx, BLOCK_N), axis=0)  # lowest accepted child
        ok = (first < BLOCK_N) & (done == 0)
        path = tl.where((idx == count) & ok, first, path)
        cur = tl.where(ok, first, cur)
        count += ok.to(tl.int32)
        done = tl.where(ok, done, 1)
    tl.store(path_ptr + b * max_nodes + idx, path.to(tl.int64), mask=idx < max_nodes)
    tl.store(num_ptr + b, count.to(tl.int64))
    tl.store(next_ptr + b, tl.load(row_token_ptr + r0 + 1 + cur).to(tl.int64))
    has_child = tl.sum((valid & (par == cur)).to(tl.int32), axis=0) > 0
    tl.store(rec_ptr + b, has_child.to(tl.int8))


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def verify_batch(
    logits: torch.Tensor,  # [num_rows, vocab] bf16/fp16/fp32, each request's root row first
    tokens: torch.Tensor,  # [num_nodes] draft token of each node
    parents: torch.Tensor,  # [num_nodes] parent node index local to the request, -1 = root
    row_offsets: torch.Tensor,  # [B + 1] request b owns rows row_offsets[b] : row_offsets[b + 1]
    temperature: torch.Tensor | None = None,  # [B] float32 (0 = greedy)
    top_k: torch.Tensor | None = None,  # [B] int (0 = off)
    top_p: torch.Tensor | None = None,  # [B] float32 (1 = off)
    seed: torch.Tensor | None = None,  # [B] int64
    root_position: torch.Tensor | None = None,  # [B] int64 absolute position of each root token
    *,
    mode: VerifyMode | str,
    max_nodes: int,  # >= the largest number of nodes of a request; width of `accepted`
    draft_probs: torch.Tensor | None = None,  # [num_nodes, vocab] q of each sampled draft (rejection)
) -> BatchVerifyOutput:
    """Verify a batch of draft trees on the GPU (or the Triton interpreter). See reference.verify_batch."""
    mode = VerifyMode(mode)
    check_verify_inputs(logits, tokens, parents, row_offsets,
                        (temperature, top_k, top_p, seed, root_position), mode, max_nodes, draft_probs)
    dev = logits.device
    num_rows, vocab = logits.shape
    batch = row_offsets.numel() - 1
    num_nodes = tokens.numel()
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    on_gpu = dev.type == "cuda" and not _interpreting()
    tok32 = tokens.to(dev, torch.int32)
    par32 = parents.to(dev, torch.int32)
    off32 = row_offsets.to(dev, torch.int32)
    row_token = torch.empty(num_rows, dtype=torch.int32, device=dev)
    # Arguments a mode never reads get any tensor (no allocations, no fill kernels).
    accept = torch.empty(max(num_nodes, 1), dtype=torch.int8, device=dev) if mode is VerifyMode.REJECTION \
        else row_token
    if mode is VerifyMode.GREEDY:
        temp = tp = tk = sd = rp = row_token
    else:
        assert temperature is not None and top_k is not None and top_p is not None
        assert seed is not None and root_position is not None
        temp = temperature.to(dev, torch.float32)
        tk = top_k.to(dev, torch.int32)
        tp = top_p.to(dev, torch.float32)
        sd = seed.to(dev, torch.int64)
        rp = root_position.to(dev, torch.int64)
    q = draft_probs if draft_probs is not None else logits
    if q.stride(-1) != 1:
        q = q.contiguous()
    block_v, radix_block, radix_bits, warps = GPU_CONFIG if on_gpu else INTERPRETER_CONFIG
    block_n = triton.next_power_of_2(max(max_nodes, 1))
    launch(_verify_rows_kernel, (num_rows,),
        logits, logits.stride(0), tok32, par32, off32,
        temp, tk, tp, sd, rp,
        q, q.stride(0), row_token, accept, vocab, batch,
        MODE=_MODES[mode], RECIP=dev.type == "cuda", PRECISE=on_gpu,
        BLOCK_V=block_v, BLOCK_B=BLOCK_B,
        RADIX_BLOCK=radix_block, RADIX_BITS=radix_bits, num_warps=warps,
        enable_fp_fusion=False, enable_reflect_ftz=False,  # torch's CUDA math: no FMA contraction, no FTZ
    )
    path = torch.empty((batch, max_nodes), dtype=torch.int64, device=dev)
    num = torch.empty(batch, dtype=torch.int64, device=dev)
    nxt = torch.empty(batch, dtype=torch.int64, device=dev)
    rec = torch.empty(batch, dtype=torch.int8, device=dev)
    launch(_walk_kernel, (batch,),
        tok32, par32, off32, row_token, accept, path, num, nxt, rec, max_nodes,
        MODE=_MODES[mode], BLOCK_N=block_n, num_warps=1 if block_n <= 32 else 2, enable_fp_fusion=False,
    )
    return BatchVerifyOutput(path, num, nxt, rec.view(torch.bool))
