"""Every operator family's lowerings (importing registers them with ``lowers``)."""

from nxsat.backend import elementwise, elementwise_ext, matmul, movement, reduce, rng  # noqa: F401
