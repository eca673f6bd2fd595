"""Two worlds for data-parallel code: a simulated one (one process, every rank's tensors in lists) and a real one
(one process per rank, ``torch.distributed`` with gloo on this machine), behind one interface.

Code written against the interface runs unchanged on both. Every collective takes a list with one tensor per
rank *that this process plays*: :class:`SimWorld` plays all ``size`` ranks (lists of ``size`` tensors), a
:class:`TorchWorld` plays its own rank only (lists of one tensor). ``world.ranks`` says which ranks those are::

    def average_gradients(replicas, world):
        for params in zip(*(m.parameters() for m in replicas)):  # one parameter, every local rank
            world.all_reduce([p.grad for p in params], op="mean")

    world = SimWorld(4)                         # graded exercises, tests, the sandbox: no processes
    world = PartialWorld(4, ranks=[1])          # this process plays rank 1 of 4; the others hold a constant
    launch(lambda world: ..., world_size=2)     # the same function on 2 real gloo ranks (Linux, fork)

The collectives (results exactly as ``torch.distributed``'s):

- ``all_reduce(tensors, op="sum" | "mean")``: in place, every rank ends with the sum (or mean);
- ``reduce_scatter(tensors, op=...)``: each rank's flat tensor (length divisible by ``size``) is reduced across
  ranks and rank r receives chunk r; returns the chunks;
- ``all_gather(shards)``: every rank receives the concatenation of all ranks' flat shards (equal lengths);
- ``broadcast(tensors, src)``: in place, every rank ends with rank ``src``'s tensor.

Both worlds log the bytes each rank sends and receives (``world.traffic``), counted for the ring algorithms
that NCCL and the ZeRO paper assume: for a tensor of S bytes, all-reduce sends and receives 2 (N-1)/N S per rank
(a reduce-scatter then an all-gather), reduce-scatter and all-gather (N-1)/N S (S: the full tensor, before
scattering or after gathering), broadcast S along a chain from the source (every rank receives S once, every
rank but the chain's last sends it once). The counts are the algorithm's, not a measurement of the wire: gloo
may move the bytes differently.

:func:`launch` starts real ranks on 127.0.0.1 (fork start method, a free port, gloo, one intra-op thread per
rank) and returns what each rank's function returned; it works from a notebook cell. Linux only (fork).
Across machines, the same function runs under ``torchrun``: see :func:`torchrun_main`.
"""
from __future__ import annotations

import contextlib
import io
import os
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

OPS = ("sum", "mean")


