"""Attention over a paged KV cache, read in place (no gathered copy).

The simulated decode kernels (ATB `_npu_paged_attention`, `npu_fused_infer_attention_score`
over a paged cache, MLA decode) run `csrc/sim_kernels.c` through ctypes: it walks each
request's block table and reads K/V rows where they lie, as the device kernels do,
vectorised (AVX-512 / AVX2 clones picked by the CPU) and split by request over the
simulated device's cores (`cores.device_cores`, torch's OpenMP team). `paged_decode` takes
one query token per request; `paged_rows` any rows with their own key ranges (prefill
tokens under causal / band limits), runs of one request's rows computed as flash-style
tiles (`csrc/sim_prefill.c`).

Arithmetic in float32 (bf16 caches widened on load), softmax with the row maximum
subtracted; results within ~1e-6 of the dense float32 reference. float16 caches, and an
install without a C compiler (no library), keep the callers' dense path (`supports`).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from vllm_npu.ops.sim import cores, native

_CACHE_DTYPES = (torch.float32, torch.bfloat16)
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class _Args(ctypes.Structure):
    """`pd_args` of csrc/sim_kernels.c, field for field."""
    _fields_ = [("q", _ptr), ("q_rope", _ptr), ("k", _ptr), ("k_rope", _ptr), ("v", _ptr),
                ("k_blk", _i64), ("k_tok", _i64), ("k_head", _i64),
                ("kr_blk", _i64), ("kr_tok", _i64), ("kr_head", _i64),
                ("v_blk", _i64), ("v_tok", _i64), ("v_head", _i64),
                ("table", _ptr), ("table_stride", _i64), ("first", _ptr), ("lens", _ptr),
                ("out", _ptr), ("lse", _ptr),
                ("B", _i64), ("N", _i64), ("H", _i64), ("D", _i64), ("R", _i64),
                ("Dv", _i64), ("bs", _i64), ("num_blocks", _i64), ("scale", ctypes.c_float),
                ("bf16", ctypes.c_int32), ("row_of", _ptr)]


@functools.cache
def _entry(name: str):
    lib = native.library()
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [ctypes.POINTER(_Args), ctypes.c_int], ctypes.c_int
    return fn


def _kernel():
    """The library's entry point (its own thread pool), or None when the install could
    not build it."""
    return _entry("npu_sim_paged_decode")


_NO_TEAM = -3


def _run(args: _Args) -> int:
    """The kernel runs on torch's OpenMP team (`npu_sim_paged_decode_team`, the device's
    cores): its workers are awake between a forward's ops (eager ops and a replay's
    matmuls run on them, `cores`), where a pool of the kernel's own would be woken from
    sleep and then share a core with a spinning worker. The pool is for a torch without
    GNU OpenMP."""
    threads = cores.device_cores()
    if threads > 1:
        status = _entry("npu_sim_paged_decode_team")(ctypes.byref(args), threads)
        if status != _NO_TEAM:
            return status
    return _kernel()(ctypes.byref(args), threads)


def supports(*caches: torch.Tensor) -> bool:
    return (_kernel() is not None and all(c.dtype in _CACHE_DTYPES for c in caches)
            and len({c.dtype for c in caches}) == 1)


def _heads(cache: torch.Tensor, heads: int) -> torch.Tensor:
    """[blocks, bs, heads*D] or [blocks, bs, heads, D] -> a [blocks, bs, heads, D] view
    whose last dim is contiguous (other strides are passed to the kernel as they are)."""
    if cache.dim() == 3:
        cache = cache.unflatten(2, (heads, -1))
    if cache.dim() != 4 or cache.shape[2] != heads or cache.stride(3) != 1:
        raise ValueError(f"paged_decode: cache of shape {tuple(cache.shape)} and stride "
                         f"{cache.stride()} is not [blocks, block_size, {heads}, D] with a "
                         "contiguous last dim")
    return cache


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 num_kv_heads: int, block_table: torch.Tensor, kv_lens: torch.Tensor,
                 scale: float, window: int | None = None,
                 query_rope: torch.Tensor | None = None,
                 key_rope: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 want_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of one query token per request over its first kv_lens[b] cached tokens
    (the last `window` + 1 of them with a sliding window: right-down causal band).

    query [B, N, D]; caches [num_blocks, block_size, Hkv*D] or [.., Hkv, D] (all one
    dtype, `supports`); block_table int32 [B, max_blocks]; kv_lens [B] ints. With
    query_rope [B, N, R] / key_rope (MLA): scores add query_rope . key_rope.
    Returns out [B, N, Dv] in query's dtype (zero rows where kv_len is 0) and lse [B, N]
    float32 (None without `want_lse`). `out`: a float32 contiguous [B, N, Dv] tensor the
    kernel writes into directly (the decode ops' own output, saving a copy)."""
    lens = kv_lens.to(torch.int64).contiguous()
    first = (lens - 1 - window).clamp_(min=0) if window is not None \
        else torch.zeros_like(lens)
    return paged_rows(query, key_cache, value_cache, num_kv_heads, block_table, first, lens,
                      scale, query_rope=query_rope, key_rope=key_rope, out=out,
                      want_lse=want_lse)


