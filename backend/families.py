"""Every operator family's lowerings (importing registers them with ``lowers``)."""

from nxsat.backend import elementwise, elementwise_ext, matmul, movement, reduce, rng  # noqa: F401

elementwise_ext.fuse_iota()  # after every family: a family's own iota lowering comes first
