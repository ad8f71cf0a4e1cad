"""Every operator family's lowerings (importing registers them with ``lowers``)."""

from nxsat.backend import collective, elementwise, indexing, matmul, movement, reduce  # noqa: F401