def paged_rows(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               num_kv_heads: int, block_table: torch.Tensor, first: torch.Tensor,
               lens: torch.Tensor, scale: float, *, row_of: torch.Tensor | None = None,
               query_rope: torch.Tensor | None = None, key_rope: torch.Tensor | None = None,
               out: torch.Tensor | None = None,
               want_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of query row r over the cached tokens [first[r], lens[r]) of block table
    row row_of[r] (r without `row_of`): a decode row, or one token of a prefill whose
    causal / band limits the caller put in first and lens (rows of one request share
    its table row and read its keys where they lie, never gathered).

    query [R, N, D]; first/lens int64 [R]; otherwise as `paged_decode`."""
    B, N, D = query.shape
    lens = lens.to(torch.int64).contiguous()
    first = first.to(torch.int64).contiguous()
    qf = query.float().contiguous()
    qr = query_rope.float().contiguous() if query_rope is not None else qf
    k = _heads(key_cache, num_kv_heads)
    kr = _heads(key_rope, num_kv_heads) if key_rope is not None else k
    v = _heads(value_cache, num_kv_heads)
    if k.shape[3] != D or v.shape[1] != k.shape[1]:
        raise ValueError(f"paged_decode: query head dim {D} vs key cache {tuple(k.shape)}, "
                         f"value cache {tuple(v.shape)}")
    table = block_table.to(torch.int32).contiguous()
    if row_of is not None:
        row_of = row_of.to(torch.int64).contiguous()
        if row_of.shape != (B,) or (B and not 0 <= int(row_of.min()) <= int(row_of.max())
                                    < table.shape[0]):
            raise ValueError(f"paged_decode: row_of must hold {B} rows of the "
                             f"{table.shape[0]}-row block table")
    elif table.shape[0] < B:
        raise ValueError(f"paged_decode: {B} query rows but {table.shape[0]} table rows")
    if out is None or out.dtype != torch.float32 or not out.is_contiguous() \
            or out.shape != (B, N, v.shape[3]):
        out = torch.empty(B, N, v.shape[3], dtype=torch.float32)
    lse = torch.empty(B, N, dtype=torch.float32) if want_lse else None
    rope = query_rope.shape[2] if query_rope is not None else 0
    _launch(_args(qf, qr, k, kr, v, table, first, lens, out, lse, rope, scale, row_of),
            first, lens)
    return out.to(query.dtype), lse


def _args(q: torch.Tensor, q_rope: torch.Tensor, k: torch.Tensor, k_rope: torch.Tensor,
          v: torch.Tensor, table: torch.Tensor, first: torch.Tensor, lens: torch.Tensor,
          out: torch.Tensor, lse: torch.Tensor | None, rope: int, scale: float,
          row_of: torch.Tensor | None) -> _Args:
    """The kernel's arguments: q [B, N, D] and caches [blocks, bs, Hkv, D] as checked by
    the caller, every tensor by address."""
    B, N, D = q.shape
    return _Args(q.data_ptr(), q_rope.data_ptr(), k.data_ptr(), k_rope.data_ptr(),
                 v.data_ptr(), *k.stride()[:3], *k_rope.stride()[:3], *v.stride()[:3],
                 table.data_ptr(), table.shape[1], first.data_ptr(), lens.data_ptr(),
                 out.data_ptr(), lse.data_ptr() if lse is not None else None,
                 B, N, k.shape[2], D, rope, v.shape[3], k.shape[1],
                 min(k.shape[0], k_rope.shape[0], v.shape[0]), scale,
                 k.dtype == torch.bfloat16, row_of.data_ptr() if row_of is not None else None)


def _launch(args: _Args, first: torch.Tensor, lens: torch.Tensor) -> None:
    """Runs the kernel on `args` (whose first / lens pointers are these tensors')."""
    status = _run(args) if args.B else 0
    if status:
        _failed(args, first, lens, status)


def _failed(args: _Args, first: torch.Tensor, lens: torch.Tensor, status: int) -> None:
    if status == -1:
        raise MemoryError(f"paged_decode: no scratch memory for {args.B} requests of up to "
                          f"{int((lens - first).max())} keys")
    if status == -2:
        raise ValueError(f"paged_decode: a request's keys (up to {int(lens.max())}) reach "
                         f"past its block table row ({args.table_stride} blocks of "
                         f"{args.bs}) or a block id outside [0, {args.num_blocks})")


def decode_launch(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                  num_kv_heads: int, block_table: torch.Tensor, kv_lens: torch.Tensor,
                  scale: float, out: torch.Tensor):
    """`paged_decode(..., out=out, want_lse=False)` prepared for a graph task (see
    graph.graph_op's `launcher`): the kernel's arguments fixed now, tensors by address and
    kv_lens copied (host data); the `native.Launch` returned only launches. None where a replay
    would have to convert device data first (query or out not float32 contiguous, the
    table not int32 contiguous, out not the result's shape) or without the kernel."""
    B, N, D = query.shape
    k, v = _heads(key_cache, num_kv_heads), _heads(value_cache, num_kv_heads)
    if _kernel() is None or k.dtype != torch.float32 or query.dtype != torch.float32 \
            or not query.is_contiguous() or block_table.dtype != torch.int32 \
            or not block_table.is_contiguous() or out.dtype != torch.float32 \
            or not out.is_contiguous() or out.shape != (B, N, v.shape[3]) \
            or k.shape[3] != D or v.shape[1] != k.shape[1] or block_table.shape[0] < B:
        return None
    lens = kv_lens.to(torch.int64, copy=True).contiguous()
    first = torch.zeros_like(lens)
    args = _args(query, query, k, k, v, block_table, first, lens, out, None, 0, scale, None)
    return native.Launch("paged_decode", [ctypes.addressof(args), cores.device_cores()],
                         keep=(args, first, lens),
                         error=functools.partial(_failed, args, first, lens))


def refresh_lens(launch: native.Launch, kv_lens: torch.Tensor) -> None:
    """A `decode_launch`'s copy of the lengths rewritten in place (a task update of the
    same call with new host lengths, already checked)."""
    launch.keep[2].copy_(kv_lens)
