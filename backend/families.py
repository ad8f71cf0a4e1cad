"""Every operator family's lowerings (importing registers them with ``lowers``)."""

from nxsat.backend import conv, elementwise, matmul, movement, reduce  # noqa: F401