@dataclass
class Traffic:
    """Bytes sent and received per rank, by collective."""

    size: int
    sent: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    calls: list[tuple[str, int]] = field(default_factory=list)  # (collective, bytes of the full tensor)

    def __post_init__(self):
        self.sent = self.sent or [0] * self.size
        self.received = self.received or [0] * self.size

    def reset(self) -> None:
        self.sent, self.received, self.calls = [0] * self.size, [0] * self.size, []

    def book(self, collective: str, nbytes: int, src: int = 0) -> None:
        """Book one collective over a tensor of ``nbytes`` (the full tensor), as a ring algorithm moves it."""
        n = self.size
        self.calls.append((collective, nbytes))
        if n == 1:
            return
        if collective == "all_reduce":
            each = 2 * (n - 1) * nbytes // n
            sends = receives = [each] * n
        elif collective in ("reduce_scatter", "all_gather"):
            each = (n - 1) * nbytes // n
            sends = receives = [each] * n
        elif collective == "broadcast":  # a chain src -> src+1 -> ... -> src-1
            last = (src - 1) % n
            sends = [0 if r == last else nbytes for r in range(n)]
            receives = [0 if r == src else nbytes for r in range(n)]
        else:
            raise ValueError(f"unknown collective {collective!r}")
        for r in range(n):
            self.sent[r] += sends[r]
            self.received[r] += receives[r]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _World:
    """What both worlds share: argument checks and the traffic log."""

    size: int
    ranks: tuple[int, ...]

    def __init__(self, size: int):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"world size must be a positive integer, got {size!r}")
        self.size = size
        self.traffic = Traffic(size)

    def _local(self, tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
        tensors = list(tensors)
        if len(tensors) != len(self.ranks):
            raise ValueError(f"{what} takes one tensor per rank this process plays ({len(self.ranks)}: ranks "
                             f"{list(self.ranks)}), got {len(tensors)}")
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{what} takes tensors, got {type(t).__name__}")
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            raise ValueError(f"{what}: every rank's tensor must have the same shape, got {sorted(shapes)}")
        return tensors

    def _op(self, op: str) -> str:
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {op!r}")
        return op

    def _divisible(self, t: torch.Tensor, what: str) -> None:
        if t.dim() != 1 or t.numel() % self.size:
            raise ValueError(f"{what} takes flat tensors whose length is a multiple of the world size {self.size}, "
                             f"got shape {tuple(t.shape)} (pad them: shard bounds)")


class SimWorld(_World):
    """``size`` ranks simulated in this process: every collective takes one tensor per rank (rank r's at index r).
    Results equal ``torch.distributed``'s up to floating-point summation order (ranks are summed in rank order)."""

    def __init__(self, size: int):
        super().__init__(size)
        self.ranks = tuple(range(size))

    def __repr__(self) -> str:
        return f"SimWorld({self.size})"

    def _everyone(self, tensors: list[torch.Tensor], reduction: bool = False) -> list[torch.Tensor]:
        """One tensor per rank of the world, in rank order (here every rank is played: the tensors given).
        ``reduction``: the call reduces them (a world that simulates ranks may make their tensors differently)."""
        return [t.detach() for t in tensors]

    def _reduced(self, tensors: list[torch.Tensor], op: str) -> torch.Tensor:
        """Every rank's tensor summed in rank order (divided by the world size for "mean"), a new tensor."""
        op = self._op(op)
        everyone = self._everyone(tensors, reduction=True)
        total = everyone[0].clone()
        for t in everyone[1:]:
            total += t
        if op == "mean":
            total /= self.size
        return total

    def all_reduce(self, tensors: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
        tensors = self._local(tensors, "all_reduce")
        total = self._reduced(tensors, op)
        for t in tensors:
            with torch.no_grad():
                t.copy_(total)
        self.traffic.book("all_reduce", _nbytes(total))
        return tensors

    def reduce_scatter(self, tensors: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
        tensors = self._local(tensors, "reduce_scatter")
        self._divisible(tensors[0], "reduce_scatter")
        total = self._reduced(tensors, op)
        self.traffic.book("reduce_scatter", _nbytes(total))
        chunks = total.chunk(self.size)
        return [chunks[r].clone() for r in self.ranks]  # rank r receives chunk r

    def all_gather(self, shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        shards = self._local(shards, "all_gather")
        if shards[0].dim() != 1:
            raise ValueError(f"all_gather takes flat shards, got shape {tuple(shards[0].shape)}")
        full = torch.cat(self._everyone(shards))
        self.traffic.book("all_gather", _nbytes(full))
        return [full.clone() for _ in shards]

    def broadcast(self, tensors: Sequence[torch.Tensor], src: int = 0) -> list[torch.Tensor]:
        tensors = self._local(tensors, "broadcast")
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.size:
            raise ValueError(f"src must be a rank of the world (0 to {self.size - 1}), got {src!r}")
        value = self._everyone(tensors)[src].clone()
        for t in tensors:
            with torch.no_grad():
                t.copy_(value)
        self.traffic.book("broadcast", _nbytes(value), src=src)
        return tensors


class PartialWorld(SimWorld):
    """A world of ``size`` ranks in which this process plays only ``ranks`` (as each process of a real process
    group plays its own); every other rank is simulated. Lists hold one tensor per rank played, in the order of
    ``world.ranks``.

    What another rank contributes to a collective (its input to ``all_reduce`` and ``reduce_scatter``, its shard
    to ``all_gather``, the value a ``broadcast`` from it sends):

    - by default, a tensor filled with ``fill``;
    - with ``seed``, numbers ``a_r``, ``b_r`` of each other rank r drawn from ``seed`` (and not shown): the rank
      holds ``a_r * t + b_r`` for a reduction (``t``: this process's first tensor of the call), so that what it
      contributes is unpredictable yet the same element by element whatever the layout of the call (one tensor per
      parameter or one flat bucket); its shard in an ``all_gather`` and what a ``broadcast`` from it sends are
      filled with ``b_r`` (nothing of ours, so what this process keeps in padding never reaches real positions).

    Code that reaches the other ranks only through the collectives gets what the full world would give; code that
    averages the tensors it was given by itself does not."""

    def __init__(self, size: int, ranks: Sequence[int], fill: float = 0.0, seed: int | None = None):
        super().__init__(size)
        ranks = tuple(ranks)
        if not ranks or len(set(ranks)) != len(ranks) or any(
                isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < size for r in ranks):
            raise ValueError(f"ranks must be distinct ranks of the world (0 to {size - 1}), got {list(ranks)}")
        self.ranks = tuple(sorted(ranks))
        self.fill = float(fill)
        self._mix: dict[int, tuple[float, float]] = {}
        if seed is not None:
            generator = torch.Generator().manual_seed(int(seed))
            draws = torch.rand(size, 2, generator=generator, dtype=torch.float64)
            self._mix = {r: (0.5 + float(draws[r, 0]), float(draws[r, 1]) - 0.5) for r in range(size)
                         if r not in self.ranks}

    def __repr__(self) -> str:
        others = "drawn" if self._mix else f"fill={self.fill}"
        return f"PartialWorld({self.size}, ranks={list(self.ranks)}, other ranks: {others})"

    def _other(self, rank: int, like: torch.Tensor, reduction: bool) -> torch.Tensor:
        if self._mix:
            a, b = self._mix[rank]
            return like * a + b if reduction else torch.full_like(like, b)
        return torch.full_like(like, self.fill)

    def _everyone(self, tensors: list[torch.Tensor], reduction: bool = False) -> list[torch.Tensor]:
        """One tensor per rank of the world, in rank order: ours, and the simulated ranks' for the others."""
        mine = dict(zip(self.ranks, tensors))
        like = tensors[0].detach()
        return [mine[r].detach() if r in mine else self._other(r, like, reduction) for r in range(self.size)]


class TorchWorld(_World):
    """This process's rank of an initialised ``torch.distributed`` process group: every collective takes a list
    of one tensor (this rank's)."""

    def __init__(self):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("TorchWorld needs an initialised process group (launch() or torchrun sets one up)")
        super().__init__(dist.get_world_size())
        self.rank = dist.get_rank()
        self.ranks = (self.rank,)
        self._dist = dist

    def __repr__(self) -> str:
        return f"TorchWorld(rank {self.rank} of {self.size})"

    def all_reduce(self, tensors, op="sum"):
        (t,) = self._local(tensors, "all_reduce")
        op = self._op(op)
        with torch.no_grad():
            self._dist.all_reduce(t)
            if op == "mean":
                t /= self.size
        self.traffic.book("all_reduce", _nbytes(t))
        return [t]

    def reduce_scatter(self, tensors, op="sum"):
        (t,) = self._local(tensors, "reduce_scatter")
        op = self._op(op)
        self._divisible(t, "reduce_scatter")
        out = torch.empty(t.numel() // self.size, dtype=t.dtype)
        scatter = getattr(self._dist, "reduce_scatter_single", None) or self._dist.reduce_scatter_tensor
        try:
            scatter(out, t.detach().contiguous())
        except (RuntimeError, NotImplementedError):  # a backend without reduce-scatter: all-reduce, keep a chunk
            total = t.detach().clone()
            self._dist.all_reduce(total)
            out = total.chunk(self.size)[self.rank].clone()
        if op == "mean":
            out /= self.size
        self.traffic.book("reduce_scatter", _nbytes(t))
        return [out]

    def all_gather(self, shards):
        (s,) = self._local(shards, "all_gather")
        if s.dim() != 1:
            raise ValueError(f"all_gather takes flat shards, got shape {tuple(s.shape)}")
        parts = [torch.empty_like(s) for _ in range(self.size)]
        self._dist.all_gather(parts, s.detach().contiguous())
        full = torch.cat(parts)
        self.traffic.book("all_gather", _nbytes(full))
        return [full]

    def broadcast(self, tensors, src=0):
        (t,) = self._local(tensors, "broadcast")
        if not 0 <= src < self.size:
            raise ValueError(f"src must be a rank of the world (0 to {self.size - 1}), got {src!r}")
        with torch.no_grad():
            self._dist.broadcast(t, src)
        self.traffic.book("broadcast", _nbytes(t), src=src)
        return [t]


# --- real ranks on this machine -----------------------------------------------------------------------------
class RankFailed(RuntimeError):
    """A rank raised: its traceback is in the message."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pack(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _rank_main(fn, rank, world_size, port, timeout, args, queue) -> None:
    """One rank: its process group, ``fn(TorchWorld(), *args)``, the result (or the traceback) and what it
    printed, sent to the parent."""
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout))
            try:
                result = fn(TorchWorld(), *args)
                # No rank leaves before every rank has joined and finished: a rank that exits while a peer is
                # still connecting breaks that peer's gloo handshake ("Connection closed by peer").
                dist.barrier()
            finally:
                dist.destroy_process_group()
        queue.put((rank, "ok", _pack(result), printed.getvalue()))
    except BaseException:  # noqa: BLE001 - the parent reports it with the rank's name
        queue.put((rank, "error", traceback.format_exc(), printed.getvalue()))
    finally:
        queue.close()
        queue.join_thread()
        os._exit(0)


_PREIMPORTED = False


def _preimport() -> None:
    """Import once, in the parent, what every rank would otherwise import on its own after the fork (DDP's first
    construction imports torch._dynamo: seconds per rank)."""
    global _PREIMPORTED
    if not _PREIMPORTED:
        import warnings

        with warnings.catch_warnings():  # torch.distributed.optim still scripts with torch.jit (deprecated)
            warnings.simplefilter("ignore", DeprecationWarning)
            import torch._dynamo  # noqa: F401
            import torch.distributed  # noqa: F401
            import torch.distributed.optim  # noqa: F401
        _PREIMPORTED = True


@dataclass(frozen=True)
class Launched:
    """What :func:`launch` brought back: each rank's return value and printed text, in rank order."""

    results: list
    printed: list[str]
    seconds: float  # from the first fork to the last result


def launch(fn: Callable, world_size: int, *args, timeout: float = 60, echo: bool = True) -> Launched:
    """Run ``fn(world, *args)`` on ``world_size`` real ranks: forked processes joined in a gloo process group on
    127.0.0.1 (a free port, one intra-op thread each); ``world`` is each rank's :class:`TorchWorld`.

    Returns a :class:`Launched` (``.results[r]`` is what rank r returned, sent back through ``torch.save``, so
    tensors and modules' state dicts come back as copies). What ranks print is returned, and shown prefixed with
    the rank when ``echo``. A rank that raises stops the run: the others are killed and :class:`RankFailed`
    carries the first failure's traceback. A run not finished within ``timeout`` seconds is killed and raises
    ``TimeoutError`` naming the ranks that did not finish. No process outlives the call. Linux only (fork)."""
    import multiprocessing
    import queue as queue_module

    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if "fork" not in multiprocessing.get_all_start_methods():
        raise RuntimeError("launch() needs the fork start method (Linux); elsewhere run the script under torchrun")
    _preimport()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    start = time.monotonic()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, timeout, args, queue), daemon=True,
                         name=f"rank-{r}") for r in range(world_size)]
    got: dict[int, tuple] = {}
    errors: dict[int, tuple[str, str]] = {}
    grace = None  # once a rank failed: a moment for the others' errors (a peer's failure ends their collectives)
    try:
        for p in procs:
            p.start()
        deadline = start + timeout
        while len(got) + len(errors) < world_size and (grace is None or time.monotonic() < grace):
            remaining = (grace or deadline) - time.monotonic()
            if remaining <= 0 and grace is None:
                missing = sorted(set(range(world_size)) - set(got))
                raise TimeoutError(f"ranks {missing} of {world_size} did not finish within {timeout} s (a collective "
                                   "that not every rank calls waits forever); printed: "
                                   + ("; ".join(f"rank {r}: {got[r][1][-300:]!r}" for r in sorted(got)) or "nothing"))
            try:
                rank, status, payload, printed = queue.get(timeout=max(0.01, min(remaining, 0.5)))
            except queue_module.Empty:  # check the processes and the deadline
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and not errors:
                    raise RankFailed(f"{dead[0].name} died with exit code {dead[0].exitcode} before reporting")
                continue
            if status == "error":
                errors[rank] = (payload, printed)
                grace = grace or time.monotonic() + 2.0
            else:
                got[rank] = (payload, printed)
        if errors:
            # The rank whose own code failed, before those that failed because it went away.
            first = min(errors, key=lambda r: ("distributed_c10d" in errors[r][0], r))
            payload, printed = errors[first]
            others = [f"rank {r} ({errors[r][0].strip().splitlines()[-1][:200]})" for r in sorted(errors) if r != first]
            raise RankFailed(f"rank {first} of {world_size} raised:\n{payload}"
                             + (f"\nit printed:\n{printed}" if printed else "")
                             + (f"\nthen {', '.join(others)} failed too" if others else ""))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
        queue.close()
    seconds = time.monotonic() - start
    results = [torch.load(io.BytesIO(got[r][0]), weights_only=False) for r in range(world_size)]
    printed = [got[r][1] for r in range(world_size)]
    if echo:
        for r, text in enumerate(printed):
            for line in text.splitlines():
                print(f"[rank {r}] {line}")
    return Launched(results, printed, seconds)


def torchrun_main(fn: Callable, *args):
    """Run ``fn(TorchWorld(), *args)`` in a process started by ``torchrun`` (which sets RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT), on gloo; returns what ``fn`` returned on this rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        result = fn(TorchWorld(), *args)
        dist.barrier()  # no rank leaves while a peer is still connecting (see launch)
        return result
    finally:
        dist.destroy_process_group()
