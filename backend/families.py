"""Every operator family's lowerings (importing registers them with ``lowers``)."""

from nxsat.backend import (  # noqa: F401
    collective,
    conv,
    elementwise,
    elementwise_ext,
    fused,
    indexing,
    matmul,
    movement,
    norm,
    reduce,
    rng,
)

elementwise_ext.fuse_iota()  # after every family: a family's own iota lowering comes first
