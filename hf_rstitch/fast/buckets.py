"""Length buckets for catch-up prefills.

A CUDA graph replays fixed shapes, so a catch-up over ``k`` unseen tokens runs the graph of the
smallest bucket ``>= k`` with the ``k`` real tokens at the front and padding behind them. Padded
positions are written to cache slots past the real ones and overwritten before anything attends
to them (see :mod:`hf_rstitch.fast.lane`). Powers of two keep the padding under 2x and the graph
count at ``log2(max_bucket)``; at batch size 1 a forward over a few dozen tokens costs about one
decode step (it is bound by reading the weights), so the padding is nearly free.
"""

from __future__ import annotations


def bucket_sizes(max_bucket: int) -> tuple[int, ...]:
    """``(1, 2, 4, ..., max_bucket)``; ``max_bucket`` must be a power of two >= 1."""
    if isinstance(max_bucket, bool) or not isinstance(max_bucket, int) or max_bucket < 1 or max_bucket & (max_bucket - 1):
        raise ValueError(
            f"max_bucket must be a power of two >= 1 (e.g. 128), got {max_bucket!r}. Catch-ups longer than it "
            "run without a graph, so pick about the longest run of tokens you expect one model to write."
        )
    sizes, size = [], 1
    while size <= max_bucket:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


def bucket_for(width: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest bucket holding ``width`` tokens, or None when ``width`` exceeds the largest."""
    if width < 1:
        raise ValueError(f"a forward call needs at least one token, got width={width}")
    for size in sizes:
        if size >= width:
            return size
    return None


def kernel_class(size: int) -> int:
    """The bucket sizes whose steps launch the same kernels: Triton specializes an integer argument as 1, as a
    multiple of 16 or as neither, and the compiled pieces (symbolic sizes) have one graph for 1 and one from 2 on.
    A lane's warm-up runs one bucket of each class for real; the others are recorded as graphs straight away
    (:meth:`hf_rstitch.fast.graphs.GraphRunner.record`)."""
    return 1 if size == 1 else 16 if size % 16 == 0 else 2


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
