"""nxsat stage."""
